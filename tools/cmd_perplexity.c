/* gemma4 perplexity: how well a model predicts a text, in the manner of
 * llama.cpp's llama-perplexity, and how far one run's distributions are from a
 * saved baseline's (KL divergence, top-1 agreement).
 *
 * The text is tokenised without special tokens into t[0..T). Window k covers
 * t[b, e) with b = k * stride and e = min(b + ctx - 1, T); the model reads
 * <bos> t[b..e) and scores every token of the window that no earlier window
 * scored (from max(b, previous e) to e), each predicted from the positions
 * before it. With the default stride ctx - 1 the windows are disjoint; a
 * smaller stride gives every scored token at least ctx - 1 - stride tokens of
 * context (after the first window). tools/train and the tests compute
 * transformers' perplexity the same way. On the public API alone (gemma4.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"

typedef struct {
    int ctx, stride;
    int32_t *scored_ids; /* [n] the token each scored row predicts */
    float *logits;       /* [n][vocab] when saved or compared, else NULL */
    double *nll;         /* [n] */
    int n, cap, vocab, windows;
} ppl_run;

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 perplexity -m MODEL -f TEXT [--ctx 512] [--stride N] [--save-logits OUT.safetensors]\n"
               "                         [--kl-divergence BASE.safetensors] [--device cpu|cuda] [--threads N]\n"
               "                         [--precision fast|exact] [--kv-type f32|bf16|fp8] [--json]\n"
               "  --ctx N         positions per window, <bos> included (default 512)\n"
               "  --stride N      tokens between window starts (default ctx - 1: disjoint windows)\n"
               "  --save-logits F the float32 logits of every scored token, as a baseline for --kl-divergence\n"
               "  --kl-divergence F  compare with a baseline saved from the same text, ctx and stride: mean KL\n"
               "                  divergence (baseline || this run), top-1 agreement and the worst token\n");
    fputs(cli_precision_help, f);
    fputs(cli_kv_type_help, f);
}

/* log(sum exp(row)) in double, and the row's argmax: log p(v) = row[v] - that. */
static double log_sum_exp(const float *row, int vocab, int *argmax) {
    float mx = row[0];
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (row[v] > mx) mx = row[v], best = v;
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
    if (argmax) *argmax = best;
    return mx + log(sum);
}

static g4_status grow(ppl_run *r, int need, int keep_logits) {
    if (need <= r->cap) return G4_OK;
    int cap = r->cap ? r->cap : 1024;
    while (cap < need) cap *= 2;
    int32_t *ids = realloc(r->scored_ids, (size_t)cap * sizeof *ids);
    if (ids) r->scored_ids = ids;
    double *nll = realloc(r->nll, (size_t)cap * sizeof *nll);
    if (nll) r->nll = nll;
    float *lg = keep_logits ? realloc(r->logits, (size_t)cap * r->vocab * sizeof *lg) : NULL;
    if (lg) r->logits = lg;
    if (!ids || !nll || (keep_logits && !lg))
        return cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory keeping %d rows of %d logits", cap, r->vocab);
    r->cap = cap;
    return G4_OK;
}

/* Evaluates every window and records each scored token's negative log-likelihood. */
static g4_status run_windows(g4_handle *h, const int32_t *t, int n_t, int keep_logits, ppl_run *r) {
    g4_model_info info;
    g4_get_model_info(h, &info);
    const int V = r->vocab, bos = info.bos_id;
    g4_sequence_options so = {.n_ctx = r->ctx};
    g4_sequence *s = NULL;
    int32_t *input = malloc((size_t)r->ctx * sizeof *input);
    float *logits = malloc((size_t)r->ctx * V * sizeof *logits);
    g4_status st = input && logits ? g4_sequence_open(h, &so, &s) : cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    int prev_end = 0;
    for (int b = 0; st == G4_OK && prev_end < n_t; b += r->stride) {
        const int e = b + r->ctx - 1 < n_t ? b + r->ctx - 1 : n_t;
        input[0] = bos;
        memcpy(input + 1, t + b, (size_t)(e - b) * sizeof *input);
        st = g4_sequence_truncate(s, 0);
        if (st == G4_OK) st = g4_sequence_append(s, input, e - b + 1, G4_ROWS_ALL, logits);
        const int first = b > prev_end ? b : prev_end;
        if (st == G4_OK) st = grow(r, r->n + (e - first), keep_logits);
        for (int j = first; st == G4_OK && j < e; j++) {
            const float *row = logits + (size_t)(j - b) * V; /* row j - b reads input[0..j-b], predicts t[j] */
            r->scored_ids[r->n] = t[j];
            r->nll[r->n] = log_sum_exp(row, V, NULL) - row[t[j]];
            if (keep_logits) memcpy(r->logits + (size_t)r->n * V, row, (size_t)V * sizeof *row);
            r->n++;
        }
        prev_end = e;
        r->windows++;
    }
    g4_sequence_close(s);
    free(input);
    free(logits);
    return st;
}

