/* The default of every fused entry of g4_backend_ops, composed from the
 * primitives exactly as backend.h states the entry's math, and the defaults of
 * the entries a backend without failures, stacking or recording needs no code
 * for. g4_backend_fill_defaults puts them where a backend's table is NULL, so
 * the model never asks whether an op exists. A composition needing a
 * temporary takes it from the backend (alloc/release) for the call. */
#include <stddef.h>

#include "backend/backend.h"

static float *temp_floats(g4_backend *be, size_t n) { return be->ops->alloc(be, (n ? n : 1) * sizeof(float)); }

static g4_status no_status(g4_backend *be) {
    (void)be;
    return G4_OK;
}

static g4_status keep_apart(g4_backend *be, g4_matrix *const *parts, int n, g4_matrix *stacked) {
    (void)be, (void)parts, (void)n, (void)stacked;
    return g4_fail(G4_ERR_UNSUPPORTED, "this backend keeps matrices apart");
}

static g4_status run_step_directly(g4_backend *be, const g4_step_key *key, g4_status (*issue)(void *ctx),
                                   void *ctx) {
    (void)be, (void)key;
    return issue(ctx);
}

static int exact_width(g4_backend *be, int width) {
    (void)be;
    return width;
}

static void matmul_gelu_mul(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w,
                            const float *mul) {
    be->ops->matmul(be, out, x, n_tokens, w);
    be->ops->gelu_mul(be, out, out, mul, (size_t)n_tokens * (size_t)w->rows);
}

static void matmul_gated(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w) {
    const int64_t F = w->rows / 2;
    const g4_matrix gate = g4_matrix_rows(w, 0, F), up = g4_matrix_rows(w, F, F);
    float *up_out = temp_floats(be, (size_t)n_tokens * (size_t)F);
    if (!up_out) return;
    be->ops->matmul(be, up_out, x, n_tokens, &up);
    be->ops->matmul_gelu_mul(be, out, x, n_tokens, &gate, up_out);
    be->ops->release(be, up_out);
}

static void rmsnorm_pair(g4_backend *be, float *out, const float *w, float *out2, const float *w2, const float *x,
                         int rows, int dim, float eps) {
    be->ops->rmsnorm(be, out, x, w, rows, dim, eps);
    be->ops->rmsnorm(be, out2, x, w2, rows, dim, eps);
}

static void rmsnorm_rope(g4_backend *be, float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                         const int32_t *pos, float theta, int n_pairs, float eps) {
    be->ops->rmsnorm(be, x, x, w, n_tokens * n_heads, head_dim, eps);
    be->ops->rope(be, x, n_tokens, n_heads, head_dim, pos, theta, n_pairs);
}

static void add_rmsnorm(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                        float scale, float *next_out, const float *next_w) {
    const size_t n = (size_t)rows * (size_t)dim;
    float *normed = temp_floats(be, n);
    if (!normed) return;
    be->ops->rmsnorm(be, normed, x, w, rows, dim, eps);
    be->ops->add(be, h, h, normed, n);
    be->ops->release(be, normed);
    if (scale != 1.0f) be->ops->scale(be, h, h, scale, n);
    if (next_out) be->ops->rmsnorm(be, next_out, h, next_w, rows, dim, eps);
}

static void add_rmsnorm_moe(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                            float *out, const float *w_out, float *out2, const float *w2, float *out3,
                            const float *w3) {
    be->ops->add_rmsnorm(be, h, x, w, rows, dim, eps, 1.0f, out, w_out);
    be->ops->rmsnorm_pair(be, out2, w2, out3, w3, h, rows, dim, eps);
}

static void moe_residual(g4_backend *be, float *h, float *dense, const float *w_dense, const float *experts,
                         const float *w_experts, const float *w_post, int rows, int dim, float eps, float scale,
                         float *next_out, const float *next_w) {
    be->ops->rmsnorm(be, dense, dense, w_dense, rows, dim, eps);
    be->ops->add_rmsnorm(be, dense, experts, w_experts, rows, dim, eps, 1.0f, NULL, NULL);
    be->ops->add_rmsnorm(be, h, dense, w_post, rows, dim, eps, scale, next_out, next_w);
}

static void moe_route_experts(g4_backend *be, float *out, const float *x, int n, int32_t *ids, float *weights,
                              const float *logits, const float *expert_scale, int n_experts, int k,
                              const g4_expert_matrix *gate, const g4_expert_matrix *up,
                              const g4_expert_matrix *down) {
    be->ops->moe_route(be, ids, weights, logits, expert_scale, n, n_experts, k);
    be->ops->moe_experts(be, out, x, n, ids, weights, k, gate, up, down);
}

/* q, then k and v into the cache, from parts already apart: q [n][Hq*D]
 * (normed in place), k and v [n][Hkv*D] each (both overwritten). */
