/* Float64 references of the backend ops (see op_reference.h). Each function
 * is the op's definition written out once, in double, in the plainest loop
 * order; nothing here is shared with src/ except the types. */
#include "support/op_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- weight decoding ---- */

static double bf16_value(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits */
static double f16_value(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + m / 1024.0, e - 15);
    return sign ? -v : v;
}

static double scalar_value(const void *base, size_t index, g4_dtype dt) {
    const unsigned char *p = base;
    uint16_t h;
    switch (dt) {
    case G4_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * index, 4);
        return f;
    }
    case G4_DTYPE_BF16: memcpy(&h, p + 2 * index, 2); return bf16_value(h);
    case G4_DTYPE_F16: memcpy(&h, p + 2 * index, 2); return f16_value(h);
    default: return NAN;
    }
}

/* Code c of a row stored as a little-endian bit stream of `bits`-bit codes
 * (uint32 words little-endian: the bytes in order are the stream). */
static unsigned read_code(const unsigned char *row, int bits, int64_t c) {
    unsigned v = 0;
    for (int i = 0; i < bits; i++) {
        const int64_t bit = c * bits + i;
        v |= (unsigned)((row[bit / 8] >> (bit % 8)) & 1) << i;
    }
    return v;
}

/* OCP FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit */
static double e2m1_value(unsigned code) {
    const int e = (code >> 1) & 3, m = code & 1;
    const double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
    return (code & 8) ? -v : v;
}

double ref_weight(const g4_matrix *m, int64_t r, int64_t c) {
    const unsigned char *row = (const unsigned char *)m->data + (size_t)r * m->row_bytes;
    uint16_t h;
    switch (m->format) {
    case G4_WEIGHT_F32: {
        float f;
        memcpy(&f, row + 4 * c, 4);
        return f;
    }
    case G4_WEIGHT_BF16: memcpy(&h, row + 2 * c, 2); return bf16_value(h);
    case G4_WEIGHT_F16: memcpy(&h, row + 2 * c, 2); return f16_value(h);
    case G4_WEIGHT_AFFINE: {
        const size_t g = (size_t)(c / m->group_size);
        const unsigned char *s = (const unsigned char *)m->scales + (size_t)r * m->scale_row_bytes;
        const unsigned char *b = (const unsigned char *)m->biases + (size_t)r * m->scale_row_bytes;
        return scalar_value(s, g, m->scale_dtype) * read_code(row, m->bits, c) + scalar_value(b, g, m->scale_dtype);
    }
    case G4_WEIGHT_MXFP4: {
        const unsigned char *s = (const unsigned char *)m->scales + (size_t)r * m->scale_row_bytes;
        const unsigned e = s[c / m->group_size];
        return e == 255 ? NAN : ldexp(e2m1_value(read_code(row, 4, c)), (int)e - 127);
    }
    }
    return NAN;
}

static void decode_row(double *dst, const g4_matrix *m, int64_t r) {
    for (int64_t c = 0; c < m->cols; c++) dst[c] = ref_weight(m, r, c);
}

/* (Threads over rows only to keep the large cases of the CUDA tests quick:
 * each output is still one double sum in column order.) */
void ref_matmul(double *out, const float *x, int n_tokens, const g4_matrix *w) {
#pragma omp parallel
    {
        double *row = malloc((size_t)w->cols * sizeof *row);
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < w->rows; r++) {
            decode_row(row, w, r);
            for (int t = 0; t < n_tokens; t++) {
                const float *xt = x + (size_t)t * w->cols;
                double s = 0;
                for (int64_t c = 0; c < w->cols; c++) s += row[c] * xt[c];
                out[(size_t)t * w->rows + r] = s;
            }
        }
        free(row);
    }
}

double ref_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

void ref_matmul_gelu_mul(double *out, const float *x, int n_tokens, const g4_matrix *w, const float *mul) {
    ref_matmul(out, x, n_tokens, w);
    for (size_t i = 0; i < (size_t)n_tokens * w->rows; i++) out[i] = ref_gelu_tanh(out[i]) * mul[i];
}

