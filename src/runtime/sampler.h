/* Next-token selection from a logit vector.
 *
 * Order of operations (as Hugging Face's logits processors/warpers and vLLM
 * apply them):
 *   1. logit bias        x[id] += bias                      (OpenAI logit_bias / HF sequence_bias)
 *   2. repetition penalty x<0 ? x*r : x/r for every token in prompt + generated text (HF, vLLM)
 *   3. presence/frequency x -= presence*(count>0) + frequency*count over generated tokens (OpenAI, vLLM)
 *   4. suppressed tokens  x = -inf                           (HF suppress_tokens)
 *   -- greedy (temperature <= 0) stops here: argmax, ties -> lowest id --
 *   5. temperature        x / T
 *   6. top-k              keep every token whose value >= the k-th largest (ties at the edge kept, as HF)
 *   7. top-p              keep the highest tokens while the probability mass above them is < p
 *                         (softmax over what top-k kept; equal values ordered by id)
 *   8. min-p              keep p_i >= min_p * p_max (over what top-p kept)
 *   9. draw               inverse CDF over the kept tokens in ascending id order with weights
 *                         exp((x_i - x_max)/T), one uniform double from the sampler's own
 *                         xoshiro256** stream (seeded through splitmix64).
 * vLLM applies min-p before top-k/top-p; HF's order is used here.
 *
 * Reproducibility: the random stream depends only on the seed. Given the
 * same logits the same tokens come out on any machine, except when a draw
 * lands within rounding (~1e-7 relative) of a boundary between two tokens
 * (expf may differ in the last bit between C libraries).
 *
 * Log-probabilities: RAW (default, vLLM's default and what OpenAI-style
 * `logprobs` report) is log_softmax of the logits given to the sampler,
 * before any processing; PROCESSED is the distribution the token was drawn
 * from (after penalties, temperature and filters; filtered tokens -inf; with
 * greedy decoding: log_softmax of the penalised logits). */
#ifndef G4_RUNTIME_SAMPLER_H
#define G4_RUNTIME_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "io/config.h"

#define G4_SAMPLER_MAX_TOP_LOGPROBS 20

typedef struct {
    int32_t id;
    float bias;
} g4_logit_bias;

typedef enum { G4_LOGPROBS_RAW = 0, G4_LOGPROBS_PROCESSED = 1 } g4_logprobs_mode;

typedef struct {
    float temperature;        /* <= 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off; must be > 0 */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; > 0 */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    const g4_logit_bias *logit_bias; /* copied by g4_sampler_create */
    size_t n_logit_bias;
    const int32_t *suppress; /* copied by g4_sampler_create */
    size_t n_suppress;
    uint64_t seed;
    int logprobs;     /* compute the chosen token's log-probability (costs a pass over the vocabulary) */
    int top_logprobs; /* also report this many most likely tokens (0..G4_SAMPLER_MAX_TOP_LOGPROBS) */
    g4_logprobs_mode logprobs_mode;
} g4_sampler_params;

typedef struct {
    int32_t id;
    float logprob;
} g4_token_logprob;

typedef struct {
    int32_t token;
    float logprob; /* of `token` (0 unless params.logprobs or top_logprobs) */
    int n_top;
    g4_token_logprob top[G4_SAMPLER_MAX_TOP_LOGPROBS]; /* most likely first; equal log-probs by id */
} g4_sample;

typedef struct g4_sampler g4_sampler;

/* Greedy, no filters, no penalties, seed 0. */
void g4_sampler_params_default(g4_sampler_params *p);

/* Defaults as transformers' generate() takes them from generation_config.json:
 * do_sample false -> greedy; else temperature, top_k, top_p, min_p,
 * repetition_penalty; suppress_tokens. `gc` must outlive the sampler's
 * creation (the suppress list is copied then). */
void g4_sampler_params_from_generation_config(g4_sampler_params *p, const g4_generation_config *gc);

g4_status g4_sampler_create(int32_t vocab_size, const g4_sampler_params *p, g4_sampler **out);
void g4_sampler_free(g4_sampler *s);

/* Forget the history (prompt and generated tokens) and restart the random
 * stream from `seed`. */
void g4_sampler_reset(g4_sampler *s, uint64_t seed);

