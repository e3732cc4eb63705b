#include "model/text_decoder.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Backend buffers for one batch; sized once for `cap` rows. */
struct g4_text_scratch {
    g4_backend *be;
    int counting;       /* 1: sizes are only added up (g4_text_scratch_bytes_for) */
    size_t device_bytes; /* backend memory of the arrays below */
    uint64_t id;        /* the owner of its steps (g4_step_key); never reused */
    int cap, cap_logits, vocab, last_logit_rows;
    int32_t *ids, *ple_ids, *pos, *seq, *kv_range, *mm_rows, *logit_rows;
    int32_t *full_tables, *sliding_tables;
    size_t full_tables_cap, sliding_tables_cap; /* elements */
    float *h, *a, *t1, *q, *attn, *gate, *up;
    float *qkv; /* attention_input's work: n * (Hq + 2 Hkv) * D */
    float *ple_all, *ple_tok, *ple_i, *ple_g;
    float *router_logits, *moe_w, *x2, *x3, *moe_out; /* x2: the router's input, x3: the experts' */
    int32_t *moe_ids;
    float *hsel, *logits;
    /* top_logits output, packed so that one copy brings it back: per call
     * lse [R] doubles, ids [R][k], values [R][k] */
    void *cand, *cand_host;
    int32_t *host_ids; /* placeholder-free ids staged on the host */
};

static size_t candidate_bytes(size_t rows, size_t k) { return rows * (sizeof(double) + k * 8); }

static void *scratch_alloc(g4_text_scratch *s, size_t bytes, int *ok) {
    bytes = bytes ? bytes : 4;
    s->device_bytes += bytes;
    if (s->counting) return NULL;
    void *p = s->be->ops->alloc(s->be, bytes);
    if (!p) *ok = 0;
    return p;
}

/* Every backend array of the scratch, allocated (or, counting, added up). */
static void scratch_arrays(g4_text_scratch *s, const g4_model *m, int max_tokens, int max_logit_rows, int *ok_out) {
    const g4_text_config *tc = &m->config.text;
    int dmax = 0, wmax = 0;
    size_t qkv_width = 0;
    for (int i = 0; i < tc->n_layers; i++) {
        const g4_layer_config *lc = &tc->layers[i];
        const size_t width = (size_t)(tc->n_heads + 2 * lc->n_kv_heads) * (size_t)lc->head_dim;
        if (lc->head_dim > dmax) dmax = lc->head_dim;
        if (lc->mlp_width > wmax) wmax = lc->mlp_width;
        if (width > qkv_width) qkv_width = width;
    }
    if (tc->moe && tc->moe_width > wmax) wmax = tc->moe_width;
    const size_t N = (size_t)max_tokens, d = (size_t)tc->hidden_size, R = (size_t)max_logit_rows;
    const size_t LP = (size_t)tc->n_layers * (size_t)tc->ple_dim;
    int ok = 1;
    s->ids = scratch_alloc(s, N * 4, &ok);
    s->ple_ids = scratch_alloc(s, N * 4, &ok);
    s->pos = scratch_alloc(s, N * 4, &ok);
    s->seq = scratch_alloc(s, N * 4, &ok);
    s->kv_range = scratch_alloc(s, N * 16, &ok);
    s->mm_rows = scratch_alloc(s, N * 4, &ok);
    s->logit_rows = scratch_alloc(s, R * 4, &ok);
    s->h = scratch_alloc(s, N * d * 4, &ok);
    s->a = scratch_alloc(s, N * d * 4, &ok);
    s->t1 = scratch_alloc(s, N * d * 4, &ok);
    s->q = scratch_alloc(s, N * (size_t)tc->n_heads * dmax * 4, &ok);
    s->attn = scratch_alloc(s, N * (size_t)tc->n_heads * dmax * 4, &ok);
    s->qkv = scratch_alloc(s, N * qkv_width * 4, &ok);
    s->gate = scratch_alloc(s, N * (size_t)wmax * 4, &ok);
    s->up = scratch_alloc(s, N * (size_t)wmax * 4, &ok);
    if (LP) {
        s->ple_all = scratch_alloc(s, N * LP * 4, &ok);
        s->ple_tok = scratch_alloc(s, N * LP * 4, &ok);
        s->ple_i = scratch_alloc(s, N * (size_t)tc->ple_dim * 4, &ok);
        s->ple_g = scratch_alloc(s, N * (size_t)tc->ple_dim * 4, &ok);
    }
    if (tc->moe) {
        s->router_logits = scratch_alloc(s, N * (size_t)tc->n_experts * 4, &ok);
        s->moe_ids = scratch_alloc(s, N * (size_t)tc->top_k_experts * 4, &ok);
        s->moe_w = scratch_alloc(s, N * (size_t)tc->top_k_experts * 4, &ok);
        s->x2 = scratch_alloc(s, N * d * 4, &ok);
        s->x3 = scratch_alloc(s, N * d * 4, &ok);
        s->moe_out = scratch_alloc(s, N * d * 4, &ok);
    }
    s->hsel = scratch_alloc(s, R * d * 4, &ok);
    s->logits = scratch_alloc(s, R * (size_t)tc->vocab_size * 4, &ok);
    s->cand = scratch_alloc(s, candidate_bytes(R, G4_TOP_LOGITS_MAX_K), &ok);
    *ok_out = ok;
}

