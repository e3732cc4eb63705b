/* cpu_matmul_fast (bf16 activations for bf16 weights, int8 activations for
 * MLX affine 4/8-bit weights) at every SIMD level this processor has, two
 * ways:
 *
 *  same inputs: against float64 dot products of the stored weights with the
 *  activations as the fast path rounds them (bf16, or cpu_quantize_q8's
 *  d * q). What is left is float32 summation error, so the bound is tight
 *  (ELEMENT_TOL, as for cpu_matmul);
 *
 *  the true product: against float64 dot products with the unrounded
 *  activations (g4_matmul_reference). This measures what the rounding costs
 *  and bounds it (relative RMS error, BF16_RMS_TOL / Q8_RMS_TOL).
 *
 * Decode and prefill token counts, odd row counts, row views whose weight
 * rows start at odd addresses, and group sizes that are and are not a
 * multiple of 64 (the kernels' two step widths). The int8 kernels must take
 * every affine product at every level, and the bf16 ones every bf16 product at
 * the scalar level and wherever the processor has AVX-512 VNNI + BF16
 * (cpu_fast_takes), so that a silent fall-back to float32 fails. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_isa.h"
#include "model/kv_cache.h"
#include "backend/cpu/cpu_matmul.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"
#include "test_util.h"

/* Bounds: about 3x the worst seen over the whole run (printed with
 * G4_TEST_VERBOSE=1). */
#define ELEMENT_TOL 5e-7    /* same inputs: |out - ref| <= ELEMENT_TOL * ||w_r|| * ||x_t|| */
#define BF16_RMS_TOL 4.5e-3  /* true product, bf16 activations: ||out - ref|| / ||ref|| */
#define Q8_RMS_TOL 4.5e-2   /* true product, int8 activations */
#define GELU_TOL 2e-6      /* fast GELU, relative */
#define SOFTCAP_TOL 6e-7   /* fast logit softcap, relative */
#define ATTENTION_TOL 3e-6  /* fast attention against the exact one, absolute (outputs within [-1, 1]) */
#define KV_BF16_TOL 1e-2    /* attention over a bf16 cache against float32 K and V, absolute */
#define KV_FP8_TOL 6e-2     /* the same over fp8 e4m3 with row scales */

static const int token_counts[] = {1, 2, 5, 8, 9, 15, 16, 17, 33, 70};
enum { MAX_TOKENS = 70 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * 0x1p-24); }

/* A buffer whose last byte is followed by a guard page. */
typedef struct {
    void *map;
    size_t map_bytes;
} guarded;

static unsigned char *guarded_alloc(guarded *g, size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), body = (bytes + page - 1) / page * page;
    g->map_bytes = body + page;
    g->map = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED) {
        fprintf(stderr, "mmap failed\n");
        exit(2);
    }
    mprotect((unsigned char *)g->map + body, page, PROT_NONE);
    return (unsigned char *)g->map + body - bytes;
}

static void guarded_free(guarded *g) {
    if (g->map) munmap(g->map, g->map_bytes);
    g->map = NULL;
}

typedef struct {
    g4_matrix m;
    guarded data, scales, biases;
} test_matrix;

static void write_param(unsigned char *p, g4_dtype dt, int64_t i, float v) {
    if (dt == G4_DTYPE_F32) {
        memcpy(p + 4 * i, &v, 4);
        return;
    }
    const uint16_t h = dt == G4_DTYPE_BF16 ? g4_f32_to_bf16(v) : g4_f32_to_f16(v);
    memcpy(p + 2 * i, &h, 2);
}

/* bf16 weights; `skew` extra bytes at the start of the buffer put every row
 * at an odd address when 1. */
