/* The parts of speculative decoding that one sequence's loop
 * (runtime/speculative.c) and the batched engine (runtime/engine.c) share:
 * the acceptance rule of a verified row and the adaptive draft length.
 * Kept apart from both so the engine needs no session. */
#ifndef G4_RUNTIME_DRAFT_RULE_H
#define G4_RUNTIME_DRAFT_RULE_H

#include <stdint.h>

#include "base/status.h"
#include "model/assistant.h"
#include "runtime/sampler.h"

#define G4_DRAFT_MAX 16

/* Whether the target keeps draft d at a verified row whose logits are
 * `logits` (host [vocab]), and if not the token it takes instead (*next;
 * *next = d when kept). Greedy sampler: d must be the sampler's choice.
 * Sampling (the drafter proposes one token, a point mass q = [d]): d is
 * kept with probability p(d) under the sampler's distribution p, else the
 * token is drawn from p without d, renormalised; so every emitted token has
 * exactly the sampler's distribution (the speculative sampling rule with
 * min(1, p/q) and max(0, p - q)). cand_ids / cand_probs: host [vocab]
 * scratch. The sampler does not accept the token here. */
g4_status g4_draft_keep(g4_sampler *sampler, const float *logits, int32_t d, int32_t *cand_ids, double *cand_probs,
                        int *keep, int32_t *next);

/* The adaptive draft length of one sequence: `len` drafts next round, in
 * 1..max. A round that kept every draft tries one more; one that kept fewer
 * than half of them drafts one fewer next time (recent acceptance falls, so
 * fewer drafts are wasted on verification). */
typedef struct {
    int len, max;
} g4_draft_length;

void g4_draft_length_init(g4_draft_length *d, int max);
void g4_draft_length_update(g4_draft_length *d, int drafted, int kept);

/* The probability of the most likely token under logits[0..n) (a softmax):
 * the drafter's confidence, compared with a --draft-min-p floor. */
double g4_draft_top_probability(const float *logits, int n);

/* One drafting round at position p (every step sees the target keys in kv
 * and sits at p, the clean algorithm): up to k drafts after `token` into
 * drafts[0..*n), the first step fed the target's hidden state `hidden`,
 * stopping after an end-of-sequence id of `target` and, with min_p > 0,
 * before a draft the drafter gives less than min_p (logits: host [vocab],
 * cands: host [top_k * tokens per centroid], its scratch for that). */
g4_status g4_draft_round(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                         const g4_drafter_kv *kv, int p, int32_t token, const float *hidden, int k, float min_p,
                         float *logits, int32_t *cands, int32_t *drafts, int *n);

/* One sequence's part in a batched drafting round (g4_draft_rounds). */
typedef struct {
    g4_drafter_kv kv;     /* the target keys its steps see */
    int pos;              /* p: every step of its round sits there */
    int32_t token;        /* its last token, fed to the first step */
    const float *hidden;  /* host [d_t]: the target's final-normed state of the row that chose it */
    int k;                /* drafts wanted (0: none) */
    int32_t *drafts;      /* out: [k] */
    int n;                /* out: drafts made */
} g4_draft_row;

/* g4_draft_round for n sequences at once: drafter step j of every row still
 * drafting is one forward of those rows (a row leaves after its k drafts,
 * an end-of-sequence id or a draft under min_p), so a round of up to k
 * drafts costs k drafter forwards, not k per sequence. Rows beyond the
 * scratch's capacity go in further groups. logits: host [rows][vocab] and
 * cands host [rows][top_k * K] (a row each of the scratch), read only with
 * min_p > 0. *forwards (may be NULL): the drafter forwards it ran. */
g4_status g4_draft_rounds(const g4_assistant *a, g4_drafter_scratch *scratch, const g4_model *target,
                          g4_draft_row *rows, int n_rows, float min_p, float *logits, int32_t *cands,
                          int *forwards);

#endif