size_t g4_text_scratch_bytes_for(const g4_model *m, int max_tokens, int max_logit_rows) {
    g4_text_scratch s = {.counting = 1};
    int ok;
    scratch_arrays(&s, m, max_tokens, max_logit_rows, &ok);
    return s.device_bytes;
}

size_t g4_text_scratch_bytes(const g4_text_scratch *s) { return s->device_bytes; }

g4_status g4_text_scratch_create(const g4_model *m, int max_tokens, int max_logit_rows, g4_text_scratch **out) {
    *out = NULL;
    const g4_text_config *tc = &m->config.text;
    g4_text_scratch *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    static atomic_uint_fast64_t scratches;
    s->be = m->backend;
    s->id = atomic_fetch_add(&scratches, 1) + 1;
    s->cap = max_tokens;
    s->cap_logits = max_logit_rows;
    s->vocab = tc->vocab_size;
    int ok = 1;
    scratch_arrays(s, m, max_tokens, max_logit_rows, &ok);
    const size_t N = (size_t)max_tokens, R = (size_t)max_logit_rows;
    s->cand_host = malloc(candidate_bytes(R, G4_TOP_LOGITS_MAX_K));
    s->host_ids = malloc(N * 3 * sizeof *s->host_ids);
    if (!ok || !s->host_ids || !s->cand_host) {
        g4_text_scratch_free(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for activations of %d tokens", max_tokens);
    }
    *out = s;
    return G4_OK;
}

void g4_text_scratch_free(g4_text_scratch *s) {
    if (!s) return;
    void *bufs[] = {s->ids, s->ple_ids, s->pos, s->seq, s->kv_range, s->mm_rows, s->logit_rows, s->full_tables,
                    s->sliding_tables, s->h, s->a, s->t1, s->q, s->qkv, s->attn, s->gate, s->up,
                    s->ple_all, s->ple_tok, s->ple_i, s->ple_g, s->router_logits, s->moe_w, s->x2, s->x3, s->moe_out,
                    s->moe_ids, s->hsel, s->logits, s->cand};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) s->be->ops->release(s->be, bufs[i]);
    free(s->host_ids);
    free(s->cand_host);
    free(s);
}

int g4_text_scratch_capacity(const g4_text_scratch *s) { return s->cap; }

/* Grows a backend int32 table buffer to hold n elements and uploads host data. */
static g4_status upload_table(g4_backend *be, int32_t **buf, size_t *cap, const int32_t *host, size_t n) {
    if (n > *cap) {
        if (*buf) be->ops->release(be, *buf);
        size_t c = n < 256 ? 256 : n * 2;
        *buf = be->ops->alloc(be, c * sizeof(int32_t));
        *cap = *buf ? c : 0;
        if (!*buf) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for block tables");
    }
    if (n) be->ops->to_device(be, *buf, host, n * sizeof(int32_t));
    return G4_OK;
}

