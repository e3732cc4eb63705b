/* gemma4 serve: the OpenAI-compatible HTTP server over the batched engine.
 *
 * Internal headers remain (server/server.h, runtime/engine.h, prefix_cache.h, memory_plan.h,
 * context.h, backend/cuda): the HTTP server and its memory plan are the library's, not part of
 * gemma4.h.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"
#include "backend/cuda/cuda_backend.h"
#include "cli_common.h"
#include "cli_draft.h"
#include "model/kv_cache.h"
#include "runtime/memory_plan.h"
#include "runtime/prefix_cache.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 serve (-m DIR|ORG/NAME | --synthetic NAME [--format bf16|mlx4|mlx8|mxfp4]) [options]\n"
            "\n"
            "OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses\n"
            "(GET/DELETE /v1/responses/ID), GET /v1/models, GET /health, GET /metrics, POST /tokenize,\n"
            "POST /detokenize; Anthropic-compatible POST /v1/messages and /v1/messages/count_tokens.\n"
            "\n"
            "  --host ADDR             address to listen on (default 127.0.0.1)\n"
            "  --port N                port (default 8080; 0 picks a free one, printed at start)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (also\n"
            "                          $GEMMA4_API_KEY) on every\n"
            "                          endpoint but /health (and /metrics with --metrics-public)\n"
            "  --metrics-public        /metrics answers without the API key\n"
            "  --no-special-in-content special-token text inside message content is tokenized as plain text\n"
            "                          (default: it becomes the control token, as in transformers and vLLM)\n"
            "  --model-name NAME       model id in /v1/models (default: the model folder's name)\n"
            "  --max-seqs N            sequences decoded together (default 32)\n"
            "  --ctx N                 positions per sequence (default: CUDA the model's whole window, or\n"
            "                          as much of it as one sequence gets in the pool; CPU min(model, 4096))\n"
            "  --kv-blocks N           KV cache blocks of 16 positions in the shared pool (default: CUDA as\n"
            "                          many as --gpu-memory leaves after the weights, working memory and\n"
            "                          rings, up to max-seqs * ctx / 16; CPU max-seqs * ctx / 16)\n"
            "  --gpu-memory F          fraction of the device's memory the server may take (default 0.9)\n"
            "  --max-queue N           requests waiting for admission before 503 (default 256)\n"
            "  --no-prefix-cache       prefill every prompt whole (default: a prompt that starts like an earlier\n"
            "                          prompt + reply reuses its KV; /metrics gemma4_prefix_cache_*)\n"
            "  --cache-snapshots N     sliding-window snapshots the prefix cache keeps beyond the running\n"
            "                          sequences (default 2 x max-seqs; each holds the window's KV)\n"
            "  --cache-ram MiB         host RAM for KV the prefix cache gives back: evicted blocks and\n"
            "                          snapshots are kept there and copied back on reuse (default 0: none)\n"
            "  --max-batch-tokens N    tokens per forward pass (default 512)\n"
            "  --max-body BYTES        request body limit (default 33554432)\n"
            "  --body-budget BYTES     request bodies held at once, all connections (default max(8 x max-body,\n"
            "                          512 MiB); beyond it: 503)\n"
            "  --max-tokens N          max_tokens limit per request (default 4096)\n"
            "  --max-prompt-tokens N   prompt length limit (default: the context)\n"
            "  --max-images N          images per request (default 8)\n"
            "  --max-audio N           audio clips per request (default 4)\n"
            "  --allowed-media-dir DIR image_url may name local files under DIR\n"
            "  --request-timeout S     a request must arrive whole within S seconds of the connection's\n"
            "                          start or its previous request (default 30)\n"
            "  --idle-timeout S        connections with no activity close after S seconds (default 60)\n"
            "  --max-connections N     open connections (default 1024)\n"
            "  --responses-store MIB   memory for stored /v1/responses (previous_response_id; default 64, 0: none)\n"
            "  --responses-store-entries N  stored responses kept, least recently used dropped (default 1000)\n"
            "  --shutdown-grace S      on SIGINT/SIGTERM, let requests finish for S seconds, then cancel (default 10)\n"
            "  --threads N             CPU threads (default: all cores)\n"
            "  --device cpu|cuda       (default: cuda when present)\n"
            "  --precision fast|exact  products measured sufficient (default) or float32-accurate\n"
            "  --kv-type f32|bf16|fp8  the KV cache's element type (default bf16; f32 with --precision exact)\n"
            "  --quiet                 no request log\n"
            "\n"
            "Speculative decoding (each decoding sequence drafts and verifies in the batched step; greedy replies are\n"
            "the ids of plain decoding; a request's \"speculative\": false opts out; /metrics gemma4_spec_decode_*):\n"
            "  --draft DIR|auto|synthetic  the MTP drafter (gemma4_assistant folder or pulled ORG/NAME; auto: the\n"
            "                          <model>-assistant beside the model; synthetic: random, for --synthetic)\n"
            "  --draft-max N           drafts a round at most, 1..%d (default %d; fewer while acceptance is low)\n"
            "  --draft-min-p P         stop a round's drafting at a draft the drafter gives less than P (default 0)\n"
            "  --draft-max-batch N     draft only while at most N sequences decode (default %d on the CPU, %d on CUDA)\n"
            "  --draft-force-accept N  benchmarks on random weights: verification keeps exactly N drafts a round\n"
            "                          (the tokens are then not the model's)\n",
            G4_DRAFT_MAX, CLI_DRAFT_MAX_DEFAULT, G4_ENGINE_DRAFT_MAX_BATCH, G4_ENGINE_DRAFT_MAX_BATCH_CUDA);
}

/* The pool from the memory budget (CUDA, --kv-blocks not given): every
 * full-layer block the budget leaves after the weights, working memory,
 * backend work buffers and max-seqs rings, at most max-seqs whole contexts;
 * without --ctx the context is the model's window, or what one sequence can
 * have of the pool. */
