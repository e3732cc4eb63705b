#include "cli_draft.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli_common.h"
#include "io/hub.h"

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