static void make_bf16(test_matrix *t, int64_t rows, int64_t cols, int skew) {
    memset(t, 0, sizeof *t);
    t->m.format = G4_WEIGHT_BF16;
    t->m.rows = rows;
    t->m.cols = cols;
    t->m.row_bytes = (size_t)cols * 2;
    unsigned char *d = guarded_alloc(&t->data, (size_t)rows * t->m.row_bytes + (size_t)skew) + skew;
    for (int64_t i = 0; i < rows * cols; i++) write_param(d, G4_DTYPE_BF16, i, rng_uniform(-0.08f, 0.08f));
    t->m.data = d;
}

static void make_affine(test_matrix *t, int bits, int group, g4_dtype sdt, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    t->m.format = G4_WEIGHT_AFFINE;
    t->m.rows = rows;
    t->m.cols = cols;
    t->m.bits = bits;
    t->m.group_size = group;
    t->m.scale_dtype = sdt;
    t->m.row_bytes = (size_t)(cols * bits / 8);
    const int64_t n_groups = cols / group;
    t->m.scale_row_bytes = (size_t)n_groups * g4_dtype_size(sdt);
    unsigned char *d = guarded_alloc(&t->data, (size_t)rows * t->m.row_bytes);
    unsigned char *s = guarded_alloc(&t->scales, (size_t)rows * t->m.scale_row_bytes);
    unsigned char *b = guarded_alloc(&t->biases, (size_t)rows * t->m.scale_row_bytes);
    for (size_t i = 0; i < (size_t)rows * t->m.row_bytes; i++) d[i] = (unsigned char)rng_next();
    const unsigned levels = 1u << bits;
    for (int64_t i = 0; i < rows * n_groups; i++) {
        /* as MLX quantises: the group's range in 2^bits - 1 steps, bias near -range/2 */
        const float range = rng_uniform(0.05f, 0.2f);
        write_param(s, sdt, i, range / (float)(levels - 1));
        write_param(b, sdt, i, -range * rng_uniform(0.35f, 0.65f));
    }
    t->m.data = d;
    t->m.scales = s;
    t->m.biases = b;
}

static void free_matrix(test_matrix *t) {
    guarded_free(&t->data);
    guarded_free(&t->scales);
    guarded_free(&t->biases);
}

/* x as the fast path rounds it for w (bf16, or int8 per group). */
static void rounded_inputs(const g4_matrix *w, const float *x, int64_t n, float *xr) {
    const int64_t cols = w->cols;
    if (w->format == G4_WEIGHT_BF16) {
        for (int64_t i = 0; i < n * cols; i++) xr[i] = g4_round_bf16(x[i]);
        return;
    }
    const int gs = w->group_size;
    const int64_t nb = cols / gs;
    int8_t *q = malloc((size_t)(n * cols));
    float *d = malloc((size_t)(n * nb) * sizeof *d), *s = malloc((size_t)(n * nb) * sizeof *s);
    cpu_quantize_q8(x, n, cols, gs, q, d, s);
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < cols; c++) xr[t * cols + c] = d[t * nb + c / gs] * (float)q[t * cols + c];
    /* the group sums must be d * sum(q) */
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        for (int64_t g = 0; g < nb; g++) {
            int32_t sq = 0;
            for (int i = 0; i < gs; i++) sq += q[t * cols + g * gs + i];
            bad += s[t * nb + g] != d[t * nb + g] * (float)sq;
        }
    CHECK(bad == 0, "cpu_quantize_q8: %d group sums are not d * sum(q)", bad);
    free(q), free(d), free(s);
}

/* float64 dot products of w's rows with x (n tokens). */
static void reference(const g4_matrix *w, const float *x, int64_t n, double *ref, double *row_norm, double *x_norm) {
    const int64_t rows = w->rows, cols = w->cols;
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        g4_matrix_rows_to_f32(w, r, 1, row);
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += (double)row[c] * row[c];
        if (row_norm) row_norm[r] = sqrt(s);
        for (int64_t t = 0; t < n; t++) {
            double acc = 0;
            for (int64_t c = 0; c < cols; c++) acc += (double)row[c] * x[t * cols + c];
            ref[t * rows + r] = acc;
        }
    }
    for (int64_t t = 0; t < n && x_norm; t++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += (double)x[t * cols + c] * x[t * cols + c];
        x_norm[t] = sqrt(s);
    }
    free(row);
}

