/* Speculative decoding on the command line: --draft DIR (an MTP drafter,
 * gemma4_assistant) and --draft-max N, shared by run, chat, generate and
 * bench. */
#ifndef G4_TOOLS_CLI_DRAFT_H
#define G4_TOOLS_CLI_DRAFT_H

#include <stdio.h>

#include "model/assistant.h"
#include "runtime/speculative.h"

/* Drafts a round when --draft-max is not given: the best tokens/s of 1..4 (1)
 * on the bundled model and its drafter (bench/RESULTS.md, "Speculative
 * decoding (issue 29)"). */
#define CLI_DRAFT_MAX_DEFAULT 1

typedef struct {
    const char *dir; /* NULL: no drafting */
    int draft_max;
} cli_draft_options;

/* Parses --draft / --draft-max at argv[*i]: 1 if consumed, 0 if not, -1 on a bad value. */
int cli_draft_option(int argc, char **argv, int *i, cli_draft_options *o);
void cli_draft_usage(FILE *f);

/* Loads the drafter named by o (a directory or a pulled ORG/NAME) on the
 * target's backend and attaches it. Prints the error and returns nonzero on
 * failure. */
int cli_open_draft(const cli_draft_options *o, const g4_model *target, g4_assistant **out);
/* The same, where `--draft synthetic` gives a random drafter for the
 * synthetic target preset `synthetic` (NULL: a real model, refused). */
int cli_open_draft_any(const cli_draft_options *o, const char *synthetic, const g4_model *target, g4_assistant **out);

/* " | draft 2: 1.43 accepted a round, 2.43 tokens a target pass, by position 0.81 0.62"
 * into buf. */
void cli_format_draft_stats(const g4_speculative_stats *s, int draft_max, char *buf, size_t n);

#endif