void g4_text_kv_ranges(const g4_model *m, const int32_t *pos, const int32_t *group_lo, const int32_t *group_hi,
                       int n, int mode, int32_t *kv_range) {
    const int W = m->config.text.sliding_window;
    for (int t = 0; t < n; t++) {
        int p = pos[t];
        int s_lo = p - W + 1 < 0 ? 0 : p - W + 1, s_hi = p;
        int f_lo = 0, f_hi = p;
        int glo = group_lo ? group_lo[t] : -1, ghi = group_hi ? group_hi[t] : -1;
        if (mode && glo >= 0 && ghi > glo) {
            if (mode == 1) {
                /* (causal OR same image) AND kv > p - W, on sliding layers only:
                 * the window bounds the past; later tokens of the same
                 * image are all visible (transformers 5.17) */
                if (ghi - 1 > s_hi) s_hi = ghi - 1;
            } else {
                /* causal-and-window OR same image on sliding layers; causal OR same image on full */
                if (glo < s_lo) s_lo = glo;
                if (ghi - 1 > s_hi) s_hi = ghi - 1;
                if (ghi - 1 > f_hi) f_hi = ghi - 1;
            }
        }
        kv_range[4 * t + 0] = s_lo;
        kv_range[4 * t + 1] = s_hi;
        kv_range[4 * t + 2] = f_lo;
        kv_range[4 * t + 3] = f_hi;
    }
}

static int is_placeholder(const g4_token_ids *tk, int32_t id) {
    return id == tk->image_id || id == tk->video_id || id == tk->audio_id;
}

static void per_layer_inputs(const g4_model *m, g4_text_scratch *s, int n) {
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const g4_text_weights *tw = &m->text;
    const int d = tc->hidden_size, P = tc->ple_dim, L = tc->n_layers;
    const size_t total = (size_t)n * L * P;
    be->ops->embed(be, s->ple_tok, &tw->ple_embed, s->ple_ids, n, tw->ple_embed_scale);
    be->ops->matmul(be, s->ple_all, s->h, n, &tw->ple_model_proj);
    be->ops->scale(be, s->ple_all, s->ple_all, (float)(1.0 / sqrt((double)d)), total);
    be->ops->rmsnorm(be, s->ple_all, s->ple_all, tw->ple_proj_norm, n * L, P, tc->rms_eps);
    be->ops->add(be, s->ple_all, s->ple_all, s->ple_tok, total);
    be->ops->scale(be, s->ple_all, s->ple_all, (float)(1.0 / sqrt(2.0)), total);
}

/* Each block reads its pre-normed input from s->a and leaves the next
 * block's there: the norm rides on the residual add that ends the block
 * before (add_rmsnorm's next_out). */
static void attention_block(const g4_model *m, g4_kv_pool *kv, g4_text_scratch *s, int i, int n,
                            const g4_attn_batch *ab) {
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const g4_layer_config *lc = &tc->layers[i];
    const g4_text_layer *w = &m->text.layers[i];
    const int D = lc->head_dim, Hq = tc->n_heads, Hkv = lc->n_kv_heads;
    const int sliding = lc->kind == G4_LAYER_SLIDING;
    /* q, k, v: their products, norms, RoPE and the cache store */
    const g4_matrix_group qkv = {.part = {&w->q, &w->k, &w->v},
                                 .n = lc->kv_donor >= 0 ? 1 : lc->k_eq_v ? 2 : 3,
                                 .stacked = &w->qkv};
    const g4_qkv_params qp = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .k_eq_v = lc->k_eq_v,
                              .q_norm = w->q_norm, .k_norm = w->k_norm, .theta = lc->rope_theta,
                              .n_pairs = lc->rope_pairs, .eps = tc->rms_eps};
    be->ops->attention_input(be, s->q, s->qkv, s->a, &qkv, &qp, lc->kv_donor >= 0 ? NULL : kv->layer_kv[i], ab,
                             sliding);
    const int cache_layer = lc->kv_donor >= 0 ? lc->kv_donor : i;
    be->ops->attention(be, s->attn, s->q, kv->layer_kv[cache_layer], ab, sliding, Hq, 1.0f);
    be->ops->matmul(be, s->t1, s->attn, n, &w->o);
    if (tc->moe) /* the router's and the experts' inputs too */
        be->ops->add_rmsnorm_moe(be, s->h, s->t1, w->post_attn_norm, n, tc->hidden_size, tc->rms_eps, s->a,
                                 w->pre_ffn_norm, s->x2, w->router_scale, s->x3, w->pre_ffn_norm2);
    else
        be->ops->add_rmsnorm(be, s->h, s->t1, w->post_attn_norm, n, tc->hidden_size, tc->rms_eps, 1.0f, s->a,
                             w->pre_ffn_norm);
}

/* scale: the layer's scalar when this block ends the layer, else 1;
 * next_norm: the weight of the norm to leave in s->a, or NULL for none */