static g4_status save_logits(const char *path, const ppl_run *r) {
    int32_t setup[2] = {r->ctx, r->stride};
    cli_tensor items[3] = {
        {.name = "logits", .dtype = CLI_F32, .ndim = 2, .shape = {r->n, r->vocab}, .data = r->logits},
        {.name = "tokens", .dtype = CLI_I32, .ndim = 1, .shape = {r->n}, .data = r->scored_ids},
        {.name = "ctx_stride", .dtype = CLI_I32, .ndim = 1, .shape = {2}, .data = setup}};
    return cli_write_tensors(path, items, 3);
}

typedef struct {
    double kl_mean, kl_err, kl_max, top1;
    int worst_index, worst_token;
} ppl_kl;

/* KL(base || run) per scored token, from the baseline file's raw logits. */
static g4_status compare(const char *path, const ppl_run *r, ppl_kl *out) {
    cli_tensor_file *set = NULL;
    g4_status st = cli_open_tensors(path, &set);
    if (st != G4_OK) return st;
    cli_tensor lg_t, tok_t, cs_t;
    const cli_tensor *lg = cli_find_tensor(set, "logits", &lg_t) ? &lg_t : NULL;
    const cli_tensor *tok = cli_find_tensor(set, "tokens", &tok_t) ? &tok_t : NULL;
    const cli_tensor *cs = cli_find_tensor(set, "ctx_stride", &cs_t) ? &cs_t : NULL;
    if (!lg || !tok || !cs || lg->dtype != CLI_F32 || tok->dtype != CLI_I32 || lg->ndim != 2 || cs->nbytes != 8)
        st = cli_fail(G4_ERR_FORMAT, "%s is not a `gemma4 perplexity --save-logits` file", path);
    else if (lg->shape[0] != r->n || lg->shape[1] != r->vocab || tok->shape[0] != r->n)
        st = cli_fail(G4_ERR_INVALID_ARGUMENT, "%s holds %lld rows of %lld logits, this run %d of %d", path,
                      (long long)lg->shape[0], (long long)lg->shape[1], r->n, r->vocab);
    else if (memcmp(tok->data, r->scored_ids, (size_t)r->n * 4) != 0)
        st = cli_fail(G4_ERR_INVALID_ARGUMENT, "%s was saved from another text (its tokens differ)", path);
    else if (((const int32_t *)cs->data)[0] != r->ctx || ((const int32_t *)cs->data)[1] != r->stride)
        st = cli_fail(G4_ERR_INVALID_ARGUMENT, "%s was saved with --ctx %d --stride %d; this run has %d and %d", path,
                      ((const int32_t *)cs->data)[0], ((const int32_t *)cs->data)[1], r->ctx, r->stride);
    if (st != G4_OK) {
        cli_close_tensors(set);
        return st;
    }
    const int V = r->vocab;
    const float *base = (const float *)lg->data;
    double sum = 0, sum2 = 0;
    int agree = 0;
    *out = (ppl_kl){.worst_index = -1};
    for (int i = 0; i < r->n; i++) {
        const float *p_row = base + (size_t)i * V, *q_row = r->logits + (size_t)i * V;
        int top_p, top_q;
        const double lse_p = log_sum_exp(p_row, V, &top_p), lse_q = log_sum_exp(q_row, V, &top_q);
        double kl = 0;
        for (int v = 0; v < V; v++) {
            const double lp = p_row[v] - lse_p, lq = q_row[v] - lse_q;
            kl += exp(lp) * (lp - lq);
        }
        if (kl < 0) kl = 0; /* rounding */
        sum += kl;
        sum2 += kl * kl;
        agree += top_p == top_q;
        if (kl > out->kl_max || out->worst_index < 0) out->kl_max = kl, out->worst_index = i, out->worst_token = r->scored_ids[i];
    }
    const double n = r->n;
    out->kl_mean = sum / n;
    out->kl_err = n > 1 ? sqrt(fmax(0, sum2 / n - out->kl_mean * out->kl_mean) / (n - 1)) : 0;
    out->top1 = agree / n;
    cli_close_tensors(set);
    return st;
}

