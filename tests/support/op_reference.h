/* Float64 references for the ops of the backend table (src/backend/backend.h),
 * written from the model spec and the op comments there, never by calling a
 * backend: what the CPU backend's and the CUDA backend's tests both compare
 * against. Clear and slow (single thread, double everywhere); inputs are the
 * host float arrays the op would read, outputs are double arrays of the op's
 * output shape. Weight decoding (bf16, f16, MLX affine, MXFP4) is done here
 * from the format's definition too (tensor/matrix.h's comment), so a wrong
 * decoder in the library cannot agree with itself. */
#ifndef G4_TESTS_OP_REFERENCE_H
#define G4_TESTS_OP_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "tensor/matrix.h"

/* ---- weights and products ---- */

/* Element (r, c) of a host-resident matrix, decoded from its format. */
double ref_weight(const g4_matrix *m, int64_t r, int64_t c);
/* out[t][r] = sum_c W[r][c] x[t][c] */
void ref_matmul(double *out, const float *x, int n_tokens, const g4_matrix *w);
/* out[t][r] = gelu_tanh((W x[t])[r]) * mul[t][r] */
void ref_matmul_gelu_mul(double *out, const float *x, int n_tokens, const g4_matrix *w, const float *mul);
/* w = gate rows then up rows: out[t][r] = gelu_tanh(g[r]) * u[r], r < rows / 2 */
void ref_matmul_gated(double *out, const float *x, int n_tokens, const g4_matrix *w);
/* out[i][:] = row ids[i] of table * scale */
void ref_embed(double *out, const g4_matrix *table, const int32_t *ids, int n, double scale);

/* ---- norms ---- */

/* y = x / sqrt(mean(x^2) + eps) * w per row (w NULL: no scale) */
void ref_rmsnorm(double *out, const float *x, const float *w, int rows, int dim, double eps);
/* h_out = (h + rmsnorm(x) * w) * scale; next_out (if not NULL) = rmsnorm(h_out) * next_w */
void ref_add_rmsnorm(double *h_out, double *next_out, const float *h, const float *x, const float *w, int rows,
                     int dim, double eps, double scale, const float *next_w);
/* add_rmsnorm (scale 1) with out = rmsnorm(h') * w_out, then out2 = rmsnorm(h') * w2, out3 = rmsnorm(h') * w3 */
void ref_add_rmsnorm_moe(double *h_out, double *out, double *out2, double *out3, const float *h, const float *x,
                         const float *w, int rows, int dim, double eps, const float *w_out, const float *w2,
                         const float *w3);
/* dense_out = rmsnorm(dense) * w_dense + rmsnorm(experts) * w_experts, then
 * add_rmsnorm(h, dense_out, w_post, scale, next_w) into h_out / next_out */
void ref_moe_residual(double *h_out, double *dense_out, double *next_out, const float *h, const float *dense,
                      const float *w_dense, const float *experts, const float *w_experts, const float *w_post,
                      int rows, int dim, double eps, double scale, const float *next_w);
/* LayerNorm with biased variance; w, b may be NULL */
void ref_layer_norm(double *out, const float *x, const float *w, const float *b, int rows, int dim, double eps);

/* ---- positions ---- */

/* rotate-half RoPE of x[n][heads][D]: pairs (j, j + D/2), j < n_pairs rotate by pos * theta^(-2j/D) */
void ref_rope(double *out, const float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos, double theta,
              int n_pairs);
/* rmsnorm of each head (w may be NULL), then rope */
void ref_rmsnorm_rope(double *out, const float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                      const int32_t *pos, double theta, int n_pairs, double eps);
/* 2-D RoPE: the first half of each head by pos_xy[t][0], the second by pos_xy[t][1] */
void ref_rope_2d(double *out, const float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, double theta);
/* qkv_prepare's three outputs from the merged rows: q [n][Hq][D], and (n_kv_heads > 0) k, v [n][Hkv][D]
 * before any cache rounding */
void ref_qkv_prepare(double *q, double *k, double *v, const float *qkv, const g4_qkv_params *p, int n_tokens,
                     const int32_t *pos);

/* ---- elementwise, rows, copies ---- */

