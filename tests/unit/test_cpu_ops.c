/* The CPU backend against the float64 references of tests/support/
 * op_reference.c, op by op: every entry of the op table the CPU backend has,
 * on fixed-seed random inputs, outputs poisoned with NaN first (an unwritten
 * element fails), on the exact path and, for the ops whose kernels change
 * with it (matmul and its fused forms, gelu_mul, attention, the experts), on
 * the fast path. Each op family has a relative-RMS tolerance and a per-row
 * max-error tolerance (op_check.h) of about 3x the worst reached here, on
 * AVX-512 and AVX2 machines; the table at the end prints both. Shapes are
 * small (the suite takes seconds): test_cpu_matmul covers the matmul kernels'
 * every edge at every ISA level, this test the ops' definitions. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"
#include "model/kv_cache.h"
#include "support/op_check.h"
#include "support/op_reference.h"
#include "support/test_random.h"
#include "test_util.h"

static g4_backend *cpu;
static int fast; /* the pass on G4_PRECISION_FAST */

/* Tolerances (rel_rms, row max): about 3x the worst reached over the
 * scalar and AVX2 levels (measured on an AVX2 machine; the table at the end
 * prints the reached values). The exact path's float32 work stays within a
 * few roundings of the reference; the fast path rounds activations to bf16
 * (scalar level, bf16 weights) or quantises them to int8 (affine 4/8-bit),
 * hence its 1e-3..1e-2 entries (cpu_fast.h). bf16 and fp8 caches are
 * checked code by code (op_check_rounded). Exceptions to 3x: the fast path
 * on AVX-512 levels
 * ("[fast avx512]") was not measured here and gets the int8 bound of its
 * family; matmul_gated and add_rmsnorm_moe (not in the CPU table yet) take
 * matmul_gelu_mul's and add_rmsnorm's. */
static const op_tolerance tolerances[] = {
    {"matmul/f32", 1.1e-6, 4.0e-6},
    {"matmul/bf16", 1.0e-6, 5.1e-6},
    {"matmul/f16", 9.0e-7, 5.5e-6},
    {"matmul/affine4", 1.1e-6, 6.5e-6},
    {"matmul/affine8", 1.0e-6, 6.3e-6},
    {"matmul/affine2-6", 1.0e-6, 5.5e-6},
    {"matmul/mxfp4", 9.3e-7, 5.2e-6},
    {"matmul_precise", 1.8e-7, 5.5e-7},
    {"matmul_gelu_mul", 1.3e-6, 1.7e-5},
    {"matmul_gated", 1.3e-6, 1.7e-5},
    {"matmul/f32 [fast]", 9.0e-7, 4.5e-6},
    {"matmul/bf16 [fast]", 5.4e-3, 1.5e-2},
    {"matmul/f16 [fast]", 8.7e-7, 4.9e-6},
    {"matmul/affine4 [fast]", 1.5e-2, 4.4e-2},
    {"matmul/affine8 [fast]", 1.3e-2, 4.9e-2},
    {"matmul/affine2-6 [fast]", 9.3e-7, 5.6e-6},
    {"matmul/mxfp4 [fast]", 8.1e-7, 3.9e-6},
    {"matmul_gelu_mul [fast]", 1.6e-2, 1.2e-1},
    {"matmul_gated [fast]", 1.6e-2, 1.2e-1},
    {"gelu_mul [fast]", 1.3e-7, 1.1e-6},
    {"moe_experts [fast]", 3.6e-2, 1.8e-1},
    {"attention f32 [fast]", 3.7e-6, 3.2e-5},
    {"attention bf16 [fast]", 1.0e-5, 7.9e-5},
    {"attention fp8 [fast]", 9.8e-6, 6.5e-5},
    {"matmul/f32 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/bf16 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/f16 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/affine4 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/affine8 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/affine2-6 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul/mxfp4 [fast avx512]", 1.5e-2, 5.0e-2},
    {"matmul_gelu_mul [fast avx512]", 1.6e-2, 1.2e-1},
    {"matmul_gated [fast avx512]", 1.6e-2, 1.2e-1},
    {"gelu_mul [fast avx512]", 1.3e-6, 1.1e-5},
    {"moe_experts [fast avx512]", 3.6e-2, 1.8e-1},
    {"attention f32 [fast avx512]", 3.7e-5, 3.2e-4},
    {"attention bf16 [fast avx512]", 1.0e-4, 7.9e-4},
    {"attention fp8 [fast avx512]", 1.0e-4, 7.9e-4},
    {"embed", 1.7e-7, 7.9e-7},
    {"rmsnorm", 9.0e-8, 2.9e-7},
    {"rmsnorm_pair", 9.0e-8, 2.9e-7},
    {"add_rmsnorm", 1.4e-7, 9.9e-7},
    {"add_rmsnorm_moe", 1.4e-7, 9.9e-7},
    {"moe_residual", 1.4e-7, 9.2e-7},
    {"layer_norm", 1.5e-7, 7.6e-7},
    {"rope", 1.1e-7, 6.3e-7},
    {"rmsnorm_rope", 1.4e-7, 8.4e-7},
    {"rope_2d", 1.3e-7, 7.7e-7},
    {"qkv_prepare q", 1.6e-7, 1.0e-6},
    {"qkv_prepare kv f32", 1.7e-7, 1.1e-6},
    {"elementwise", 1.5e-7, 7.2e-7},
    {"gelu_mul", 7.9e-8, 8.7e-7},
    {"silu/glu", 1.4e-7, 1.8e-6},
    {"pool_rows", 1.3e-7, 6.5e-7},
    {"attention f32", 7.3e-8, 4.8e-7},
    {"attention bf16", 7.3e-8, 4.3e-7},
    {"attention fp8", 1.3e-6, 9.2e-6},
    {"moe_route weights", 1.1e-7, 3.2e-7},
    {"moe_experts", 1.2e-6, 6.7e-6},
    {"conv2d", 6.0e-7, 3.0e-6},
    {"depthwise_conv1d", 1.5e-7, 8.9e-7},
    {"chunked_attention", 8.9e-7, 1.3e-5},
};
/* top_logits' log-sum-exp, relative (3x the 6.2e-10 reached: the CPU sums exp in float32) */
static const double lse_tol = 2e-9;

/* "name", or on the fast pass "name [fast]" ("[fast avx512]" at the AVX-512 levels, unmeasured here) */
static const char *family(const char *name) {
    static char buf[4][64];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s%s", name,
             !fast ? "" : cpu_isa_active() >= CPU_ISA_AVX512 ? " [fast avx512]" : " [fast]");
    return b;
}

static float *nan_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* ---- matmul and its fused forms ---- */

typedef struct {
    g4_weight_format f;
    int bits, group;
    g4_dtype sdt;
} format_case;