/* Tokens of the prompt: they count for the repetition penalty only. */
g4_status g4_sampler_add_prompt(g4_sampler *s, const int32_t *ids, size_t n);

/* A generated token (after sampling, or forced): counts for the repetition,
 * presence and frequency penalties. */
g4_status g4_sampler_accept(g4_sampler *s, int32_t token);

/* Chooses the next token from logits[vocab_size] (not modified). NaN logits
 * or a vocabulary with no finite logit left are errors. */
g4_status g4_sampler_sample(g4_sampler *s, const float *logits, g4_sample *out);

/* The tokens the sampler would draw from for these logits and their
 * probabilities (renormalised, summing to 1), in ascending id order; with
 * greedy decoding the single argmax token. ids/probs must hold vocab_size
 * entries. Does not advance the random stream. For tests and tools. */
g4_status g4_sampler_candidates(g4_sampler *s, const float *logits, int32_t *ids, double *probs, size_t *n);

/* 1 when the sampler decodes greedily (temperature <= 0): it then draws no
 * random numbers and its choice is a function of the logits and history. */
int g4_sampler_is_greedy(const g4_sampler *s);

/* Choosing from the row's largest logits only (the backend's top_logits
 * op, so that a decode step copies k pairs to the host instead of the row).
 *
 * g4_sampler_candidates_needed: how many of the row's largest logits
 * g4_sampler_sample_top needs to choose exactly as g4_sampler_sample would
 * from the full row, or 0 when these parameters need the full row. It
 * accepts: greedy (k = max(1, top_logprobs)), and temperature > 0 with
 * 0 < top_k < vocab (k = max(top_k, top_logprobs) + 4: the margin shows
 * whether values tied with the k-th run past the list), either with any
 * top_p/min_p, logprobs mode and top_logprobs; never logit bias,
 * suppressed tokens or repetition/presence/frequency penalties (they move
 * logits anywhere in the row); at most G4_SAMPLER_MAX_CANDIDATES. */
#define G4_SAMPLER_MAX_CANDIDATES 1024
int g4_sampler_candidates_needed(const g4_sampler *s);
/* 1 when samples carry log-probabilities (logprobs or top_logprobs asked). */
int g4_sampler_wants_logprobs(const g4_sampler *s);

/* Chooses from the row's n >= g4_sampler_candidates_needed(s) largest logits
 * (ids/values ordered by value descending, equal values by ascending id;
 * entries past the vocabulary ignored) and the row's log-sum-exp (NaN: the
 * row held a NaN, an error as in g4_sampler_sample): the same token,
 * log-probabilities and use of the random stream as g4_sampler_sample on
 * the full row. When values tied with the top_k-th run to the end of the
 * list the candidates cannot decide: *need_full is set, nothing is drawn,
 * and the caller samples the full row with g4_sampler_sample. */
g4_status g4_sampler_sample_top(g4_sampler *s, const int32_t *ids, const float *values, int n, double lse,
                                g4_sample *out, int *need_full);

/* 1 when the parameters hold no logit bias, suppressed tokens or
 * repetition/presence/frequency penalties: the row's own largest logits
 * are then the ones the sampler weighs. */
int g4_sampler_takes_candidates(const g4_sampler *s);

/* g4_sampler_sample_top for a list that holds every finite logit of the row
 * (ids/values[0..n), ordered so; every other logit -inf: a masked row whose
 * allowed tokens all came back; -inf entries may follow, the row's -inf
 * tokens lowest id first, as its top log-probabilities name them after the
 * finite ones), for any parameters
 * g4_sampler_takes_candidates accepts, top-k or not: the same token,
 * log-probabilities and use of the random stream as g4_sampler_sample on
 * the full row. *need_full is set (nothing drawn) only when top_logprobs
 * asks for more than n entries. */
g4_status g4_sampler_sample_complete(g4_sampler *s, const int32_t *ids, const float *values, int n, double lse,
                                     g4_sample *out, int *need_full);

/* The random stream (exposed for tests): next 64-bit output and a uniform
 * double in [0, 1) with 53 random bits. */
uint64_t g4_sampler_next_u64(g4_sampler *s);
double g4_sampler_next_double(g4_sampler *s);

#endif
