#include "runtime/batch.h"

#include <stdlib.h>
#include <string.h>

static int is_vision(const g4_token_ids *tk, int32_t id) { return id == tk->image_id || id == tk->video_id; }

int g4_batch_bidir_mode(const g4_model *m, int vision_mask) {
    if (!m->config.text.bidirectional_vision) return 0;
    return vision_mask == G4_VISION_MASK_CAUSAL ? 0 : vision_mask == G4_VISION_MASK_ALL_LAYERS ? 2 : 1;
}

int g4_batch_chunk_len(const g4_model *m, int bidir_mode, const int32_t *ids, int n, int start, int budget) {
    int left = n - start;
    int len = left < budget ? left : budget;
    if (len < left && len > 0 && bidir_mode) {
        const g4_token_ids *tk = &m->config.tokens;
        int end = start + len;
        if (is_vision(tk, ids[end]) && is_vision(tk, ids[end - 1])) {
            /* the boundary cuts an image group: end the chunk where it starts */
            int g = end - 1;
            while (g > start && is_vision(tk, ids[g - 1])) g--;
            len = g - start;
        }
    }
    return len;
}

g4_status g4_batch_builder_init(g4_batch_builder *b, const g4_model *m, int bidir_mode, int max_tokens, int max_seqs,
                                int max_logit_rows, int ring_blocks, int table_cap) {
    memset(b, 0, sizeof *b);
    b->model = m;
    b->bidir_mode = bidir_mode;
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->max_logit_rows = max_logit_rows;
    b->ring_blocks = ring_blocks;
    /* the widest row a step may ask for: a table_cap table at the backend's width */
    g4_backend *be = m->backend;
    b->table_cap = be->ops->block_table_width(be, table_cap);
    const size_t N = (size_t)max_tokens, S = (size_t)max_seqs, R = (size_t)max_logit_rows;
    b->media_stage = be->ops->alloc(be, N * m->config.text.hidden_size * sizeof(float));
    b->ids = malloc(N * sizeof *b->ids);
    b->pos = malloc(N * sizeof *b->pos);
    b->seq = malloc(N * sizeof *b->seq);
    b->ranges = malloc(N * 4 * sizeof *b->ranges);
    b->glo = malloc(N * sizeof *b->glo);
    b->ghi = malloc(N * sizeof *b->ghi);
    b->mm_rows = malloc(N * sizeof *b->mm_rows);
    b->logit_rows = malloc(R * sizeof *b->logit_rows);
    b->logit_owner = malloc(R * sizeof *b->logit_owner);
    b->full_tables = calloc(S * (size_t)b->table_cap, sizeof *b->full_tables);
    b->sliding_tables = malloc(S * (size_t)ring_blocks * sizeof *b->sliding_tables);
    b->kv = malloc(S * sizeof *b->kv);
    if (!b->media_stage || !b->ids || !b->pos || !b->seq || !b->ranges || !b->glo || !b->ghi || !b->mm_rows ||
        !b->logit_rows || !b->logit_owner || !b->full_tables || !b->sliding_tables || !b->kv) {
        g4_batch_builder_free(b);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for batches of %d tokens", max_tokens);
    }
    return G4_OK;
}

void g4_batch_builder_free(g4_batch_builder *b) {
    if (!b->model) return;
    g4_backend *be = b->model->backend;
    if (b->media_stage) be->ops->release(be, b->media_stage);
    free(b->ids), free(b->pos), free(b->seq), free(b->ranges), free(b->glo), free(b->ghi), free(b->mm_rows);
    free(b->logit_rows), free(b->logit_owner), free(b->full_tables), free(b->sliding_tables), free(b->kv);
    memset(b, 0, sizeof *b);
}

void g4_batch_builder_reset(g4_batch_builder *b) { b->n_tokens = b->n_seqs = b->n_logit_rows = b->n_mm = 0; }

/* Image groups (maximal runs of image/video placeholders, transformers'
 * get_block_sequence_ids_for_mask) -> each row's group range [lo, hi). */