static void feed_forward_block(const g4_model *m, g4_text_scratch *s, int i, int n, float scale,
                               const float *next_norm) {
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const g4_text_layer *w = &m->text.layers[i];
    const int d = tc->hidden_size;
    const g4_matrix_group gate_up = {.part = {&w->gate, &w->up}, .n = 2, .stacked = &w->gate_up};
    be->ops->matmul_gate_up(be, s->gate, s->up, s->a, n, &gate_up);
    be->ops->matmul(be, s->t1, s->gate, n, &w->down);
    if (tc->moe) {
        /* dense branch, then the routed experts beside it: the router reads
         * x2 and the experts x3, the attention's residual step's two other
         * norms of h (add_rmsnorm_moe) */
        be->ops->matmul(be, s->router_logits, s->x2, n, &w->router);
        be->ops->moe_route_experts(be, s->moe_out, s->x3, n, s->moe_ids, s->moe_w, s->router_logits,
                                   w->per_expert_scale, tc->n_experts, tc->top_k_experts, &w->expert_gate,
                                   &w->expert_up, &w->expert_down);
        /* both branches normed and summed, then the residual step */
        be->ops->moe_residual(be, s->h, s->t1, w->post_ffn_norm1, s->moe_out, w->post_ffn_norm2, w->post_ffn_norm, n,
                              d, tc->rms_eps, scale, next_norm ? s->a : NULL, next_norm);
        return;
    }
    be->ops->add_rmsnorm(be, s->h, s->t1, w->post_ffn_norm, n, d, tc->rms_eps, scale, next_norm ? s->a : NULL,
                         next_norm);
}

/* ends the layer: applies its scalar (next_norm as in feed_forward_block) */
static void per_layer_embedding_block(const g4_model *m, g4_text_scratch *s, int i, int n, const float *next_norm) {
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const g4_text_layer *w = &m->text.layers[i];
    const int d = tc->hidden_size, P = tc->ple_dim, L = tc->n_layers;
    /* this layer's slice of the per-layer inputs, as rows of their own (one
     * token: the slice already is one) */
    const float *ple_i = s->ple_all + (size_t)i * P;
    if (n > 1) {
        be->ops->copy_rows(be, s->ple_i, P, ple_i, L * P, n, P);
        ple_i = s->ple_i;
    }
    be->ops->matmul_gelu_mul(be, s->ple_g, s->h, n, &w->ple_gate, ple_i);
    be->ops->matmul(be, s->t1, s->ple_g, n, &w->ple_proj);
    be->ops->add_rmsnorm(be, s->h, s->t1, w->ple_post_norm, n, d, tc->rms_eps, w->layer_scalar,
                         next_norm ? s->a : NULL, next_norm);
}

/* One forward pass as run_step issues it. */
typedef struct {
    const g4_model *m;
    g4_kv_pool *kv;
    g4_text_scratch *s;
    const g4_text_batch *b;
} forward_step;

/* Everything after the uploads: embeddings through the logits, all on
 * backend buffers (host memory only where the batch asks: soft tokens,
 * hooks, hidden-state copies; the step key says so). */
