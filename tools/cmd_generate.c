/* gemma4 generate: greedy continuation of a token sequence, printed as one
 * line of comma-separated ids. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_common.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 generate -m DIR --ids 2,17,33,... -n N [--ignore-eos] [--threads N]\n"
               "                       [--device cpu|cuda|cuda:N] [--precision exact|fast]\n");
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *ids_text = NULL, *count_text = "16", *threads_text = NULL, *device = NULL;
    int ignore_eos = 0;
    g4_precision precision = G4_PRECISION_EXACT;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--ids", &ids_text)) ||
            (r = cli_option(argc, argv, &i, "-n", &count_text)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--ignore-eos")) {
            ignore_eos = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 generate: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path || !ids_text) {
        usage(stderr);
        return 2;
    }
    long n_new = cli_parse_count(count_text, "-n");
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    if (n_new < 0 || threads < 0) return 2;
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_text, &ids, &n) != 0) return 2;
    if (n == 0) {
        fprintf(stderr, "gemma4 generate: empty prompt: --ids lists no tokens\n");
        free(ids);
        return 2;
    }
    g4_backend *be;
    g4_model *model;
    if (cli_open_model_on(model_path, device, (int)threads, &be, &model) != 0) {
        free(ids);
        return 1;
    }
    be->ops->set_precision(be, precision);
    g4_session_options opt = {.n_ctx = n + (int)n_new + 1};
    g4_session *s = NULL;
    int32_t *out = malloc((size_t)(n_new + 1) * sizeof *out);
    int n_out = 0, rc = 1;
    /* the argmax (first of equal logits) comes back alone, not the row */
    int32_t next = 0;
    float top_value;
    double lse;
    g4_status st = out ? g4_session_create(model, &opt, &s) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && n_new > 0) st = g4_session_eval_top(s, ids, n, NULL, 1, &next, &top_value, &lse);
    while (st == G4_OK && n_out < n_new) {
        if (isnan(lse)) {
            st = g4_fail(G4_ERR_INTERNAL, "the logits hold NaN");
            break;
        }
        out[n_out++] = next;
        int is_eos = 0;
        for (int k = 0; k < model->config.tokens.n_eos; k++) is_eos |= next == model->config.tokens.eos_ids[k];
        if ((is_eos && !ignore_eos) || n_out == n_new) break;
        st = g4_session_eval_top(s, &next, 1, NULL, 1, &next, &top_value, &lse);
    }
    if (st == G4_OK) {
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out[i]);
        printf("\n");
        rc = 0;
    } else {
        cli_report_error("generate", st);
    }
    g4_session_destroy(s);
    free(out);
    free(ids);
    cli_close_model(be, model);
    return rc;
}
