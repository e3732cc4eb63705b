/* gemma4 bench: prefill (ppN) and decode (tgN) speed in llama-bench's
 * conventions (fresh context, repeats, mean ± sd, sampling excluded; decode
 * steps copy back only the argmax, as greedy generation does), each
 * beside its physical limit on this machine: prefill against measured FLOP/s,
 * decode against measured memory bandwidth over the bytes a step reads.
 *
 * Internal headers remain (backend/cuda/cuda_backend.h, backend/cpu/cpu_probe.h, runtime/engine.h,
 * runtime/session.h, model/kv_cache.h): it times the engine's steps and reads the device probes, below
 * the public API by design.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cpu/cpu_probe.h"
#include "bench_draft.h"
#include "cli_common.h"
#include "cli_draft.h"
#include "model/kv_cache.h"
#include "runtime/engine.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 bench (-m DIR | --synthetic NAME) [--format bf16|mlx4|mlx8|mxfp4]\n"
            "                    [-p 512] [-n 128] [-r 3] [--threads N] [--device cpu|cuda|cuda:N] [--json]\n"
            "                    [--precision fast|exact] [--kv-type f32|bf16|fp8]\n"
            "                    [-d 0]   (decode after this many tokens of context, prefilled untimed)\n"
            "                    [--ctx N]   (session positions; default max(p, d + n) + 8)\n"
            "                    [--streams 1,8,32]   (aggregate decode of concurrent streams, batched)\n"
            "                    [--draft DIR [--draft-max N] [--draft-prompt TEXT]]   (greedy decoding of the\n"
            "                    prompt with and without speculation by an MTP drafter: tg tokens/s of each;\n"
            "                    --draft synthetic: a random drafter for the --synthetic target;\n"
            "                    --force-accept 0,1,2: the speed when verification keeps that many drafts;\n"
            "                    with --streams: each stream count plain and drafted through the batched\n"
            "                    engine, every sequence drafting, --force-accept's first count if given)\n"
            "  NAME: e2b, e4b, 26b-a4b, 31b or 12b (full-size, random weights; real release configs)\n");
}

typedef struct {
    double mean, sd;
} stats;

static stats summarize(const double *v, int n) {
    stats s = {0, 0};
    for (int i = 0; i < n; i++) s.mean += v[i];
    s.mean /= n;
    for (int i = 0; i < n; i++) s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0;
    return s;
}

static int32_t bench_token(int i, int vocab) { return (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)(vocab - 3)) + 3; }

/* ---- concurrent streams through the batched engine ---- */

typedef struct {
    int generated;
    double first_token_time;
    int done;
} stream_state;

static void on_stream_token(void *user, const g4_token_event *ev) {
    stream_state *s = user;
    if (ev->has_token) {
        if (s->generated++ == 0) s->first_token_time = g4_now_seconds();
    }
    if (ev->finish != G4_FINISH_NONE) s->done = 1;
}

/* Aggregate decode throughput of n concurrent greedy streams, each with a
 * prompt of prompt_len tokens and tg generated tokens (stop tokens ignored).
 * Decode time runs from the moment every stream has its first token (all
 * prefills done) to the end. */
/* CPU seconds of the whole process: on a loaded machine, work done rather
 * than time waited (with --threads 1, the engine thread's alone) */
static double process_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    const g4_assistant *drafter; /* NULL: plain decoding */
    int draft_max, forced;       /* forced < 0: real verification */
} stream_draft;

