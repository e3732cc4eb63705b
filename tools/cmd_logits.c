/* gemma4 logits: logits for every position of a token sequence, written as
 * float32 tensor "logits" [T, V] to a safetensors file. With --decode the
 * tokens go through the KV cache one at a time instead of one prefill. With
 * --hidden the residual stream at named points is written too
 * ("hidden.embed", "hidden.layer0", "hidden.last_prenorm", "hidden.final_norm"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_media.h"
#include "io/safetensors.h"
#include "runtime/context.h"
#include "runtime/prompt.h"
#include "runtime/session.h"

#define N_HIDDEN 4
static const char *const hidden_names[N_HIDDEN] = {"embed", "layer0", "last_prenorm", "final_norm"};

typedef struct {
    g4_backend *be;
    float *rows[N_HIDDEN]; /* accumulated [T][d] per name */
    int n_rows[N_HIDDEN];
    int dim, cap;
} hidden_capture;

static void capture_hidden(void *ctx, const char *name, const float *data, int rows, int dim) {
    hidden_capture *hc = ctx;
    for (int k = 0; k < N_HIDDEN; k++) {
        if (strcmp(name, hidden_names[k]) != 0) continue;
        if (hc->n_rows[k] + rows > hc->cap) return;
        hc->dim = dim;
        hc->be->ops->to_host(hc->be, hc->rows[k] + (size_t)hc->n_rows[k] * dim, data, (size_t)rows * dim * 4);
        hc->n_rows[k] += rows;
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 logits -m DIR --ids 2,17,33,... -o OUT.safetensors [--decode] [--hidden]\n"
               "                     [--image FILE]... [--audio FILE]... [--image-tokens N] [--threads N]\n"
               "                     [--vision-mask default|all-layers|causal] [--device cpu|cuda|cuda:N]\n"
               "                     [--precision exact|fast] [--kv-type f32|bf16|fp8]\n"
               "  Images and audio replace the placeholder ids of --ids (the processor's expanded\n"
               "  input_ids: <|image|> x soft tokens inside <|image>...<image|>) in order.\n");
}

int cmd_logits(int argc, char **argv) {
    const char *model_path = NULL, *ids_text = NULL, *out_path = NULL, *threads_text = NULL, *mask_text = NULL,
               *device = NULL;
    int decode = 0, hidden = 0;
    g4_precision precision = G4_PRECISION_EXACT;
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_media media = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--ids", &ids_text)) ||
            (r = cli_option(argc, argv, &i, "-o", &out_path)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--vision-mask", &mask_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_media_option(argc, argv, &i, &media))) {
            if (r < 0) {
                cli_media_free(&media);
                return 2;
            }
        } else if (cli_flag(argv, i, "--decode")) {
            decode = 1;
        } else if (cli_flag(argv, i, "--hidden")) {
            hidden = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 logits: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path || !ids_text || !out_path) {
        usage(stderr);
        cli_media_free(&media);
        return 2;
    }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_text, &ids, &n) != 0) {
        cli_media_free(&media);
        return 2;
    }
    if (n == 0) {
        fprintf(stderr, "gemma4 logits: empty prompt: --ids lists no tokens\n");
        free(ids);
        cli_media_free(&media);
        return 2;
    }
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    if (threads < 0) return 2;
    g4_context *ctx;
    g4_context_options co = {.device = device, .threads = (int)threads, .precision = precision};
    if (g4_context_open(model_path, &co, &ctx) != G4_OK) {
        fprintf(stderr, "gemma4 logits: cannot load model: %s\n", g4_error_message());
        free(ids);
        cli_media_free(&media);
        return 1;
    }
    g4_backend *be = ctx->backend;
    g4_model *model = ctx->model;
    g4_prompt prompt = {0};
    g4_soft_tokens soft = {0};
    if (media.n > 0) {
        g4_status pst = g4_prompt_from_ids(ctx, ids, n, media.items, media.n, &prompt);
        if (pst != G4_OK) {
            cli_report_error("logits", pst);
            free(ids);
            cli_media_free(&media);
            g4_context_close(ctx);
            return 1;
        }
        soft = (g4_soft_tokens){prompt.media.n, prompt.media.rows, prompt.media.embeds};
    }
    const int V = model->config.text.vocab_size, d = model->config.text.hidden_size;
    g4_session_options opt = {.n_ctx = n, .kv_type = g4_kv_type_resolve(kv_type, precision, model)};
    if (mask_text && cli_parse_vision_mask(mask_text, &opt.vision_mask) != 0) {
        free(ids);
        cli_media_free(&media);
        g4_context_close(ctx);
        return 2;
    }
    g4_session *s = NULL;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    hidden_capture hc = {.be = be, .cap = n};
    int rc = 1;
    g4_status st = logits ? g4_session_create(model, &opt, &s) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && hidden) {
        for (int k = 0; k < N_HIDDEN; k++) {
            hc.rows[k] = malloc((size_t)n * d * sizeof(float));
            if (!hc.rows[k]) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        s->hook = capture_hidden;
        s->hook_ctx = &hc;
    }
    if (st == G4_OK) {
        if (decode && soft.n > 0) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "--decode works on text ids only (images are prefilled whole)");
        } else if (decode) {
            for (int t = 0; t < n && st == G4_OK; t++)
                st = g4_session_eval(s, ids + t, 1, NULL, G4_LOGITS_LAST, logits + (size_t)t * V);
        } else {
            st = g4_session_eval(s, ids, n, soft.n ? &soft : NULL, G4_LOGITS_ALL, logits);
        }
    }
    if (st == G4_OK) {
        g4_st_write_item items[1 + N_HIDDEN] = {{.name = "logits", .dtype = G4_DTYPE_F32, .ndim = 2,
                                                 .shape = {n, V}, .data = logits}};
        size_t n_items = 1;
        char names[N_HIDDEN][32];
        for (int k = 0; hidden && k < N_HIDDEN; k++) {
            snprintf(names[k], sizeof names[k], "hidden.%s", hidden_names[k]);
            items[n_items++] = (g4_st_write_item){.name = names[k], .dtype = G4_DTYPE_F32, .ndim = 2,
                                                  .shape = {hc.n_rows[k], d}, .data = hc.rows[k]};
        }
        st = g4_st_write(out_path, items, n_items);
    }
    if (st == G4_OK)
        rc = 0;
    else
        cli_report_error("logits", st);
    for (int k = 0; k < N_HIDDEN; k++) free(hc.rows[k]);
    g4_session_destroy(s);
    free(logits);
    free(ids);
    g4_prompt_free(ctx, &prompt);
    g4_context_close(ctx);
    cli_media_free(&media);
    return rc;
}
