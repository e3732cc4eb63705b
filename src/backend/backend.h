/* The backend interface: every numeric operation the models perform.
 *
 * Model code never calls a kernel directly; it calls these entries through a
 * g4_backend. CPU and CUDA implement the same table and are tested against
 * each other op by op. Activations cross this interface as float32 arrays in
 * the backend's memory ("device pointers": host memory on the CPU backend).
 * Shapes are row-major; "rows x dim" means rows contiguous vectors of dim.
 *
 * Attention reads a paged KV cache: positions live in fixed-size blocks of a
 * per-layer pool; a sequence's block table maps its logical blocks to pool
 * blocks. Full-attention layers use a linear table (block b = pos / bs);
 * sliding layers use a ring (block (pos / bs) % ring_blocks), so a sequence
 * holds at most window + chunk positions there. */
#ifndef G4_BACKEND_BACKEND_H
#define G4_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/matrix.h"

/* Where each query row of a batch sits and what it may see. All arrays are
 * backend memory. */
typedef struct {
    int n_tokens;
    const int32_t *pos;       /* [n_tokens] absolute position in its sequence */
    const int32_t *seq;       /* [n_tokens] row of the block tables */
    /* [n_tokens][4]: visible key positions, inclusive, for sliding layers
     * (lo, hi) then full layers (lo, hi). Causal, window and bidirectional
     * image rules all reduce to one contiguous range per token. */
    const int32_t *kv_range;
    const int32_t *full_tables;    /* [n_seqs][full_table_stride] */
    int full_table_stride;
    const int32_t *sliding_tables; /* [n_seqs][ring_blocks] */
    int ring_blocks;
    int block_size;
} g4_attn_batch;

typedef struct g4_backend g4_backend;

typedef struct {
    const char *name;
    void (*destroy)(g4_backend *be);

    /* memory */
    void *(*alloc)(g4_backend *be, size_t bytes);      /* NULL on failure */
    void (*release)(g4_backend *be, void *ptr);
    void (*to_device)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(g4_backend *be, void *dst, const void *src, size_t bytes);
    /* Makes a host-resident weight usable by this backend (may copy it to the
     * device and rewrite its pointers). */
    g4_status (*prepare_matrix)(g4_backend *be, g4_matrix *m);
    /* Waits for queued work (no-op on CPU). */
    void (*synchronize)(g4_backend *be);

    /* out[t][r] = sum_c W[r][c] x[t][c] */
    void (*matmul)(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
    /* out[i][:] = row ids[i] of table, times scale. ids are backend memory. */
    void (*embed)(g4_backend *be, float *out, const g4_matrix *table, const int32_t *ids, int n, float scale);
    /* y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no scale), per row. In place allowed. */
    void (*rmsnorm)(g4_backend *be, float *out, const float *x, const float *w, int rows, int dim, float eps);
    /* Rotates each head of x[n_tokens][n_heads][head_dim] in place ("rotate half"
     * pairing j with j + head_dim/2) for positions pos[t]: the first n_pairs
     * frequencies theta^(-2j/head_dim) rotate, the rest pass through. */
    void (*rope)(g4_backend *be, float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
                 float theta, int n_pairs);
    /* out = gelu_tanh(gate) * up, elementwise */
    void (*gelu_mul)(g4_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* out = a + b */
    void (*add)(g4_backend *be, float *out, const float *a, const float *b, size_t n);
    /* out = a * s (s a scalar) */
    void (*scale)(g4_backend *be, float *out, const float *a, float s, size_t n);
    /* out[r][c] = a[r][c] * v[c] (broadcast a vector over rows) */
    void (*mul_rows)(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
    /* out[r][c] = a[r][c] * b[r][c] */
    void (*mul)(g4_backend *be, float *out, const float *a, const float *b, size_t n);
    /* x = cap * tanh(x / cap) */
    void (*softcap)(g4_backend *be, float *x, size_t n, float cap);
    /* dst[i][:] = src[rows[i]][:]; rows are backend memory. */
    void (*gather_rows)(g4_backend *be, float *dst, const float *src, const int32_t *rows, int n, int dim);
    /* dst[rows[i]][:] = src[i][:]; rows are backend memory. */
    void (*scatter_rows)(g4_backend *be, float *dst, const int32_t *rows, const float *src, int n, int dim);
    /* dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < cols */
    void (*copy_rows)(g4_backend *be, float *dst, int dst_stride, const float *src, int src_stride, int rows,
                      int cols);

    /* KV cache: a pool of n_blocks * block_size slots of [n_kv_heads][head_dim]
     * for K and the same for V. Opaque to the model. */
    void *(*kv_alloc)(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim);
    void (*kv_free)(g4_backend *be, void *kv);
    /* Writes k[t], v[t] ([n_tokens][n_kv_heads][head_dim]) at each token's slot. */
    void (*kv_store)(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b,
                     int sliding);
    /* out[t][h] = softmax_j(q[t][h] . K[j] * scale) V[j] over the token's
     * visible range, kv head = h / (n_heads / n_kv_heads). */
    void (*attention)(g4_backend *be, float *out, const float *q, const void *kv, const g4_attn_batch *b,
                      int sliding, int n_heads, float scale);

    /* MoE routing: softmax over router logits [n][n_experts], top-k, renormalise,
     * times per_expert_scale. ids/weights are [n][k] backend memory. */
    void (*moe_route)(g4_backend *be, int32_t *ids, float *weights, const float *logits, const float *expert_scale,
                      int n, int n_experts, int k);
    /* out[t] = sum_j weights[t][j] * down_e(gelu(gate_e x[t]) * up_e x[t]), e = ids[t][j]. */
    void (*moe_experts)(g4_backend *be, float *out, const float *x, int n, const int32_t *ids, const float *weights,
                        int k, const g4_expert_matrix *gate, const g4_expert_matrix *up,
                        const g4_expert_matrix *down);

    /* vision tower */
    /* x = min(max(x, lo), hi) */
    void (*clamp)(g4_backend *be, float *x, size_t n, float lo, float hi);
    /* out = a * s + b (scalars) */
    void (*affine)(g4_backend *be, float *out, const float *a, float s, float b, size_t n);
    /* out[r][c] = a[r][c] + v[c] */
    void (*add_rows)(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
    /* 2-D RoPE of x[n][n_heads][head_dim] in place: channels [0, head_dim/2)
     * rotate by position pos_xy[t][0] and [head_dim/2, head_dim) by
     * pos_xy[t][1], each half as "rotate half" RoPE of size head_dim/2 with
     * frequencies theta^(-2j/(head_dim/2)). pos_xy is backend memory. */
    void (*rope_2d)(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta);
    /* out[slot[r]][:] += in[r][:] * scale for r < n_in, out zeroed first
     * ([n_out][dim]); rows with slot < 0 are skipped. slot is backend memory. */
    void (*pool_rows)(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                      float scale);
} g4_backend_ops;

struct g4_backend {
    const g4_backend_ops *ops;
    void *impl;
};

/* Creates the CPU backend (threads: 0 = all cores). */
g4_status g4_backend_cpu_create(int threads, g4_backend **out);
/* Creates the CUDA backend on device `device` (G4_ERR_UNSUPPORTED without a GPU). */
g4_status g4_backend_cuda_create(int device, g4_backend **out);
void g4_backend_destroy(g4_backend *be);

#endif