void ref_matmul_gated(double *out, const float *x, int n_tokens, const g4_matrix *w) {
    const int64_t F = w->rows / 2;
    double *both = malloc((size_t)n_tokens * w->rows * sizeof *both);
    ref_matmul(both, x, n_tokens, w);
    for (int t = 0; t < n_tokens; t++)
        for (int64_t r = 0; r < F; r++)
            out[(size_t)t * F + r] = ref_gelu_tanh(both[(size_t)t * w->rows + r]) * both[(size_t)t * w->rows + F + r];
    free(both);
}

void ref_embed(double *out, const g4_matrix *table, const int32_t *ids, int n, double scale) {
    for (int i = 0; i < n; i++)
        for (int64_t c = 0; c < table->cols; c++)
            out[(size_t)i * table->cols + c] = ref_weight(table, ids[i], c) * scale;
}

/* ---- norms ---- */

/* one row, double in and out */
static void rmsnorm_row(double *y, const double *x, const float *w, int dim, double eps) {
    double ss = 0;
    for (int c = 0; c < dim; c++) ss += x[c] * x[c];
    const double inv = 1.0 / sqrt(ss / dim + eps);
    for (int c = 0; c < dim; c++) y[c] = x[c] * inv * (w ? (double)w[c] : 1.0);
}

static void widen(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

void ref_rmsnorm(double *out, const float *x, const float *w, int rows, int dim, double eps) {
    double *row = malloc((size_t)dim * sizeof *row);
    for (int r = 0; r < rows; r++) {
        widen(row, x + (size_t)r * dim, (size_t)dim);
        rmsnorm_row(out + (size_t)r * dim, row, w, dim, eps);
    }
    free(row);
}

/* h_row = (h_row + rmsnorm(x_row) * w) * scale, in place on doubles */
static void add_norm_row(double *h, const double *x, const float *w, int dim, double eps, double scale,
                         double *tmp) {
    rmsnorm_row(tmp, x, w, dim, eps);
    for (int c = 0; c < dim; c++) h[c] = (h[c] + tmp[c]) * scale;
}

void ref_add_rmsnorm(double *h_out, double *next_out, const float *h, const float *x, const float *w, int rows,
                     int dim, double eps, double scale, const float *next_w) {
    double *xr = malloc((size_t)dim * sizeof *xr), *tmp = malloc((size_t)dim * sizeof *tmp);
    for (int r = 0; r < rows; r++) {
        double *hr = h_out + (size_t)r * dim;
        widen(hr, h + (size_t)r * dim, (size_t)dim);
        widen(xr, x + (size_t)r * dim, (size_t)dim);
        add_norm_row(hr, xr, w, dim, eps, scale, tmp);
        if (next_out) rmsnorm_row(next_out + (size_t)r * dim, hr, next_w, dim, eps);
    }
    free(xr), free(tmp);
}

void ref_add_rmsnorm_moe(double *h_out, double *out, double *out2, double *out3, const float *h, const float *x,
                         const float *w, int rows, int dim, double eps, const float *w_out, const float *w2,
                         const float *w3) {
    ref_add_rmsnorm(h_out, out, h, x, w, rows, dim, eps, 1.0, w_out);
    for (int r = 0; r < rows; r++) {
        rmsnorm_row(out2 + (size_t)r * dim, h_out + (size_t)r * dim, w2, dim, eps);
        rmsnorm_row(out3 + (size_t)r * dim, h_out + (size_t)r * dim, w3, dim, eps);
    }
}

void ref_moe_residual(double *h_out, double *dense_out, double *next_out, const float *h, const float *dense,
                      const float *w_dense, const float *experts, const float *w_experts, const float *w_post,
                      int rows, int dim, double eps, double scale, const float *next_w) {
    double *a = malloc((size_t)dim * sizeof *a), *b = malloc((size_t)dim * sizeof *b);
    double *tmp = malloc((size_t)dim * sizeof *tmp);
    for (int r = 0; r < rows; r++) {
        double *d = dense_out + (size_t)r * dim, *hr = h_out + (size_t)r * dim;
        widen(tmp, dense + (size_t)r * dim, (size_t)dim);
        rmsnorm_row(a, tmp, w_dense, dim, eps);
        widen(tmp, experts + (size_t)r * dim, (size_t)dim);
        rmsnorm_row(b, tmp, w_experts, dim, eps);
        for (int c = 0; c < dim; c++) d[c] = a[c] + b[c];
        widen(hr, h + (size_t)r * dim, (size_t)dim);
        add_norm_row(hr, d, w_post, dim, eps, scale, tmp);
        if (next_out) rmsnorm_row(next_out + (size_t)r * dim, hr, next_w, dim, eps);
    }
    free(a), free(b), free(tmp);
}

void ref_layer_norm(double *out, const float *x, const float *w, const float *b, int rows, int dim, double eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        double mu = 0, var = 0;
        for (int c = 0; c < dim; c++) mu += xr[c];
        mu /= dim;
        for (int c = 0; c < dim; c++) var += (xr[c] - mu) * (xr[c] - mu);
        var /= dim;
        const double inv = 1.0 / sqrt(var + eps);
        for (int c = 0; c < dim; c++)
            out[(size_t)r * dim + c] = (xr[c] - mu) * inv * (w ? (double)w[c] : 1.0) + (b ? (double)b[c] : 0.0);
    }
}