static void image_groups(const g4_batch_builder *b, const g4_batch_piece *p, int32_t *glo, int32_t *ghi) {
    const g4_token_ids *tk = &b->model->config.tokens;
    for (int t = 0; t < p->len;) {
        if (!is_vision(tk, p->ids[t])) {
            t++;
            continue;
        }
        int u = t;
        while (u < p->len && is_vision(tk, p->ids[u])) u++;
        /* a chunk that resumes inside an image (from the prefix cache): the image starts before it */
        int back = 0;
        while (t == 0 && back < p->lookback && is_vision(tk, p->ids[-back - 1])) back++;
        for (int k = t; k < u; k++) glo[k] = p->pos + t - back, ghi[k] = p->pos + u;
        t = u;
    }
}

int g4_batch_add(g4_batch_builder *b, const g4_batch_piece *p) {
    const g4_model *m = b->model;
    const int n = b->n_tokens, s = b->n_seqs++, d = m->config.text.hidden_size;
    b->kv[s] = p->kv;
    for (int t = 0; t < p->len; t++) {
        b->ids[n + t] = p->ids[t];
        b->pos[n + t] = p->pos + t;
        b->seq[n + t] = s;
        b->glo[n + t] = b->ghi[n + t] = -1;
    }
    const int bidir = p->prefill ? b->bidir_mode : 0;
    if (bidir) image_groups(b, p, b->glo + n, b->ghi + n);
    g4_text_kv_ranges(m, b->pos + n, b->glo + n, b->ghi + n, p->len, bidir, b->ranges + 4 * n);
    g4_backend *be = m->backend;
    for (int k = 0; k < p->n_media; k++) {
        int r = p->media_rows[k] - p->media_origin;
        if (r < 0 || r >= p->len) continue;
        be->ops->copy(be, b->media_stage + (size_t)b->n_mm * d, p->media_embeds + (size_t)k * d,
                      (size_t)d * sizeof(float));
        b->mm_rows[b->n_mm++] = n + r;
    }
    int first = p->logits == G4_BATCH_ALL_LOGITS ? 0 : p->len - 1;
    for (int t = first; p->logits != G4_BATCH_NO_LOGITS && t < p->len; t++) {
        b->logit_rows[b->n_logit_rows] = n + t;
        b->logit_owner[b->n_logit_rows++] = s;
    }
    b->n_tokens += p->len;
    return s;
}

void g4_batch_finish(g4_batch_builder *b, g4_text_batch *out) {
    int longest = 1;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->kv[s]->n_full > longest) longest = b->kv[s]->n_full;
    /* laid once, at the width the backend asks for (block_table_width: CUDA
     * pads it so that a decode step keeps its recording while tables grow);
     * g4_text_forward uploads them as they are */
    g4_backend *be = b->model->backend;
    const int stride = be->ops->block_table_width(be, longest);
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t *row = b->full_tables + (size_t)s * stride;
        const int n_full = b->kv[s]->n_full;
        memcpy(row, b->kv[s]->full_blocks, (size_t)n_full * sizeof *row);
        memset(row + n_full, 0, (size_t)(stride - n_full) * sizeof *row);
        memcpy(b->sliding_tables + (size_t)s * b->ring_blocks, b->kv[s]->ring, (size_t)b->ring_blocks * sizeof(int32_t));
    }
    *out = (g4_text_batch){
        .n_tokens = b->n_tokens,
        .ids = b->ids,
        .pos = b->pos,
        .seq = b->seq,
        .kv_range = b->ranges,
        .n_seqs = b->n_seqs,
        .full_tables = b->full_tables,
        .full_table_stride = stride,
        .sliding_tables = b->sliding_tables,
        .n_mm = b->n_mm,
        .mm_rows = b->mm_rows,
        .mm_embeds = b->n_mm ? b->media_stage : NULL,
        .n_logit_rows = b->n_logit_rows,
        .logit_rows = b->logit_rows,
    };
}