static const format_case formats[] = {
    {G4_WEIGHT_F32, 0, 0, 0},
    {G4_WEIGHT_BF16, 0, 0, 0},
    {G4_WEIGHT_F16, 0, 0, 0},
    {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
    {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16},
    {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F32},
    {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
    {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F32},
    {G4_WEIGHT_AFFINE, 2, 64, G4_DTYPE_BF16},
    {G4_WEIGHT_AFFINE, 3, 64, G4_DTYPE_BF16},
    {G4_WEIGHT_AFFINE, 5, 32, G4_DTYPE_BF16},
    {G4_WEIGHT_AFFINE, 6, 64, G4_DTYPE_F16},
    {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8},
};

static const char *matmul_family(const g4_matrix *m) {
    switch (m->format) {
    case G4_WEIGHT_F32: return "matmul/f32";
    case G4_WEIGHT_BF16: return "matmul/bf16";
    case G4_WEIGHT_F16: return "matmul/f16";
    case G4_WEIGHT_MXFP4: return "matmul/mxfp4";
    case G4_WEIGHT_AFFINE: return m->bits == 4 ? "matmul/affine4" : m->bits == 8 ? "matmul/affine8" : "matmul/affine2-6";
    }
    return "matmul/?";
}

static void check_matmul(const host_matrix *t, const g4_matrix *m, int n, const char *label) {
    float *x = rand_floats((size_t)n * m->cols, 0.05f, 2.0f), *got = nan_floats((size_t)n * m->rows);
    double *want = doubles((size_t)n * m->rows);
    cpu->ops->matmul(cpu, got, x, n, m);
    ref_matmul(want, x, n, m);
    char what[128];
    snprintf(what, sizeof what, "%s%s %lldx%lld n=%d", label, t->name, (long long)m->rows, (long long)m->cols, n);
    op_check(family(matmul_family(m)), what, got, want, (size_t)n, (size_t)m->rows);
    free(x), free(got), free(want);
}

static void test_matmul(void) {
    const int ns[] = {1, 3, 17};
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++) {
        host_matrix t;
        host_matrix_make(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, 72, 512);
        for (int i = 0; i < 3; i++) check_matmul(&t, &t.m, ns[i], "");
        const g4_matrix view = g4_matrix_rows(&t.m, 13, 40); /* a row view */
        check_matmul(&t, &view, 5, "rows[13,53) ");
        if (!fast) { /* matmul_precise (the vision tower's) */
            float *x = rand_floats((size_t)3 * 512, 0.05f, 2.0f), *got = nan_floats((size_t)3 * 72);
            double *want = doubles((size_t)3 * 72);
            cpu->ops->matmul_precise(cpu, got, x, 3, &t.m);
            ref_matmul(want, x, 3, &t.m);
            char what[96];
            snprintf(what, sizeof what, "%s 72x512 n=3", t.name);
            op_check("matmul_precise", what, got, want, 3, 72);
            free(x), free(got), free(want);
        }
        host_matrix_free(&t);
    }
    /* odd shapes: rows and columns off every vector width */
    host_matrix t;
    host_matrix_make(&t, G4_WEIGHT_BF16, 0, 0, 0, 33, 40);
    for (int i = 0; i < 3; i++) check_matmul(&t, &t.m, ns[i], "odd ");
    host_matrix_free(&t);
    host_matrix_make(&t, G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_BF16, 5, 96);
    for (int i = 0; i < 3; i++) check_matmul(&t, &t.m, ns[i], "odd ");
    host_matrix_free(&t);
}

static void test_matmul_fused(void) {
    const format_case cases[] = {{G4_WEIGHT_BF16, 0, 0, 0},
                                 {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
                                 {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
                                 {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    const int ns[] = {1, 17};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        host_matrix t;
        host_matrix_make(&t, cases[k].f, cases[k].bits, cases[k].group, cases[k].sdt, 2 * 48, 256);
        for (int i = 0; i < 2; i++) {
            const int n = ns[i];
            const size_t no = (size_t)n * t.m.rows;
            float *x = rand_floats((size_t)n * 256, 0.05f, 2.0f), *mul = rand_floats(no, 0.1f, 3.0f);
            float *got = nan_floats(no);
            double *want = doubles(no);
            char what[96];
            snprintf(what, sizeof what, "%s 96x256 n=%d", t.name, n);
            cpu->ops->matmul_gelu_mul(cpu, got, x, n, &t.m, mul);
            ref_matmul_gelu_mul(want, x, n, &t.m, mul);
            op_check(family("matmul_gelu_mul"), what, got, want, (size_t)n, (size_t)t.m.rows);
            if (cpu->ops->matmul_gated) { /* (optional in the table) */
                for (size_t j = 0; j < no / 2; j++) got[j] = NAN;
                cpu->ops->matmul_gated(cpu, got, x, n, &t.m);
                ref_matmul_gated(want, x, n, &t.m);
                op_check(family("matmul_gated"), what, got, want, (size_t)n, (size_t)t.m.rows / 2);
            }
            free(x), free(mul), free(got), free(want);
        }
        host_matrix_free(&t);
    }
}

static void test_embed(void) {
    const format_case cases[] = {{G4_WEIGHT_BF16, 0, 0, 0},
                                 {G4_WEIGHT_F32, 0, 0, 0},
                                 {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
                                 {G4_WEIGHT_AFFINE, 6, 64, G4_DTYPE_F32},
                                 {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        host_matrix t;
        host_matrix_make(&t, cases[k].f, cases[k].bits, cases[k].group, cases[k].sdt, 300, 256);
        int32_t ids[9];
        for (int i = 0; i < 9; i++) ids[i] = rand_int(300);
        ids[3] = ids[1], ids[8] = 299;
        const float scales[] = {1.0f, 39.25f};
        for (int s = 0; s < 2; s++) {
            float *got = nan_floats(9 * 256);
            double *want = doubles(9 * 256);
            cpu->ops->embed(cpu, got, &t.m, ids, 9, scales[s]);
            ref_embed(want, &t.m, ids, 9, scales[s]);
            char what[128];
            snprintf(what, sizeof what, "%s 300x256, 9 ids, scale %g", t.name, scales[s]);
            op_check("embed", what, got, want, 9, 256);
            free(got), free(want);
        }
        host_matrix_free(&t);
    }
}

/* ---- norms ---- */

static void test_norms(void) {
    const int cases[][2] = {{7, 1536}, {3, 37}, {20, 256}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1];
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(n, 0.01f, 30.0f), *h = rand_floats(n, 0.01f, 10.0f), *w[4];
        for (int i = 0; i < 4; i++) w[i] = rand_floats((size_t)dim, 0.5f, 2.0f);
        float *got = nan_floats(n), *got2 = nan_floats(n), *got3 = nan_floats(n), *gh = malloc(n * 4);
        double *want = doubles(n), *want2 = doubles(n), *want3 = doubles(n), *wh = doubles(n);
        char what[96];
        for (int weighted = 0; weighted < 2; weighted++) {
            const float *wt = weighted ? w[0] : NULL;
            snprintf(what, sizeof what, "%d x %d%s", rows, dim, weighted ? "" : ", no weight");
            cpu->ops->rmsnorm(cpu, got, x, wt, rows, dim, 1e-6f);
            ref_rmsnorm(want, x, wt, rows, dim, 1e-6);
            op_check("rmsnorm", what, got, want, (size_t)rows, (size_t)dim);
            memcpy(got, x, n * 4); /* in place */
            cpu->ops->rmsnorm(cpu, got, got, wt, rows, dim, 1e-6f);
            op_check("rmsnorm", "in place", got, want, (size_t)rows, (size_t)dim);
            cpu->ops->rmsnorm_pair(cpu, got, w[1], got2, wt, x, rows, dim, 1e-6f);
            ref_rmsnorm(want2, x, w[1], rows, dim, 1e-6);
            op_check("rmsnorm_pair", what, got, want2, (size_t)rows, (size_t)dim);
            op_check("rmsnorm_pair", what, got2, want, (size_t)rows, (size_t)dim);
            /* h = (h + rmsnorm(x) w) * scale, next = rmsnorm(h) * next_w */
            const float scale = weighted ? 0.37f : 1.0f;
            memcpy(gh, h, n * 4);
            cpu->ops->add_rmsnorm(cpu, gh, x, w[0], rows, dim, 1e-6f, scale, got, wt);
            ref_add_rmsnorm(wh, want, h, x, w[0], rows, dim, 1e-6, scale, wt);
            snprintf(what, sizeof what, "%d x %d, scale %g%s", rows, dim, scale, weighted ? "" : ", unweighted next");
            op_check("add_rmsnorm", what, gh, wh, (size_t)rows, (size_t)dim);
            op_check("add_rmsnorm", what, got, want, (size_t)rows, (size_t)dim);
            memcpy(gh, h, n * 4);
            cpu->ops->add_rmsnorm(cpu, gh, x, w[0], rows, dim, 1e-6f, scale, NULL, NULL);
            op_check("add_rmsnorm", "no next norm", gh, wh, (size_t)rows, (size_t)dim);
            if (cpu->ops->add_rmsnorm_moe) { /* (optional in the table) */
                memcpy(gh, h, n * 4);
                cpu->ops->add_rmsnorm_moe(cpu, gh, x, w[0], rows, dim, 1e-6f, got, w[1], got2, w[2], got3, wt);
                ref_add_rmsnorm_moe(wh, want, want2, want3, h, x, w[0], rows, dim, 1e-6, w[1], w[2], wt);
                op_check("add_rmsnorm_moe", what, gh, wh, (size_t)rows, (size_t)dim);
                op_check("add_rmsnorm_moe", what, got, want, (size_t)rows, (size_t)dim);
                op_check("add_rmsnorm_moe", what, got2, want2, (size_t)rows, (size_t)dim);
                op_check("add_rmsnorm_moe", what, got3, want3, (size_t)rows, (size_t)dim);
            }
            /* the MoE layer's end: dense = norm(dense) w_d + norm(experts) w_e, then the residual step */
            float *dense = rand_floats(n, 0.01f, 30.0f), *experts = rand_floats(n, 0.01f, 5.0f);
            memcpy(gh, h, n * 4);
            memcpy(got2, dense, n * 4);
            cpu->ops->moe_residual(cpu, gh, got2, w[0], experts, w[1], w[2], rows, dim, 1e-6f, scale, got, wt ? w[3] : NULL);
            ref_moe_residual(wh, want2, want, h, dense, w[0], experts, w[1], w[2], rows, dim, 1e-6, scale,
                             wt ? w[3] : NULL);
            op_check("moe_residual", what, gh, wh, (size_t)rows, (size_t)dim);
            op_check("moe_residual", what, got2, want2, (size_t)rows, (size_t)dim);
            op_check("moe_residual", what, got, want, (size_t)rows, (size_t)dim);
            free(dense), free(experts);
        }
        for (int i = 0; i < 4; i++) free(w[i]);
        free(x), free(h), free(got), free(got2), free(got3), free(gh), free(want), free(want2), free(want3), free(wh);
    }
    /* LayerNorm (the audio conformer, the 12B's vision embedder) with and without weight and bias */
    const int dims[] = {32, 1024, 6912};
    for (int k = 0; k < 3; k++) {
        const int rows = 5, dim = dims[k];
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(n, 0.01f, 4.0f), *w = rand_floats((size_t)dim, 0.5f, 1.5f);
        float *b = rand_floats((size_t)dim, 0.01f, 0.2f), *got = nan_floats(n);
        double *want = doubles(n);
        cpu->ops->layer_norm(cpu, got, x, k == 1 ? NULL : w, k == 2 ? NULL : b, rows, dim, 1e-5f);
        ref_layer_norm(want, x, k == 1 ? NULL : w, k == 2 ? NULL : b, rows, dim, 1e-5);
        char what[64];
        snprintf(what, sizeof what, "5 x %d%s", dim, k == 1 ? ", no weight" : k == 2 ? ", no bias" : "");
        op_check("layer_norm", what, got, want, (size_t)rows, (size_t)dim);
        free(x), free(w), free(b), free(got), free(want);
    }
}

/* ---- positions ---- */

static void test_rope(void) {
    const struct {
        int n, heads, dim, pairs;
        float theta;
    } cases[] = {{5, 8, 256, 128, 10000.0f}, {3, 4, 512, 64, 1000000.0f}, {3, 2, 72, 10, 500.0f}, {2, 3, 18, 5, 50.0f}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int n = cases[k].n, H = cases[k].heads, D = cases[k].dim;
        const size_t total = (size_t)n * H * D;
        float *x = rand_floats(total, 0.01f, 3.0f), *w = rand_floats((size_t)D, 0.5f, 2.0f), *got = malloc(total * 4);
        double *want = doubles(total);
        int32_t pos[8];
        for (int t = 0; t < n; t++) pos[t] = t == 0 ? 0 : rand_int(100000);
        char what[96];
        snprintf(what, sizeof what, "%d x %d heads x %d, %d pairs, theta %g", n, H, D, cases[k].pairs, cases[k].theta);
        memcpy(got, x, total * 4);
        cpu->ops->rope(cpu, got, n, H, D, pos, cases[k].theta, cases[k].pairs);
        ref_rope(want, x, n, H, D, pos, cases[k].theta, cases[k].pairs);
        op_check("rope", what, got, want, (size_t)n * H, (size_t)D);
        for (int weighted = 0; weighted < 2; weighted++) {
            memcpy(got, x, total * 4);
            cpu->ops->rmsnorm_rope(cpu, got, weighted ? w : NULL, n, H, D, pos, cases[k].theta, cases[k].pairs, 1e-6f);
            ref_rmsnorm_rope(want, x, weighted ? w : NULL, n, H, D, pos, cases[k].theta, cases[k].pairs, 1e-6);
            op_check("rmsnorm_rope", what, got, want, (size_t)n * H, (size_t)D);
        }
        free(x), free(w), free(got), free(want);
    }
    /* 2-D RoPE of the vision tower: 50 patches, 12 heads of 64 */
    const int n = 50, H = 12, D = 64;
    const size_t total = (size_t)n * H * D;
    float *x = rand_floats(total, 0.01f, 3.0f), *got = malloc(total * 4);
    double *want = doubles(total);
    int32_t pos[100];
    for (int t = 0; t < n; t++) pos[2 * t] = rand_int(40), pos[2 * t + 1] = rand_int(40);
    memcpy(got, x, total * 4);
    cpu->ops->rope_2d(cpu, got, n, H, D, pos, 100.0f);
    ref_rope_2d(want, x, n, H, D, pos, 100.0);
    op_check("rope_2d", "50 patches, 12 heads x 64", got, want, (size_t)n * H, (size_t)D);
    free(x), free(got), free(want);
}

/* ---- elementwise, rows, copies ---- */

static void test_elementwise(void) {
    const int rows = 7, dim = 151;
    const size_t n = (size_t)rows * dim;
    float *a = rand_floats(2 * n, 0.01f, 4.0f), *b = rand_floats(n, 0.01f, 4.0f), *v = rand_floats((size_t)dim, 0.1f, 2.0f);
    float *s = rand_floats((size_t)rows, 0.0f, 1.0f), *got = nan_floats(2 * n);
    double *want = doubles(2 * n);
    for (int i = 0; i < 5; i++) a[i * 13] = i % 2 ? 40.0f : -40.0f; /* softcap/clamp/gelu tails */
    cpu->ops->add(cpu, got, a, b, n), ref_add(want, a, b, n);
    op_check("elementwise", "add 1057", got, want, rows, (size_t)dim);
    cpu->ops->scale(cpu, got, a, 0.37f, n), ref_scale(want, a, 0.37f, n);
    op_check("elementwise", "scale 1057", got, want, rows, (size_t)dim);
    cpu->ops->mul(cpu, got, a, b, n), ref_mul(want, a, b, n);
    op_check("elementwise", "mul 1057", got, want, rows, (size_t)dim);
    cpu->ops->mul_rows(cpu, got, a, v, rows, dim), ref_mul_rows(want, a, v, rows, dim);
    op_check("elementwise", "mul_rows 7 x 151", got, want, rows, (size_t)dim);
    memcpy(got, a, n * 4);
    cpu->ops->softcap(cpu, got, n, 30.0f), ref_softcap(want, a, n, 30.0);
    op_check("elementwise", "softcap 30, 1057", got, want, rows, (size_t)dim);
    cpu->ops->affine(cpu, got, a, 1.7f, -0.25f, n), ref_affine(want, a, 1.7f, -0.25f, n);
    op_check("elementwise", "affine 1057", got, want, rows, (size_t)dim);
    cpu->ops->scale_rows(cpu, got, a, s, rows, dim), ref_scale_rows(want, a, s, rows, dim);
    op_check("elementwise", "scale_rows 7 x 151", got, want, rows, (size_t)dim);
    cpu->ops->add_rows(cpu, got, a, v, rows, dim), ref_add_rows(want, a, v, rows, dim);
    op_check("elementwise", "add_rows 7 x 151", got, want, rows, (size_t)dim);
    cpu->ops->clamp(cpu, got, a, -1.5f, 2.5f, n), ref_clamp(want, a, -1.5f, 2.5f, n);
    op_check("elementwise", "clamp [-1.5, 2.5]", got, want, rows, (size_t)dim);
    cpu->ops->clamp(cpu, got, a, -INFINITY, 1.0f, n), ref_clamp(want, a, -INFINITY, 1.0f, n);
    op_check("elementwise", "clamp [-inf, 1]", got, want, rows, (size_t)dim);
    cpu->ops->relu(cpu, got, a, n), ref_relu(want, a, n);
    op_check("elementwise", "relu 1057", got, want, rows, (size_t)dim);
    cpu->ops->silu(cpu, got, a, n), ref_silu(want, a, n);
    op_check("silu/glu", "silu 1057", got, want, rows, (size_t)dim);
    cpu->ops->glu(cpu, got, a, rows, dim), ref_glu(want, a, rows, dim);
    op_check("silu/glu", "glu 7 x 302 -> 151", got, want, rows, (size_t)dim);
    for (int pass = 0; pass < 2; pass++) { /* gelu_mul changes with the precision */
        fast = pass;
        cpu->ops->set_precision(cpu, pass ? G4_PRECISION_FAST : G4_PRECISION_EXACT);
        cpu->ops->gelu_mul(cpu, got, a, b, n), ref_gelu_mul(want, a, b, n);
        op_check(family("gelu_mul"), "1057", got, want, rows, (size_t)dim);
        /* a long one: the fast path works in pieces */
        float *g = rand_floats(9000, 0.01f, 6.0f), *u = rand_floats(9000, 0.1f, 2.0f), *o = nan_floats(9000);
        double *wo = doubles(9000);
        cpu->ops->gelu_mul(cpu, o, g, u, 9000), ref_gelu_mul(wo, g, u, 9000);
        op_check(family("gelu_mul"), "9000", o, wo, 9, 1000);
        free(g), free(u), free(o), free(wo);
    }
    fast = 0;
    cpu->ops->set_precision(cpu, G4_PRECISION_EXACT);
    free(a), free(b), free(v), free(s), free(got), free(want);
}

static void test_rows_and_copies(void) {
    const int n_src = 50, dim = 96, n = 17;
    float *src = rand_floats((size_t)n_src * dim, 0.01f, 5.0f), *small = rand_floats((size_t)n * dim, 0.01f, 5.0f);
    float *got = nan_floats((size_t)n_src * dim);
    double *want = doubles((size_t)n_src * dim);
    int32_t rows[17];
    for (int i = 0; i < n; i++) rows[i] = (i * 7 + 3) % n_src; /* distinct */
    cpu->ops->gather_rows(cpu, got, src, rows, n, dim), ref_gather_rows(want, src, rows, n, dim);
    op_check_exact("gather_rows", "17 of 50 rows x 96", got, want, (size_t)n * dim);
    memcpy(got, src, (size_t)n_src * dim * 4);
    cpu->ops->scatter_rows(cpu, got, rows, small, n, dim), ref_scatter_rows(want, src, n_src, rows, small, n, dim);
    op_check_exact("scatter_rows", "17 rows into 50 x 96", got, want, (size_t)n_src * dim);
    float *slice = nan_floats((size_t)7 * 32);
    cpu->ops->copy_rows(cpu, slice, 32, src + 5 * 32, 3 * 32, 7, 32), ref_copy_rows(want, src + 5 * 32, 3 * 32, 7, 32);
    op_check_exact("copy_rows", "7 rows x 32 of a 96-wide matrix", slice, want, (size_t)7 * 32);
    cpu->ops->copy(cpu, got, src, (size_t)n_src * dim * 4), ref_copy_rows(want, src, dim, n_src, dim);
    op_check_exact("copy", "4800 floats", got, want, (size_t)n_src * dim);
    /* pooling: 90 rows into 10 slots, some skipped */
    float *in = rand_floats((size_t)90 * dim, 0.01f, 4.0f), *pooled = nan_floats((size_t)10 * dim);
    int32_t slot[90];
    for (int r = 0; r < 90; r++) slot[r] = r % 13 == 5 ? -1 : rand_int(10);
    cpu->ops->pool_rows(cpu, pooled, in, slot, 90, 10, dim, 9.2376f), ref_pool_rows(want, in, slot, 90, 10, dim, 9.2376);
    op_check("pool_rows", "90 rows into 10 x 96", pooled, want, 10, (size_t)dim);
    free(src), free(small), free(got), free(want), free(slice), free(in), free(pooled);
}

/* ---- sampling support ---- */

static void test_top_logits(void) {
    const int rows = 4, vocab = 3001, ks[] = {1, 40, 64, 3100};
    float *x = rand_floats((size_t)rows * vocab, 0.0f, 30.0f);
    for (int i = 0; i < vocab; i++) x[vocab + i] = roundf(x[vocab + i] * 4) / 4; /* row 1: many ties */
    x[3 * vocab + 77] = NAN;                                                      /* row 3: a NaN */
    for (int ki = 0; ki < 4; ki++) {
        const int k = ks[ki] > G4_TOP_LOGITS_MAX_K ? G4_TOP_LOGITS_MAX_K : ks[ki];
        int32_t *ids = malloc((size_t)rows * k * 4), *want_ids = malloc((size_t)rows * k * 4);
        float *vals = nan_floats((size_t)rows * k), *want_vals = malloc((size_t)rows * k * 4);
        double lse[4], want_lse[4];
        cpu->ops->top_logits(cpu, ids, vals, lse, x, rows, vocab, k);
        ref_top_logits(want_ids, want_vals, want_lse, x, rows, vocab, k);
        int same = 1;
        double lse_err = 0;
        for (int r = 0; r < 3; r++) { /* row 3's candidates are unspecified */
            same &= !memcmp(ids + (size_t)r * k, want_ids + (size_t)r * k, (size_t)k * 4);
            same &= !memcmp(vals + (size_t)r * k, want_vals + (size_t)r * k, (size_t)k * 4);
            const double e = fabs(lse[r] - want_lse[r]) / fabs(want_lse[r]);
            lse_err = e > lse_err ? e : lse_err;
        }
        printf("  %-24s 4 x 3001, k=%-4d (ties, a NaN row): ids/values %s, lse rel err %.1e, NaN row lse %g\n",
               "top_logits", k, same ? "equal" : "DIFFER", lse_err, lse[3]);
        CHECK(same, "top_logits k=%d: ids or values differ from the reference", k);
        CHECK(lse_err <= lse_tol, "top_logits k=%d: lse rel err %.3e above %.0e", k, lse_err, lse_tol);
        CHECK(isnan(lse[3]), "top_logits k=%d: a row with a NaN gets lse NaN (got %g)", k, lse[3]);
        free(ids), free(want_ids), free(vals), free(want_vals);
    }
    free(x);
}

/* ---- mixture of experts ---- */

static void test_moe(void) {
    /* routing: top-8 of 128 (the 26B-A4B's), top-2 of 5 */
    const int route[][3] = {{5, 128, 8}, {3, 5, 2}};
    for (int c = 0; c < 2; c++) {
        const int n = route[c][0], E = route[c][1], k = route[c][2];
        float *logits = rand_floats((size_t)n * E, 0.0f, 3.0f), *scale = rand_floats((size_t)E, 0.5f, 1.5f);
        for (int e = 0; e < E; e++) scale[e] = fabsf(scale[e]);
        /* planted: a tie for the top (token 0), -inf and NaN logits (token 1: never chosen ahead of a number) */
        logits[1] = logits[E - 1] = 9.0f;
        logits[E + 2] = -INFINITY;
        if (k < E) logits[E + 3] = NAN;
        int32_t *ids = malloc((size_t)n * k * 4), *want_ids = malloc((size_t)n * k * 4);
        float *w = nan_floats((size_t)n * k);
        double *want_w = doubles((size_t)n * k);
        cpu->ops->moe_route(cpu, ids, w, logits, scale, n, E, k);
        ref_moe_route(want_ids, want_w, logits, scale, n, E, k);
        char what[64];
        snprintf(what, sizeof what, "%d tokens, top-%d of %d", n, k, E);
        CHECK(!memcmp(ids, want_ids, (size_t)n * k * 4), "moe_route %s: the reference's experts in its order", what);
        op_check("moe_route weights", what, w, want_w, (size_t)n, (size_t)k);
        free(logits), free(scale), free(ids), free(want_ids), free(w), free(want_w);
    }
    /* experts: HF layout (gate_up [E][2I][d], down [E][d][I]) in bf16 and MLX (separate, affine 4-bit) */
    const int E = 6, I = 64, d = 128, k = 3;
    for (int layout = 0; layout < 2; layout++) {
        host_matrix gu, up, down;
        g4_expert_matrix g, u, dn;
        if (layout == 0) {
            host_matrix_make(&gu, G4_WEIGHT_BF16, 0, 0, 0, (int64_t)E * 2 * I, d);
            host_matrix_make(&down, G4_WEIGHT_BF16, 0, 0, 0, (int64_t)E * d, I);
            g = (g4_expert_matrix){gu.m, E, I, 2 * I, 0};
            u = (g4_expert_matrix){gu.m, E, I, 2 * I, I};
        } else {
            host_matrix_make(&gu, G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, (int64_t)E * I, d);
            host_matrix_make(&up, G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, (int64_t)E * I, d);
            host_matrix_make(&down, G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, (int64_t)E * d, I);
            g = (g4_expert_matrix){gu.m, E, I, I, 0};
            u = (g4_expert_matrix){up.m, E, I, I, 0};
        }
        dn = (g4_expert_matrix){down.m, E, d, d, 0};
        const int ns[] = {1, 5, 17};
        for (int pass = 0; pass < 2; pass++) {
            fast = pass;
            cpu->ops->set_precision(cpu, pass ? G4_PRECISION_FAST : G4_PRECISION_EXACT);
            for (int i = 0; i < 3; i++) {
                const int n = ns[i];
                float *x = rand_floats((size_t)n * d, 0.05f, 2.0f), *w = rand_floats((size_t)n * k, 0.05f, 0.6f);
                int32_t *ids = malloc((size_t)n * k * 4);
                for (int t = 0; t < n; t++) /* k distinct experts per token */
                    for (int j = 0; j < k; j++) ids[t * k + j] = (t + 2 * j) % E;
                float *got = nan_floats((size_t)n * d);
                double *want = doubles((size_t)n * d);
                cpu->ops->moe_experts(cpu, got, x, n, ids, w, k, &g, &u, &dn);
                ref_moe_experts(want, x, n, ids, w, k, &g, &u, &dn);
                char what[96];
                snprintf(what, sizeof what, "%s E=%d k=%d %dx%d n=%d", layout ? "MLX affine4" : "HF bf16", E, k, I, d, n);
                op_check(family("moe_experts"), what, got, want, (size_t)n, (size_t)d);
                if (cpu->ops->moe_route_experts) { /* (optional in the table): routing, then the experts */
                    float *logits = rand_floats((size_t)n * E, 0.0f, 3.0f), *scale = rand_floats((size_t)E, 0.5f, 1.5f);
                    int32_t *got_ids = malloc((size_t)n * k * 4);
                    float *got_w = nan_floats((size_t)n * k);
                    double *want_w = doubles((size_t)n * k);
                    ref_moe_route(ids, want_w, logits, scale, n, E, k);
                    for (int i = 0; i < n * k; i++) w[i] = (float)want_w[i];
                    ref_moe_experts(want, x, n, ids, w, k, &g, &u, &dn);
                    cpu->ops->moe_route_experts(cpu, got, x, n, got_ids, got_w, logits, scale, E, k, &g, &u, &dn);
                    CHECK(!memcmp(got_ids, ids, (size_t)n * k * 4), "moe_route_experts %s: the reference's experts", what);
                    op_check("moe_route weights", what, got_w, want_w, (size_t)n, (size_t)k);
                    op_check(family("moe_experts"), what, got, want, (size_t)n, (size_t)d);
                    free(logits), free(scale), free(got_ids), free(got_w), free(want_w);
                }
                free(x), free(w), free(ids), free(got), free(want);
            }
        }
        fast = 0;
        cpu->ops->set_precision(cpu, G4_PRECISION_EXACT);
        host_matrix_free(&gu), host_matrix_free(&down);
        if (layout == 1) host_matrix_free(&up);
    }
}

/* ---- KV cache, qkv_prepare, attention ---- */

static const char *kv_name(g4_kv_type t) { return t == G4_KV_F32 ? "f32" : t == G4_KV_BF16 ? "bf16" : "fp8"; }

/* A paged cache for S sequences of up to max_len positions: shuffled block
 * tables, linear (full) or a ring of ring_blocks (sliding). */
typedef struct {
    int S, bs, stride, ring, n_blocks, sliding;
    int32_t *full, *slide;
    void *kv;
} test_cache;

static void cache_make(test_cache *c, int S, int max_len, int bs, int sliding, int window, int chunk, int Hkv, int D,
                       g4_kv_type type) {
    c->S = S, c->bs = bs, c->sliding = sliding;
    c->stride = (max_len + bs - 1) / bs;
    c->ring = sliding ? g4_kv_ring_blocks(window, chunk, bs) : 1;
    c->n_blocks = sliding ? S * c->ring : S * c->stride + 3;
    c->full = malloc((size_t)S * c->stride * 4), c->slide = malloc((size_t)S * c->ring * 4);
    int32_t *perm = malloc((size_t)c->n_blocks * 4);
    for (int i = 0; i < c->n_blocks; i++) perm[i] = i;
    shuffle(perm, c->n_blocks);
    for (int i = 0; i < S * c->stride; i++) c->full[i] = perm[i % c->n_blocks];
    for (int i = 0; i < S * c->ring; i++) c->slide[i] = perm[i % c->n_blocks];
    free(perm);
    c->kv = cpu->ops->kv_alloc(cpu, c->n_blocks, bs, Hkv, D, type);
    CHECK(c->kv != NULL, "kv_alloc %s", kv_name(type));
}

static g4_attn_batch cache_batch(const test_cache *c, int n, const int32_t *pos, const int32_t *seq,
                                 const int32_t *ranges) {
    return (g4_attn_batch){.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = c->full,
                           .full_table_stride = c->stride, .sliding_tables = c->slide, .ring_blocks = c->ring,
                           .block_size = c->bs};
}

static void cache_free(test_cache *c) {
    cpu->ops->kv_free(cpu, c->kv);
    free(c->full), free(c->slide);
}

/* kv_store then kv_read: f32 and bf16 exactly the reference's rounding,
 * fp8 within its tolerance (a value on a rounding boundary may go either
 * way: the op scales in float32) */
static void test_kv_store(void) {
    enum { N = 40, HKV = 2, D = 64 };
    for (int type = G4_KV_F32; type <= G4_KV_FP8; type++) {
        test_cache c;
        cache_make(&c, 1, N, 16, 0, 0, N, HKV, D, (g4_kv_type)type);
        int32_t pos[N], seq[N], ranges[4 * N] = {0};
        for (int t = 0; t < N; t++) pos[t] = t, seq[t] = 0;
        const g4_attn_batch b = cache_batch(&c, N, pos, seq, ranges);
        float *k = rand_floats((size_t)N * HKV * D, 0.01f, 2.0f), *v = rand_floats((size_t)N * HKV * D, 0.0f, 300.0f);
        float *gk = nan_floats((size_t)N * HKV * D), *gv = nan_floats((size_t)N * HKV * D);
        double *wk = doubles((size_t)N * HKV * D), *wv = doubles((size_t)N * HKV * D);
        cpu->ops->kv_store(cpu, c.kv, k, v, &b, 0);
        cpu->ops->kv_read(cpu, c.kv, gk, gv, &b, 0);
        for (int r = 0; r < N * HKV; r++) {
            ref_kv_round(wk + (size_t)r * D, k + (size_t)r * D, D, (g4_kv_type)type);
            ref_kv_round(wv + (size_t)r * D, v + (size_t)r * D, D, (g4_kv_type)type);
        }
        char what[64];
        snprintf(what, sizeof what, "40 positions x 2 heads x 64, %s", kv_name((g4_kv_type)type));
        if (type == G4_KV_FP8) { /* (x * 448 / peak in float32 may round a code the other way than in double) */
            op_check_rounded(what, gk, k, (size_t)N * HKV, D, G4_KV_FP8, 1);
            op_check_rounded(what, gv, v, (size_t)N * HKV, D, G4_KV_FP8, 1);
        } else {
            op_check_exact("kv_store", what, gk, wk, (size_t)N * HKV * D);
            op_check_exact("kv_store", what, gv, wv, (size_t)N * HKV * D);
        }
        /* kv_copy_blocks: logical block 2 of the table, after a copy of block 0 into it, reads back as block 0 */
        if (type == G4_KV_F32) {
            int32_t p2[16], s2[16];
            for (int t = 0; t < 16; t++) p2[t] = t + 16 * 2, s2[t] = 0; /* logical block 2 ... */
            /* ... lives in pool block full[2]; copy pool block full[0] there */
            const int32_t psrc[] = {c.full[0]}, pdst[] = {c.full[2]};
            cpu->ops->kv_copy_blocks(cpu, c.kv, psrc, pdst, 1);
            const g4_attn_batch b2 = cache_batch(&c, 16, p2, s2, ranges);
            float *ck = nan_floats((size_t)16 * HKV * D), *cv = nan_floats((size_t)16 * HKV * D);
            cpu->ops->kv_read(cpu, c.kv, ck, cv, &b2, 0);
            op_check_exact("kv_copy_blocks", "a block's K after the copy = its source's", ck, wk, (size_t)16 * HKV * D);
            op_check_exact("kv_copy_blocks", "and its V", cv, wv, (size_t)16 * HKV * D);
            /* kv_save_blocks / kv_load_blocks: pool block full[0] (positions 0..15) through host memory into
             * full[1] (16..31): its bytes are the K values then the V values (f32), read back as positions 0..15 */
            if (cpu->ops->kv_save_blocks && cpu->ops->kv_load_blocks) {
                const size_t block_bytes = (size_t)16 * HKV * 2 * g4_kv_row_bytes(G4_KV_F32, D);
                unsigned char *host = malloc(block_bytes);
                const int32_t from[] = {c.full[0]}, to[] = {c.full[1]};
                cpu->ops->kv_save_blocks(cpu, c.kv, from, 1, host);
                float hk[16 * HKV * D], hv[16 * HKV * D];
                memcpy(hk, host, sizeof hk);
                memcpy(hv, host + sizeof hk, sizeof hv);
                op_check_exact("kv_save_blocks", "host bytes: K values of block 0", hk, wk, (size_t)16 * HKV * D);
                op_check_exact("kv_save_blocks", "then its V values", hv, wv, (size_t)16 * HKV * D);
                cpu->ops->kv_load_blocks(cpu, c.kv, to, 1, host);
                for (int t = 0; t < 16; t++) p2[t] = t + 16;
                const g4_attn_batch b3 = cache_batch(&c, 16, p2, s2, ranges);
                cpu->ops->kv_read(cpu, c.kv, ck, cv, &b3, 0);
                op_check_exact("kv_load_blocks", "block 1 after loading block 0's bytes: K", ck, wk, (size_t)16 * HKV * D);
                op_check_exact("kv_load_blocks", "and V", cv, wv, (size_t)16 * HKV * D);
                free(host);
            }
            free(ck), free(cv);
        }
        free(k), free(v), free(gk), free(gv), free(wk), free(wv);
        cache_free(&c);
    }
}

typedef struct {
    const char *label;
    int n_q, n_kv, D, n_pairs;
    float theta;
    int k_eq_v, sliding, window, bs, S, len, chunk;
    int no_kv;
} qkv_case;

/* qkv_prepare chunk by chunk: q of every chunk, and at the end every cache
 * position still held, against the reference's K and V (f32), or code by
 * code against the reference's rounding of them (bf16, fp8) */
static void check_qkv_prepare(const qkv_case *c, g4_kv_type type) {
    const int Hq = c->n_q, Hkv = c->n_kv, D = c->D, S = c->S;
    test_cache cache = {0};
    if (!c->no_kv) cache_make(&cache, S, c->len, c->bs, c->sliding, c->window, c->chunk, Hkv, D, type);
    else cache_make(&cache, S, c->len, c->bs, 0, 0, c->chunk, 1, D, type);
    float *qn = rand_floats((size_t)D, 0.5f, 2.0f), *kn = rand_floats((size_t)D, 0.5f, 2.0f);
    const g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = c->no_kv ? 0 : Hkv, .head_dim = D, .k_eq_v = c->k_eq_v,
                             .q_norm = qn, .k_norm = kn, .theta = c->theta, .n_pairs = c->n_pairs, .eps = 1e-6f};
    const int width = (Hq + (c->no_kv ? 0 : (c->k_eq_v ? 1 : 2) * Hkv)) * D, kv_w = Hkv * D;
    const int max_n = S * c->chunk;
    int32_t *pos = malloc((size_t)max_n * 4), *seq = malloc((size_t)max_n * 4), *ranges = calloc((size_t)max_n, 16);
    float *q = nan_floats((size_t)max_n * Hq * D);
    double *wq = doubles((size_t)max_n * Hq * D), *wk = doubles((size_t)max_n * kv_w), *wv = doubles((size_t)max_n * kv_w);
    /* the reference's stored K/V of every position: [seq][pos][Hkv][D] */
    double *all_k = doubles((size_t)S * c->len * kv_w), *all_v = doubles((size_t)S * c->len * kv_w);
    for (int start = 0; start < c->len; start += c->chunk) {
        const int per = c->len - start < c->chunk ? c->len - start : c->chunk;
        int n = 0;
        for (int s = 0; s < S; s++)
            for (int t = 0; t < per; t++) pos[n] = start + t, seq[n] = s, n++;
        const g4_attn_batch b = cache_batch(&cache, n, pos, seq, ranges);
        float *qkv = rand_floats((size_t)n * width, 0.01f, 3.0f);
        cpu->ops->qkv_prepare(cpu, q, qkv, &p, c->no_kv ? NULL : cache.kv, &b, c->sliding);
        ref_qkv_prepare(wq, wk, wv, qkv, &p, n, pos);
        char what[128];
        snprintf(what, sizeof what, "%s: q of %d tokens", c->label, n);
        op_check("qkv_prepare q", what, q, wq, (size_t)n * Hq, (size_t)D);
        for (int t = 0; t < n && !c->no_kv; t++)
            for (int h = 0; h < Hkv; h++) {
                const size_t at = (((size_t)seq[t] * c->len + pos[t]) * Hkv + h) * D, from = ((size_t)t * Hkv + h) * D;
                memcpy(all_k + at, wk + from, (size_t)D * sizeof *wk); /* unrounded: the check rounds */
                memcpy(all_v + at, wv + from, (size_t)D * sizeof *wv);
            }
        free(qkv);
    }
    if (!c->no_kv) { /* every position still held */
        const int kept = c->sliding ? (c->len < cache.ring * c->bs ? c->len : cache.ring * c->bs) : c->len;
        const int n_read = S * kept;
        int32_t *rpos = malloc((size_t)n_read * 4), *rseq = malloc((size_t)n_read * 4), *rr = calloc((size_t)n_read, 16);
        double *want_k = doubles((size_t)n_read * kv_w), *want_v = doubles((size_t)n_read * kv_w);
        for (int s = 0, i = 0; s < S; s++)
            for (int t = c->len - kept; t < c->len; t++, i++) {
                rpos[i] = t, rseq[i] = s;
                memcpy(want_k + (size_t)i * kv_w, all_k + ((size_t)s * c->len + t) * kv_w, (size_t)kv_w * 8);
                memcpy(want_v + (size_t)i * kv_w, all_v + ((size_t)s * c->len + t) * kv_w, (size_t)kv_w * 8);
            }
        const g4_attn_batch b = cache_batch(&cache, n_read, rpos, rseq, rr);
        float *gk = nan_floats((size_t)n_read * kv_w), *gv = nan_floats((size_t)n_read * kv_w);
        cpu->ops->kv_read(cpu, cache.kv, gk, gv, &b, c->sliding);
        char what[128];
        snprintf(what, sizeof what, "%s: cache K and V (%s), %d positions", c->label, kv_name(type), n_read);
        if (type == G4_KV_F32) {
            op_check("qkv_prepare kv f32", what, gk, want_k, (size_t)n_read * Hkv, (size_t)D);
            op_check("qkv_prepare kv f32", what, gv, want_v, (size_t)n_read * Hkv, (size_t)D);
        } else { /* computed values: code by code, within a step of the reference's rounding */
            float *fk = malloc((size_t)n_read * kv_w * 4), *fv = malloc((size_t)n_read * kv_w * 4);
            for (size_t i = 0; i < (size_t)n_read * kv_w; i++) fk[i] = (float)want_k[i], fv[i] = (float)want_v[i];
            op_check_rounded(what, gk, fk, (size_t)n_read * Hkv, D, type, 0);
            op_check_rounded(what, gv, fv, (size_t)n_read * Hkv, D, type, 0);
            free(fk), free(fv);
        }
        free(rpos), free(rseq), free(rr), free(want_k), free(want_v), free(gk), free(gv);
    }
    cache_free(&cache);
    free(qn), free(kn), free(pos), free(seq), free(ranges), free(q), free(wq), free(wk), free(wv), free(all_k), free(all_v);
}

static void test_qkv_prepare(void) {
    const qkv_case cases[] = {
        /* label, Hq, Hkv, D, pairs, theta, k_eq_v, sliding, window, bs, seqs, len, chunk, no_kv */
        {"sliding 256, ring wraps, decode", 4, 1, 256, 128, 10000.0f, 0, 1, 24, 8, 1, 40, 1, 0},
        {"global 512, 25% RoPE, prefill", 4, 1, 512, 64, 1000000.0f, 0, 0, 0, 16, 1, 40, 20, 0},
        {"GQA 2, 3 sequences, k_eq_v", 4, 2, 64, 32, 10000.0f, 1, 1, 16, 4, 3, 30, 7, 0},
        {"KV-shared layer: q only", 4, 1, 128, 16, 1000000.0f, 0, 0, 0, 16, 1, 10, 10, 1},
        {"odd head_dim 18, partial pairs", 4, 2, 18, 5, 500.0f, 0, 1, 12, 4, 2, 21, 3, 0},
    };
    for (int type = G4_KV_F32; type <= G4_KV_FP8; type++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            if (type == G4_KV_F32 || !cases[i].no_kv) check_qkv_prepare(&cases[i], (g4_kv_type)type);
}

typedef struct {
    const char *label;
    int n_heads, n_kv, head_dim, block_size;
    int sliding, window;
    int n_seqs;
    int lens[4];
    int prefill; /* 0: the last token of every sequence; 1: the last chunk of sequence 0 */
    int chunk;   /* positions per kv_store call (and the prefill chunk) */
    int bidir;   /* tokens 2..5 of the queries see each other (an image block) */
    int empty_row;
} attn_case;

/* Stores every sequence chunk by chunk, then attends the queries; the
 * reference reads the reference's rounding of the same K/V by logical
 * position, over each token's visible range. */
static void check_attention(const attn_case *ac, g4_kv_type type) {
    const int Hq = ac->n_heads, Hkv = ac->n_kv, D = ac->head_dim, S = ac->n_seqs;
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = ac->lens[s] > max_len ? ac->lens[s] : max_len;
    test_cache c;
    cache_make(&c, S, max_len, ac->block_size, ac->sliding, ac->window, ac->chunk, Hkv, D, type);
    const size_t kv_row = (size_t)Hkv * D;
    float *keys[4], *vals[4];
    const size_t cap = (size_t)max_len + (size_t)S * ac->chunk + S;
    int32_t *pos = malloc(cap * 4), *seq = malloc(cap * 4), *ranges = calloc(cap, 16);
    double *row = doubles((size_t)D);
    for (int s = 0; s < S; s++) {
        keys[s] = rand_floats((size_t)ac->lens[s] * kv_row, 0.01f, 2.0f);
        vals[s] = rand_floats((size_t)ac->lens[s] * kv_row, 0.01f, 2.0f);
        for (int start = 0; start < ac->lens[s]; start += ac->chunk) {
            const int n = ac->lens[s] - start < ac->chunk ? ac->lens[s] - start : ac->chunk;
            for (int t = 0; t < n; t++) pos[t] = start + t, seq[t] = s;
            const g4_attn_batch b = cache_batch(&c, n, pos, seq, ranges);
            cpu->ops->kv_store(cpu, c.kv, keys[s] + (size_t)start * kv_row, vals[s] + (size_t)start * kv_row, &b,
                               ac->sliding);
        }
        /* what the cache holds, for the reference */
        for (size_t r = 0; r < (size_t)ac->lens[s] * Hkv; r++) {
            ref_kv_round(row, keys[s] + r * D, D, type);
            for (int d = 0; d < D; d++) keys[s][r * D + d] = (float)row[d];
            ref_kv_round(row, vals[s] + r * D, D, type);
            for (int d = 0; d < D; d++) vals[s][r * D + d] = (float)row[d];
        }
    }
    int n = 0;
    if (!ac->prefill) {
        for (int s = 0; s < S; s++) pos[n] = ac->lens[s] - 1, seq[n] = s, n++;
    } else {
        const int last = (ac->lens[0] - 1) / ac->chunk * ac->chunk;
        for (int p = last; p < ac->lens[0]; p++) pos[n] = p, seq[n] = 0, n++;
    }
    for (int t = 0; t < n; t++) {
        const int p = pos[t];
        ranges[4 * t + 0] = p - ac->window + 1 < 0 ? 0 : p - ac->window + 1;
        ranges[4 * t + 1] = p;
        ranges[4 * t + 2] = 0;
        ranges[4 * t + 3] = p;
    }
    if (ac->bidir && n > 6)
        for (int t = 2; t <= 5; t++) ranges[4 * t + 1] = ranges[4 * t + 3] = pos[5];
    if (ac->empty_row) ranges[4 * (n - 1) + 0] = ranges[4 * (n - 1) + 2] = pos[n - 1] + 1;
    const g4_attn_batch b = cache_batch(&c, n, pos, seq, ranges);
    const size_t nq = (size_t)n * Hq * D;
    float *q = rand_floats(nq, 0.01f, 2.0f), *got = nan_floats(nq);
    double *want = doubles(nq);
    const float scale = D == 72 ? 0.125f : 1.0f;
    const float *kp[4], *vp[4];
    for (int s = 0; s < S; s++) kp[s] = keys[s], vp[s] = vals[s];
    ref_attention(want, q, kp, vp, seq, ranges + (ac->sliding ? 0 : 2), 4, n, Hq, Hkv, D, scale);
    char fam[40], what[128];
    snprintf(fam, sizeof fam, "attention %s", kv_name(type));
    snprintf(what, sizeof what, "%s: %d x %d/%d heads x %d", ac->label, n, Hq, Hkv, D);
    for (int pass = 0; pass < 2; pass++) {
        fast = pass;
        cpu->ops->set_precision(cpu, pass ? G4_PRECISION_FAST : G4_PRECISION_EXACT);
        for (size_t i = 0; i < nq; i++) got[i] = NAN;
        cpu->ops->attention(cpu, got, q, c.kv, &b, ac->sliding, Hq, scale);
        op_check(family(fam), what, got, want, (size_t)n * Hq, (size_t)D);
    }
    fast = 0;
    cpu->ops->set_precision(cpu, G4_PRECISION_EXACT);
    for (int s = 0; s < S; s++) free(keys[s]), free(vals[s]);
    free(pos), free(seq), free(ranges), free(row), free(q), free(got), free(want);
    cache_free(&c);
}

static void test_attention(void) {
    const attn_case cases[] = {
        {"decode full, 3 sequences", 4, 1, 128, 16, 0, 1 << 30, 3, {1, 17, 300}, 0, 64, 0, 0},
        {"decode sliding, ring wraps", 4, 1, 64, 16, 1, 48, 2, {3, 200}, 0, 16, 0, 0},
        {"decode full GQA 4, head_dim 512", 8, 2, 512, 16, 0, 1 << 30, 1, {90}, 0, 32, 0, 0},
        {"prefill sliding, ring wraps", 4, 2, 64, 16, 1, 40, 1, {150}, 1, 24, 0, 0},
        {"prefill full with an image block", 4, 2, 64, 16, 0, 1 << 30, 1, {60}, 1, 40, 1, 0},
        {"prefill head_dim 40, an empty row", 6, 3, 40, 8, 0, 1 << 30, 1, {50}, 1, 16, 0, 1},
        {"vision-like 72, one block", 4, 4, 72, 96, 0, 1 << 30, 1, {96}, 1, 96, 0, 0},
    };
    for (int type = G4_KV_F32; type <= G4_KV_FP8; type++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention(&cases[i], (g4_kv_type)type);
}

/* ---- the audio tower's convolutions and attention ---- */

static void test_audio(void) {
    /* conv2d: the subsampling convolutions' shapes, smaller (3x3, stride 2, pad 1) */
    const int shapes[2][4] = {{21, 32, 1, 16}, {11, 16, 16, 8}};
    for (int k = 0; k < 2; k++) {
        const int h = shapes[k][0], w = shapes[k][1], ci = shapes[k][2], co = shapes[k][3];
        const int Ho = (h + 2 - 3) / 2 + 1, Wo = (w + 2 - 3) / 2 + 1;
        const size_t nx = (size_t)h * w * ci, nw = (size_t)co * 9 * ci, no = (size_t)Ho * Wo * co;
        float *x = rand_floats(nx, 0.01f, 2.0f), *wt = rand_floats(nw, 0.01f, 0.3f), *got = nan_floats(no);
        double *want = doubles(no);
        cpu->ops->conv2d(cpu, got, x, wt, h, w, ci, co, 3, 3, 2, 1);
        ref_conv2d(want, x, wt, h, w, ci, co, 3, 3, 2, 1);
        char what[64];
        snprintf(what, sizeof what, "%d x %d x %d -> %d", h, w, ci, co);
        op_check("conv2d", what, got, want, (size_t)Ho * Wo, (size_t)co);
        free(x), free(wt), free(got), free(want);
    }
    const int T = 25, C = 96, K = 5;
    float *x = rand_floats((size_t)T * C, 0.01f, 2.0f), *w = rand_floats((size_t)C * K, 0.01f, 0.5f);
    float *got = nan_floats((size_t)T * C);
    double *want = doubles((size_t)T * C);
    cpu->ops->depthwise_conv1d_causal(cpu, got, x, w, T, C, K);
    ref_depthwise_conv1d_causal(want, x, w, T, C, K);
    op_check("depthwise_conv1d", "25 x 96, kernel 5", got, want, T, C);
    free(x), free(w), free(got), free(want);
    /* chunked attention: 4 heads of 32, chunk 12, 12 past frames, 13 relative keys, padding at the end */
    g4_chunked_attn_params p = {.n_frames = 40, .n_heads = 4, .head_dim = 32, .chunk = 12, .past = 12, .future = 0,
                                .n_rel = 13, .max_past_dist = 11, .max_future_dist = 0, .logit_cap = 50.0f,
                                .invalid_logit = -1e9f};
    const size_t n = (size_t)p.n_frames * p.n_heads * p.head_dim, nr = (size_t)p.n_rel * p.n_heads * p.head_dim;
    float *q = rand_floats(n, 0.01f, 2.0f), *k = rand_floats(n, 0.01f, 2.0f), *v = rand_floats(n, 0.01f, 2.0f);
    float *rk = rand_floats(nr, 0.01f, 1.0f), *out = nan_floats(n);
    double *wo = doubles(n);
    int32_t valid[40];
    for (int i = 0; i < 40; i++) valid[i] = i < 35;
    for (int inv = 0; inv < 2; inv++) {
        p.invert_mask = inv;
        cpu->ops->chunked_attention(cpu, out, q, k, v, rk, valid, &p);
        ref_chunked_attention(wo, q, k, v, rk, valid, &p);
        op_check("chunked_attention", inv ? "40 frames x 4 heads x 32, inverted mask" : "40 frames x 4 heads x 32",
                 out, wo, (size_t)p.n_frames * p.n_heads, (size_t)p.head_dim);
    }
    free(q), free(k), free(v), free(rk), free(out), free(wo);
}

static void run_all(void) {
    for (int pass = 0; pass < 2; pass++) { /* matmul and its fused forms on both paths */
        fast = pass;
        cpu->ops->set_precision(cpu, pass ? G4_PRECISION_FAST : G4_PRECISION_EXACT);
        test_matmul();
        test_matmul_fused();
    }
    fast = 0;
    cpu->ops->set_precision(cpu, G4_PRECISION_EXACT);
    test_embed();
    test_norms();
    test_rope();
    test_elementwise();
    test_rows_and_copies();
    test_top_logits();
    test_moe();
    test_kv_store();
    test_qkv_prepare();
    test_attention();
    test_audio();
}

int main(void) {
    g4_status st = g4_backend_cpu_create(1, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    op_check_init(tolerances, (int)(sizeof tolerances / sizeof tolerances[0]));
    printf("optional ops in the CPU table: matmul_gated %s, add_rmsnorm_moe %s, moe_route_experts %s\n",
           cpu->ops->matmul_gated ? "yes" : "no", cpu->ops->add_rmsnorm_moe ? "yes" : "no",
           cpu->ops->moe_route_experts ? "yes" : "no");
    /* every SIMD level this processor has (the kernels differ per level), the same inputs each time; the
     * sanitizer build (G4_TEST_SANITIZED=1, for memory errors) the scalar and the top level only */
    static const char *const level_names[] = {"scalar", "avx2", "avx512", "avx512vnni"};
    const cpu_isa top = cpu_isa_supported();
    const char *san = getenv("G4_TEST_SANITIZED");
    const int sanitized = san && !strcmp(san, "1");
    for (int level = CPU_ISA_SCALAR; level <= (int)top; level++) {
        if (sanitized && level != CPU_ISA_SCALAR && level != (int)top) continue;
        cpu_isa_force((cpu_isa)level);
        printf("-- ISA level %s\n", level_names[level]);
        rng_state = 0x2545F4914F6CDD1Dull;
        run_all();
    }
    cpu_isa_force(top);
    op_report();
    g4_backend_destroy(cpu);
    return test_finish();
}