static g4_status size_pool_from_memory(const g4_model *m, const g4_memory_plan *plan, uint64_t budget,
                                       g4_engine_options *eo) {
    const int S = eo->max_seqs ? eo->max_seqs : 32, max_pos = m->config.text.max_position;
    const int64_t fit = g4_memory_plan_full_blocks(plan, budget, S);
    int n_ctx = eo->n_ctx ? (eo->n_ctx < max_pos ? eo->n_ctx : max_pos) : max_pos;
    if (!eo->n_ctx && fit * plan->block_size < n_ctx) n_ctx = (int)(fit * plan->block_size);
    const int64_t per_seq = (n_ctx + plan->block_size - 1) / plan->block_size;
    if (fit < 1 || fit < per_seq)
        return g4_fail(G4_ERR_LIMIT,
                       "the %s KV cache of one %d-position sequence needs %.2f GiB beside %.2f GiB of weights, "
                       "working memory and %d sliding rings, and --gpu-memory leaves %.2f GiB in all; lower --ctx "
                       "or --max-seqs, use --kv-type fp8, or raise --gpu-memory",
                       g4_kv_type_name(plan->kv_type), n_ctx, (double)g4_memory_plan_seq_bytes(plan, n_ctx) / (1 << 30),
                       (double)(plan->weight_bytes + plan->scratch_bytes + plan->reserve_bytes) / (1 << 30), S,
                       (double)budget / (1 << 30));
    eo->n_ctx = n_ctx;
    eo->kv_blocks = (int)(fit < (int64_t)S * per_seq ? fit : (int64_t)S * per_seq);
    return G4_OK;
}