static double worst_same_seen, worst_bf16_rms_seen, worst_q8_rms_seen;

/* One matrix at the active level against both references. */
static void check_level(const g4_matrix *w, const float *x, const double *ref_same, const double *ref_true,
                        const double *row_norm, const double *x_norm, const char *label) {
    const int64_t rows = w->rows;
    const int bf16 = w->format == G4_WEIGHT_BF16;
    for (size_t k = 0; k < sizeof token_counts / sizeof token_counts[0]; k++) {
        const int64_t n = token_counts[k];
        const int rounded = cpu_fast_takes(w, n);
        const cpu_isa level = cpu_isa_active();
        /* every level: the int8 products; bf16 ones at scalar and VNNI only */
        const int bf16_level = level == CPU_ISA_SCALAR || level == CPU_ISA_AVX512_VNNI;
        const int expected = bf16 ? bf16_level && w->cols % 2 == 0 : 1;
        CHECK(rounded == expected, "%s %s n=%lld: fast kernel taken %d", label, cpu_isa_name(), (long long)n, rounded);
        float *out = malloc((size_t)(n * rows) * sizeof *out);
        for (int64_t i = 0; i < n * rows; i++) out[i] = NAN;
        cpu_matmul_fast(out, x, n, w);
        double worst = 0, num = 0, den = 0;
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                const double o = out[t * rows + r], e = rounded ? ref_same[t * rows + r] : ref_true[t * rows + r];
                const double err = isnan(o) ? INFINITY : fabs(o - e) / (row_norm[r] * x_norm[t]);
                if (!(err <= worst)) worst = err;
                num += (o - ref_true[t * rows + r]) * (o - ref_true[t * rows + r]);
                den += ref_true[t * rows + r] * ref_true[t * rows + r];
            }
        const double rms = sqrt(num / den);
        if (worst > worst_same_seen) worst_same_seen = worst;
        const int counted = rounded && n * rows >= 200; /* (a few outputs near zero make a small count meaningless) */
        double *seen = bf16 ? &worst_bf16_rms_seen : &worst_q8_rms_seen;
        if (counted && rms > *seen) *seen = rms;
        CHECK(worst <= ELEMENT_TOL, "%s %s n=%lld: same-input error %.3g of |w||x|", label, cpu_isa_name(),
              (long long)n, worst);
        CHECK(!counted || rms <= (bf16 ? BF16_RMS_TOL : Q8_RMS_TOL), "%s %s n=%lld: rms error %.3g against float64",
              label, cpu_isa_name(), (long long)n, rms);
        free(out);
    }
}

static void check_matrix(const g4_matrix *w, const char *label) {
    const int64_t rows = w->rows, cols = w->cols;
    float *x = malloc((size_t)(MAX_TOKENS * cols) * sizeof *x), *xr = malloc((size_t)(MAX_TOKENS * cols) * sizeof *xr);
    for (int64_t i = 0; i < MAX_TOKENS * cols; i++) x[i] = rng_uniform(-1.0f, 1.0f);
    /* a few tokens with a large outlier, as real activations have */
    for (int64_t t = 0; t < MAX_TOKENS; t += 7) x[t * cols + (t * 37) % cols] = 20.0f;
    rounded_inputs(w, x, MAX_TOKENS, xr);
    double *ref_same = malloc((size_t)(MAX_TOKENS * rows) * sizeof *ref_same);
    double *ref_true = malloc((size_t)(MAX_TOKENS * rows) * sizeof *ref_true);
    double *row_norm = malloc((size_t)rows * sizeof *row_norm), *x_norm = malloc(MAX_TOKENS * sizeof *x_norm);
    reference(w, xr, MAX_TOKENS, ref_same, NULL, NULL);
    reference(w, x, MAX_TOKENS, ref_true, row_norm, x_norm);
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        cpu_isa_force((cpu_isa)level);
        check_level(w, x, ref_same, ref_true, row_norm, x_norm, label);
    }
    cpu_isa_force(cpu_isa_supported());
    free(x), free(xr), free(ref_same), free(ref_true), free(row_norm), free(x_norm);
}