static g4_status bench_streams(const g4_model *m, g4_kv_type kv_type, int n, int prompt_len, int tg,
                               const stream_draft *sd, double *decode_tps, double *cpu_tps, g4_engine_stats *stats_out) {
    const int V = m->config.text.vocab_size;
    g4_engine_options opt = {.max_seqs = n, .n_ctx = prompt_len + tg + 8, .kv_type = kv_type,
                             .max_batch_tokens = n * prompt_len > 512 ? n * prompt_len : 512};
    if (sd && sd->drafter) {
        opt.drafter = sd->drafter;
        opt.draft_max = sd->draft_max;
        opt.draft_max_batch = n; /* every sequence drafts: the measurement that sets the default */
        opt.draft_force = sd->forced >= 0;
        opt.draft_forced_accept = sd->forced;
    }
    g4_engine *e;
    g4_status st = g4_engine_create(m, &opt, &e);
    if (st != G4_OK) return st;
    stream_state *states = calloc((size_t)n, sizeof *states);
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    for (int r = 0; st == G4_OK && r < n; r++) {
        for (int i = 0; i < prompt_len; i++) prompt[i] = bench_token(r * 977 + i, V);
        g4_request req = {.prompt = prompt, .n_prompt = prompt_len, .max_tokens = tg, .on_token = on_stream_token,
                          .user = &states[r]};
        g4_sampler_params_default(&req.sampling);
        st = g4_engine_submit(e, &req, NULL);
    }
    double t_all_started = 0, cpu_started = 0;
    while (st == G4_OK) {
        int pending = g4_engine_step(e);
        if (pending < 0) {
            st = g4_fail(G4_ERR_INTERNAL, "engine step failed: %s", g4_error_message());
            break;
        }
        if (t_all_started == 0) {
            int started = 0;
            for (int r = 0; r < n; r++) started += states[r].generated > 0;
            if (started == n) t_all_started = g4_now_seconds(), cpu_started = process_seconds();
        }
        if (pending == 0) break;
    }
    double t_end = g4_now_seconds();
    int tokens = 0;
    for (int r = 0; r < n; r++) tokens += states[r].generated - 1; /* after the first */
    *decode_tps = t_end > t_all_started ? tokens / (t_end - t_all_started) : 0;
    const double cpu_end = process_seconds();
    if (cpu_tps) *cpu_tps = cpu_end > cpu_started ? tokens / (cpu_end - cpu_started) : 0;
    if (stats_out) g4_engine_get_stats(e, stats_out);
    free(states);
    free(prompt);
    g4_engine_destroy(e);
    return st;
}

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *synthetic = NULL, *format = "bf16", *pp_text = "512", *tg_text = "128",
               *reps_text = "3", *threads_text = NULL, *device = NULL, *streams_text = NULL, *depth_text = "0",
               *ctx_text = NULL;
    int json = 0;
    g4_precision precision = G4_PRECISION_FAST;
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    const char *draft_prompt = "In the beginning God created the heaven and the earth.", *force_accept = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) ||
            (r = cli_option(argc, argv, &i, "--synthetic", &synthetic)) ||
            (r = cli_option(argc, argv, &i, "--format", &format)) || (r = cli_option(argc, argv, &i, "-p", &pp_text)) ||
            (r = cli_option(argc, argv, &i, "-n", &tg_text)) || (r = cli_option(argc, argv, &i, "-r", &reps_text)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_option(argc, argv, &i, "--streams", &streams_text)) ||
            (r = cli_option(argc, argv, &i, "-d", &depth_text)) || (r = cli_option(argc, argv, &i, "--ctx", &ctx_text)) ||
            (r = cli_draft_option(argc, argv, &i, &draft)) ||
            (r = cli_option(argc, argv, &i, "--draft-prompt", &draft_prompt)) ||
            (r = cli_option(argc, argv, &i, "--force-accept", &force_accept))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--json")) {
            json = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 bench: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!!model_path == !!synthetic) {
        usage(stderr);
        return 2;
    }
    long pp = cli_parse_count(pp_text, "-p"), tg = cli_parse_count(tg_text, "-n"), reps = cli_parse_count(reps_text, "-r");
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    long depth = cli_parse_count(depth_text, "-d"), ctx = ctx_text ? cli_parse_count(ctx_text, "--ctx") : 0;
    if (pp < 0 || tg < 0 || reps <= 0 || threads < 0 || depth < 0 || ctx < 0) return 2;
    const long ctx_needed = (pp > depth + tg ? pp : depth + tg) + 8;
    if (ctx_text && ctx < ctx_needed) {
        fprintf(stderr, "gemma4 bench: --ctx %ld is too small for -p %ld, -d %ld, -n %ld (%ld positions needed)\n", ctx,
                pp, depth, tg, ctx_needed);
        return 2;
    }
    int32_t *streams = NULL;
    int n_streams = 0;
    if (streams_text && (cli_parse_ids(streams_text, &streams, &n_streams) != 0 || n_streams == 0)) return 2;

    g4_backend *be = NULL;
    g4_model *model = NULL;
    double t_load = g4_now_seconds();
    if (model_path) {
        if (cli_open_model_on(model_path, device, (int)threads, &be, &model) != 0) return 1;
        be->ops->set_precision(be, precision);
    } else {
        if (cli_create_backend(device, (int)threads, &be) != 0) return 1;
        be->ops->set_precision(be, precision);
        g4_status st = g4_model_synthesize(synthetic, format, be, &model);
        if (st != G4_OK) {
            cli_report_error("bench", st);
            g4_backend_destroy(be);
            return 1;
        }
    }
    t_load = g4_now_seconds() - t_load;
    kv_type = g4_kv_type_resolve(kv_type, precision, model);
    size_t rss_loaded = g4_current_rss_bytes(), rss_peak_loading = g4_peak_rss_bytes();
    fprintf(stderr, "gemma4 bench: %s loaded in %.1f s; measuring machine limits...\n", model->path, t_load);
    /* GPU: device-to-device copy bandwidth and cuBLAS bf16 rate; CPU: memory
     * read bandwidth and float32 FMA rate */
    const int on_gpu = g4_backend_is_cuda(be);
    double bandwidth = on_gpu ? g4_cuda_probe_bandwidth(be) : g4_measure_memory_bandwidth();
    double gflops = on_gpu ? 1000.0 * g4_cuda_probe_bf16_tflops(be) : g4_measure_cpu_flops();
    g4_reset_peak_rss(); /* the probes' 1 GiB buffer is not the model's */

    const int V = model->config.text.vocab_size;
    const int n_ctx = (int)(ctx_text ? ctx : ctx_needed);
    g4_session_options opt = {.n_ctx = n_ctx, .kv_type = kv_type};
    g4_session *s = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    const long n_ids = pp > depth ? pp : depth;
    int32_t *ids = malloc((size_t)(n_ids + 1) * sizeof *ids);
    double *pp_rate = calloc((size_t)reps, sizeof(double)), *tg_rate = calloc((size_t)reps, sizeof(double));
    g4_status st = (logits && ids && pp_rate && tg_rate) ? g4_session_create(model, &opt, &s)
                                                         : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (long i = 0; i <= n_ids; i++) ids[i] = bench_token((int)i, V); /* one past: the warm-up reads ids[0] when -p 0 */
    /* warm-up: page in the weights and spin up the threads; on a GPU one full
     * prompt and a few steps, so that lazily loaded kernels and scratch
     * buffers are ready before timing */
    int warm = pp > 16 ? 16 : (int)(pp ? pp : 1);
    if (on_gpu && pp > warm) warm = (int)pp;
    if (st == G4_OK) st = g4_session_eval(s, ids, warm, NULL, G4_LOGITS_LAST, logits); /* the full-row path ready too */
    for (int i = 0; on_gpu && st == G4_OK && i < 4 && warm + i < n_ctx; i++) {
        int32_t tok = bench_token(i + 3, V);
        int32_t top_id;
        float top_value;
        double lse;
        st = g4_session_eval_top(s, &tok, 1, NULL, 1, &top_id, &top_value, &lse);
    }
    for (long r = 0; st == G4_OK && r < reps; r++) {
        if (pp > 0) {
            g4_session_reset(s);
            double t0 = g4_now_seconds();
            int32_t top_id;
            float top_value;
            double lse;
            st = g4_session_eval_top(s, ids, (int)pp, NULL, 1, &top_id, &top_value, &lse);
            pp_rate[r] = pp / (g4_now_seconds() - t0);
        }
        if (st == G4_OK && tg > 0) {
            g4_session_reset(s);
            if (depth > 0) { /* the context decode starts from, untimed */
                int32_t top_id;
                float top_value;
                double lse;
                st = g4_session_eval_top(s, ids, (int)depth, NULL, 1, &top_id, &top_value, &lse);
            }
            double t0 = g4_now_seconds();
            for (long i = 0; st == G4_OK && i < tg; i++) {
                int32_t tok = bench_token((int)i + 7, V), top_id;
                float top_value;
                double lse;
                /* as greedy decoding runs: only the argmax comes back (top_logits, k = 1) */
                st = g4_session_eval_top(s, &tok, 1, NULL, 1, &top_id, &top_value, &lse);
            }
            tg_rate[r] = tg / (g4_now_seconds() - t0);
        }
    }
    size_t rss_anon, rss_file; /* while the session still holds its KV cache */
    g4_current_rss_split(&rss_anon, &rss_file);
    double kv_alloc = s ? (double)g4_kv_pool_bytes(s->kv, model) : 0;
    int rc = 1;
    if (st == G4_OK) {
        stats p = summarize(pp_rate, (int)reps), t = summarize(tg_rate, (int)reps);
        double weight_bytes = (double)g4_model_decode_weight_bytes(model);
        double kv_bytes = (double)g4_model_decode_kv_bytes(model, (int)(depth + tg / 2), kv_type);
        double tg_limit = bandwidth * 1e9 / (weight_bytes + kv_bytes);
        double flops_token = g4_model_flops_per_token(model);
        double pp_limit = gflops * 1e9 / flops_token;
        size_t peak = g4_peak_rss_bytes();
        double rss = (double)(peak > rss_peak_loading ? peak : rss_peak_loading) / (1u << 30);
        double gpu_mem = (double)g4_cuda_memory_used(be) / (1u << 30);
        const char *fmt_name = synthetic ? format : "checkpoint";
        if (json) {
            printf("{\"model\":\"%s\",\"format\":\"%s\",\"threads\":%ld,\"pp\":%ld,\"pp_tps\":%.3f,\"pp_sd\":%.3f,"
                   "\"pp_limit_tps\":%.3f,\"tg\":%ld,\"tg_tps\":%.3f,\"tg_sd\":%.3f,\"tg_limit_tps\":%.3f,"
                   "\"bandwidth_gbs\":%.2f,\"gflops\":%.1f,\"decode_bytes\":%.0f,\"peak_rss_gib\":%.3f,"
                   "\"load_s\":%.2f,\"backend\":\"%s\",\"device\":\"%s\",\"gpu_mem_gib\":%.3f,"
                   "\"rss_private_gib\":%.3f,\"rss_file_gib\":%.3f,\"kv_cache_bytes\":%.0f,\"depth\":%ld,"
                   "\"n_ctx\":%d,\"kv_type\":\"%s\",\"kv_decode_bytes\":%.0f}\n",
                   model->path, fmt_name, threads, pp, p.mean, p.sd, pp_limit, tg, t.mean, t.sd, tg_limit, bandwidth,
                   gflops, weight_bytes + kv_bytes, rss, t_load, be->ops->name, g4_cuda_device_name(be), gpu_mem,
                   (double)rss_anon / (1u << 30), (double)rss_file / (1u << 30), kv_alloc, depth, n_ctx,
                   g4_kv_type_name(kv_type), kv_bytes);
        } else {
            printf("| model | format | test | t/s | limit t/s | of limit |\n|---|---|---|---|---|---|\n");
            if (pp > 0)
                printf("| %s | %s | pp%ld | %.2f ± %.2f | %.1f (%.1f GFLOP/token at %.0f GFLOP/s) | %.1f%% |\n",
                       model->path, fmt_name, pp, p.mean, p.sd, pp_limit, flops_token / 1e9, gflops,
                       100 * p.mean / pp_limit);
            if (tg > 0)
                printf("| %s | %s | tg%ld%s%.0ld | %.2f ± %.2f | %.2f (%.2f GB/token: weights %.2f + %s KV %.2f, at "
                       "%.1f GB/s) | %.1f%% |\n",
                       model->path, fmt_name, tg, depth ? " @ d" : "", depth, t.mean, t.sd, tg_limit,
                       (weight_bytes + kv_bytes) / 1e9, weight_bytes / 1e9, g4_kv_type_name(kv_type), kv_bytes / 1e9,
                       bandwidth, 100 * t.mean / tg_limit);
            printf("\npeak RSS %.2f GiB (%.2f GiB after loading), load %.1f s, %s backend, threads %s, "
                   "time to first token at pp%ld: %.1f ms\n",
                   rss, (double)rss_loaded / (1u << 30), t_load, be->ops->name, threads ? threads_text : "all", pp,
                   pp > 0 ? 1000.0 * pp / p.mean : 0.0);
            printf("RSS after the runs: %.2f GiB private (heap: KV cache of %.1f MiB allocated, scratch, converted "
                   "vectors), %.2f GiB mapped from files (weights used in place)\n",
                   (double)rss_anon / (1u << 30), kv_alloc / (1u << 20), (double)rss_file / (1u << 30));
            if (on_gpu)
                printf("GPU %s: %.2f GiB in use; limits from a measured %.0f GB/s device copy and %.0f TFLOP/s "
                       "cuBLAS bf16\n",
                       g4_cuda_device_name(be), gpu_mem, bandwidth, gflops / 1000.0);
        }
        rc = 0;
    } else {
        cli_report_error("bench", st);
    }
    g4_session_destroy(s);
    free(logits);
    free(ids);
    free(pp_rate);
    free(tg_rate);
    /* concurrent streams: aggregate decode through the batched engine,
     * compared with one stream through the same engine (measured first when
     * the list does not start with 1) */
    double base = 0;
    stream_draft sd = {.draft_max = draft.draft_max, .forced = -1};
    g4_assistant *stream_drafter = NULL;
    if (n_streams > 0 && draft.dir) {
        rc = cli_open_draft_any(&draft, synthetic, model, &stream_drafter);
        sd.drafter = stream_drafter;
        int32_t *levels = NULL;
        int n_levels = 0;
        if (rc == 0 && force_accept && (cli_parse_ids(force_accept, &levels, &n_levels) != 0 || n_levels == 0)) rc = 2;
        if (rc == 0 && force_accept) sd.forced = levels[0] < draft.draft_max ? levels[0] : draft.draft_max;
        free(levels);
    }
    for (int k = n_streams > 0 && streams[0] != 1 ? -1 : 0; rc == 0 && k < n_streams; k++) {
        const int n = k < 0 ? 1 : streams[k];
        double tps = 0, dtps = 0, cpu = 0, dcpu = 0;
        g4_engine_stats ds = {0};
        g4_status sst = bench_streams(model, kv_type, n, 16, (int)(tg > 1 ? tg : 2), NULL, &tps, &cpu, NULL);
        if (sst == G4_OK && sd.drafter && k >= 0)
            sst = bench_streams(model, kv_type, n, 16, (int)(tg > 1 ? tg : 2), &sd, &dtps, &dcpu, &ds);
        if (sst != G4_OK) {
            cli_report_error("bench --streams", sst);
            rc = 1;
            break;
        }
        if (n == 1 && base == 0) base = tps;
        if (k < 0) continue;
        if (sd.drafter) {
            const double rounds = ds.draft_rounds ? (double)ds.draft_rounds : 1;
            if (json)
                printf("{\"model\":\"%s\",\"streams\":%d,\"decode_tps\":%.2f,\"draft_decode_tps\":%.2f,"
                       "\"cpu_tps\":%.2f,\"draft_cpu_tps\":%.2f,"
                       "\"draft_max\":%d,\"forced_accept\":%d,\"accepted_per_round\":%.3f,\"first_draft_acceptance\":%.3f}\n",
                       model->path, n, tps, dtps, cpu, dcpu, sd.draft_max, sd.forced, (double)ds.drafts_accepted / rounds,
                       ds.drafted_at[0] ? (double)ds.accepted_at[0] / (double)ds.drafted_at[0] : 0.0);
            else
                printf("| %s | streams %d | plain %.1f t/s | drafted (%d a round%s) %.1f t/s | %.2fx | per CPU second "
                       "%.1f / %.1f: %.2fx | %.2f kept a round, first draft %.2f |\n",
                       model->path, n, tps, sd.draft_max, sd.forced >= 0 ? ", forced acceptance" : "", dtps,
                       tps > 0 ? dtps / tps : 0.0, cpu, dcpu, cpu > 0 ? dcpu / cpu : 0.0, (double)ds.drafts_accepted / rounds,
                       ds.drafted_at[0] ? (double)ds.accepted_at[0] / (double)ds.drafted_at[0] : 0.0);
            continue;
        }
        if (json)
            printf("{\"model\":\"%s\",\"streams\":%d,\"decode_tps\":%.2f,\"per_stream_tps\":%.2f}\n", model->path,
                   streams[k], tps, tps / streams[k]);
        else
            printf("| %s | streams %d | aggregate decode %.1f t/s | %.1f t/s per stream | %.2fx one stream |\n",
                   model->path, streams[k], tps, tps / streams[k], base > 0 ? tps / base : 0.0);
    }
    free(streams);
    g4_assistant_release(stream_drafter);
    if (rc == 0 && draft.dir && n_streams == 0) {
        bench_draft_options o = {.draft = &draft, .synthetic = synthetic, .prompt = draft_prompt,
                                 .force_accept = force_accept, .tg = (int)(tg > 1 ? tg : 2), .reps = (int)reps,
                                 .json = json};
        rc = bench_draft(model, &o);
    }
    cli_close_model(be, model);
    return rc;
}