static g4_status run_ops(void *ctx) {
    const forward_step *f = ctx;
    const g4_model *m = f->m;
    g4_kv_pool *kv = f->kv;
    g4_text_scratch *s = f->s;
    const g4_text_batch *b = f->b;
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const int n = b->n_tokens, d = tc->hidden_size;
    g4_attn_batch ab = {
        .n_tokens = n,
        .pos = s->pos,
        .seq = s->seq,
        .kv_range = s->kv_range,
        .full_tables = s->full_tables,
        .full_table_stride = f->b->full_table_stride,
        .sliding_tables = s->sliding_tables,
        .ring_blocks = kv->ring_blocks,
        .block_size = kv->block_size,
    };

    be->ops->embed(be, s->h, &m->text.embed, s->ids, n, m->text.embed_scale);
    if (b->n_mm > 0) {
        if (b->n_mm > n) return g4_fail(G4_ERR_INVALID_ARGUMENT, "more soft tokens than rows");
        be->ops->to_device(be, s->mm_rows, b->mm_rows, (size_t)b->n_mm * 4);
        be->ops->scatter_rows(be, s->h, s->mm_rows, b->mm_embeds, b->n_mm, d);
    }
    if (b->hook) b->hook(b->hook_ctx, "embed", s->h, n, d);
    if (tc->ple_dim > 0) per_layer_inputs(m, s, n);
    be->ops->rmsnorm(be, s->a, s->h, m->text.layers[0].input_norm, n, d, tc->rms_eps);
    for (int i = 0; i < tc->n_layers; i++) {
        attention_block(m, kv, s, i, n, &ab);
        const int ple = tc->ple_dim > 0;
        const float *next_norm = i + 1 < tc->n_layers ? m->text.layers[i + 1].input_norm : NULL;
        if (ple) {
            feed_forward_block(m, s, i, n, 1.0f, NULL);
            per_layer_embedding_block(m, s, i, n, next_norm);
        } else {
            feed_forward_block(m, s, i, n, m->text.layers[i].layer_scalar, next_norm);
        }
        if (b->hook && i == 0) b->hook(b->hook_ctx, "layer0", s->h, n, d);
    }
    if (b->hook) {
        b->hook(b->hook_ctx, "last_prenorm", s->h, n, d);
        be->ops->rmsnorm(be, s->a, s->h, m->text.final_norm, n, d, tc->rms_eps);
        b->hook(b->hook_ctx, "final_norm", s->a, n, d);
    }
    if (b->n_logit_rows > 0) {
        const int R = b->n_logit_rows;
        be->ops->gather_rows(be, s->hsel, s->h, s->logit_rows, R, d);
        be->ops->rmsnorm(be, s->hsel, s->hsel, m->text.final_norm, R, d, tc->rms_eps);
        be->ops->matmul(be, s->logits, s->hsel, R, &m->text.embed);
        if (tc->final_softcap > 0)
            be->ops->softcap(be, s->logits, (size_t)R * tc->vocab_size, tc->final_softcap);
        if (b->n_candidates > 0 && !b->mask_bits) { /* masked: after the masks come (g4_text_forward) */
            const int k = b->n_candidates;
            double *lse = s->cand;
            int32_t *ids = (int32_t *)(lse + R);
            float *values = (float *)(ids + (size_t)R * k);
            be->ops->top_logits(be, ids, values, lse, s->logits, R, tc->vocab_size, k);
        }
    }
    return G4_OK;
}