/* ---- positions ---- */

/* The angle of pair j at position pos, in float32 as the model defines it
 * (spec 2.1: HF builds inv_freq = 1 / theta^(2j/size) and pos * inv_freq in
 * float32, then cos/sin): at long positions that rounding (1e-3 rad near
 * position 1e5) is part of the result, so the reference makes it too;
 * everything after is double. */
static double rope_angle(double pos, double theta, int j, int size) {
    const float e = (float)(2 * j) / (float)size;
    const float p = (float)pow(theta, (double)e);
    const float inv = 1.0f / p;
    return (double)((float)pos * inv);
}

/* rotate-half over one vector of `size` values at stride 1: pairs (j, j + size/2) for j < n_pairs, angle
 * pos * theta^(-2j/size) */
static void rope_vec(double *v, int size, int n_pairs, double pos, double theta) {
    const int half = size / 2;
    if (n_pairs > half) n_pairs = half;
    for (int j = 0; j < n_pairs; j++) {
        const double a = rope_angle(pos, theta, j, size), c = cos(a), s = sin(a);
        const double x0 = v[j], x1 = v[j + half];
        v[j] = x0 * c - x1 * s;
        v[j + half] = x1 * c + x0 * s;
    }
}

void ref_rope(double *out, const float *x, int n_tokens, int n_heads, int head_dim, const int32_t *pos, double theta,
              int n_pairs) {
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < n_heads; h++) {
            double *v = out + ((size_t)t * n_heads + h) * head_dim;
            widen(v, x + ((size_t)t * n_heads + h) * head_dim, (size_t)head_dim);
            rope_vec(v, head_dim, n_pairs, pos[t], theta);
        }
}

void ref_rmsnorm_rope(double *out, const float *x, const float *w, int n_tokens, int n_heads, int head_dim,
                      const int32_t *pos, double theta, int n_pairs, double eps) {
    ref_rmsnorm(out, x, w, n_tokens * n_heads, head_dim, eps);
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < n_heads; h++)
            rope_vec(out + ((size_t)t * n_heads + h) * head_dim, head_dim, n_pairs, pos[t], theta);
}

void ref_rope_2d(double *out, const float *x, int n, int n_heads, int head_dim, const int32_t *pos_xy, double theta) {
    const int half = head_dim / 2;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            double *v = out + ((size_t)t * n_heads + h) * head_dim;
            widen(v, x + ((size_t)t * n_heads + h) * head_dim, (size_t)head_dim);
            rope_vec(v, half, half / 2, pos_xy[2 * t], theta);
            rope_vec(v + half, half, half / 2, pos_xy[2 * t + 1], theta);
        }
}

