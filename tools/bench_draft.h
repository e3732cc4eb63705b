/* gemma4 bench --draft: greedy decoding of a prompt with and without
 * speculation by an MTP drafter, tokens/s of each and the acceptance seen;
 * or, with --force-accept, the speed at given acceptance lengths. */
#ifndef G4_TOOLS_BENCH_DRAFT_H
#define G4_TOOLS_BENCH_DRAFT_H

#include "cli_draft.h"
#include "model/model.h"

typedef struct {
    const cli_draft_options *draft; /* dir "synthetic": a random drafter for the synthetic target */
    const char *synthetic;          /* the synthetic target's preset, or NULL */
    const char *prompt;             /* tokenized with the model's tokenizer, <bos> first (synthetic: fixed ids) */
    const char *force_accept;       /* NULL, or a list of draft counts kept a round ("0,1,2,3") */
    int tg, reps, json;
} bench_draft_options;

/* Prints a table (or JSON lines) to stdout; returns 0 on success. */
int bench_draft(g4_model *model, const bench_draft_options *o);

#endif