static void test_bf16(void) {
    /* rows: fewer than one micro-kernel, odd, more than one tile; columns:
     * under, at and over the 256-column tile, odd (float32 path) */
    const int64_t shapes[][2] = {{1, 32}, {3, 250}, {17, 256}, {67, 1538}, {9, 4096 + 6}, {5, 33}};
    char label[96];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int skew = 0; skew < 2; skew++) {
            test_matrix t;
            make_bf16(&t, shapes[s][0], shapes[s][1], skew);
            snprintf(label, sizeof label, "bf16 %lldx%lld%s", (long long)shapes[s][0], (long long)shapes[s][1],
                     skew ? " (odd address)" : "");
            check_matrix(&t.m, label);
            free_matrix(&t);
        }
}

static void test_affine(void) {
    const int bits[] = {4, 8};
    const int groups[] = {32, 64, 96, 128};
    char label[96];
    for (int bi = 0; bi < 2; bi++)
        for (int gi = 0; gi < 4; gi++) {
            const int g = groups[gi];
            const int64_t shapes[][2] = {{1, g}, {3, 4 * g}, {67, 1536 / 32 * 32 / g * g + g}, {5, 259 * g}};
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                const g4_dtype dt = s == 1 ? G4_DTYPE_F16 : s == 3 ? G4_DTYPE_F32 : G4_DTYPE_BF16;
                test_matrix t;
                make_affine(&t, bits[bi], g, dt, shapes[s][0], shapes[s][1]);
                snprintf(label, sizeof label, "affine%d g%d %s %lldx%lld", bits[bi], g, g4_dtype_name(dt),
                         (long long)shapes[s][0], (long long)shapes[s][1]);
                check_matrix(&t.m, label);
                /* a view of rows 1.. (its rows start mid-buffer) */
                g4_matrix v = g4_matrix_rows(&t.m, 1, shapes[s][0] - 1);
                if (v.rows > 0) {
                    snprintf(label + strlen(label), sizeof label - strlen(label), " rows view");
                    check_matrix(&v, label);
                }
                free_matrix(&t);
            }
        }
}

/* Formats the fast path does not take (3-bit affine, f32) give cpu_matmul's
 * result exactly. */
static void test_other_formats_exact(void) {
    test_matrix t;
    make_affine(&t, 3, 64, G4_DTYPE_BF16, 9, 256);
    const int64_t n = 20;
    float *x = malloc((size_t)(n * 256) * sizeof *x), *a = malloc((size_t)(n * 9) * sizeof *a),
          *b = malloc((size_t)(n * 9) * sizeof *b);
    for (int64_t i = 0; i < n * 256; i++) x[i] = rng_uniform(-1.0f, 1.0f);
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        cpu_isa_force((cpu_isa)level);
        CHECK(!cpu_fast_takes(&t.m, n), "affine3 is not on the fast path (%s)", cpu_isa_name());
        cpu_matmul(a, x, n, &t.m);
        cpu_matmul_fast(b, x, n, &t.m);
        CHECK(memcmp(a, b, (size_t)(n * 9) * sizeof *a) == 0, "affine3 fast = exact (%s)", cpu_isa_name());
        cpu_matmul_with(G4_PRECISION_EXACT, b, x, n, &t.m);
        CHECK(memcmp(a, b, (size_t)(n * 9) * sizeof *a) == 0, "cpu_matmul_with exact = cpu_matmul (%s)",
              cpu_isa_name());
    }
    cpu_isa_force(cpu_isa_supported());
    free(x), free(a), free(b);
    free_matrix(&t);
}