void ref_qkv_prepare(double *q, double *k, double *v, const float *qkv, const g4_qkv_params *p, int n_tokens,
                     const int32_t *pos) {
    const int Hq = p->n_q_heads, Hkv = p->n_kv_heads, D = p->head_dim;
    const int width = (Hq + (Hkv ? (p->k_eq_v ? 1 : 2) * Hkv : 0)) * D;
    double *row = malloc((size_t)D * sizeof *row);
    for (int t = 0; t < n_tokens; t++) {
        const float *in = qkv + (size_t)t * width;
        for (int h = 0; h < Hq; h++) {
            double *o = q + ((size_t)t * Hq + h) * D;
            widen(row, in + (size_t)h * D, (size_t)D);
            rmsnorm_row(o, row, p->q_norm, D, p->eps);
            rope_vec(o, D, p->n_pairs, pos[t], p->theta);
        }
        for (int h = 0; h < Hkv; h++) {
            const float *kin = in + (size_t)(Hq + h) * D;
            const float *vin = p->k_eq_v ? kin : in + (size_t)(Hq + Hkv + h) * D;
            double *ko = k + ((size_t)t * Hkv + h) * D, *vo = v + ((size_t)t * Hkv + h) * D;
            widen(row, kin, (size_t)D);
            rmsnorm_row(ko, row, p->k_norm, D, p->eps);
            rope_vec(ko, D, p->n_pairs, pos[t], p->theta);
            widen(row, vin, (size_t)D);
            rmsnorm_row(vo, row, NULL, D, p->eps);
        }
    }
    free(row);
}

/* ---- elementwise, rows, copies ---- */

void ref_gelu_mul(double *out, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = ref_gelu_tanh(gate[i]) * up[i];
}
void ref_add(double *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (double)a[i] + b[i];
}
void ref_scale(double *out, const float *a, double s, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * s;
}
void ref_mul(double *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (double)a[i] * b[i];
}
void ref_mul_rows(double *out, const float *a, const float *v, int rows, int dim) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = (double)a[(size_t)r * dim + c] * v[c];
}
void ref_softcap(double *out, const float *x, size_t n, double cap) {
    for (size_t i = 0; i < n; i++) out[i] = cap * tanh(x[i] / cap);
}
void ref_affine(double *out, const float *a, double s, double b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] * s + b;
}
void ref_scale_rows(double *out, const float *a, const float *s, int rows, int dim) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = (double)a[(size_t)r * dim + c] * s[r];
}
void ref_add_rows(double *out, const float *a, const float *v, int rows, int dim) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) out[(size_t)r * dim + c] = (double)a[(size_t)r * dim + c] + v[c];
}
void ref_clamp(double *out, const float *x, double lo, double hi, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}
void ref_relu(double *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = x[i] > 0 ? x[i] : 0.0;
}
void ref_silu(double *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = x[i] / (1.0 + exp(-(double)x[i]));
}
void ref_glu(double *out, const float *x, int rows, int dim) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < dim; c++) {
            const double a = x[(size_t)r * 2 * dim + c], g = x[(size_t)r * 2 * dim + dim + c];
            out[(size_t)r * dim + c] = a / (1.0 + exp(-g));
        }
}
void ref_gather_rows(double *dst, const float *src, const int32_t *rows, int n, int dim) {
    for (int i = 0; i < n; i++) widen(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, (size_t)dim);
}
void ref_scatter_rows(double *dst, const float *base, int n_dst, const int32_t *rows, const float *src, int n,
                      int dim) {
    widen(dst, base, (size_t)n_dst * dim);
    for (int i = 0; i < n; i++) widen(dst + (size_t)rows[i] * dim, src + (size_t)i * dim, (size_t)dim);
}
void ref_copy_rows(double *dst, const float *src, int src_stride, int rows, int cols) {
    for (int r = 0; r < rows; r++) widen(dst + (size_t)r * cols, src + (size_t)r * src_stride, (size_t)cols);
}
void ref_pool_rows(double *out, const float *in, const int32_t *slot, int n_in, int n_out, int dim, double scale) {
    memset(out, 0, (size_t)n_out * dim * sizeof *out);
    for (int r = 0; r < n_in; r++)
        if (slot[r] >= 0)
            for (int c = 0; c < dim; c++) out[(size_t)slot[r] * dim + c] += in[(size_t)r * dim + c] * scale;
}

/* ---- sampling support ---- */

typedef struct {
    float value;
    int32_t id;
} scored;