static void report(const ppl_run *r, const ppl_kl *kl, int json) {
    double sum = 0, sum2 = 0;
    for (int i = 0; i < r->n; i++) sum += r->nll[i], sum2 += r->nll[i] * r->nll[i];
    const double n = r->n, mean = sum / n;
    const double err = n > 1 ? sqrt(fmax(0, sum2 / n - mean * mean) / (n - 1)) : 0;
    const double ppl = exp(mean);
    if (json) {
        printf("{\"tokens\": %d, \"windows\": %d, \"ctx\": %d, \"stride\": %d, \"mean_nll\": %.9g, \"ppl\": %.9g, "
               "\"ppl_err\": %.9g",
               r->n, r->windows, r->ctx, r->stride, mean, ppl, ppl * err);
        if (kl)
            printf(", \"kld_mean\": %.9g, \"kld_err\": %.9g, \"kld_max\": %.9g, \"top1_agreement\": %.9g, "
                   "\"worst_index\": %d, \"worst_token\": %d",
                   kl->kl_mean, kl->kl_err, kl->kl_max, kl->top1, kl->worst_index, kl->worst_token);
        printf("}\n");
        return;
    }
    printf("perplexity: %.4f +/- %.4f over %d tokens (%d windows, ctx %d, stride %d; mean NLL %.6f)\n", ppl, ppl * err,
           r->n, r->windows, r->ctx, r->stride, mean);
    if (kl)
        printf("KL divergence from the baseline: mean %.6g +/- %.2g, max %.6g (scored token %d, id %d); "
               "top-1 agreement %.3f%%\n",
               kl->kl_mean, kl->kl_err, kl->kl_max, kl->worst_index, kl->worst_token, 100 * kl->top1);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL, *ctx_text = NULL, *stride_text = NULL, *save_path = NULL,
               *base_path = NULL, *device = NULL, *threads_text = NULL;
    const char *kv_type = NULL;
    int json = 0, exact = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "-f", &text_path)) ||
            (r = cli_option(argc, argv, &i, "--ctx", &ctx_text)) ||
            (r = cli_option(argc, argv, &i, "--stride", &stride_text)) ||
            (r = cli_option(argc, argv, &i, "--save-logits", &save_path)) ||
            (r = cli_option(argc, argv, &i, "--kl-divergence", &base_path)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_exact_option(argc, argv, &i, &exact)) || (r = cli_kv_type_name_option(argc, argv, &i, &kv_type))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--json")) {
            json = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 perplexity: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path || !text_path) {
        usage(stderr);
        return 2;
    }
    const long ctx = ctx_text ? cli_parse_count(ctx_text, "--ctx") : 512;
    const long stride = stride_text ? cli_parse_count(stride_text, "--stride") : ctx - 1;
    const long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    if (ctx < 0 || stride < 0 || threads < 0) return 2;
    if (ctx < 2 || stride < 1 || stride > ctx - 1) {
        fprintf(stderr, "gemma4 perplexity: need --ctx >= 2 and 1 <= --stride <= ctx - 1 (got %ld and %ld)\n", ctx,
                stride);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    if (cli_read_file(text_path, (size_t)1 << 30, &text, &len) != 0) return 1;
    g4_handle *h = NULL;
    g4_open_options oo = {.device = device, .threads = (int)threads, .exact = exact, .kv_type = kv_type,
                          .sequences_only = 1};
    g4_status st = g4_open(model_path, &oo, &h);
    const g4_tokenizer *tok = st == G4_OK ? g4_model_tokenizer(h) : NULL;
    if (st == G4_OK && !tok)
        st = cli_fail(G4_ERR_NOT_FOUND, "%s has no tokenizer.json (get the full model with `gemma4 pull ORG/NAME`)",
                      model_path);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (st == G4_OK) st = g4_tokenize(tok, text, len, 0, &ids, &n_ids);
    if (st == G4_OK && n_ids < 1) st = cli_fail(G4_ERR_INVALID_ARGUMENT, "%s holds no tokens", text_path);
    if (st == G4_OK && n_ids > (1u << 30)) st = cli_fail(G4_ERR_LIMIT, "%s holds over 2^30 tokens", text_path);
    g4_model_info info = {0};
    if (st == G4_OK) g4_get_model_info(h, &info);
    if (st == G4_OK && ctx > info.max_position)
        st = cli_fail(G4_ERR_INVALID_ARGUMENT, "--ctx %ld is past the model's %d positions", ctx, info.max_position);
    ppl_run run = {.ctx = (int)ctx, .stride = (int)stride, .vocab = info.vocab_size};
    const int keep = save_path || base_path;
    if (st == G4_OK) st = run_windows(h, ids, (int)n_ids, keep, &run);
    if (st == G4_OK && save_path) st = save_logits(save_path, &run);
    ppl_kl kl;
    if (st == G4_OK && base_path) st = compare(base_path, &run, &kl);
    if (st == G4_OK) report(&run, base_path ? &kl : NULL, json);
    else cli_report_error("perplexity", st);
    free(run.scored_ids);
    free(run.nll);
    free(run.logits);
    g4_free(ids);
    free(text);
    g4_close(h);
    return st == G4_OK ? 0 : 1;
}
