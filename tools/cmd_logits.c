/* gemma4 logits: logits for every position of a token sequence, written as
 * float32 tensor "logits" [T, V] to a safetensors file. With --decode the
 * tokens go through the KV cache one at a time instead of one prefill. With
 * --hidden the residual stream at named points is written too
 * ("hidden.embed", "hidden.layer0", "hidden.last_prenorm", "hidden.final_norm").
 * On the public API alone (gemma4.h: a g4_sequence on a sequences_only handle). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"

#define N_HIDDEN 4
static const char *const hidden_names[N_HIDDEN] = {"embed", "layer0", "last_prenorm", "final_norm"};

typedef struct {
    float *rows[N_HIDDEN]; /* accumulated [T][d] per name */
    int n_rows[N_HIDDEN];
    int cap;
} hidden_capture;

/* g4_hidden_sink: where the next rows of a capture point go (NULL: past the buffer, or not kept) */
static float *capture_hidden(void *user, const char *name, int rows, int dim) {
    hidden_capture *hc = user;
    for (int k = 0; k < N_HIDDEN; k++) {
        if (strcmp(name, hidden_names[k]) != 0) continue;
        if (hc->n_rows[k] + rows > hc->cap) return NULL;
        float *dest = hc->rows[k] + (size_t)hc->n_rows[k] * dim;
        hc->n_rows[k] += rows;
        return dest;
    }
    return NULL;
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
               *device = NULL, *kv_type = NULL;
    int decode = 0, hidden = 0, exact = 1;
    cli_media_files media = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--ids", &ids_text)) ||
            (r = cli_option(argc, argv, &i, "-o", &out_path)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--vision-mask", &mask_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) || (r = cli_exact_option(argc, argv, &i, &exact)) ||
            (r = cli_kv_type_name_option(argc, argv, &i, &kv_type)) ||
            (r = cli_media_files_option(argc, argv, &i, &media))) {
            if (r < 0) {
                cli_media_files_free(&media);
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
        cli_media_files_free(&media);
        return 2;
    }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_text, &ids, &n) != 0) {
        cli_media_files_free(&media);
        return 2;
    }
    if (n == 0) {
        fprintf(stderr, "gemma4 logits: empty prompt: --ids lists no tokens\n");
        free(ids);
        cli_media_files_free(&media);
        return 2;
    }
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    if (threads < 0 || (mask_text && cli_check_vision_mask(mask_text) != 0)) {
        free(ids);
        cli_media_files_free(&media);
        return 2;
    }
    g4_handle *h;
    g4_open_options oo = {.device = device, .threads = (int)threads, .exact = exact, .kv_type = kv_type,
                          .sequences_only = 1};
    if (g4_open(model_path, &oo, &h) != G4_OK) {
        fprintf(stderr, "gemma4 logits: cannot load model: %s\n", g4_error_message());
        free(ids);
        cli_media_files_free(&media);
        return 1;
    }
    g4_model_info info;
    g4_get_model_info(h, &info);
    const int V = info.vocab_size, d = info.hidden_size;
    g4_sequence_options so = {.n_ctx = n, .vision_mask = mask_text};
    g4_sequence *s = NULL;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    hidden_capture hc = {.cap = n};
    int rc = 1;
    g4_status st = logits ? g4_sequence_open(h, &so, &s) : cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && hidden) {
        for (int k = 0; k < N_HIDDEN; k++) {
            hc.rows[k] = malloc((size_t)n * d * sizeof(float));
            if (!hc.rows[k]) st = cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        g4_sequence_set_hidden_sink(s, capture_hidden, &hc);
    }
    if (st == G4_OK) {
        if (decode && media.n > 0) {
            st = cli_fail(G4_ERR_INVALID_ARGUMENT, "--decode works on text ids only (images are prefilled whole)");
        } else if (decode) {
            for (int t = 0; t < n && st == G4_OK; t++)
                st = g4_sequence_append(s, ids + t, 1, G4_ROWS_LAST, logits + (size_t)t * V);
        } else {
            st = g4_sequence_append_media(s, ids, n, media.files, media.n, G4_ROWS_ALL, logits);
        }
    }
    if (st == G4_OK) {
        cli_tensor items[1 + N_HIDDEN] = {{.name = "logits", .ndim = 2, .shape = {n, V}, .data = logits}};
        int n_items = 1;
        char names[N_HIDDEN][32];
        for (int k = 0; hidden && k < N_HIDDEN; k++) {
            snprintf(names[k], sizeof names[k], "hidden.%s", hidden_names[k]);
            items[n_items++] = (cli_tensor){.name = names[k], .ndim = 2, .shape = {hc.n_rows[k], d}, .data = hc.rows[k]};
        }
        st = cli_write_tensors(out_path, items, n_items);
    }
    if (st == G4_OK)
        rc = 0;
    else
        cli_report_error("logits", st);
    for (int k = 0; k < N_HIDDEN; k++) free(hc.rows[k]);
    g4_sequence_close(s);
    free(logits);
    free(ids);
    g4_close(h);
    cli_media_files_free(&media);
    return rc;
}