/* The start line's memory account: what the pool holds and what it allows. */
static void print_kv_line(g4_engine *engine, const g4_memory_plan *plan, uint64_t budget) {
    g4_engine_stats es;
    g4_engine_get_stats(engine, &es);
    const int S = plan->max_seqs, n_ctx = g4_engine_n_ctx(engine);
    printf("gemma4 serve: KV cache %s: %llu B/token on full layers, %llu B/token on sliding ones (rings of %d "
           "positions, %.2f MiB per sequence); pool %.2f GiB: %d blocks of %d = %lld positions, %d sequences of "
           "%d at once",
           g4_kv_type_name(es.kv_type), (unsigned long long)es.kv_full_bytes_per_token,
           (unsigned long long)es.kv_sliding_bytes_per_token, plan->ring_tokens, (double)plan->ring_bytes / (1 << 20),
           (double)es.kv_bytes / (1 << 30), es.kv_blocks_total, es.kv_block_size,
           (long long)es.kv_blocks_total * es.kv_block_size, S,
           (int)(es.kv_blocks_total / S * es.kv_block_size < n_ctx ? es.kv_blocks_total / S * es.kv_block_size : n_ctx));
    if (budget) printf("; %.2f GiB budget (weights %.2f GiB)", (double)budget / (1 << 30),
                       (double)plan->weight_bytes / (1 << 30));
    printf("\n");
}

static int parse_count(const char *text, const char *name, long *out) {
    if (!text) return 0;
    long v = cli_parse_count(text, name);
    if (v < 0) return -1;
    *out = v;
    return 0;
}

/* A context around a synthetic model (random weights, no tokenizer). */
static g4_status open_synthetic(const char *name, const char *format, const char *device, int threads,
                                g4_context **out) {
    g4_context *c = calloc(1, sizeof *c);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status st = g4_backend_open(device, threads, &c->backend);
    if (st == G4_OK) st = g4_model_synthesize(name, format, c->backend, &c->model);
    if (st != G4_OK) {
        g4_context_close(c);
        return st;
    }
    c->generation.temperature = 1.0f;
    c->generation.top_p = 1.0f;
    c->generation.repetition_penalty = 1.0f;
    c->chat.variant = c->model->config.text.ple_dim > 0 ? G4_CHAT_SMALL : G4_CHAT_LARGE;
    c->chat.source = G4_CHAT_FROM_CONFIG;
    const g4_token_ids *tk = &c->model->config.tokens;
    for (int i = 0; i < tk->n_eos && c->n_stop < G4_MAX_STOP_IDS; i++) c->stop_ids[c->n_stop++] = tk->eos_ids[i];
    c->image_tokens = 280;
    c->audio_tokens_max = 750;
    *out = c;
    return G4_OK;
}