/* larger value first, equal values (+0 and -0 too) by lower id; NaN last */
static int by_value_then_id(const void *pa, const void *pb) {
    const scored *a = pa, *b = pb;
    const int na = isnan(a->value), nb = isnan(b->value);
    if (na != nb) return na - nb;
    if (!na && a->value != b->value) return a->value > b->value ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

void ref_top_logits(int32_t *ids, float *values, double *lse, const float *logits, int rows, int vocab, int k) {
    scored *all = malloc((size_t)(vocab ? vocab : 1) * sizeof *all);
    for (int r = 0; r < rows; r++) {
        const float *x = logits + (size_t)r * vocab;
        int nan = 0;
        double m = -INFINITY;
        for (int i = 0; i < vocab; i++) {
            if (isnan(x[i])) nan = 1;
            else if (x[i] > m) m = x[i];
            all[i] = (scored){x[i], i};
        }
        double s = 0;
        for (int i = 0; i < vocab && !nan; i++) s += exp(x[i] - m);
        lse[r] = nan ? NAN : m + log(s);
        qsort(all, (size_t)vocab, sizeof *all, by_value_then_id);
        for (int j = 0; j < k; j++) {
            ids[(size_t)r * k + j] = j < vocab ? all[j].id : -1;
            values[(size_t)r * k + j] = j < vocab ? all[j].value : -INFINITY;
        }
    }
    free(all);
}

/* ---- mixture of experts ---- */

/* The top-k of the softmax are the top-k logits, and renormalising over
 * them cancels the full denominator (the spec's "equivalent forms"), so the
 * weights are a softmax over the chosen logits. A NaN logit is never chosen
 * ahead of a number. */
static int route_better(float a, int ia, float b, int ib) {
    if (isnan(b)) return !isnan(a) || ia < ib;
    if (isnan(a)) return 0;
    return a > b || (a == b && ia < ib);
}

void ref_moe_route(int32_t *ids, double *weights, const float *logits, const float *expert_scale, int n, int E, int k) {
    char *taken = malloc((size_t)E);
    for (int t = 0; t < n; t++) {
        const float *x = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * k;
        memset(taken, 0, (size_t)E);
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || route_better(x[e], e, x[best], best))) best = e;
            taken[best] = 1;
            id[j] = best;
        }
        const double m = x[id[0]];
        double s = 0;
        for (int j = 0; j < k; j++) s += exp(x[id[j]] - m);
        for (int j = 0; j < k; j++) weights[(size_t)t * k + j] = exp(x[id[j]] - m) / s * expert_scale[id[j]];
    }
    free(taken);
}

static double *decode_matrix(const g4_matrix *m) {
    double *all = malloc((size_t)m->rows * m->cols * sizeof *all);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < m->rows; r++) decode_row(all + (size_t)r * m->cols, m, r);
    return all;
}

/* Expert by expert (each decoded once), every (token, choice) that picked it. */
void ref_moe_experts(double *out, const float *x, int n, const int32_t *ids, const float *weights, int k,
                     const g4_expert_matrix *gate, const g4_expert_matrix *up, const g4_expert_matrix *down) {
    const int64_t I = gate->rows_per_expert, d = down->rows_per_expert, cols = gate->all.cols;
    memset(out, 0, (size_t)n * d * sizeof *out);
    for (int e = 0; e < gate->n_experts; e++) {
        int used = 0;
        for (int i = 0; i < n * k; i++) used |= ids[i] == e;
        if (!used) continue;
        const g4_matrix ge = g4_expert_view(gate, e), ue = g4_expert_view(up, e), de = g4_expert_view(down, e);
        double *G = decode_matrix(&ge), *U = decode_matrix(&ue), *Dn = decode_matrix(&de);
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < n; t++) {
            double *h = malloc((size_t)I * sizeof *h);
            const float *xt = x + (size_t)t * cols;
            for (int j = 0; j < k; j++) {
                if (ids[(size_t)t * k + j] != e) continue;
                for (int64_t i = 0; i < I; i++) {
                    double g = 0, u = 0;
                    for (int64_t c = 0; c < cols; c++) g += G[i * cols + c] * xt[c], u += U[i * cols + c] * xt[c];
                    h[i] = ref_gelu_tanh(g) * u; /* double: down's product is taken in double too */
                }
                for (int64_t r = 0; r < d; r++) {
                    double y = 0;
                    for (int64_t i = 0; i < I; i++) y += Dn[r * I + i] * h[i];
                    out[(size_t)t * d + r] += weights[(size_t)t * k + j] * y;
                }
            }
            free(h);
        }
        free(G), free(U), free(Dn);
    }
}