g4_status g4_text_forward(const g4_model *m, g4_kv_pool *kv, g4_text_scratch *s, const g4_text_batch *b) {
    g4_backend *be = m->backend;
    const g4_text_config *tc = &m->config.text;
    const g4_token_ids *tk = &m->config.tokens;
    const int n = b->n_tokens;
    if (n <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "empty batch: no tokens to run");
    if (n > s->cap || b->n_logit_rows > s->cap_logits)
        return g4_fail(G4_ERR_LIMIT, "batch of %d tokens / %d logit rows exceeds the scratch capacity %d / %d", n,
                       b->n_logit_rows, s->cap, s->cap_logits);
    for (int t = 0; t < n; t++) {
        if (b->ids[t] < 0 || b->ids[t] >= tc->vocab_size)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "token id %d (row %d) is outside the vocabulary [0, %d)",
                           b->ids[t], t, tc->vocab_size);
    }
    if (b->n_candidates < 0 || b->n_candidates > G4_TOP_LOGITS_MAX_K ||
        (b->n_candidates > 0 && (!b->cand_ids || !b->cand_values || !b->cand_lse)))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d candidates per logit row asked (1..%d, with host outputs)",
                       b->n_candidates, G4_TOP_LOGITS_MAX_K);
    /* (masks come only from a runtime that found the backend's top_logits_masked) */
    if (b->mask_bits && (b->n_candidates <= 0 || !b->mask_slot || b->mask_words <= 0))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "token masks need candidates and mask slots");
    for (int r = 0; r < b->n_logit_rows; r++)
        if (b->logit_rows[r] < 0 || b->logit_rows[r] >= n)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "logit row %d outside the batch", b->logit_rows[r]);
    /* Placeholders embed as pad (their rows are overwritten by soft tokens)
     * and feed pad to the per-layer embeddings, as transformers does. */
    int32_t *embed_ids = s->host_ids;
    for (int t = 0; t < n; t++) embed_ids[t] = is_placeholder(tk, b->ids[t]) ? tk->pad_id : b->ids[t];
    be->ops->to_device(be, s->ids, embed_ids, (size_t)n * 4);
    be->ops->to_device(be, s->pos, b->pos, (size_t)n * 4);
    be->ops->to_device(be, s->kv_range, b->kv_range, (size_t)n * 16);
    if (b->seq) {
        be->ops->to_device(be, s->seq, b->seq, (size_t)n * 4);
    } else {
        int32_t *zeros = s->host_ids + n;
        memset(zeros, 0, (size_t)n * sizeof *zeros);
        be->ops->to_device(be, s->seq, zeros, (size_t)n * 4);
    }
    forward_step f = {.m = m, .kv = kv, .s = s, .b = b};
    g4_status st = upload_table(be, &s->full_tables, &s->full_tables_cap, b->full_tables,
                                (size_t)b->n_seqs * b->full_table_stride);
    if (st == G4_OK)
        st = upload_table(be, &s->sliding_tables, &s->sliding_tables_cap, b->sliding_tables,
                          (size_t)b->n_seqs * kv->ring_blocks);
    if (st != G4_OK) return st;
    if (b->n_logit_rows) be->ops->to_device(be, s->logit_rows, b->logit_rows, (size_t)b->n_logit_rows * 4);
    if (tc->ple_dim > 0) {
        /* ids beyond the per-layer vocabulary read row 0, as transformers masks them */
        int32_t *ple_ids = s->host_ids + 2 * n;
        for (int t = 0; t < n; t++) ple_ids[t] = embed_ids[t] < tc->ple_vocab ? embed_ids[t] : 0;
        be->ops->to_device(be, s->ple_ids, ple_ids, (size_t)n * 4);
    }

    /* what the step's ops depend on: its shape and the buffers that may move */
    const g4_step_key key = {
        .owner = s->id,
        .n_tokens = n,
        .shape = {b->n_logit_rows, b->n_candidates, b->full_table_stride, kv->ring_blocks,
                  b->mask_bits != NULL}, /* masked: candidates chosen after the step */
        .buffers = {s->full_tables, s->sliding_tables, kv},
        .direct = b->n_mm > 0 || b->hook,
    };
    st = be->ops->run_step(be, &key, run_ops, &f);
    if (st == G4_OK && b->n_logit_rows > 0 && b->n_candidates > 0 && b->mask_bits) {
        if (b->masks_ready) b->masks_ready(b->masks_ctx);
        const int R = b->n_logit_rows, k = b->n_candidates;
        double *lse = s->cand;
        int32_t *ids = (int32_t *)(lse + R);
        float *values = (float *)(ids + (size_t)R * k);
        be->ops->top_logits_masked(be, ids, values, lse, s->logits, R, tc->vocab_size, k, b->mask_bits,
                                   b->mask_words, b->mask_slot);
    }
    s->last_logit_rows = st == G4_OK ? b->n_logit_rows : 0;
    /* the logit rows' final-normed states stay in hsel after the step: copied
     * here, not by the step's ops, so a step that wants them (a drafter's
     * input) still replays its recording */
    if (st == G4_OK && b->n_logit_rows > 0 && b->hidden_out)
        be->ops->to_host(be, b->hidden_out, s->hsel, (size_t)b->n_logit_rows * tc->hidden_size * sizeof(float));
    if (st == G4_OK && b->n_logit_rows > 0 && b->logits)
        be->ops->to_host(be, b->logits, s->logits, (size_t)b->n_logit_rows * tc->vocab_size * sizeof(float));
    if (st == G4_OK && b->n_logit_rows > 0 && b->n_candidates > 0) {
        const size_t R = (size_t)b->n_logit_rows, k = (size_t)b->n_candidates;
        be->ops->to_host(be, s->cand_host, s->cand, candidate_bytes(R, k));
        const double *lse = s->cand_host;
        const int32_t *ids = (const int32_t *)(lse + R);
        const float *values = (const float *)(ids + R * k);
        memcpy(b->cand_lse, lse, R * sizeof *lse);
        memcpy(b->cand_ids, ids, R * k * sizeof *ids);
        memcpy(b->cand_values, values, R * k * sizeof *values);
    }
    /* a failed backend op leaves garbage behind: never return it as results */
    if (st == G4_OK) st = be->ops->status(be);
    return st;
}

g4_status g4_text_scratch_logits(g4_text_scratch *s, int row, float *logits) {
    if (row < 0 || row >= s->last_logit_rows)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "logit row %d: the last batch produced %d", row, s->last_logit_rows);
    s->be->ops->to_host(s->be, logits, s->logits + (size_t)row * s->vocab, (size_t)s->vocab * sizeof(float));
    return s->be->ops->status(s->be);
}
