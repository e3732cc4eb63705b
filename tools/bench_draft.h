/* gemma4 bench --draft: greedy decoding of a real prompt with and without
 * speculation by an MTP drafter, tokens/s of each and the acceptance seen. */
#ifndef G4_TOOLS_BENCH_DRAFT_H
#define G4_TOOLS_BENCH_DRAFT_H

#include "cli_draft.h"
#include "model/model.h"

/* prompt: text tokenized with the model's tokenizer (its folder's
 * tokenizer.json), with <bos> first. Prints a table (or JSON lines) to
 * stdout; returns 0 on success. */
int bench_draft(g4_model *model, const cli_draft_options *draft, const char *prompt, int tg, int reps, int json);

#endif