/* The fast attention (float32, heads of a KV head together) against the
 * exact one (float64 sums) on the same cache: causal over 0..n-1 in full
 * layers, a window of 40 in sliding ones. Group sizes 8 (E2B), 2, 12 (more
 * than the kernels take at once) and 3; head sizes that the SIMD kernels take
 * (multiples of 16) and one they do not (24). */
static double worst_attention_seen, worst_gelu_seen, worst_softcap_seen, worst_kv_type_seen[4];
static void test_attention(void) {
    enum { N = 97, BS = 16, BLOCKS = 8, WINDOW = 40 };
    const int shapes[][3] = {{8, 1, 256}, {4, 2, 32}, {12, 1, 64}, {3, 1, 24}, {2, 2, 512}}; /* heads, kv heads, D */
    g4_backend *fast, *exact;
    CHECK(g4_backend_cpu_create(0, &fast) == G4_OK, "fast backend");
    CHECK(g4_backend_cpu_create(0, &exact) == G4_OK, "exact backend");
    fast->ops->set_precision(fast, G4_PRECISION_FAST);
    CHECK(cpu_backend_precision(fast) == G4_PRECISION_FAST && cpu_backend_precision(exact) == G4_PRECISION_EXACT,
          "precision fields");
    int32_t pos[N], seq[N], range[4 * N], table[BLOCKS], ring[BLOCKS];
    for (int t = 0; t < N; t++) {
        pos[t] = t, seq[t] = 0;
        range[4 * t] = t - WINDOW + 1 > 0 ? t - WINDOW + 1 : 0, range[4 * t + 1] = t;
        range[4 * t + 2] = 0, range[4 * t + 3] = t;
    }
    for (int i = 0; i < BLOCKS; i++) table[i] = BLOCKS - 1 - i, ring[i] = i; /* a shuffled full table */
    const g4_attn_batch b = {.n_tokens = N, .pos = pos, .seq = seq, .kv_range = range, .full_tables = table,
                             .full_table_stride = BLOCKS, .sliding_tables = ring, .ring_blocks = BLOCKS,
                             .block_size = BS};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int H = shapes[s][0], Hkv = shapes[s][1], D = shapes[s][2];
        float *k = malloc((size_t)N * Hkv * D * sizeof *k), *v = malloc((size_t)N * Hkv * D * sizeof *v);
        float *q = malloc((size_t)N * H * D * sizeof *q);
        float *o1 = malloc((size_t)N * H * D * sizeof *o1), *o2 = malloc((size_t)N * H * D * sizeof *o2);
        for (size_t i = 0; i < (size_t)N * Hkv * D; i++) k[i] = rng_uniform(-1, 1), v[i] = rng_uniform(-1, 1);
        for (size_t i = 0; i < (size_t)N * H * D; i++) q[i] = rng_uniform(-1, 1);
        float *o0 = malloc((size_t)N * H * D * sizeof *o0);
        /* the exact path over float32 K and V, the reference of the typed caches */
        void *kv32 = exact->ops->kv_alloc(exact, BLOCKS, BS, Hkv, D, G4_KV_F32);
        exact->ops->kv_store(exact, kv32, k, v, &b, 0);
        for (int type = G4_KV_F32; type <= G4_KV_FP8; type++) {
            void *kv = exact->ops->kv_alloc(exact, BLOCKS, BS, Hkv, D, (g4_kv_type)type);
            CHECK(kv, "kv_alloc %s", g4_kv_type_name((g4_kv_type)type));
            exact->ops->kv_store(exact, kv, k, v, &b, 0);
            for (int sliding = 0; sliding < 2; sliding++) {
                const float scale = 1.0f / sqrtf((float)D) * 3.0f; /* sharp enough that the softmax matters */
                exact->ops->attention(exact, o0, q, kv32, &b, sliding, H, scale);
                exact->ops->attention(exact, o1, q, kv, &b, sliding, H, scale);
                /* the stored type's rounding against float32 K and V (bf16: 2^-9 relative per value, fp8
                 * e4m3: 2^-4 of the row's peak at worst, mostly less) */
                double type_worst = 0;
                for (size_t i = 0; i < (size_t)N * H * D; i++) {
                    const double e = fabs((double)o1[i] - o0[i]);
                    if (!(e <= type_worst)) type_worst = isnan(e) ? INFINITY : e;
                }
                const double type_tol = type == G4_KV_F32 ? 0 : type == G4_KV_BF16 ? KV_BF16_TOL : KV_FP8_TOL;
                CHECK(type_worst <= type_tol, "attention %dx%d/%d %s over a %s cache against f32: worst %.3g > %.3g",
                      H, D, Hkv, sliding ? "sliding" : "full", g4_kv_type_name((g4_kv_type)type), type_worst,
                      type_tol);
                if (type_worst > worst_kv_type_seen[type]) worst_kv_type_seen[type] = type_worst;
                /* the fast kernels read the stored type as the exact path does */
                for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
                    cpu_isa_force((cpu_isa)level);
                    for (size_t i = 0; i < (size_t)N * H * D; i++) o2[i] = NAN;
                    fast->ops->attention(fast, o2, q, kv, &b, sliding, H, scale);
                    double worst = 0;
                    for (size_t i = 0; i < (size_t)N * H * D; i++) {
                        const double e = isnan(o2[i]) ? INFINITY : fabs((double)o2[i] - o1[i]);
                        if (!(e <= worst)) worst = e;
                    }
                    if (worst > worst_attention_seen) worst_attention_seen = worst;
                    /* outputs are averages of values in [-1, 1] */
                    CHECK(worst <= ATTENTION_TOL, "attention %dx%d/%d %s %s over %s: worst error %.3g", H, D, Hkv,
                          sliding ? "sliding" : "full", cpu_isa_name(), g4_kv_type_name((g4_kv_type)type), worst);
                }
                cpu_isa_force(cpu_isa_supported());
            }
            exact->ops->kv_free(exact, kv);
        }
        exact->ops->kv_free(exact, kv32);
        free(o0);
        free(k), free(v), free(q), free(o1), free(o2);
    }
    g4_backend_destroy(fast);
    g4_backend_destroy(exact);
}

