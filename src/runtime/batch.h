/* Building one forward pass: pieces of sequences (a decode token, a prefill
 * chunk) -> one g4_text_batch. The one place that knows how positions,
 * image groups, key ranges, soft-token rows, logit rows and block tables
 * are laid out; the engine's scheduler step and its caller-driven
 * sequences (g4_engine_eval, under g4_session) both build through it. */
#ifndef G4_RUNTIME_BATCH_H
#define G4_RUNTIME_BATCH_H

#include <stdint.h>

#include "gemma4.h" /* g4_vision_mask (SPEC §5 / unified A7) */
#include "model/kv_cache.h"
#include "model/text_decoder.h"

/* The g4_text_kv_ranges mode for a model and a g4_vision_mask: 0 none,
 * 1 the gemma4 rule, 2 all layers. */
int g4_batch_bidir_mode(const g4_model *m, int vision_mask);

/* Rows of the next prefill chunk of ids[start..n), at most `budget`, ending
 * before an image group that the boundary would cut in two when image
 * tokens attend both ways (bidir_mode != 0): such groups are prefilled
 * whole. 0 when the group at `start` alone is longer than budget. */
int g4_batch_chunk_len(const g4_model *m, int bidir_mode, const int32_t *ids, int n, int start, int budget);

typedef enum { G4_BATCH_NO_LOGITS = 0, G4_BATCH_LAST_LOGITS, G4_BATCH_ALL_LOGITS } g4_batch_logits;

/* One sequence's rows in a batch. */
typedef struct {
    const g4_kv_seq *kv;
    const int32_t *ids; /* [len]; ids[-lookback..-1] are the tokens just before (a resumed image starts there) */
    int len, lookback;
    int pos;            /* position of ids[0] */
    int prefill;        /* 0: decode tokens (no bidirectional overlay) */
    /* soft tokens: media_rows[i] - media_origin is a row of ids (others are skipped);
     * media_embeds backend [n_media][hidden] */
    int n_media;
    const int32_t *media_rows;
    const float *media_embeds;
    int media_origin;
    g4_batch_logits logits;
} g4_batch_piece;

typedef struct {
    const g4_model *model;
    int bidir_mode;
    int max_tokens, max_seqs, max_logit_rows;
    int ring_blocks, table_cap; /* per sequence: sliding ring, full-layer table capacity (at the backend's width) */
    /* host arrays of the batch being built */
    int32_t *ids, *pos, *seq, *ranges, *glo, *ghi, *mm_rows, *logit_rows, *logit_owner, *full_tables, *sliding_tables;
    const g4_kv_seq **kv; /* [max_seqs] */
    float *media_stage;   /* backend [max_tokens][hidden]: the batch's soft tokens, in row order */
    int n_tokens, n_seqs, n_logit_rows, n_mm;
} g4_batch_builder;

g4_status g4_batch_builder_init(g4_batch_builder *b, const g4_model *m, int bidir_mode, int max_tokens, int max_seqs,
                                int max_logit_rows, int ring_blocks, int table_cap);
void g4_batch_builder_free(g4_batch_builder *b);
void g4_batch_builder_reset(g4_batch_builder *b);

/* Appends a piece (the caller keeps within max_tokens / max_seqs /
 * max_logit_rows); returns its sequence index in the batch. */
int g4_batch_add(g4_batch_builder *b, const g4_batch_piece *p);

/* The batch so far, with its block tables laid at the backend's
 * block_table_width of the longest (rows zero-padded); the outputs (logits,
 * candidates, hidden states, hook) are the caller's to set. */
void g4_batch_finish(g4_batch_builder *b, g4_text_batch *out);

#endif
