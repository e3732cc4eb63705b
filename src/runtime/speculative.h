/* Speculative decoding with an MTP drafter (SPEC-gemma4-unified-assistant
 * B5, the clean algorithm): the drafter proposes up to k tokens after the
 * last chosen one (its argmax, as transformers drafts), the target verifies
 * all k+1 positions in one pass, the longest prefix the target keeps is
 * emitted with the target's next token, and its cache forgets the rest.
 *
 * Each verified row is given to the sampler in order, with the history it
 * would have had (logit bias, penalties and suppressed tokens included).
 * Greedy sampler (temperature <= 0): a draft is kept when it is the
 * sampler's choice, so the tokens are exactly those of plain decoding.
 * Sampling: a draft d is kept with probability p(d) under the sampler's
 * distribution p, else the row's token is drawn from p without d: every
 * token then has exactly the distribution of plain sampling (the random
 * stream is used differently, so a seed gives other tokens than without
 * drafting).
 *
 * Rolling back is a truncation of the sequence: full layers keep a slot per
 * position; sliding rings are sized by the session for a window plus a chunk,
 * so that the k+1 verified positions never overwrite a position that later
 * queries (target or drafter) still see; g4_speculative_create checks it. */
#ifndef G4_RUNTIME_SPECULATIVE_H
#define G4_RUNTIME_SPECULATIVE_H

#include <stdint.h>

#include "model/assistant.h"
#include "runtime/draft_rule.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

/* The public counts (gemma4.h), indexed by position up to G4_MAX_DRAFTS. */
typedef g4_draft_stats g4_speculative_stats;
_Static_assert(G4_MAX_DRAFTS == G4_DRAFT_MAX, "gemma4.h's G4_MAX_DRAFTS is draft_rule.h's G4_DRAFT_MAX");

typedef struct g4_speculative g4_speculative;

/* A drafter (attached to s's model) driving session s with up to draft_max
 * (1..G4_DRAFT_MAX) drafts a round. */
g4_status g4_speculative_create(g4_session *s, const g4_assistant *a, int draft_max, g4_speculative **out);
void g4_speculative_free(g4_speculative *sp);

/* Evaluates the prompt ids[0..n) (appended to the session) and chooses the
 * first token with `sampler` into *token (not yet accepted by the sampler
 * nor evaluated: the next g4_speculative_step starts from it). */
g4_status g4_speculative_prefill(g4_speculative *sp, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                 g4_sampler *sampler, int32_t *token);

/* One round after `token` (the last chosen token, already accepted by the
 * sampler): drafts up to min(draft_max, max_new - 1) tokens, verifies, and
 * writes the tokens that follow into out[0..*n_out) (1..max_new of them:
 * accepted drafts, accepted by the sampler here, then the target's own next
 * choice, which is not, and which the next round starts from). */
g4_status g4_speculative_step(g4_speculative *sp, int32_t token, g4_sampler *sampler, int max_new, int32_t *out,
                              int *n_out);

/* The verification half of a step, with given drafts d_1..d_k (0 <= k <=
 * draft_max): one target pass over [token, d_1..d_k], the same acceptance
 * and rollback. */
g4_status g4_speculative_verify(g4_speculative *sp, int32_t token, const int32_t *drafts, int k,
                                g4_sampler *sampler, int32_t *out, int *n_out);

/* Greedy decoding of up to max_new tokens after prompt[0..n_prompt) (appended
 * to s) through a drafter (forced_accept as g4_speculative_force_acceptance;
 * -1 for real decoding): the ids plain greedy decoding gives, into
 * out[0..*n_out), ending after the first of stop_ids (n_stop may be 0). The
 * run's stats into *stats and the seconds after the prefill into
 * *decode_seconds where not NULL. */
g4_status g4_speculative_greedy(g4_session *s, const g4_assistant *a, int draft_max, int forced_accept,
                                const int32_t *prompt, int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, int32_t *out,
                                int *n_out, g4_speculative_stats *stats, double *decode_seconds);

/* Benchmarks on random weights only (where drafts are never right): every
 * later verification keeps exactly min(n, drafts) drafts, whatever the target
 * says, and then the target's own token, so that the speed at each acceptance
 * length can be measured; the tokens are then not the model's. n < 0: off. */
void g4_speculative_force_acceptance(g4_speculative *sp, int n);

const g4_speculative_stats *g4_speculative_get_stats(const g4_speculative *sp);
void g4_speculative_reset_stats(g4_speculative *sp);

#endif
