/* Loading an MTP drafter by hand, for the commands that still drive the
 * model's internals (bench, serve, info); the --draft options themselves
 * are cli_args.h's, and run, chat and generate hand them to g4_open. */
#ifndef G4_TOOLS_CLI_DRAFT_H
#define G4_TOOLS_CLI_DRAFT_H

#include "cli_args.h"
#include "model/assistant.h"
#include "runtime/speculative.h"

/* Loads the drafter named by o (a directory or a pulled ORG/NAME) on the
 * target's backend and attaches it. Prints the error and returns nonzero on
 * failure. */
int cli_open_draft(const cli_draft_options *o, const g4_model *target, g4_assistant **out);
/* The same, where `--draft synthetic` gives a random drafter for the
 * synthetic target preset `synthetic` (NULL: a real model, refused). */
int cli_open_draft_any(const cli_draft_options *o, const char *synthetic, const g4_model *target, g4_assistant **out);

#endif