/* The fast GELU (float32, one exp) against the float64 formula, over the
 * range activations take and beyond (where it must tend to x and to 0). */
static void test_gelu(void) {
    enum { N = 4003 };
    float *gate = malloc(N * sizeof *gate), *up = malloc(N * sizeof *up), *out = malloc(N * sizeof *out);
    for (int i = 0; i < N; i++) gate[i] = -60.0f + 120.0f * (float)i / (N - 1), up[i] = rng_uniform(0.5f, 2.0f);
    gate[7] = 0.0f, gate[8] = 1e-20f, gate[9] = -1e-20f, gate[10] = 300.0f, gate[11] = -300.0f;
    int tested = 0;
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        const cpu_fast_table *f = cpu_fast_for((cpu_isa)level);
        if (!f->gelu_mul) continue;
        tested++;
        f->gelu_mul(out, gate, up, N);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            const double x = gate[i], g = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
            /* relative, and absolute below 1e-3 (where the float64 formula itself cancels) */
            const double e = g * up[i], err = fabs(out[i] - e) / fmax(fabs(e), 1e-3);
            if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
        }
        if (worst > worst_gelu_seen) worst_gelu_seen = worst;
        CHECK(worst <= GELU_TOL, "gelu_mul %s: relative error %.3g", cpu_isa_level_name((cpu_isa)level), worst);
    }
    /* every SIMD level has one (AVX-512 without VNNI uses AVX2's) */
    const int simd_levels = cpu_isa_supported() >= CPU_ISA_AVX2 ? (int)cpu_isa_supported() - CPU_ISA_AVX2 + 1 : 0;
    CHECK(tested == simd_levels, "fast gelu at %d levels, want %d", tested, simd_levels);
    free(gate), free(up), free(out);
}

