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
 * holds at most window + chunk positions there.
 *
 * Fused entries ("exactly X then Y") have defaults composed from the
 * primitives (backend_defaults.c): a backend implements what it can do
 * better and g4_backend_fill_defaults completes its table at creation, so
 * every entry is always there and the model issues one sequence of calls
 * whatever the backend. */
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

/* Matrices that read the same input, as the loader left them: parts[0..n)
 * (a layer's q, k, v; its gate, up) and, when the backend chose to stack
 * them at upload (prepare_stacked), *stacked with their rows in order (the
 * parts are then views of it); else stacked->data is NULL. */
typedef struct {
    const g4_matrix *part[3];
    int n;
    const g4_matrix *stacked;
} g4_matrix_group;

/* What a step's ops depend on besides the contents of its buffers (see
 * run_step). Keys are equal when every field is. */
typedef struct {
    uint64_t owner;          /* who issues it (a scratch's id; never reused) */
    int n_tokens;            /* rows of the batch */
    int shape[6];            /* the rest of the step's shape, as its owner counts it */
    const void *buffers[4];  /* buffers it reads whose addresses may change between steps */
    int direct;              /* 1: issue also reads or writes host memory (hooks, copies out): never recorded */
} g4_step_key;

/* The element type of a KV cache pool. F32: the verification path's. BF16:
 * K and V rounded to bf16 (half the bytes). FP8: fp8 e4m3 (tensor/fp8.h)
 * with one float32 scale per stored row of head_dim values (slot, KV head),
 * the row's peak / 448, so a row uses the whole e4m3 range whatever its
 * magnitude (a quarter of the bytes plus 4 per row). AUTO is for option
 * structs (the caller's default); kv_alloc never sees it. Attention reads
 * each type where it lies (no conversion pass). */
typedef enum { G4_KV_AUTO = 0, G4_KV_F32, G4_KV_BF16, G4_KV_FP8 } g4_kv_type;

/* How the products are computed. EXACT: about float32 accuracy everywhere —
 * the verification path, which the fixture tests use and a new backend starts
 * in. FAST: the precision a trained model needs, measured by KL divergence
 * against EXACT (README, "Precision"): on CUDA one bf16 tensor-core product
 * per prefill GEMM instead of a hi + lo split. Decode is the same in both. */
typedef enum { G4_PRECISION_EXACT = 0, G4_PRECISION_FAST = 1 } g4_precision;

/* The most candidates top_logits gives per row. */
#define G4_TOP_LOGITS_MAX_K 1024

/* The attention input of one layer for qkv_prepare: rows of the merged
 * projection [n_tokens][q | k | v], q = n_q_heads heads, k and v n_kv_heads
 * heads each (no v part when k_eq_v: V is then the raw k part; no k or v
 * when n_kv_heads is 0), every head head_dim wide. */
typedef struct {
    int n_q_heads, n_kv_heads, head_dim;
    int k_eq_v;
    const float *q_norm, *k_norm; /* [head_dim] backend arrays; NULL = no scale */
    float theta;                  /* RoPE of q and k, as the rope op */
    int n_pairs;
    float eps;
} g4_qkv_params;

/* Chunked local attention (audio tower). Frames are split into blocks of
 * `chunk`; query frame i sits in block b = i / chunk at row w = i % chunk.
 * Block b's context is the W = chunk + past + future frames
 * j = b*chunk - past + c, c in [0, W) (frames outside [0, T) read as zero
 * vectors). For each head h and each c:
 *   logit[c] = q[i][h] . k[j][h]
 *            + (0 <= c - w < n_rel ? q[i][h] . rel_k[c - w][h] : 0)
 *   logit[c] = logit_cap * tanh(logit[c] / logit_cap)      (skipped if logit_cap <= 0)
 *   logit[c] = invalid_logit unless 0 <= j < T, valid[j] and
 *              -max_future_dist <= i - j <= max_past_dist
 *   out[i][h] = sum_c softmax(logit)[c] * v[j][h]
 * The softmax runs over all W context slots, masked ones included (they
 * get exp(invalid_logit - max), i.e. 0 unless every slot is masked, when
 * the weights are uniform, as in transformers). rel_k[r] is the relative
 * key of distance i - j = past - r (the "c - w" indexing is transformers'
 * _rel_shift; it equals it exactly while n_rel <= past + future + 2).
 * invert_mask (validation only): a slot is instead visible iff
 * 0 <= j < T and NOT (valid[j] and the distance rule) -- what transformers
 * 5.17 computes with attn_implementation="eager" (a bug), so that the
 * references made that way can be matched. */
