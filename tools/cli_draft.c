#include "cli_draft.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli_common.h"
#include "io/hub.h"

int cli_draft_option(int argc, char **argv, int *i, cli_draft_options *o) {
    const char *value = NULL;
    int r;
    if ((r = cli_option(argc, argv, i, "--draft", &value))) {
        if (r > 0) o->dir = value;
        return r;
    }
    if ((r = cli_option(argc, argv, i, "--draft-max", &value))) {
        if (r < 0) return r;
        long n = cli_parse_count(value, "--draft-max");
        if (n < 1 || n > G4_DRAFT_MAX) {
            if (n >= 0) fprintf(stderr, "gemma4: --draft-max %ld outside 1..%d\n", n, G4_DRAFT_MAX);
            return -1;
        }
        o->draft_max = (int)n;
        return 1;
    }
    return 0;
}

void cli_draft_usage(FILE *f) {
    fprintf(f,
            "  --draft DIR       speculative decoding with this MTP drafter (gemma4_assistant; a folder or a\n"
            "                    pulled ORG/NAME; auto: the <model>-assistant beside the model)\n"
            "  --draft-max N     drafts a round, 1..%d (default %d)\n",
            G4_DRAFT_MAX, CLI_DRAFT_MAX_DEFAULT);
}

int cli_open_draft(const cli_draft_options *o, const g4_model *target, g4_assistant **out) {
    *out = NULL;
    char *dir = NULL;
    g4_status st = !strcmp(o->dir, "auto") ? g4_assistant_find(target->path, &dir) : g4_resolve_model_path(o->dir, &dir);
    if (st == G4_OK && !strcmp(o->dir, "auto")) fprintf(stderr, "gemma4: drafter %s\n", dir);
    if (st == G4_OK) st = g4_assistant_load_dir(dir, target->backend, out);
    free(dir);
    if (st == G4_OK) st = g4_assistant_attach(*out, target);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4: cannot use the drafter: %s\n", g4_error_message());
        g4_assistant_release(*out);
        *out = NULL;
        return 1;
    }
    return 0;
}

int cli_open_draft_any(const cli_draft_options *o, const char *synthetic, const g4_model *target, g4_assistant **out) {
    *out = NULL;
    if (strcmp(o->dir, "synthetic") != 0) return cli_open_draft(o, target, out);
    if (!synthetic) {
        fprintf(stderr, "gemma4: --draft synthetic needs a synthetic target (--synthetic NAME)\n");
        return 1;
    }
    g4_status st = g4_assistant_synthesize(synthetic, target->backend, out);
    if (st == G4_OK) st = g4_assistant_attach(*out, target);
    if (st != G4_OK) {
        cli_report_error("--draft synthetic", st);
        g4_assistant_release(*out);
        *out = NULL;
        return 1;
    }
    return 0;
}

void cli_format_draft_stats(const g4_speculative_stats *s, int draft_max, char *buf, size_t n) {
    if (s->rounds == 0) {
        snprintf(buf, n, " | draft %d: no rounds", draft_max);
        return;
    }
    size_t k = (size_t)snprintf(buf, n, " | draft %d: %.2f accepted a round, %.2f tokens a target pass, by position",
                                draft_max, (double)s->accepted / s->rounds,
                                (double)(s->accepted + s->rounds) / s->rounds);
    for (int i = 0; i < draft_max && i < G4_DRAFT_MAX && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, " %.2f",
                              s->drafted_at[i] ? (double)s->accepted_at[i] / s->drafted_at[i] : 0.0);
    if (k < n)
        snprintf(buf + k, n - k, "; %.1f ms drafting, %.1f ms verifying a round",
                 1e3 * s->draft_seconds / s->rounds, 1e3 * s->verify_seconds / s->rounds);
}