/* The fast softcap (cap * tanh(x / cap), float32) against float64's tanh:
 * logits from tiny to far past the cap, both branches of its tanh and the
 * switch between them, a tail after the vectors; NaN stays NaN, infinities
 * give +-cap. */
static void test_softcap(void) {
    enum { N = 5003 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    const float caps[] = {30.0f, 50.0f, 0.5f};
    int tested = 0;
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        const cpu_fast_table *f = cpu_fast_for((cpu_isa)level);
        if (!f->softcap) continue;
        tested++;
        for (int c = 0; c < 3; c++) {
            const float cap = caps[c];
            for (int i = 0; i < N; i++) x[i] = cap * (-12.0f + 24.0f * (float)i / (N - 1));
            for (int i = 0; i < 40; i++) x[100 + i] = cap * 0.4f * (1.0f + (float)(i - 20) * 1e-3f); /* the switch */
            for (int i = 0; i < 40; i++) x[200 + i] = cap * ldexpf(1.0f, -i) * (i % 2 ? -1.0f : 1.0f); /* tiny */
            x[7] = 0.0f, x[8] = -0.0f, x[9] = 1e-30f, x[10] = 1e30f, x[11] = -1e30f;
            memcpy(y, x, N * sizeof *x);
            f->softcap(y, N, cap);
            double worst = 0;
            for (int i = 0; i < N; i++) {
                const double e = cap * tanh((double)x[i] / cap);
                const double err = e == 0.0 ? fabs(y[i]) : fabs(y[i] - e) / fabs(e);
                if (!(err <= worst)) worst = isnan(err) ? INFINITY : err;
            }
            if (worst > worst_softcap_seen) worst_softcap_seen = worst;
            CHECK(worst <= SOFTCAP_TOL, "softcap %s cap %g: relative error %.3g", cpu_isa_level_name((cpu_isa)level),
                  cap, worst);
        }
        float special[11] = {NAN, INFINITY, -INFINITY, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f};
        f->softcap(special, 11, 30.0f);
        CHECK(isnan(special[0]) && special[1] == 30.0f && special[2] == -30.0f,
              "softcap %s: NaN -> %g, inf -> %g, -inf -> %g", cpu_isa_level_name((cpu_isa)level), special[0],
              special[1], special[2]);
    }
    const int simd_levels = cpu_isa_supported() >= CPU_ISA_AVX2 ? (int)cpu_isa_supported() - CPU_ISA_AVX2 + 1 : 0;
    CHECK(tested == simd_levels, "fast softcap at %d levels, want %d", tested, simd_levels);
    free(x), free(y);
}

/* Each level's bf16 rounding gives g4_f32_to_bf16's bits: ties, NaN,
 * infinities, subnormals. */
static void test_to_bf16_levels(void) {
    enum { N = 1000 };
    float x[N];
    uint16_t got[N];
    for (int i = 0; i < N; i++) x[i] = rng_uniform(-4.0f, 4.0f);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xff800001u, 0x7f800000u, 0x00000001u,
                                0x807fffffu, 0x7f7fffffu, 0x00008000u, 0x80000000u};
    for (int i = 0; i < 10; i++) memcpy(&x[3 * i + 1], &special[i], 4);
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        const cpu_fast_table *f = cpu_fast_for((cpu_isa)level);
        if (!f->to_bf16) continue;
        f->to_bf16(x, N - 3, got); /* a tail of 13 after the vectors */
        int bad = 0;
        for (int i = 0; i < N - 3; i++) bad += got[i] != g4_f32_to_bf16(x[i]);
        CHECK(bad == 0, "to_bf16 at %s: %d values differ from g4_f32_to_bf16", cpu_isa_level_name((cpu_isa)level), bad);
    }
}