/* ---- KV cache and attention ---- */

static double bf16_round(double x) {
    const float f = (float)x; /* float first: bf16 of the float32 the op receives */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t lsb = (u >> 16) & 1;
    u = (u + 0x7fff + lsb) & 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* The e4m3 value nearest to x (|x| <= 448), ties to the even code. The
 * positive values: code c = (e << 3) | m, e 0: m / 8 * 2^-6, else
 * (1 + m / 8) * 2^(e - 7); 0x7f is NaN. */
static double e4m3_round(double x) {
    const double a = fabs(x);
    double best = 0;
    int best_code = 0;
    for (int c = 0; c < 0x7f; c++) {
        const int e = c >> 3, m = c & 7;
        const double v = e == 0 ? m / 8.0 * ldexp(1, -6) : (1 + m / 8.0) * ldexp(1, e - 7);
        const double d = fabs(v - a), db = fabs(best - a);
        if (d < db || (d == db && (c & 1) == 0 && (best_code & 1))) best = v, best_code = c;
    }
    return x < 0 ? -best : best;
}

void ref_kv_round(double *out, const float *x, int head_dim, g4_kv_type type) {
    if (type == G4_KV_BF16) {
        for (int d = 0; d < head_dim; d++) out[d] = bf16_round(x[d]);
    } else if (type == G4_KV_FP8) {
        double peak = 0;
        for (int d = 0; d < head_dim; d++) peak = fabs(x[d]) > peak ? fabs(x[d]) : peak;
        const double scale = peak / 448.0;
        for (int d = 0; d < head_dim; d++) out[d] = peak > 0 ? e4m3_round(x[d] / scale) * scale : 0.0;
    } else {
        widen(out, x, (size_t)head_dim);
    }
}

void ref_attention(double *out, const float *q, const float *const *k_seq, const float *const *v_seq,
                   const int32_t *seq, const int32_t *range, int range_stride, int n_tokens, int n_heads,
                   int n_kv_heads, int head_dim, double scale) {
    const int group = n_heads / n_kv_heads, D = head_dim;
    const size_t kv_row = (size_t)n_kv_heads * D;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < n_tokens; t++) {
        const int lo = range[(size_t)t * range_stride], hi = range[(size_t)t * range_stride + 1];
        const int n = hi - lo + 1;
        double *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)t * n_heads + h) * D;
            const float *K = k_seq[seq[t]], *V = v_seq[seq[t]];
            const int g = h / group;
            double *o = out + ((size_t)t * n_heads + h) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            if (n <= 0) continue;
            double m = -INFINITY, s = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = K + (size_t)(lo + j) * kv_row + (size_t)g * D;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)qh[d] * kj[d];
                p[j] = dot * scale;
                m = p[j] > m ? p[j] : m;
            }
            for (int j = 0; j < n; j++) s += p[j] = exp(p[j] - m);
            for (int j = 0; j < n; j++) {
                const float *vj = V + (size_t)(lo + j) * kv_row + (size_t)g * D;
                for (int d = 0; d < D; d++) o[d] += p[j] / s * vj[d];
            }
        }
        free(p);
    }
}

