/* gemma4 generate: greedy continuation of a token sequence, printed as one
 * line of comma-separated ids.
 *
 * Internal headers remain (runtime/session.h, cli_generate.h, cli_draft.h): greedy decoding through
 * the engine's token choice and an MTP drafter, which gemma4.h's g4_sequence does not offer yet (left
 * while drafting changes in the engine).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_common.h"
#include "cli_draft.h"
#include "runtime/session.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 generate -m DIR --ids 2,17,33,... -n N [--ignore-eos] [--threads N]\n"
               "                       [--device cpu|cuda|cuda:N] [--precision exact|fast]\n"
               "                       [--kv-type f32|bf16|fp8]\n"
               "                       [--draft DIR [--draft-max N]]\n");
    cli_draft_usage(f);
}

static int is_eos(const g4_model *m, int32_t id) {
    for (int k = 0; k < m->config.tokens.n_eos; k++)
        if (id == m->config.tokens.eos_ids[k]) return 1;
    return 0;
}

/* The same greedy ids through speculative decoding (argmax rows: a greedy
 * sampler without processors); the drafts' acceptance to stderr. */
static g4_status generate_drafted(g4_session *s, const g4_assistant *drafter, int draft_max, const int32_t *ids,
                                  int n, int n_new, int ignore_eos, int32_t *out, int *n_out) {
    const g4_model *m = s->model;
    g4_speculative_stats stats;
    g4_status st = g4_speculative_greedy(s, drafter, draft_max, -1, ids, n, n_new, m->config.tokens.eos_ids,
                                         ignore_eos ? 0 : m->config.tokens.n_eos, out, n_out, &stats, NULL);
    if (st == G4_OK && n_new > 0) {
        char line[256];
        cli_format_draft_stats(&stats, draft_max, line, sizeof line);
        fprintf(stderr, "[%d tokens%s]\n", *n_out, line);
    }
    return st;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *ids_text = NULL, *count_text = "16", *threads_text = NULL, *device = NULL;
    int ignore_eos = 0;
    g4_precision precision = G4_PRECISION_EXACT;
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--ids", &ids_text)) ||
            (r = cli_option(argc, argv, &i, "-n", &count_text)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) || (r = cli_draft_option(argc, argv, &i, &draft))) {
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
    g4_assistant *drafter = NULL;
    if (draft.dir && cli_open_draft(&draft, model, &drafter) != 0) {
        free(ids);
        cli_close_model(be, model);
        return 1;
    }
    g4_session_options opt = {.n_ctx = n + (int)n_new + 1, .kv_type = g4_kv_type_resolve(kv_type, precision, model)};
    g4_session *s = NULL;
    int32_t *out = malloc((size_t)(n_new + 1) * sizeof *out);
    int n_out = 0, rc = 1;
    /* the argmax (first of equal logits) comes back alone, not the row */
    int32_t next = 0;
    float top_value;
    double lse;
    g4_status st = out ? g4_session_create(model, &opt, &s) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK && drafter) {
        st = generate_drafted(s, drafter, draft.draft_max, ids, n, (int)n_new, ignore_eos, out, &n_out);
    } else {
        if (st == G4_OK && n_new > 0) st = g4_session_eval_top(s, ids, n, NULL, 1, &next, &top_value, &lse);
        while (st == G4_OK && n_out < n_new) {
            if (isnan(lse)) {
                st = g4_fail(G4_ERR_INTERNAL, "the logits hold NaN");
                break;
            }
            out[n_out++] = next;
            if ((is_eos(model, next) && !ignore_eos) || n_out == n_new) break;
            st = g4_session_eval_top(s, &next, 1, NULL, 1, &next, &top_value, &lse);
        }
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
    g4_assistant_release(drafter);
    cli_close_model(be, model);
    return rc;
}