double ref_gelu_tanh(double x);
void ref_gelu_mul(double *out, const float *gate, const float *up, size_t n);
void ref_add(double *out, const float *a, const float *b, size_t n);
void ref_scale(double *out, const float *a, double s, size_t n);
void ref_mul(double *out, const float *a, const float *b, size_t n);
void ref_mul_rows(double *out, const float *a, const float *v, int rows, int dim);
void ref_softcap(double *out, const float *x, size_t n, double cap);
void ref_affine(double *out, const float *a, double s, double b, size_t n);
void ref_scale_rows(double *out, const float *a, const float *s, int rows, int dim);
void ref_add_rows(double *out, const float *a, const float *v, int rows, int dim);
void ref_clamp(double *out, const float *x, double lo, double hi, size_t n);
void ref_relu(double *out, const float *x, size_t n);
void ref_silu(double *out, const float *x, size_t n);
void ref_glu(double *out, const float *x, int rows, int dim);
/* dst[i] = src[rows[i]] */
void ref_gather_rows(double *dst, const float *src, const int32_t *rows, int n, int dim);
/* dst (n_dst rows, starting as a copy of base) with dst[rows[i]] = src[i] */
void ref_scatter_rows(double *dst, const float *base, int n_dst, const int32_t *rows, const float *src, int n,
                      int dim);
/* dst[r][c] = src[r * src_stride + c], dst rows of cols */
void ref_copy_rows(double *dst, const float *src, int src_stride, int rows, int cols);
/* out zeroed ([n_out][dim]), then out[slot[r]] += in[r] * scale for slot[r] >= 0 */
void ref_pool_rows(double *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim, double scale);

/* ---- sampling support ---- */

/* Per row: the k largest logits by value descending, equal values by
 * ascending id (slots past the vocabulary: id -1, value -inf), and the row's
 * log-sum-exp in double (NaN for a row holding a NaN). */
void ref_top_logits(int32_t *ids, float *values, double *lse, const float *logits, int rows, int vocab, int k);

/* ---- mixture of experts ---- */

/* softmax over each row of logits [n][E], top-k (ties: lower id first; NaN never ahead of a number), weights
 * renormalised over the k and times expert_scale[id] */
void ref_moe_route(int32_t *ids, double *weights, const float *logits, const float *expert_scale, int n, int E, int k);
/* out[t] = sum_j weights[t][j] * down_e(gelu_tanh(gate_e x[t]) * up_e x[t]), e = ids[t][j] */
void ref_moe_experts(double *out, const float *x, int n, const int32_t *ids, const float *weights, int k,
                     const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down);

/* ---- KV cache and attention ---- */

/* What a cache of `type` holds for one row of head_dim values: bf16 round to
 * nearest even; fp8: scale = peak / 448, each value / scale rounded to the
 * nearest e4m3 (ties to even code), times scale. F32: the value. */
void ref_kv_round(double *out, const float *x, int head_dim, g4_kv_type type);
/* Attention of n tokens from logical K/V: kv[s] points at sequence s's
 * positions, [pos][n_kv_heads][head_dim] (as stored, i.e. after rounding).
 * Token t sees positions range[t][0..1] inclusive (the sliding or full pair
 * of kv_range), an empty range giving zeros. out[t][h] = softmax_j(q . K[j] *
 * scale) V[j], kv head h / (n_heads / n_kv_heads). */
void ref_attention(double *out, const float *q, const float *const *k_seq, const float *const *v_seq,
                   const int32_t *seq, const int32_t *range, int range_stride, int n_tokens, int n_heads,
                   int n_kv_heads, int head_dim, double scale);
/* The audio tower's chunked local attention (g4_chunked_attn_params in backend.h). */
void ref_chunked_attention(double *out, const float *q, const float *k, const float *v, const float *rel_k,
                           const int32_t *valid, const g4_chunked_attn_params *p);

/* ---- convolutions ---- */

/* x [H][W][c_in], w [c_out][kh][kw][c_in] -> out [Ho][Wo][c_out] (zero padding) */
void ref_conv2d(double *out, const float *x, const float *w, int H, int W, int c_in, int c_out, int kh, int kw,
                int stride, int pad);
/* x [T][C], w [C][K] -> out[t][c] = sum_k w[c][k] x[t - (K-1) + k][c] */
void ref_depthwise_conv1d_causal(double *out, const float *x, const float *w, int T, int C, int K);

/* ---- comparing a result with the reference ---- */

/* Errors of got[rows][cols] against want: rel_rms = ||got - want|| / ||want||
 * over everything; row_max = the worst row's max |got - want| over that
 * row's RMS of want (so an error confined to one row or tile shows even when
 * the whole-array RMS dilutes it). NaN or inf in got gives +inf for both. */
typedef struct {
    double rel_rms, row_max;
} ref_error;
ref_error ref_compare(const float *got, const double *want, size_t rows, size_t cols);

#endif
