/* Generating a reply on the terminal: shared by `gemma4 run` and `gemma4 chat`,
 * on the public API (g4_sequence_generate). Streams the answer to stdout as
 * it is produced (never a broken UTF-8 sequence), reasoning (the thought
 * channel) to stderr, and reports speed. */
#ifndef G4_TOOLS_CLI_GENERATE_H
#define G4_TOOLS_CLI_GENERATE_H

#include <signal.h>
#include <stdio.h>
#include <stdint.h>

#include "cli_args.h"

/* --json-schema FILE, --grammar FILE, --regex TEXT, --json: at most one
 * (the last given); texts owned. */
typedef struct {
    int json_object;
    char *json_schema, *grammar, *regex;
} cli_constraint;

typedef struct {
    g4_params sampling;      /* the command line's values; cli_sampling_resolve adds the model's */
    unsigned sampling_given; /* which sampling fields the command line set (cli_sampling_option) */
    int max_tokens;
    int show_reasoning; /* print the thought channel to stderr */
} cli_generate_options;

typedef struct {
    g4_generate_result gen;
    int interrupted; /* stopped by Ctrl-C */
    int32_t *ids;    /* the reply's ids (malloc'd) */
    int n_ids;
} cli_generate_result;

/* Parses the sampling/generation flags common to run and chat at argv[*i];
 * returns 1 if it consumed one, 0 if not, -1 on a bad value. */
int cli_sampling_option(int argc, char **argv, int *i, cli_generate_options *o);
/* The sampling of a reply: the model's generation_config, with the fields the
 * command line gave replaced by their values. */
void cli_sampling_resolve(cli_generate_options *o, const g4_handle *h);
void cli_sampling_usage(FILE *f);

/* Makes the sequence hold the input and a reply (g4_sequence_generate: what
 * the sequence already holds of the input is kept), streaming the reply to
 * the terminal, until a stop token, max_tokens, the context end or
 * *interrupt. */
g4_status cli_generate(g4_handle *h, g4_sequence *s, const g4_input *in, const cli_generate_options *o,
                       const cli_constraint *constraint, volatile sig_atomic_t *interrupt, cli_generate_result *r);

/* --json-schema FILE, --grammar FILE, --regex TEXT, --json at argv[*i]
 * (1 consumed, 0 not ours, -1 bad value); cli_constraint_usage prints them. */
int cli_constraint_option(int argc, char **argv, int *i, cli_constraint *c);
void cli_constraint_usage(FILE *f);
int cli_constraint_given(const cli_constraint *c);
void cli_constraint_free(cli_constraint *c);

/* g4_open for run and chat: the model's tokenizer.json is required. */
g4_status cli_open_with_tokenizer(const char *model, const g4_open_options *o, g4_handle **h);
/* Appends a user message {"role": "user", "content": [media parts..., text]}
 * to the cJSON array `messages` (a part for each of files[0..n), in order,
 * then the text). */
void cli_add_user_message(void *messages, const g4_media_file *files, int n, const char *text);

/* "[prompt 42 tokens, 350.2 tok/s | 17 tokens, 25.3 tok/s]" to stderr, with the
 * drafts' acceptance after speculative decoding. */
void cli_print_stats(const cli_generate_result *r);

#endif