/* The folder's name, or the hub id as given. */
static char *default_model_name(const char *arg) {
    if (!g4_is_directory(arg)) return strdup(arg);
    size_t n = strlen(arg);
    while (n > 1 && arg[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && arg[start - 1] != '/') start--;
    char *name = malloc(n - start + 1);
    if (name) {
        memcpy(name, arg + start, n - start);
        name[n - start] = 0;
    }
    return name;
}

int cmd_serve(int argc, char **argv) {
    const char *model_path = NULL, *synthetic = NULL, *format = "bf16", *device = NULL;
    const char *v[25] = {0}, *fraction_text = NULL;
    enum { HOST, PORT, KEY, NAME, SEQS, CTX, BLOCKS, QUEUE, BATCH, BODY, MAXTOK, MAXPROMPT, IMAGES, AUDIO, MEDIA,
           REQTIME, IDLE, CONNS, GRACE, THREADS, BUDGET, STORE_MIB, STORE_N, SNAPSHOTS, CACHE_RAM };
    static const char *const names[] = {"--host",       "--port",       "--api-key",         "--model-name",
                                        "--max-seqs",   "--ctx",        "--kv-blocks",       "--max-queue",
                                        "--max-batch-tokens", "--max-body", "--max-tokens",  "--max-prompt-tokens",
                                        "--max-images", "--max-audio",  "--allowed-media-dir", "--request-timeout",
                                        "--idle-timeout", "--max-connections", "--shutdown-grace", "--threads",
                                        "--body-budget", "--responses-store", "--responses-store-entries",
                                        "--cache-snapshots", "--cache-ram"};
    int quiet = 0, metrics_public = 0, no_special = 0, no_prefix_cache = 0;
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    const char *draft_min_p = NULL, *draft_batch = NULL, *draft_force = NULL;
    g4_precision precision = G4_PRECISION_FAST;
    g4_kv_type kv_type = G4_KV_AUTO;
    for (int i = 1; i < argc; i++) {
        int r = 0;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) ||
            (r = cli_option(argc, argv, &i, "--synthetic", &synthetic)) ||
            (r = cli_option(argc, argv, &i, "--format", &format)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_option(argc, argv, &i, "--gpu-memory", &fraction_text)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_draft_option(argc, argv, &i, &draft)) ||
            (r = cli_option(argc, argv, &i, "--draft-min-p", &draft_min_p)) ||
            (r = cli_option(argc, argv, &i, "--draft-max-batch", &draft_batch)) ||
            (r = cli_option(argc, argv, &i, "--draft-force-accept", &draft_force))) {
            if (r < 0) return 2;
            continue;
        }
        for (int k = 0; k < (int)(sizeof names / sizeof names[0]) && !r; k++)
            r = cli_option(argc, argv, &i, names[k], &v[k]);
        if (r < 0) return 2;
        if (r) continue;
        if (cli_flag(argv, i, "--quiet")) {
            quiet = 1;
        } else if (cli_flag(argv, i, "--metrics-public")) {
            metrics_public = 1;
        } else if (cli_flag(argv, i, "--no-special-in-content")) {
            no_special = 1;
        } else if (cli_flag(argv, i, "--no-prefix-cache")) {
            no_prefix_cache = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 serve: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!!model_path == !!synthetic) {
        fprintf(stderr, "gemma4 serve: give either -m DIR or --synthetic NAME\n");
        usage(stderr);
        return 2;
    }
    long port = 8080, seqs = 0, ctx_len = 0, blocks = 0, queue = 0, batch = 0, body = 0, max_tok = 0, max_prompt = 0,
         images = 0, audio = 0, req_time = 0, idle = 0, conns = 0, grace = 10, threads = 0, budget = 0,
         store_mib = 64, store_n = 1000, snapshots = 0, cache_ram = 0;
    long *nums[] = {NULL, &port, NULL, NULL, &seqs, &ctx_len, &blocks, &queue, &batch, &body, &max_tok, &max_prompt,
                    &images, &audio, NULL, &req_time, &idle, &conns, &grace, &threads, &budget, &store_mib, &store_n,
                    &snapshots, &cache_ram};
    for (int k = 0; k < 25; k++)
        if (nums[k] && parse_count(v[k], names[k], nums[k])) return 2;
    double fraction = 0.9;
    if (fraction_text && (sscanf(fraction_text, "%lf", &fraction) != 1 || !(fraction > 0 && fraction <= 1))) {
        fprintf(stderr, "gemma4 serve: --gpu-memory must be a fraction in (0, 1], got '%s'\n", fraction_text);
        return 2;
    }
    if (store_mib > (1L << 20)) {
        fprintf(stderr, "gemma4 serve: --responses-store is in MiB, at most 1048576\n");
        return 2;
    }
    if (cache_ram > (1L << 30)) {
        fprintf(stderr, "gemma4 serve: --cache-ram is in MiB, at most 1073741824\n");
        return 2;
    }
    double min_p = 0;
    if (draft_min_p && (sscanf(draft_min_p, "%lf", &min_p) != 1 || !(min_p >= 0 && min_p <= 1))) {
        fprintf(stderr, "gemma4 serve: --draft-min-p must be a probability in [0, 1], got '%s'\n", draft_min_p);
        return 2;
    }
    long draft_max_batch = 0, forced_accept = -1;
    if (parse_count(draft_batch, "--draft-max-batch", &draft_max_batch)) return 2;
    if (parse_count(draft_force, "--draft-force-accept", &forced_accept)) return 2;
    if (forced_accept > draft.draft_max) {
        fprintf(stderr, "gemma4 serve: --draft-force-accept %ld exceeds --draft-max %d\n", forced_accept, draft.draft_max);
        return 2;
    }
    if (!draft.dir && (draft_min_p || draft_batch || draft_force)) {
        fprintf(stderr, "gemma4 serve: --draft-min-p, --draft-max-batch and --draft-force-accept need --draft\n");
        return 2;
    }
    if (port > 65535) {
        fprintf(stderr, "gemma4 serve: --port must be in 0..65535\n");
        return 2;
    }
    const char *api_key = v[KEY] ? v[KEY] : getenv("GEMMA4_API_KEY");
    if (api_key && !api_key[0]) api_key = NULL;
    if (!quiet) g4_log_set_level(G4_LOG_INFO);

    /* SIGINT/SIGTERM are taken by sigwait below; every thread inherits the mask */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Request bodies and their parsed copies are large and short-lived, and
     * each connection's thread has its own malloc arena: with glibc's
     * default (a threshold that rises after each large free) they end up
     * inside the arenas and stay resident. A fixed threshold keeps every
     * block over 1 MiB in its own mapping, returned to the system on free,
     * so peak RSS follows the requests in flight, not their history. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    /* a socket and an eventfd per connection: allow as many as the hard limit does */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }

    g4_context *ctx = NULL;
    g4_context_options co = {.device = device, .threads = (int)threads, .precision = precision};
    g4_status st = synthetic ? open_synthetic(synthetic, format, device, (int)threads, &ctx)
                             : g4_context_open(model_path, &co, &ctx);
    if (st != G4_OK) {
        cli_report_error("serve", st);
        return 1;
    }
    ctx->backend->ops->set_precision(ctx->backend, precision);
    char *name = v[NAME] ? strdup(v[NAME]) : synthetic ? NULL : default_model_name(model_path);
    if (!name && synthetic) {
        name = malloc(strlen(synthetic) + 16);
        if (name) sprintf(name, "synthetic-%s", synthetic);
    }
    g4_engine_options eo = {.max_seqs = (int)seqs, .n_ctx = (int)ctx_len, .kv_blocks = (int)blocks,
                            .max_batch_tokens = (int)batch, .max_queue = (int)queue, .threads = (int)threads,
                            .no_prefix_cache = no_prefix_cache, .cache_snapshots = (int)snapshots,
                            .cache_ram_bytes = (uint64_t)cache_ram << 20,
                            .kv_type = g4_kv_type_resolve(kv_type, precision, ctx->model)};
    g4_assistant *drafter = NULL;
    if (draft.dir && cli_open_draft_any(&draft, synthetic, ctx->model, &drafter)) {
        g4_context_close(ctx);
        free(name);
        return 1;
    }
    eo.drafter = drafter;
    eo.draft_max = draft.draft_max;
    eo.draft_min_p = (float)min_p;
    eo.draft_max_batch = (int)draft_max_batch;
    eo.draft_force = forced_accept >= 0;
    eo.draft_forced_accept = (int)forced_accept;
    g4_memory_plan plan;
    g4_memory_plan_make(ctx->model, eo.kv_type, 16, eo.max_batch_tokens, eo.max_seqs ? eo.max_seqs : 32, &plan);
    uint64_t mem_budget = g4_memory_budget(&plan, ctx->backend, fraction);
    if (mem_budget && !no_prefix_cache) {
        /* the prefix cache's window snapshots come out of the same budget: by
         * default 2 x max-seqs of them, but at most a quarter of what the
         * weights and working memory leave (one 31B bf16 window is ~0.8 GiB) */
        const uint64_t snap = plan.snapshot_bytes;
        const uint64_t fixed = plan.weight_bytes + plan.scratch_bytes + plan.reserve_bytes;
        if (snap && !snapshots) {
            const uint64_t room = mem_budget > fixed ? (mem_budget - fixed) / 4 / snap : 0;
            const int S = eo.max_seqs ? eo.max_seqs : 32;
            eo.cache_snapshots = room < (uint64_t)(2 * S) ? (room > 0 ? (int)room : 1) : 2 * S;
        }
        const uint64_t snap_bytes = snap * (uint64_t)(eo.cache_snapshots ? eo.cache_snapshots : 2 * (eo.max_seqs ? eo.max_seqs : 32));
        mem_budget = mem_budget > snap_bytes ? mem_budget - snap_bytes : 0;
    }
    if (g4_backend_is_cuda(ctx->backend) && !blocks) st = size_pool_from_memory(ctx->model, &plan, mem_budget, &eo);
    g4_engine *engine = NULL;
    if (st == G4_OK) st = g4_engine_create(ctx->model, &eo, &engine);
    if (st == G4_OK) st = g4_engine_start(engine);
    g4_server *srv = NULL;
    g4_server_options so = {.host = v[HOST],
                            .port = (int)port,
                            .api_key = api_key,
                            .model_name = name,
                            .max_body = (size_t)body,
                            .body_budget = (size_t)budget,
                            .max_tokens = (int)max_tok,
                            .max_prompt_tokens = (int)max_prompt,
                            .max_images = (int)images,
                            .max_audio = (int)audio,
                            .allowed_media_dir = v[MEDIA],
                            .request_timeout_s = (int)req_time,
                            .idle_timeout_s = (int)idle,
                            .max_connections = (int)conns,
                            .threads = (int)threads,
                            .metrics_public = metrics_public,
                            .no_special_in_content = no_special,
                            .responses_store_entries = store_mib == 0 || store_n == 0 ? -1 : (int)store_n,
                            .responses_store_bytes = (size_t)store_mib << 20};
    if (st == G4_OK) st = g4_server_start(ctx, engine, &so, &srv);
    if (st != G4_OK) {
        cli_report_error("serve", st);
        if (engine) g4_engine_stop(engine, 1);
        g4_engine_destroy(engine);
        g4_assistant_release(drafter);
        g4_context_close(ctx);
        free(name);
        return 1;
    }
    printf("gemma4 serve: listening on http://%s:%d (model %s, context %d, %s)\n", v[HOST] ? v[HOST] : "127.0.0.1",
           g4_server_port(srv), name, g4_engine_n_ctx(engine), ctx->tokenizer ? "tokenizer" : "no tokenizer: ids only");
    print_kv_line(engine, &plan, mem_budget);
    if (drafter)
        printf("gemma4 serve: speculative decoding with %s: up to %d drafts a round while at most %d sequences decode%s\n",
               draft.dir, draft.draft_max, g4_engine_draft_max_batch(engine),
               forced_accept >= 0 ? " (forced acceptance: benchmark tokens, not the model's)" : "");
    fflush(stdout);

    int sig = 0;
    while (sigwait(&stop_signals, &sig) != 0) {
    }
    fprintf(stderr, "gemma4 serve: %s: finishing %d request(s) (up to %ld s; signal again to cancel them now)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", g4_server_in_flight(srv), grace);
    g4_server_drain(srv);
    double deadline = g4_now_seconds() + (double)grace;
    while (g4_server_in_flight(srv) > 0 && g4_now_seconds() < deadline) {
        struct timespec wait = {0, 50 * 1000000L};
        if (sigtimedwait(&stop_signals, NULL, &wait) >= 0) break; /* asked again: stop now */
    }
    g4_server_stop(srv);
    g4_engine_stop(engine, 1);
    g4_engine_destroy(engine);
    g4_assistant_release(drafter);
    g4_context_close(ctx);
    free(name);
    fprintf(stderr, "gemma4 serve: stopped\n");
    return 0;
}