typedef struct {
    int n_frames;          /* T */
    int n_heads, head_dim;
    int chunk, past, future;
    int n_rel;
    int max_past_dist, max_future_dist;
    float logit_cap;       /* e.g. 50 */
    float invalid_logit;   /* e.g. -1e9 */
    int invert_mask;       /* 0 for inference; see above */
} g4_chunked_attn_params;

typedef struct {
    const char *name;
    void (*destroy)(g4_backend *be);
    /* Chooses the kernels of every later op (see g4_precision). */
    void (*set_precision)(g4_backend *be, g4_precision precision);

    /* memory */
    void *(*alloc)(g4_backend *be, size_t bytes);      /* NULL on failure */
    void (*release)(g4_backend *be, void *ptr);
    void (*to_device)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(g4_backend *be, void *dst, const void *src, size_t bytes);
    /* Makes a host-resident weight usable by this backend (may copy it to the
     * device and rewrite its pointers). */
    g4_status (*prepare_matrix)(g4_backend *be, g4_matrix *m);
    /* Prepares host-resident parts[0..n) (one format and width) as
     * prepare_matrix does, placed one after the other so that *stacked,
     * their rows in order, is a matrix too; each part becomes a view of it
     * (no extra memory). The backend's choice: G4_ERR_UNSUPPORTED, nothing
     * prepared, when it keeps them apart (the default; the CPU, whose weights
     * stay in the memory map, where stacking would copy them) or cannot
     * stack them; the loader then prepares each part alone. */
    g4_status (*prepare_stacked)(g4_backend *be, g4_matrix *const *parts, int n, g4_matrix *stacked);
    /* Waits for queued work (no-op on CPU). */
    void (*synchronize)(g4_backend *be);
    /* Ops return nothing, so a backend that can fail (a CUDA launch, an
     * out-of-memory scratch buffer) keeps its first failure; this returns it
     * as an error (G4_OK when none: the default, for backends whose ops
     * cannot fail). Work still queued may fail later: call after a copy to
     * the host to cover everything before it. */
    g4_status (*status)(g4_backend *be);

    /* One step of a model (a forward pass): issue(ctx) issues its ops. The
     * backend may record the ops of a key's first runs and replay the
     * recording for later runs of an equal key (the CUDA backend's graphs),
     * reading whatever the same buffers then hold; replay runs exactly the
     * kernels issue would. So issue's ops must depend only on the key: its
     * shapes and the buffer addresses that may differ between steps. The
     * default (CPU) calls issue. Returns issue's status. */
    g4_status (*run_step)(g4_backend *be, const g4_step_key *key, g4_status (*issue)(void *ctx), void *ctx);
    /* The row width of the block tables a step should use when its longest
     * table has `width` entries (>= width). The default is width; the CUDA
     * backend rounds up to a power of two, so that decode steps keep one key
     * (and one recording) while their sequences grow. */
    int (*block_table_width)(g4_backend *be, int width);

    /* out[t][r] = sum_c W[r][c] x[t][c] */
    void (*matmul)(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
    /* out[t][r] = gelu_tanh((W x[t])[r]) * mul[t][r]: matmul then gelu_mul,
     * fused where the backend can (a gated MLP's gate projection). */
    void (*matmul_gelu_mul)(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w,
                            const float *mul);
    /* A gated MLP's two projections as one matrix, w = gate rows then up
     * rows (rows even, F = rows / 2): out[t][r] = gelu_tanh((W x[t])[r]) *
     * (W x[t])[F + r] for r < F: matmul then gelu_mul (the default takes a
     * temporary for the up rows); one kernel on CUDA. */
    void (*matmul_gated)(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
    /* A gated MLP's input from w = gate, up (n 2): out[t][r] =
     * gelu_tanh((Wgate x[t])[r]) * (Wup x[t])[r]. work: n_tokens * rows
     * floats of scratch. The default: matmul_gated where w is stacked, else
     * matmul (up) then matmul_gelu_mul (gate). */
    void (*matmul_gate_up)(g4_backend *be, float *out, float *work, const float *x, int n_tokens,
                           const g4_matrix_group *w);
    /* The same with smaller rounding error where the backend has a way (CPU:
     * float64 sums across runs of 32 columns). The vision tower uses it: its
     * float32 error is what the decoder amplifies most. */
    void (*matmul_precise)(g4_backend *be, float *out, const float *x, int n_tokens, const g4_matrix *w);
    /* out[i][:] = row ids[i] of table, times scale. ids are backend memory. */
    void (*embed)(g4_backend *be, float *out, const g4_matrix *table, const int32_t *ids, int n, float scale);
    /* y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no scale), per row. In place allowed. */
    void (*rmsnorm)(g4_backend *be, float *out, const float *x, const float *w, int rows, int dim, float eps);
    /* Two weights on one norm: out = rmsnorm(x) * w, out2 = rmsnorm(x) * w2
     * (either weight may be NULL); x must overlap neither output. */
    void (*rmsnorm_pair)(g4_backend *be, float *out, const float *w, float *out2, const float *w2, const float *x,
                         int rows, int dim, float eps);
    /* Rotates each head of x[n_tokens][n_heads][head_dim] in place ("rotate half"
     * pairing j with j + head_dim/2) for positions pos[t]: the first n_pairs
     * frequencies theta^(-2j/head_dim) rotate, the rest pass through. */
    void (*rope)(g4_backend *be, float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos,
                 float theta, int n_pairs);
    /* rmsnorm of each head (weight w, may be NULL) then rope, in place:
     * exactly rmsnorm(x, x, w, n_tokens * n_heads, head_dim, eps) followed
     * by rope(x, ...), in one pass (the q/k norms before RoPE). */
    void (*rmsnorm_rope)(g4_backend *be, float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                         const int32_t *pos, float theta, int n_pairs, float eps);
    /* The residual step after a post-norm: per row,
     * h = (h + rmsnorm(x) * w) * scale (x unchanged; scale 1 = no scaling),
     * then, when next_out is not NULL, next_out = rmsnorm(h) * next_w (the
     * next block's pre-norm; next_w may be NULL). Exactly rmsnorm into a
     * temporary, add, scale, rmsnorm, in one pass. */
    void (*add_rmsnorm)(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                        float scale, float *next_out, const float *next_w);
    /* A MoE layer's attention residual step and the three norms its feed-forward block
     * takes of the new h, in one pass: add_rmsnorm(h, x, w, rows, dim, eps,
     * 1, out, w_out), then rmsnorm_pair(out2, w2, out3, w3, h, ...); exactly
     * those bits. */
    void (*add_rmsnorm_moe)(g4_backend *be, float *h, const float *x, const float *w, int rows, int dim, float eps,
                            float *out, const float *w_out, float *out2, const float *w2, float *out3,
                            const float *w3);
    /* The end of a MoE layer's feed-forward block, per row: dense =
     * rmsnorm(dense) * w_dense + rmsnorm(experts) * w_experts, then the
     * residual step add_rmsnorm(h, dense, w_post, ..., scale, next_out,
     * next_w). Exactly rmsnorm then add_rmsnorm twice, in one pass. */
    void (*moe_residual)(g4_backend *be, float *h, float *dense, const float *w_dense, const float *experts,
                         const float *w_experts, const float *w_post, int rows, int dim, float eps, float scale,
                         float *next_out, const float *next_w);
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
    /* Sampling support: per row of logits [rows][vocab], the k largest
     * logits ordered by value descending, equal values by ascending id,
     * into ids[rows][k] and values[rows][k] (the logits' own bits; slots
     * beyond the vocabulary get id -1 and -inf), and the row's log-sum-exp
     * m + log(sum_i exp(x_i - m)), m the row's maximum (= values[r][0]), into
     * lse[rows] (double: log-probabilities are formed in double). A row
     * holding a NaN gets lse NaN (its ids/values are then unspecified but
     * within the vocabulary or -1). k <= G4_TOP_LOGITS_MAX_K. So only k
     * pairs per row cross to the host instead of the whole row. */
    void (*top_logits)(g4_backend *be, int32_t *ids, float *values, double *lse, const float *logits, int rows,
                       int vocab, int k);

    /* KV cache: a pool of n_blocks * block_size slots of [n_kv_heads][head_dim]
     * for K and the same for V, in `type` (F32, BF16 or FP8; NULL for AUTO or
     * out of memory). Opaque to the model; kv_store and qkv_prepare round
     * what they write to the type, kv_read returns the stored values. */
    void *(*kv_alloc)(g4_backend *be, int n_blocks, int block_size, int n_kv_heads, int head_dim, g4_kv_type type);
    void (*kv_free)(g4_backend *be, void *kv);
    /* Writes k[t], v[t] ([n_tokens][n_kv_heads][head_dim]) at each token's slot. */
    void (*kv_store)(g4_backend *be, void *kv, const float *k, const float *v, const g4_attn_batch *b,
                     int sliding);
    /* The inverse of kv_store: k[t], v[t] read back from each token's slot
     * (tests and inspection). */
    void (*kv_read)(g4_backend *be, const void *kv, float *k, float *v, const g4_attn_batch *b, int sliding);
    /* Block dst[i] of the pool takes a copy of block src[i], K and V, for
     * i < n (host arrays; no dst is also a src). Whole blocks as opaque
     * storage, whatever the element type: what the prefix cache saves and
     * restores sliding windows with. */
    void (*kv_copy_blocks)(g4_backend *be, void *kv, const int32_t *src, const int32_t *dst, int n);
    /* Blocks blocks[0..n) of the pool to host memory and back (the prefix
     * cache's host-RAM tier): block after block, each its K values, its V
     * values and (FP8) its K and V row scales, block_size * n_kv_heads * 2 *
     * g4_kv_row_bytes(type, head_dim) bytes. kv_save_blocks returns once host
     * holds them; kv_load_blocks once host may be reused. */
    void (*kv_save_blocks)(g4_backend *be, const void *kv, const int32_t *blocks, int n, void *host);
    void (*kv_load_blocks)(g4_backend *be, void *kv, const int32_t *blocks, int n, const void *host);
    /* A layer's attention input from its merged projection qkv (rows as
     * g4_qkv_params describes) in one pass, exactly as the sequence
     *   q = rmsnorm_rope(q part, q_norm); k = rmsnorm_rope(k part, k_norm);
     *   v = rmsnorm(v part (k_eq_v: the raw k part), no weight);
     *   kv_store(kv, k, v, b, sliding)
     * with positions b->pos of b->n_tokens tokens: q [n_tokens][n_q_heads]
     * [head_dim] contiguous into q (which must not overlap qkv), k and v into
     * the cache. kv NULL: q only (KV-shared layers). */
    void (*qkv_prepare)(g4_backend *be, float *q, const float *qkv, const g4_qkv_params *p, void *kv,
                        const g4_attn_batch *b, int sliding);
    /* A layer's attention input from its projections w = q, k, v (n 3),
     * q, k with V the raw k part (n 2, k_eq_v) or q alone (n 1, kv NULL: a
     * KV-shared layer): exactly qkv_prepare's sequence with q part = Wq x,
     * k part = Wk x, v part = Wv x, for the n_tokens = b->n_tokens rows of
     * x. work: n_tokens * (n_q_heads + 2 * n_kv_heads) * head_dim floats of
     * scratch. The default: one matmul and qkv_prepare where w is stacked,
     * else each product and norm apart. */
    void (*attention_input)(g4_backend *be, float *q, float *work, const float *x, const g4_matrix_group *w,
                            const g4_qkv_params *p, void *kv, const g4_attn_batch *b, int sliding);
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
    /* moe_route then moe_experts in one call (the default), so that a
     * backend can run the routing inside the experts' first launch; the same
     * results. */
    void (*moe_route_experts)(g4_backend *be, float *out, const float *x, int n, int32_t *ids, float *weights,
                              const float *logits, const float *expert_scale, int n_experts, int k,
                              const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down);

    /* vision tower */
    /* out = a * s + b (scalars) */
    void (*affine)(g4_backend *be, float *out, const float *a, float s, float b, size_t n);
    /* 2-D RoPE of x[n][n_heads][head_dim] in place: channels [0, head_dim/2)
     * rotate by position pos_xy[t][0] and [head_dim/2, head_dim) by
     * pos_xy[t][1], each half as "rotate half" RoPE of size head_dim/2 with
     * frequencies theta^(-2j/(head_dim/2)). pos_xy is backend memory. */
    void (*rope_2d)(g4_backend *be, float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, float theta);
    /* out[slot[r]][:] += in[r][:] * scale for r < n_in, out zeroed first
     * ([n_out][dim]); rows with slot < 0 are skipped. slot is backend memory. */
    void (*pool_rows)(g4_backend *be, float *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim,
                      float scale);

    /* audio tower (float32 throughout; every array is backend memory) */

    /* out[r][c] = a[r][c] * s[r]: one scalar per row (e.g. a 0/1 frame mask). In place allowed. */
    void (*scale_rows)(g4_backend *be, float *out, const float *a, const float *s, int rows, int dim);
    /* out[r][c] = a[r][c] + v[c]: a bias broadcast over rows. In place allowed. */
    void (*add_rows)(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
    /* out = min(max(x, lo), hi), elementwise; lo/hi may be -inf/+inf. In place allowed. */
    void (*clamp)(g4_backend *be, float *out, const float *x, float lo, float hi, size_t n);
    /* out = max(x, 0). In place allowed. */
    void (*relu)(g4_backend *be, float *out, const float *x, size_t n);
    /* out = x * sigmoid(x) = x / (1 + exp(-x)). In place allowed. */
    void (*silu)(g4_backend *be, float *out, const float *x, size_t n);
    /* Gated linear unit over the last dim (torch.nn.functional.glu):
     * x [rows][2*dim], out [rows][dim], out[r][c] = x[r][c] * sigmoid(x[r][dim + c]).
     * out must not overlap x. */
    void (*glu)(g4_backend *be, float *out, const float *x, int rows, int dim);
    /* LayerNorm per row: mu = mean(x), var = mean((x - mu)^2) (biased),
     * y = (x - mu) / sqrt(var + eps) * w[c] + b[c]; w and/or b may be NULL
     * (no scale / no shift). In place allowed. */
    void (*layer_norm)(g4_backend *be, float *out, const float *x, const float *w, const float *b, int rows,
                       int dim, float eps);
    /* 2-D convolution of one image, channels last (NHWC without the N), no bias:
     * x [H][W][c_in], w [c_out][kh][kw][c_in], out [Ho][Wo][c_out] with
     * Ho = (H + 2*pad - kh) / stride + 1, Wo = (W + 2*pad - kw) / stride + 1,
     * out[i][j][o] = sum_{a<kh, b<kw, c<c_in} w[o][a][b][c] * x[i*stride - pad + a][j*stride - pad + b][c],
     * x read as 0 outside [0,H) x [0,W). (PyTorch Conv2d with padding=pad,
     * its OIHW weight transposed to OHWI.) out must not overlap x. */
    void (*conv2d)(g4_backend *be, float *out, const float *x, const float *w, int H, int W, int c_in, int c_out,
                   int kh, int kw, int stride, int pad);
    /* Causal depthwise 1-D convolution along time, no bias: x [T][C], w [C][K],
     * out[t][c] = sum_{k<K} w[c][k] * x[t - (K-1) + k][c], x read as 0 before
     * t = 0 (PyTorch Conv1d with groups = C after left-padding K-1 zeros).
     * out must not overlap x. */
    void (*depthwise_conv1d_causal)(g4_backend *be, float *out, const float *x, const float *w, int T, int C,
                                    int K);
    /* Chunked local self-attention with a Transformer-XL relative-position
     * term (the Gemma 4 / USM audio conformer), fp32 softmax. See
     * g4_chunked_attn_params for the exact semantics. q, k, v, out are
     * [T][n_heads][head_dim]; rel_k is [n_rel][n_heads][head_dim]; valid is
     * [T] (nonzero = a real frame, 0 = padding). out must not overlap inputs. */
    void (*chunked_attention)(g4_backend *be, float *out, const float *q, const float *k, const float *v,
                              const float *rel_k, const int32_t *valid, const g4_chunked_attn_params *p);
} g4_backend_ops;

struct g4_backend {
    const g4_backend_ops *ops;
    void *impl;
};

/* Creates the CPU backend (threads: 0 = all cores), on the exact path until
 * set_precision says otherwise. */
g4_status g4_backend_cpu_create(int threads, g4_backend **out);
/* Creates the CUDA backend on device `device` (G4_ERR_UNSUPPORTED without a GPU). */
g4_status g4_backend_cuda_create(int device, g4_backend **out);
void g4_backend_destroy(g4_backend *be);
/* Fills every entry of ops that a backend left NULL and that has a default
 * (backend_defaults.c): the fused ops composed from primitives, status,
 * prepare_stacked, run_step, block_table_width. */
void g4_backend_fill_defaults(g4_backend_ops *ops);

#endif
