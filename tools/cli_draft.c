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

/* --draft auto: the drafter beside the target, as Google names them (every
 * gemma-4-X-it has a gemma-4-X-it-assistant): the folder `<model>-assistant`
 * next to the model's, or for a model in the hub cache
 * (.../models--ORG--NAME/snapshots/REV) the pulled ORG/NAME-assistant. */
static g4_status find_drafter(const char *model_dir, char **out) {
    *out = NULL;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model_dir);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    char sibling[4200];
    snprintf(sibling, sizeof sibling, "%s-assistant", dir);
    if (g4_is_directory(sibling)) {
        *out = strdup(sibling);
        return *out ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    const char *repo = strstr(dir, "models--");
    const char *snap = repo ? strstr(repo, "/snapshots/") : NULL;
    if (snap) {
        char id[512] = "";
        size_t k = 0;
        int org_done = 0;
        for (const char *c = repo + strlen("models--"); c < snap && k + 1 < sizeof id; c++) {
            if (!org_done && c[0] == '-' && c[1] == '-') { /* the first "--" parts ORG from NAME */
                id[k++] = '/';
                org_done = 1;
                c++;
            } else {
                id[k++] = *c;
            }
        }
        id[k] = 0;
        char hub_id[600];
        snprintf(hub_id, sizeof hub_id, "%s-assistant", id);
        if (g4_resolve_model_path(hub_id, out) == G4_OK && g4_is_directory(*out)) return G4_OK;
        free(*out);
        *out = NULL;
        return g4_fail(G4_ERR_NOT_FOUND, "--draft auto: no drafter beside %s (looked for %s and the pulled %s)",
                       model_dir, sibling, hub_id);
    }
    return g4_fail(G4_ERR_NOT_FOUND, "--draft auto: no drafter beside %s (looked for %s)", model_dir, sibling);
}

int cli_open_draft(const cli_draft_options *o, const g4_model *target, g4_assistant **out) {
    *out = NULL;
    char *dir = NULL;
    g4_status st = !strcmp(o->dir, "auto") ? find_drafter(target->path, &dir) : g4_resolve_model_path(o->dir, &dir);
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