void ref_chunked_attention(double *out, const float *q, const float *k, const float *v, const float *rel_k,
                           const int32_t *valid, const g4_chunked_attn_params *p) {
    const int T = p->n_frames, H = p->n_heads, D = p->head_dim;
    const int W = p->chunk + p->past + p->future;
    double *logit = malloc((size_t)W * sizeof *logit);
    for (int i = 0; i < T; i++) {
        const int b = i / p->chunk, w = i % p->chunk;
        for (int h = 0; h < H; h++) {
            const float *qi = q + ((size_t)i * H + h) * D;
            double m = -INFINITY;
            for (int c = 0; c < W; c++) {
                const int j = b * p->chunk - p->past + c;
                const int inside = j >= 0 && j < T;
                double l = 0;
                if (inside) {
                    const float *kj = k + ((size_t)j * H + h) * D;
                    for (int d = 0; d < D; d++) l += (double)qi[d] * kj[d];
                }
                const int r = c - w;
                if (r >= 0 && r < p->n_rel) {
                    const float *rk = rel_k + ((size_t)r * H + h) * D;
                    for (int d = 0; d < D; d++) l += (double)qi[d] * rk[d];
                }
                if (p->logit_cap > 0) l = p->logit_cap * tanh(l / p->logit_cap);
                const int dist_ok = i - j <= p->max_past_dist && j - i <= p->max_future_dist;
                const int visible = inside && (p->invert_mask ? !(valid[j] && dist_ok) : (valid[j] && dist_ok));
                logit[c] = visible ? l : p->invalid_logit;
                m = logit[c] > m ? logit[c] : m;
            }
            double s = 0;
            for (int c = 0; c < W; c++) s += logit[c] = exp(logit[c] - m);
            double *o = out + ((size_t)i * H + h) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int c = 0; c < W; c++) {
                const int j = b * p->chunk - p->past + c;
                if (j < 0 || j >= T) continue; /* a zero vector */
                const float *vj = v + ((size_t)j * H + h) * D;
                for (int d = 0; d < D; d++) o[d] += logit[c] / s * vj[d];
            }
        }
    }
    free(logit);
}

/* ---- convolutions ---- */

void ref_conv2d(double *out, const float *x, const float *w, int H, int W, int c_in, int c_out, int kh, int kw,
                int stride, int pad) {
    const int Ho = (H + 2 * pad - kh) / stride + 1, Wo = (W + 2 * pad - kw) / stride + 1;
    for (int i = 0; i < Ho; i++)
        for (int j = 0; j < Wo; j++)
            for (int o = 0; o < c_out; o++) {
                double s = 0;
                for (int a = 0; a < kh; a++)
                    for (int b = 0; b < kw; b++) {
                        const int y = i * stride - pad + a, xx = j * stride - pad + b;
                        if (y < 0 || y >= H || xx < 0 || xx >= W) continue;
                        for (int c = 0; c < c_in; c++)
                            s += (double)w[(((size_t)o * kh + a) * kw + b) * c_in + c] *
                                 x[((size_t)y * W + xx) * c_in + c];
                    }
                out[((size_t)i * Wo + j) * c_out + o] = s;
            }
}

void ref_depthwise_conv1d_causal(double *out, const float *x, const float *w, int T, int C, int K) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                const int src = t - (K - 1) + k;
                if (src >= 0) s += (double)w[(size_t)c * K + k] * x[(size_t)src * C + c];
            }
            out[(size_t)t * C + c] = s;
        }
}

/* ---- comparing ---- */

ref_error ref_compare(const float *got, const double *want, size_t rows, size_t cols) {
    ref_error e = {0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < rows * cols; i++) {
        if (!isfinite(got[i])) return (ref_error){INFINITY, INFINITY};
        const double d = got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    e.rel_rms = den > 0 ? sqrt(num / den) : sqrt(num);
    /* a row whose reference is (near) zero is measured against the whole array's RMS */
    const double floor = rows * cols > 0 ? 1e-3 * sqrt(den / (double)(rows * cols)) : 0;
    for (size_t r = 0; r < rows; r++) {
        double worst = 0, ss = 0;
        for (size_t c = 0; c < cols; c++) {
            const double d = fabs(got[r * cols + c] - want[r * cols + c]);
            worst = d > worst ? d : worst;
            ss += want[r * cols + c] * want[r * cols + c];
        }
        double rms = sqrt(ss / (double)(cols ? cols : 1));
        if (rms < floor) rms = floor;
        const double rel = rms > 0 ? worst / rms : worst;
        e.row_max = rel > e.row_max ? rel : e.row_max;
    }
    return e;
}
