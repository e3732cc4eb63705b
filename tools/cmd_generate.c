/* gemma4 generate: greedy continuation of a token sequence, printed as one
 * line of comma-separated ids.
 *
 * On the public API alone (gemma4.h through cli_args.h): g4_open, g4_input_ids,
 * g4_sequence_generate with greedy parameters; the drafter is g4_open's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 generate -m DIR --ids 2,17,33,... -n N [--ignore-eos] [--threads N]\n"
               "                       [--device cpu|cuda|cuda:N] [--precision exact|fast]\n"
               "                       [--kv-type f32|bf16|fp8]\n"
               "                       [--draft DIR [--draft-max N]]\n");
    cli_draft_usage(f);
}

/* The ids as they come; the reply ends after config.json's eos (reported) unless --ignore-eos. */
typedef struct {
    int32_t *out;
    int n_out;
    const g4_model_info *info;
    int ignore_eos;
} collected;

static int collect(void *user, int32_t tok) {
    collected *c = user;
    c->out[c->n_out++] = tok;
    for (int k = 0; k < c->info->n_eos && !c->ignore_eos; k++)
        if (tok == c->info->eos_ids[k]) return 1;
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *ids_text = NULL, *count_text = "16", *threads_text = NULL, *device = NULL,
               *kv_type = NULL;
    int ignore_eos = 0, exact = 1;
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--ids", &ids_text)) ||
            (r = cli_option(argc, argv, &i, "-n", &count_text)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) || (r = cli_exact_option(argc, argv, &i, &exact)) ||
            (r = cli_kv_type_name_option(argc, argv, &i, &kv_type)) || (r = cli_draft_option(argc, argv, &i, &draft))) {
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
    g4_handle *h;
    g4_open_options oo = {.device = device, .threads = (int)threads, .exact = exact, .kv_type = kv_type,
                          .sequences_only = 1, .draft = draft.dir, .draft_max = draft.draft_max};
    if (g4_open(model_path, &oo, &h) != G4_OK) {
        fprintf(stderr, "gemma4: cannot load model: %s\n", g4_error_message());
        free(ids);
        return 1;
    }
    cli_report_auto_drafter(&draft, h);
    g4_model_info info;
    g4_get_model_info(h, &info);
    g4_sequence_options so = {.n_ctx = n + (int)n_new + 1};
    g4_sequence *s = NULL;
    g4_input *in = NULL;
    collected got = {.out = malloc((size_t)(n_new + 1) * sizeof *got.out), .info = &info, .ignore_eos = ignore_eos};
    /* greedy (the first of equal logits), no processors; no stop ids: the eos ends it in collect(), reported */
    static const int32_t no_stop_ids[1] = {0};
    g4_generate_options go = {.stop_ids = no_stop_ids, .n_stop = 0};
    g4_params_default(&go.params);
    go.params.max_tokens = (int)n_new;
    g4_generate_result res;
    int rc = 1;
    g4_status st = got.out ? g4_sequence_open(h, &so, &s) : cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && n_new > 0) st = g4_input_ids(h, ids, n, NULL, 0, &in);
    if (st == G4_OK && n_new > 0) st = g4_sequence_generate(s, in, &go, collect, &got, &res);
    if (st == G4_OK && n_new > 0 && res.drafted) {
        char line[256];
        cli_format_draft_stats(&res.draft, res.draft_max, line, sizeof line);
        fprintf(stderr, "[%d tokens%s]\n", got.n_out, line);
    }
    if (st == G4_OK) {
        for (int i = 0; i < got.n_out; i++) printf("%s%d", i ? "," : "", got.out[i]);
        printf("\n");
        rc = 0;
    } else {
        cli_report_error("generate", st);
    }
    g4_input_free(in);
    g4_sequence_close(s);
    free(got.out);
    free(ids);
    g4_close(h);
    return rc;
}
