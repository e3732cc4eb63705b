/* The Gemma 4 text decoder forward pass (SPEC-gemma4.md §2), written
 * against the backend interface. One call runs a batch of token rows — a
 * prefill chunk of one sequence, or one decode step of many — through every
 * layer, storing K/V in the cache and producing logits for chosen rows. */
#ifndef G4_MODEL_TEXT_DECODER_H
#define G4_MODEL_TEXT_DECODER_H

#include <stdint.h>

#include "model/kv_cache.h"
#include "model/model.h"

/* Called with intermediate residual streams (backend memory, rows x dim):
 * "embed", "layer0", ..., "last_prenorm", "final_norm". */
typedef void (*g4_hidden_hook)(void *ctx, const char *name, const float *data, int rows, int dim);

typedef struct {
    int n_tokens;
    /* host arrays, [n_tokens] */
    const int32_t *ids;
    const int32_t *pos;
    const int32_t *seq;        /* row of the block tables; NULL = all 0 */
    const int32_t *kv_range;   /* [n_tokens][4], see g4_attn_batch */
    /* host block tables, uploaded as they are: full_tables [n_seqs][full_table_stride]
     * (the stride the backend's block_table_width gives for the longest
     * table, as g4_batch_finish lays them: it is part of the step's key) */
    int n_seqs;
    const int32_t *full_tables;
    int full_table_stride;
    const int32_t *sliding_tables; /* [n_seqs][ring_blocks] */
    /* multimodal soft tokens (already projected to the text width) that
     * replace the embeddings of rows mm_rows[i]; mm_embeds is backend memory */
    int n_mm;
    const int32_t *mm_rows;
    const float *mm_embeds;
    /* which rows produce logits, written to `logits` (host, [n_logit_rows][vocab]) */
    int n_logit_rows;
    const int32_t *logit_rows;
    float *logits;
    /* instead of `logits` (NULL) or besides them: the n_candidates
     * (<= G4_TOP_LOGITS_MAX_K) largest logits of each logit row, as the
     * backend's top_logits gives them: host [n_logit_rows][n_candidates] ids
     * and values, and each row's log-sum-exp (host [n_logit_rows]). Only
     * these cross to the host. */
    int n_candidates;
    int32_t *cand_ids;
    float *cand_values;
    double *cand_lse;
    /* constrained decoding (issue 31), with n_candidates: when mask_bits is
     * set, logit row r takes its candidates through token mask mask_slot[r]
     * (< 0: none) of mask_bits, the backend's top_logits_masked (both
     * backend memory: [slots][mask_words] words, [n_logit_rows] slots).
     * masks_ready(masks_ctx), if set, runs first, once the logits' ops are
     * queued: where the caller, which computed the masks meanwhile, uploads
     * them and the slots. */
    const uint32_t *mask_bits;
    int mask_words;
    const int32_t *mask_slot;
    void (*masks_ready)(void *ctx);
    void *masks_ctx;
    /* optional: final hidden states of the logit rows (host, [n_logit_rows][d]) */
    float *hidden_out;
    g4_hidden_hook hook;
    void *hook_ctx;
} g4_text_batch;

typedef struct g4_text_scratch g4_text_scratch;

/* Working memory for batches of up to max_tokens rows and max_logit_rows logits. */
g4_status g4_text_scratch_create(const g4_model *m, int max_tokens, int max_logit_rows, g4_text_scratch **out);
void g4_text_scratch_free(g4_text_scratch *s);
int g4_text_scratch_capacity(const g4_text_scratch *s);
/* Backend bytes the scratch allocated, and what g4_text_scratch_create
 * would allocate for that shape (the same list of arrays). The block
 * tables it grows later are small and not counted. */
size_t g4_text_scratch_bytes(const g4_text_scratch *s);
size_t g4_text_scratch_bytes_for(const g4_model *m, int max_tokens, int max_logit_rows);

/* Row `row` of the logits of the last g4_text_forward on this scratch
 * (host [vocab]), also when it asked for candidates only: what a sampler
 * that cannot decide from the candidates falls back to. */
g4_status g4_text_scratch_logits(g4_text_scratch *s, int row, float *logits);

g4_status g4_text_forward(const g4_model *m, g4_kv_pool *kv, g4_text_scratch *scratch, const g4_text_batch *b);

/* The per-token visible key ranges (g4_attn_batch.kv_range) for a chunk of
 * one sequence at positions pos[0..n). group_lo/hi give, per token, the
 * position range [lo, hi) of the image it belongs to (lo = hi = -1 for none);
 * mode 0: no bidirectional overlay; 1: gemma4 rule (sliding layers only,
 * within the window); 2: plain-forward rule (all layers, not windowed). */
void g4_text_kv_ranges(const g4_model *m, const int32_t *pos, const int32_t *group_lo, const int32_t *group_hi,
                       int n, int mode, int32_t *kv_range);

#endif
