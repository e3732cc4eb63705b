/* Generating a reply on the terminal: shared by `gemma4 run` and `gemma4 chat`.
 * Streams the answer to stdout as it is produced (never a broken UTF-8
 * sequence), reasoning (the thought channel) to stderr, and reports speed. */
#ifndef G4_TOOLS_CLI_GENERATE_H
#define G4_TOOLS_CLI_GENERATE_H

#include <signal.h>
#include <stdio.h>
#include <stdint.h>

#include "constrain/constrain.h"
#include "runtime/context.h"
#include "runtime/prompt.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/speculative.h"

typedef struct {
    g4_sampler_params sampling;
    unsigned sampling_given; /* which sampling fields the command line set (cli_sampling_option) */
    int max_tokens;
    int show_reasoning; /* print the thought channel to stderr */
    int quiet_stats;    /* no timing line */
    const g4_assistant *draft; /* speculative decoding with this drafter (greedy only), or NULL */
    int draft_max;             /* drafts a round */
    struct g4_token_matcher *constraint; /* the reply follows this grammar (drafting is then off), or NULL */
} cli_generate_options;

typedef struct {
    int n_prompt;           /* tokens evaluated for this reply (the new part of the prompt) */
    int n_generated;
    double prefill_seconds, decode_seconds;
    int interrupted;        /* stopped by Ctrl-C */
    int hit_stop;           /* ended with a stop token */
    int32_t *ids;           /* generated ids (malloc'd) */
    int drafted;            /* speculative decoding ran: */
    int draft_max;
    g4_speculative_stats draft_stats;
} cli_generate_result;

/* Parses the sampling/generation flags common to run and chat at argv[*i];
 * returns 1 if it consumed one, 0 if not, -1 on a bad value. */
int cli_sampling_option(int argc, char **argv, int *i, cli_generate_options *o);
/* The sampling of a reply: the model's generation_config, with the fields the
 * command line gave replaced by their values. */
void cli_sampling_resolve(cli_generate_options *o, const g4_generation_config *gc);
void cli_sampling_usage(FILE *f);

/* Evaluates prompt ids [from, n) (earlier ones are already in the session)
 * with the prompt's soft tokens, then samples until a stop token,
 * max_tokens, the context end or *interrupt. */
g4_status cli_generate(g4_context *c, g4_session *s, const g4_prompt *p, int from, const cli_generate_options *o,
                       volatile sig_atomic_t *interrupt, cli_generate_result *r);

/* --json-schema FILE, --grammar FILE, --regex TEXT, --json at argv[*i] into
 * spec (1 consumed, 0 not ours, -1 bad value); cli_constraint_usage prints
 * them. */
int cli_constraint_option(int argc, char **argv, int *i, g4_constraint_spec *spec);
void cli_constraint_usage(FILE *f);
/* The spec compiled for this context (NULL matcher for kind NONE); prints
 * the error and returns nonzero on failure. */
int cli_constraint_matcher(g4_context *c, const g4_constraint_spec *spec, int think, int starts_in_reasoning,
                           struct g4_token_matcher **out);

/* "[prompt 42 tokens, 350.2 tok/s | 17 tokens, 25.3 tok/s]" to stderr, with the
 * drafts' acceptance after speculative decoding. */
void cli_print_stats(const cli_generate_result *r);

#endif