static void attention_parts(g4_backend *be, float *q, float *k, float *v, const g4_qkv_params *p, void *kv,
                            const g4_attn_batch *b, int sliding) {
    const int n = b->n_tokens, D = p->head_dim;
    be->ops->rmsnorm_rope(be, q, p->q_norm, n, p->n_q_heads, D, b->pos, p->theta, p->n_pairs, p->eps);
    if (!kv || p->n_kv_heads == 0) return;
    be->ops->rmsnorm_rope(be, k, p->k_norm, n, p->n_kv_heads, D, b->pos, p->theta, p->n_pairs, p->eps);
    be->ops->rmsnorm(be, v, v, NULL, n * p->n_kv_heads, D, p->eps);
    be->ops->kv_store(be, kv, k, v, b, sliding);
}

static void qkv_prepare(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                        const g4_attn_batch *b, int sliding) {
    const int n = b->n_tokens, D = p->head_dim;
    const int wq = p->n_q_heads * D, wkv = p->n_kv_heads * D;
    const int width = wq + (p->k_eq_v ? 1 : 2) * wkv;
    be->ops->copy_rows(be, q, wq, qkv, width, n, wq);
    float *kv_rows = kv && wkv ? temp_floats(be, (size_t)2 * n * wkv) : NULL;
    if (kv_rows) {
        float *k = kv_rows, *v = kv_rows + (size_t)n * wkv;
        be->ops->copy_rows(be, k, wkv, qkv + wq, width, n, wkv);
        be->ops->copy_rows(be, v, wkv, qkv + wq + (p->k_eq_v ? 0 : wkv), width, n, wkv);
    }
    attention_parts(be, q, kv_rows, kv_rows ? kv_rows + (size_t)n * wkv : NULL, p, kv_rows ? kv : NULL, b, sliding);
    if (kv_rows) be->ops->release(be, kv_rows);
}

static void attention_input(g4_backend *be, float *q, float *work, const float *x, const g4_matrix_group *w,
                            const g4_qkv_params *p, void *kv, const g4_attn_batch *b, int sliding) {
    const int n = b->n_tokens;
    if (w->stacked && w->stacked->data) {
        be->ops->matmul(be, work, x, n, w->stacked);
        be->ops->qkv_prepare(be, q, work, p, kv, b, sliding);
        return;
    }
    be->ops->matmul(be, q, x, n, w->part[0]);
    if (w->n < 2 || !kv) {
        attention_parts(be, q, NULL, NULL, p, NULL, b, sliding);
        return;
    }
    const size_t kv_elems = (size_t)n * p->n_kv_heads * p->head_dim;
    float *k = work, *v = work + kv_elems;
    be->ops->matmul(be, k, x, n, w->part[1]);
    if (w->n == 2)
        be->ops->copy(be, v, k, kv_elems * sizeof(float)); /* V from the raw k projection */
    else
        be->ops->matmul(be, v, x, n, w->part[2]);
    attention_parts(be, q, k, v, p, kv, b, sliding);
}

static void matmul_gate_up(g4_backend *be, float *out, float *work, const float *x, int n_tokens,
                           const g4_matrix_group *w) {
    if (w->stacked && w->stacked->data) {
        be->ops->matmul_gated(be, out, x, n_tokens, w->stacked);
        return;
    }
    be->ops->matmul(be, work, x, n_tokens, w->part[1]);
    be->ops->matmul_gelu_mul(be, out, x, n_tokens, w->part[0], work);
}

void g4_backend_fill_defaults(g4_backend_ops *o) {
    if (!o->status) o->status = no_status;
    if (!o->prepare_stacked) o->prepare_stacked = keep_apart;
    if (!o->run_step) o->run_step = run_step_directly;
    if (!o->block_table_width) o->block_table_width = exact_width;
    if (!o->matmul_gelu_mul) o->matmul_gelu_mul = matmul_gelu_mul;
    if (!o->matmul_gated) o->matmul_gated = matmul_gated;
    if (!o->matmul_gate_up) o->matmul_gate_up = matmul_gate_up;
    if (!o->rmsnorm_pair) o->rmsnorm_pair = rmsnorm_pair;
    if (!o->rmsnorm_rope) o->rmsnorm_rope = rmsnorm_rope;
    if (!o->add_rmsnorm) o->add_rmsnorm = add_rmsnorm;
    if (!o->add_rmsnorm_moe) o->add_rmsnorm_moe = add_rmsnorm_moe;
    if (!o->moe_residual) o->moe_residual = moe_residual;
    if (!o->moe_route_experts) o->moe_route_experts = moe_route_experts;
    if (!o->qkv_prepare) o->qkv_prepare = qkv_prepare;
    if (!o->attention_input) o->attention_input = attention_input;
}