/* Each level's quantiser gives the reference's bytes, scales and sums. */
static void test_quantize_levels(void) {
    enum { COLS = 4 * 96 };
    float x[3 * COLS];
    for (int i = 0; i < 3 * COLS; i++) x[i] = rng_uniform(-3.0f, 3.0f);
    x[5] = 1e-30f, x[COLS + 7] = -50.0f; /* a tiny and a large value */
    for (int i = 2 * COLS; i < 2 * COLS + 96; i++) x[i] = 0.0f; /* an all-zero block */
    const int blocks[] = {32, 64, 96, 128};
    for (int bi = 0; bi < 4; bi++) {
        const int nb = COLS / blocks[bi];
        int8_t q0[3 * COLS], q1[3 * COLS];
        float d0[3 * 12], s0[3 * 12], d1[3 * 12], s1[3 * 12];
        cpu_quantize_q8(x, 3, COLS, blocks[bi], q0, d0, s0);
        for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
            const cpu_fast_table *f = cpu_fast_for((cpu_isa)level);
            if (!f->quantize_q8) continue;
            for (int t = 0; t < 3; t++)
                f->quantize_q8(x + t * COLS, COLS, blocks[bi], q1 + t * COLS, d1 + t * nb, s1 + t * nb);
            CHECK(memcmp(q0, q1, sizeof q0) == 0 && memcmp(d0, d1, (size_t)(3 * nb) * sizeof *d0) == 0 &&
                      memcmp(s0, s1, (size_t)(3 * nb) * sizeof *s0) == 0,
                  "quantiser at %s, block %d: the reference's bytes", cpu_isa_level_name((cpu_isa)level), blocks[bi]);
        }
    }
}

/* The quantiser itself: round to nearest, the block's largest magnitude
 * maps to +-127, an all-zero block gives zero scale and codes. */
static void test_quantize(void) {
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = i < 32 ? 0.0f : (float)(i - 48) / 16.0f;
    int8_t q[64];
    float d[2], s[2];
    cpu_quantize_q8(x, 1, 64, 32, q, d, s);
    int zero = 1;
    for (int i = 0; i < 32; i++) zero &= q[i] == 0;
    CHECK(zero && d[0] == 0.0f && s[0] == 0.0f, "zero block: d %g sum %g", d[0], s[0]);
    CHECK(d[1] == 1.0f / 127.0f, "scale %.9g", d[1]);
    CHECK(q[32] == -127 && q[63] == (int8_t)lrintf(15.0f / 16.0f * 127.0f), "codes %d %d", q[32], q[63]);
    int worst = 0;
    for (int i = 32; i < 64; i++) {
        const double err = fabs((double)q[i] * d[1] - x[i]);
        if (err > 0.5 * d[1] * (1 + 1e-6)) worst = 1;
    }
    CHECK(!worst, "every code within half a step");
}

int main(int argc, char **argv) {
    if (!getenv("OMP_WAIT_POLICY") && argc > 0) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
    }
    printf("cpu_matmul_fast: supported level %s\n", cpu_isa_level_name(cpu_isa_supported()));
    test_quantize();
    test_quantize_levels();
    test_attention();
    test_gelu();
    test_softcap();
    test_to_bf16_levels();
    test_other_formats_exact();
    test_bf16();
    test_affine();
    const char *verbose = getenv("G4_TEST_VERBOSE");
    if (verbose && *verbose == '1')
        printf("worst same-input error %.3g of |w||x|; rms error against float64: bf16 %.3g, int8 %.3g; attention "
               "%.3g, gelu %.3g, softcap %.3g\n",
               worst_same_seen, worst_bf16_rms_seen, worst_q8_rms_seen, worst_attention_seen, worst_gelu_seen,
               worst_softcap_seen);
    return test_finish();
}
