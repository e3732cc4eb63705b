/* The CUDA backend against the CPU backend, op by op: every entry of the op
 * table on random inputs (fixed seed, realistic magnitudes, never zeros),
 * outputs poisoned with NaN first so an unwritten element fails, at
 * real-model sizes (E2B/26B/31B widths, the 262144-row LM head, head_dim 256
 * and 512, GQA, sliding rings that wrap) and at odd sizes that take the
 * generic paths. Tolerances (relative RMS): 1e-6 for elementwise float32
 * ops, 1e-5 for float32 reductions in another order (GEMV, attention,
 * experts at decode sizes), 1e-4 for prefill GEMMs on bf16 tensor cores
 * with split (hi + lo) operands, the default, and 1e-2 for the plain bf16
 * mode (G4_PRECISION_FAST). Exits 77 (skipped) without a usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "base/file.h"
#include "model/kv_cache.h"
#include "tensor/dtype.h"
#include "test_util.h"

#define TOL_EXACT 0.0
#define TOL_ELEMENTWISE 1e-6
#define TOL_REDUCE 1e-5
#define TOL_SPLIT 1e-4
#define TOL_BF16 1e-2

static g4_backend *cpu, *gpu;

/* ---- random numbers ---- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double uniform01(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static int rand_int(int n) { return (int)(next_u64() % (uint64_t)n); }

/* A magnitude in [lo, hi] with a random sign: never zero. */
static float rnd(float lo, float hi) {
    float v = lo + (hi - lo) * (float)uniform01();
    return (next_u64() & 1) ? -v : v;
}

static float *rand_floats(size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rnd(lo, hi);
    return p;
}

/* ---- device helpers ---- */

static void *up(const void *host, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes ? bytes : 4);
    if (d && bytes) gpu->ops->to_device(gpu, d, host, bytes);
    return d;
}

static float *poisoned(size_t n) {
    float *nan = malloc((n ? n : 1) * sizeof *nan);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    float *d = up(nan, n * sizeof *nan);
    free(nan);
    return d;
}

static float *down(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    gpu->ops->to_host(gpu, h, d, n * sizeof *h);
    return h;
}

static void release(void *d) { gpu->ops->release(gpu, d); }

/* ---- reporting: one line per case, the worst error per op at the end ---- */

typedef struct {
    const char *op;
    double worst, tol;
    int cases;
} op_stat;
static op_stat stats[64];
static int n_stats;

static void record(const char *op, double err, double tol) {
    int i = 0;
    while (i < n_stats && strcmp(stats[i].op, op)) i++;
    if (i == n_stats && n_stats < 64) stats[n_stats++] = (op_stat){op, 0, tol, 0};
    if (i < 64) {
        if (err > stats[i].worst) stats[i].worst = err;
        if (tol > stats[i].tol) stats[i].tol = tol;
        stats[i].cases++;
    }
}

static void compare(const char *op, const char *what, const float *got, const float *want, size_t n, double tol) {
    double err = test_rel_rms(got, want, n);
    printf("  %-12s %-52s rel_rms %.2e (tol %.0e)\n", op, what, err, tol);
    CHECK(err <= tol, "%s %s: rel_rms %.3e above %.0e", op, what, err, tol);
    record(op, err, tol);
}

/* ---- weight matrices in every format ---- */

typedef struct {
    g4_matrix host, dev;
    void *bufs[3];
    char name[64];
} test_matrix;

static void make_matrix(test_matrix *t, g4_weight_format f, int bits, int group, g4_dtype sdt, int64_t rows,
                        int64_t cols) {
    memset(t, 0, sizeof *t);
    g4_matrix *m = &t->host;
    m->format = f;
    m->rows = rows;
    m->cols = cols;
    const size_t n = (size_t)rows * (size_t)cols;
    switch (f) {
    case G4_WEIGHT_F32: {
        float *w = rand_floats(n, 0.005f, 0.08f);
        m->data = t->bufs[0] = w;
        m->row_bytes = (size_t)cols * 4;
        snprintf(t->name, sizeof t->name, "f32");
        break;
    }
    case G4_WEIGHT_BF16:
    case G4_WEIGHT_F16: {
        uint16_t *w = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            float v = rnd(0.005f, 0.08f);
            w[i] = f == G4_WEIGHT_BF16 ? g4_f32_to_bf16(v) : g4_f32_to_f16(v);
        }
        m->data = t->bufs[0] = w;
        m->row_bytes = (size_t)cols * 2;
        snprintf(t->name, sizeof t->name, f == G4_WEIGHT_BF16 ? "bf16" : "f16");
        break;
    }
    case G4_WEIGHT_AFFINE:
    case G4_WEIGHT_MXFP4: {
        m->bits = f == G4_WEIGHT_MXFP4 ? 4 : bits;
        m->group_size = group;
        m->row_bytes = (size_t)(cols * m->bits / 8);
        unsigned char *codes = malloc((size_t)rows * m->row_bytes);
        for (size_t i = 0; i < (size_t)rows * m->row_bytes; i++) codes[i] = (unsigned char)next_u64();
        m->data = t->bufs[0] = codes;
        const size_t groups = (size_t)(cols / group);
        if (f == G4_WEIGHT_MXFP4) {
            unsigned char *s = malloc((size_t)rows * groups);
            for (size_t i = 0; i < (size_t)rows * groups; i++) s[i] = (unsigned char)(118 + rand_int(7));
            m->scales = t->bufs[1] = s;
            m->scale_dtype = G4_DTYPE_U8;
            m->scale_row_bytes = groups;
            snprintf(t->name, sizeof t->name, "mxfp4");
        } else {
            const size_t es = g4_dtype_size(sdt);
            unsigned char *s = malloc((size_t)rows * groups * es), *b = malloc((size_t)rows * groups * es);
            const float levels = (float)((1 << bits) - 1);
            for (size_t i = 0; i < (size_t)rows * groups; i++) {
                float scale = 0.1f / levels * (0.5f + (float)uniform01());
                float bias = -scale * levels * (0.4f + 0.2f * (float)uniform01());
                if (sdt == G4_DTYPE_F32) {
                    memcpy(s + 4 * i, &scale, 4);
                    memcpy(b + 4 * i, &bias, 4);
                } else {
                    uint16_t sv = sdt == G4_DTYPE_BF16 ? g4_f32_to_bf16(scale) : g4_f32_to_f16(scale);
                    uint16_t bv = sdt == G4_DTYPE_BF16 ? g4_f32_to_bf16(bias) : g4_f32_to_f16(bias);
                    memcpy(s + 2 * i, &sv, 2);
                    memcpy(b + 2 * i, &bv, 2);
                }
            }
            m->scales = t->bufs[1] = s;
            m->biases = t->bufs[2] = b;
            m->scale_dtype = sdt;
            m->scale_row_bytes = groups * es;
            snprintf(t->name, sizeof t->name, "affine%d/g%d/%s", bits, group, g4_dtype_name(sdt));
        }
        break;
    }
    }
    t->dev = t->host;
    g4_status st = gpu->ops->prepare_matrix(gpu, &t->dev);
    CHECK(st == G4_OK, "prepare_matrix %s: %s", t->name, g4_error_message());
}

static void free_matrix(test_matrix *t) {
    for (int i = 0; i < 3; i++) free(t->bufs[i]);
    memset(t, 0, sizeof *t); /* device copies belong to the backend */
}

/* ---- matmul ---- */

/* Another CUDA backend, created with tuning overrides ("key=value,...",
 * README.md "CUDA tuning") to check or time an alternative path; NULL, with
 * a failed check, if it cannot be. */
static g4_backend *knob_backend(const char *tune) {
    g4_backend *be = NULL;
    const g4_status st = g4_backend_cuda_create_tuned(0, tune, &be);
    CHECK(st == G4_OK, "CUDA backend with %s: %s", tune, g4_error_message());
    return st == G4_OK ? be : NULL;
}

static void check_matmul_on(g4_backend *be, const char *tag, const g4_matrix *hm, const g4_matrix *dm,
                            const char *name, int n, double gemm_tol) {
    const int64_t rows = hm->rows, cols = hm->cols;
    float *x = rand_floats((size_t)n * cols, 0.05f, 2.0f);
    float *want = malloc((size_t)n * rows * sizeof *want);
    cpu->ops->matmul(cpu, want, x, n, hm);
    float *dx = up(x, (size_t)n * cols * 4), *dout = poisoned((size_t)n * rows);
    gpu->ops->synchronize(gpu); /* be may be another backend with its own stream */
    be->ops->matmul(be, dout, dx, n, dm);
    be->ops->synchronize(be);
    float *got = down(dout, (size_t)n * rows);
    char what[128];
    snprintf(what, sizeof what, "%s%s %lldx%lld n=%d", tag, name, (long long)rows, (long long)cols, n);
    const double tol = n <= 8 || hm->format == G4_WEIGHT_F32 ? TOL_REDUCE : gemm_tol;
    compare(n <= 8 ? "matmul/gemv" : gemm_tol > TOL_SPLIT ? "matmul/gemm-bf16" : "matmul/gemm", what, got, want,
            (size_t)n * rows, tol);
    release(dx);
    release(dout);
    free(x);
    free(want);
    free(got);
}

/* matmul_gated of n tokens on be over t (gate rows, then as many up rows)
 * against the CPU's matmul and gelu_mul */
static void check_gated_on(g4_backend *be, const char *tag, const test_matrix *t, int n) {
    const int64_t F = t->host.rows / 2, cols = t->host.cols;
    float *x = rand_floats((size_t)n * cols, 0.05f, 2.0f);
    float *both = malloc((size_t)n * 2 * F * sizeof *both), *want = malloc((size_t)n * F * sizeof *want);
    cpu->ops->matmul(cpu, both, x, n, &t->host);
    for (int i = 0; i < n; i++)
        cpu->ops->gelu_mul(cpu, want + (size_t)i * F, both + (size_t)i * 2 * F, both + (size_t)i * 2 * F + F, (size_t)F);
    float *dx = up(x, (size_t)n * cols * 4), *dout = poisoned((size_t)n * F);
    gpu->ops->synchronize(gpu); /* be may be another backend with its own stream */
    be->ops->matmul_gated(be, dout, dx, n, &t->dev);
    be->ops->synchronize(be);
    float *got = down(dout, (size_t)n * F);
    char what[128];
    snprintf(what, sizeof what, "%s%s %lldx%lld n=%d", tag, t->name, (long long)t->host.rows, (long long)cols, n);
    compare("matmul_gated", what, got, want, (size_t)n * F, n <= 8 ? TOL_REDUCE : TOL_SPLIT);
    release(dx), release(dout);
    free(x), free(both), free(want), free(got);
}

static void check_matmul(test_matrix *t, const int *ns, int count) {
    for (int i = 0; i < count; i++) check_matmul_on(gpu, "", &t->host, &t->dev, t->name, ns[i], TOL_SPLIT);
}

static void test_matmul(void) {
    const int decode[] = {1, 2, 3, 5, 8}, prefill[] = {9, 64, 200}, few[] = {1, 4, 8, 128};
    /* every format at a real E2B shape (q_proj 2048 x 1536) */
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {
        {G4_WEIGHT_BF16, 0, 0, 0},
        {G4_WEIGHT_F16, 0, 0, 0},
        {G4_WEIGHT_F32, 0, 0, 0},
        {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16},
        {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F32},
        {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F32},
        {G4_WEIGHT_AFFINE, 2, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 3, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 5, 32, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 6, 64, G4_DTYPE_F16},
        {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8},
    };
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++) {
        test_matrix t;
        make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, 2048, 1536);
        check_matmul(&t, decode, 5);
        check_matmul(&t, prefill, 3);
        /* a row view (pointer arithmetic on device pointers) */
        g4_matrix hv = g4_matrix_rows(&t.host, 37, 300), dv = g4_matrix_rows(&t.dev, 37, 300);
        char name[96];
        snprintf(name, sizeof name, "%s rows[37,337)", t.name);
        check_matmul_on(gpu, "", &hv, &dv, name, 3, TOL_SPLIT);
        check_matmul_on(gpu, "", &hv, &dv, name, 33, TOL_SPLIT);
        free_matrix(&t);
    }
    /* real widths: k_proj 256 x 1536, gate 6144 x 1536, down 1536 x 6144, 31B o_proj-like 1024 x 5376 */
    const int64_t shapes[][2] = {{256, 1536}, {6144, 1536}, {1536, 6144}, {1024, 5376}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        test_matrix t;
        make_matrix(&t, G4_WEIGHT_BF16, 0, 0, 0, shapes[s][0], shapes[s][1]);
        check_matmul(&t, few, 4);
        free_matrix(&t);
        make_matrix(&t, G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, shapes[s][0], shapes[s][1]);
        check_matmul(&t, few, 4);
        free_matrix(&t);
        make_matrix(&t, G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, shapes[s][0], shapes[s][1]);
        check_matmul(&t, few, 4);
        free_matrix(&t);
    }
    /* wide rows (31B down_proj width): many 16-byte chunks per thread in the decode kernels */
    {
        struct {
            g4_weight_format f;
            int bits, group;
        } wide[] = {{G4_WEIGHT_AFFINE, 4, 64}, {G4_WEIGHT_AFFINE, 8, 64}, {G4_WEIGHT_AFFINE, 2, 64},
                    {G4_WEIGHT_MXFP4, 4, 32}, {G4_WEIGHT_BF16, 0, 0}};
        const int wn[] = {1, 3, 16};
        for (size_t k = 0; k < sizeof wide / sizeof wide[0]; k++) {
            test_matrix t;
            make_matrix(&t, wide[k].f, wide[k].bits, wide[k].group, G4_DTYPE_BF16, 72, 21504);
            check_matmul(&t, wn, 3);
            free_matrix(&t);
        }
    }
    /* odd shapes: rows not a multiple of anything, rows that break 16-byte alignment */
    const int64_t odd[][2] = {{77, 96}, {33, 40}, {5, 100}, {129, 72}};
    for (size_t s = 0; s < sizeof odd / sizeof odd[0]; s++) {
        test_matrix t;
        make_matrix(&t, G4_WEIGHT_BF16, 0, 0, 0, odd[s][0], odd[s][1]);
        check_matmul(&t, decode, 5);
        check_matmul(&t, prefill, 2);
        free_matrix(&t);
        make_matrix(&t, G4_WEIGHT_F32, 0, 0, 0, odd[s][0], odd[s][1]);
        check_matmul(&t, decode, 3);
        check_matmul(&t, prefill, 2);
        free_matrix(&t);
        if (odd[s][1] % 32 == 0) {
            make_matrix(&t, G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_BF16, odd[s][0], odd[s][1]);
            check_matmul(&t, decode, 3);
            check_matmul(&t, prefill, 2);
            free_matrix(&t);
            make_matrix(&t, G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, odd[s][0], odd[s][1]);
            check_matmul(&t, decode, 3);
            check_matmul(&t, prefill, 2);
            free_matrix(&t);
        }
    }
    /* the E2B LM head: 262144 x 1536 bf16, decode sizes */
    {
        test_matrix t;
        make_matrix(&t, G4_WEIGHT_BF16, 0, 0, 0, 262144, 1536);
        const int lm[] = {1, 3};
        check_matmul(&t, lm, 2);
        free_matrix(&t);
    }
}

/* ---- embeddings, norms, rope, elementwise ---- */

static void test_embed(void) {
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_F32, 0, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
                   {G4_WEIGHT_AFFINE, 6, 64, G4_DTYPE_F32}, {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++) {
        test_matrix t;
        make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, 5000, 1536);
        const int n = 9;
        int32_t ids[9];
        for (int i = 0; i < n; i++) ids[i] = rand_int(5000);
        ids[3] = ids[1]; /* repeats */
        ids[8] = 4999;
        const float scales[] = {1.0f, 39.25f};
        for (int s = 0; s < 2; s++) {
            float *want = malloc((size_t)n * 1536 * 4);
            cpu->ops->embed(cpu, want, &t.host, ids, n, scales[s]);
            int32_t *dids = up(ids, sizeof ids);
            float *dout = poisoned((size_t)n * 1536);
            gpu->ops->embed(gpu, dout, &t.dev, dids, n, scales[s]);
            float *got = down(dout, (size_t)n * 1536);
            char what[160];
            snprintf(what, sizeof what, "%s 5000x1536 n=%d scale %g", t.name, n, scales[s]);
            compare("embed", what, got, want, (size_t)n * 1536, TOL_ELEMENTWISE);
            release(dids);
            release(dout);
            free(want);
            free(got);
        }
        free_matrix(&t);
    }
}

/* The MoE layer's end (both branches normed and summed, then the residual
 * step) against the CPU op: the register kernel at 26B-A4B's width and odd
 * ones, the three-launch path beyond it (5376). */
static void test_moe_residual(void) {
    const int cases[][2] = {{1, 2816}, {3, 1536}, {5, 37}, {2, 5376}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1];
        const size_t n = (size_t)rows * dim;
        const float scale = k % 2 ? 0.37f : 1.0f;
        float *dense = rand_floats(n, 0.01f, 30.0f), *experts = rand_floats(n, 0.01f, 5.0f);
        float *h = rand_floats(n, 0.01f, 10.0f), *w[4];
        for (int i = 0; i < 4; i++) w[i] = rand_floats((size_t)dim, 0.5f, 2.0f);
        const float *next_w = k == 2 ? NULL : w[3];
        float *want_h = malloc(n * 4), *want_dense = malloc(n * 4), *want_next = malloc(n * 4);
        memcpy(want_h, h, n * 4);
        memcpy(want_dense, dense, n * 4);
        cpu->ops->moe_residual(cpu, want_h, want_dense, w[0], experts, w[1], w[2], rows, dim, 1e-6f, scale, want_next,
                               next_w);
        float *dh = up(h, n * 4), *dd = up(dense, n * 4), *de = up(experts, n * 4), *dw[4], *dnext = poisoned(n);
        for (int i = 0; i < 4; i++) dw[i] = up(w[i], (size_t)dim * 4);
        gpu->ops->moe_residual(gpu, dh, dd, dw[0], de, dw[1], dw[2], rows, dim, 1e-6f, scale, dnext,
                               next_w ? dw[3] : NULL);
        float *got_h = down(dh, n), *got_dense = down(dd, n), *got_next = down(dnext, n);
        char what[96];
        snprintf(what, sizeof what, "%d x %d, scale %g%s", rows, dim, scale, next_w ? "" : ", unweighted next norm");
        compare("moe_residual h", what, got_h, want_h, n, TOL_ELEMENTWISE);
        compare("moe_residual sum", what, got_dense, want_dense, n, TOL_ELEMENTWISE);
        compare("moe_residual next", what, got_next, want_next, n, TOL_ELEMENTWISE);
        release(dh), release(dd), release(de), release(dnext);
        for (int i = 0; i < 4; i++) release(dw[i]), free(w[i]);
        free(dense), free(experts), free(h), free(want_h), free(want_dense), free(want_next);
        free(got_h), free(got_dense), free(got_next);
    }
}

/* h = (h + rmsnorm(x) * w) * scale against the CPU op, and the CPU op
 * against its definition (rmsnorm, add, scale) bit for bit. */
static void test_add_rmsnorm(void) {
    const int cases[][2] = {{1, 1536}, {8, 5376}, {3, 2816}, {5, 37}};
    const float scales[] = {1.0f, 0.37f};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1];
        const size_t n = (size_t)rows * dim;
        const float scale = scales[k % 2];
        float *x = rand_floats(n, 0.01f, 30.0f), *w = rand_floats((size_t)dim, 0.5f, 2.0f);
        float *h = rand_floats(n, 0.01f, 10.0f), *want = malloc(n * 4), *steps = malloc(n * 4);
        float *w2 = rand_floats((size_t)dim, 0.5f, 2.0f), *want_next = malloc(n * 4), *steps_next = malloc(n * 4);
        const float *next_w = k == 2 ? NULL : w2; /* the next norm with and without a weight */
        memcpy(want, h, n * 4);
        cpu->ops->add_rmsnorm(cpu, want, x, w, rows, dim, 1e-6f, scale, want_next, next_w);
        cpu->ops->rmsnorm(cpu, steps, x, w, rows, dim, 1e-6f);
        cpu->ops->add(cpu, steps, h, steps, n);
        cpu->ops->scale(cpu, steps, steps, scale, n);
        cpu->ops->rmsnorm(cpu, steps_next, steps, next_w, rows, dim, 1e-6f);
        CHECK(memcmp(steps, want, n * 4) == 0 && memcmp(steps_next, want_next, n * 4) == 0,
              "cpu add_rmsnorm %d x %d equals rmsnorm, add, scale, rmsnorm", rows, dim);
        float *dx = up(x, n * 4), *dw = up(w, (size_t)dim * 4), *dh = up(h, n * 4), *dw2 = up(w2, (size_t)dim * 4);
        float *dnext = poisoned(n);
        gpu->ops->add_rmsnorm(gpu, dh, dx, dw, rows, dim, 1e-6f, scale, dnext, next_w ? dw2 : NULL);
        float *got = down(dh, n), *got_next = down(dnext, n);
        char what[96];
        snprintf(what, sizeof what, "%d x %d, scale %g", rows, dim, scale);
        compare("add_rmsnorm", what, got, want, n, TOL_ELEMENTWISE);
        compare("add_rmsnorm next", what, got_next, want_next, n, TOL_ELEMENTWISE);
        /* and with no next norm: h alone */
        float *dh2 = up(h, n * 4);
        gpu->ops->add_rmsnorm(gpu, dh2, dx, dw, rows, dim, 1e-6f, scale, NULL, NULL);
        float *got2 = down(dh2, n);
        compare("add_rmsnorm", "no next norm", got2, want, n, TOL_ELEMENTWISE);
        release(dx), release(dw), release(dh), release(dw2), release(dnext), release(dh2);
        free(x), free(w), free(h), free(want), free(steps), free(got), free(w2), free(want_next), free(steps_next);
        free(got_next), free(got2);
    }
}

/* add_rmsnorm_moe: the same bits as add_rmsnorm then rmsnorm_pair on the
 * GPU, and the CPU's two ops within rounding */
static void test_add_rmsnorm_moe(void) {
    const int cases[][2] = {{1, 2816}, {3, 2816}, {1, 1536}, {8, 704}, {5, 37}, {2, 5376}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1];
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(n, 0.01f, 30.0f), *h = rand_floats(n, 0.01f, 10.0f);
        float *w = rand_floats((size_t)dim, 0.5f, 2.0f), *w1 = rand_floats((size_t)dim, 0.5f, 2.0f);
        float *w2 = rand_floats((size_t)dim, 0.5f, 2.0f), *w3 = rand_floats((size_t)dim, 0.5f, 2.0f);
        const float *w3_or_null = k == 4 ? NULL : w3; /* a norm without a weight too */
        float *want_h = malloc(n * 4), *want[3] = {malloc(n * 4), malloc(n * 4), malloc(n * 4)};
        memcpy(want_h, h, n * 4);
        cpu->ops->add_rmsnorm(cpu, want_h, x, w, rows, dim, 1e-6f, 1.0f, want[0], w1);
        cpu->ops->rmsnorm_pair(cpu, want[1], w2, want[2], w3_or_null, want_h, rows, dim, 1e-6f);
        float *dx = up(x, n * 4), *dw = up(w, (size_t)dim * 4), *dw1 = up(w1, (size_t)dim * 4);
        float *dw2 = up(w2, (size_t)dim * 4), *dw3 = up(w3, (size_t)dim * 4);
        float *got_h[2], *got[2][3];
        for (int v = 0; v < 2; v++) { /* v 0: one op, 1: the two */
            float *dh = up(h, n * 4), *d[3] = {poisoned(n), poisoned(n), poisoned(n)};
            if (v == 0)
                gpu->ops->add_rmsnorm_moe(gpu, dh, dx, dw, rows, dim, 1e-6f, d[0], dw1, d[1], dw2, d[2],
                                          w3_or_null ? dw3 : NULL);
            else {
                gpu->ops->add_rmsnorm(gpu, dh, dx, dw, rows, dim, 1e-6f, 1.0f, d[0], dw1);
                gpu->ops->rmsnorm_pair(gpu, d[1], dw2, d[2], w3_or_null ? dw3 : NULL, dh, rows, dim, 1e-6f);
            }
            got_h[v] = down(dh, n);
            for (int j = 0; j < 3; j++) got[v][j] = down(d[j], n), release(d[j]);
            release(dh);
        }
        char what[96];
        snprintf(what, sizeof what, "%d x %d%s", rows, dim, w3_or_null ? "" : ", one norm unweighted");
        compare("add_rmsnorm_moe h", what, got_h[0], want_h, n, TOL_ELEMENTWISE);
        compare("add_rmsnorm_moe next", what, got[0][0], want[0], n, TOL_ELEMENTWISE);
        compare("add_rmsnorm_moe router", what, got[0][1], want[1], n, TOL_ELEMENTWISE);
        compare("add_rmsnorm_moe experts", what, got[0][2], want[2], n, TOL_ELEMENTWISE);
        int same = memcmp(got_h[0], got_h[1], n * 4) == 0;
        for (int j = 0; j < 3; j++) same = same && memcmp(got[0][j], got[1][j], n * 4) == 0;
        CHECK(same, "add_rmsnorm_moe %s: the same bits as add_rmsnorm then rmsnorm_pair", what);
        release(dx), release(dw), release(dw1), release(dw2), release(dw3);
        free(x), free(h), free(w), free(w1), free(w2), free(w3), free(want_h);
        for (int j = 0; j < 3; j++) free(want[j]), free(got[0][j]), free(got[1][j]);
        free(got_h[0]), free(got_h[1]);
    }
}

/* gelu_tanh(W x) * mul: the GEMV epilogue (n <= 8, fast and generic
 * layouts, with the column split or not) and the prefill fallback. */
static void test_matmul_gelu_mul(void) {
    const struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
        int64_t rows, cols;
    } cases[] = {{G4_WEIGHT_BF16, 0, 0, 0, 6144, 1536},          {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, 256, 1536},
                 {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, 96, 2048}, {G4_WEIGHT_AFFINE, 3, 32, G4_DTYPE_F16, 50, 96},
                 {G4_WEIGHT_BF16, 0, 0, 0, 20000, 256},          {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F32, 40, 21504},
                 {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16, 77, 160},  {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16, 77, 2816},
                 {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F32, 40, 21504}};
    const int ns[] = {1, 3, 8, 20};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        test_matrix t;
        make_matrix(&t, cases[k].f, cases[k].bits, cases[k].group, cases[k].sdt, cases[k].rows, cases[k].cols);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
            const int n = ns[i];
            const size_t no = (size_t)n * cases[k].rows;
            float *x = rand_floats((size_t)n * cases[k].cols, 0.05f, 2.0f), *mul = rand_floats(no, 0.1f, 3.0f);
            float *want = malloc(no * 4);
            cpu->ops->matmul_gelu_mul(cpu, want, x, n, &t.host, mul);
            float *dx = up(x, (size_t)n * cases[k].cols * 4), *dmul = up(mul, no * 4), *dout = poisoned(no);
            gpu->ops->matmul_gelu_mul(gpu, dout, dx, n, &t.dev, dmul);
            float *got = down(dout, no);
            char what[96];
            snprintf(what, sizeof what, "%s %lldx%lld n=%d", t.name, (long long)cases[k].rows, (long long)cases[k].cols,
                     n);
            compare(n <= 8 ? "matmul_gelu_mul" : "matmul_gelu_mul/gemm", what, got, want, no,
                    n <= 8 ? 1e-5 : 1e-4);
            release(dx), release(dmul), release(dout);
            free(x), free(mul), free(want), free(got);
        }
        free_matrix(&t);
    }
}

static void test_rmsnorm(void) {
    const int cases[][3] = {{7, 1536, 1}, {64 * 8, 256, 1}, {5, 512, 0}, {3, 5376, 1}, {4, 37, 1}, {300, 2816, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1], with_w = cases[k][2];
        float *x = rand_floats((size_t)rows * dim, 0.01f, 30.0f), *w = rand_floats((size_t)dim, 0.5f, 2.0f);
        float *want = malloc((size_t)rows * dim * 4);
        cpu->ops->rmsnorm(cpu, want, x, with_w ? w : NULL, rows, dim, 1e-6f);
        float *dx = up(x, (size_t)rows * dim * 4), *dw = up(w, (size_t)dim * 4);
        gpu->ops->rmsnorm(gpu, dx, dx, with_w ? dw : NULL, rows, dim, 1e-6f); /* in place */
        float *got = down(dx, (size_t)rows * dim);
        char what[96];
        snprintf(what, sizeof what, "%d x %d%s in place", rows, dim, with_w ? "" : " (no weight)");
        compare("rmsnorm", what, got, want, (size_t)rows * dim, TOL_ELEMENTWISE);
        release(dx);
        release(dw);
        free(x);
        free(w);
        free(want);
        free(got);
    }
}

/* One norm, two weights (the MoE router's input and the experts'): both
 * outputs against the CPU's two rmsnorms; a NULL weight, an odd width and a
 * width past the register kernels (two launches) */
static void test_rmsnorm_pair(void) {
    const int cases[][2] = {{1, 2816}, {3, 1536}, {4, 37}, {2, 9000}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rows = cases[k][0], dim = cases[k][1];
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(n, 0.01f, 30.0f), *w = rand_floats((size_t)dim, 0.5f, 2.0f);
        float *w2 = rand_floats((size_t)dim, 0.5f, 2.0f), *want = malloc(n * 4), *want2 = malloc(n * 4);
        const float *wa = w, *wb = k == 2 ? NULL : w2;
        cpu->ops->rmsnorm(cpu, want, x, wa, rows, dim, 1e-6f);
        cpu->ops->rmsnorm(cpu, want2, x, wb, rows, dim, 1e-6f);
        float *dx = up(x, n * 4), *dw = up(w, (size_t)dim * 4), *dw2 = up(w2, (size_t)dim * 4);
        float *dout = poisoned(n), *dout2 = poisoned(n);
        gpu->ops->rmsnorm_pair(gpu, dout, dw, dout2, wb ? dw2 : NULL, dx, rows, dim, 1e-6f);
        float *got = down(dout, n), *got2 = down(dout2, n);
        char what[96];
        snprintf(what, sizeof what, "%d x %d%s", rows, dim, wb ? "" : " (second without weight)");
        compare("rmsnorm_pair", what, got, want, n, TOL_ELEMENTWISE);
        compare("rmsnorm_pair second", what, got2, want2, n, TOL_ELEMENTWISE);
        release(dx), release(dw), release(dw2), release(dout), release(dout2);
        free(x), free(w), free(w2), free(want), free(want2), free(got), free(got2);
    }
}

/* RoPE alone (fused = 0), or fused with the q/k norm before it (rmsnorm_rope,
 * with and without a weight) against the CPU's rmsnorm then rope */
static void test_rope(int fused) {
    /* heads x head_dim, rotated pairs, theta: sliding 256 (full), global 512 (25%), odd */
    const struct {
        int n, heads, dim, pairs;
        float theta;
    } cases[] = {{5, 8, 256, 128, 10000.0f}, {3, 32, 512, 64, 1000000.0f}, {40, 16, 256, 128, 10000.0f},
                 {2, 4, 64, 32, 10000.0f},   {3, 2, 72, 10, 500.0f}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int n = cases[k].n, H = cases[k].heads, D = cases[k].dim;
        const size_t total = (size_t)n * H * D;
        float *x = rand_floats(total, 0.01f, 3.0f), *want = malloc(total * 4);
        int32_t *pos = malloc((size_t)n * 4);
        for (int t = 0; t < n; t++) pos[t] = t == 0 ? 0 : t == 1 ? 131071 : rand_int(100000);
        float *w = rand_floats((size_t)D, 0.5f, 2.0f);
        const float *wk = k % 2 ? NULL : w;
        memcpy(want, x, total * 4);
        float *dx = up(x, total * 4), *dw = up(w, (size_t)D * 4);
        int32_t *dpos = up(pos, (size_t)n * 4);
        if (fused) {
            cpu->ops->rmsnorm_rope(cpu, want, wk, n, H, D, pos, cases[k].theta, cases[k].pairs, 1e-6f);
            gpu->ops->rmsnorm_rope(gpu, dx, wk ? dw : NULL, n, H, D, dpos, cases[k].theta, cases[k].pairs, 1e-6f);
        } else {
            cpu->ops->rope(cpu, want, n, H, D, pos, cases[k].theta, cases[k].pairs);
            gpu->ops->rope(gpu, dx, n, H, D, dpos, cases[k].theta, cases[k].pairs);
        }
        float *got = down(dx, total);
        char what[96];
        snprintf(what, sizeof what, "n=%d %d heads x %d, %d pairs, theta %g", n, H, D, cases[k].pairs, cases[k].theta);
        compare(fused ? "rmsnorm_rope" : "rope", what, got, want, total, TOL_ELEMENTWISE);
        release(dx);
        release(dw);
        free(w);
        release(dpos);
        free(x);
        free(want);
        free(pos);
        free(got);
    }
}

/* Elementwise ops on an odd size: out of place into NaN, then in place. */
static void test_elementwise(void) {
    const size_t n = 100003;
    const int rows = 61, dim = 1639; /* rows * dim = 99979 */
    float *a = rand_floats(n, 0.01f, 8.0f), *b = rand_floats(n, 0.01f, 8.0f), *v = rand_floats(dim, 0.1f, 2.0f);
    float *want = malloc(n * 4);
    float *da = up(a, n * 4), *db = up(b, n * 4), *dv = up(v, dim * 4);
    const char *names[] = {"gelu_mul", "add", "scale", "mul", "mul_rows", "softcap", "clamp", "affine", "add_rows"};
    for (int op = 0; op < 9; op++) {
        float *dout = poisoned(n);
        size_t count = n;
        memcpy(want, a, n * 4);
        switch (op) {
        case 0: cpu->ops->gelu_mul(cpu, want, a, b, n); gpu->ops->gelu_mul(gpu, dout, da, db, n); break;
        case 1: cpu->ops->add(cpu, want, a, b, n); gpu->ops->add(gpu, dout, da, db, n); break;
        case 2: cpu->ops->scale(cpu, want, a, 0.70710678f, n); gpu->ops->scale(gpu, dout, da, 0.70710678f, n); break;
        case 3: cpu->ops->mul(cpu, want, a, b, n); gpu->ops->mul(gpu, dout, da, db, n); break;
        case 4:
            count = (size_t)rows * dim;
            cpu->ops->mul_rows(cpu, want, a, v, rows, dim);
            gpu->ops->mul_rows(gpu, dout, da, dv, rows, dim);
            break;
        case 5:
            gpu->ops->copy(gpu, dout, da, n * 4);
            cpu->ops->softcap(cpu, want, n, 3.0f);
            gpu->ops->softcap(gpu, dout, n, 3.0f);
            break;
        case 6:
            gpu->ops->copy(gpu, dout, da, n * 4);
            cpu->ops->clamp(cpu, want, want, -2.5f, 1.5f, n);
            gpu->ops->clamp(gpu, dout, dout, -2.5f, 1.5f, n);
            break;
        case 7: cpu->ops->affine(cpu, want, a, 2.0f, -1.0f, n); gpu->ops->affine(gpu, dout, da, 2.0f, -1.0f, n); break;
        case 8:
            count = (size_t)rows * dim;
            cpu->ops->add_rows(cpu, want, a, v, rows, dim);
            gpu->ops->add_rows(gpu, dout, da, dv, rows, dim);
            break;
        }
        float *got = down(dout, count);
        char what[64];
        snprintf(what, sizeof what, "%zu values", count);
        compare(names[op], what, got, want, count, TOL_ELEMENTWISE);
        free(got);
        release(dout);
    }
    /* in place, as the decoder calls them */
    memcpy(want, a, n * 4);
    cpu->ops->add(cpu, want, want, b, n);
    gpu->ops->add(gpu, da, da, db, n);
    float *got = down(da, n);
    compare("add", "in place", got, want, n, TOL_ELEMENTWISE);
    free(got);
    release(da);
    release(db);
    release(dv);
    free(a);
    free(b);
    free(v);
    free(want);
}

static void test_rows_and_copies(void) {
    const int n_src = 50, dim = 1536, n = 17;
    float *src = rand_floats((size_t)n_src * dim, 0.01f, 5.0f);
    int32_t rows[17];
    for (int i = 0; i < n; i++) rows[i] = (i * 7 + 3) % n_src; /* distinct */
    float *dsrc = up(src, (size_t)n_src * dim * 4);
    int32_t *drows = up(rows, sizeof rows);
    /* gather */
    float *want = malloc((size_t)n_src * dim * 4);
    cpu->ops->gather_rows(cpu, want, src, rows, n, dim);
    float *dout = poisoned((size_t)n * dim);
    gpu->ops->gather_rows(gpu, dout, dsrc, drows, n, dim);
    float *got = down(dout, (size_t)n * dim);
    compare("gather_rows", "17 of 50 rows x 1536", got, want, (size_t)n * dim, TOL_EXACT);
    free(got);
    /* scatter into a copy of src */
    float *small = rand_floats((size_t)n * dim, 0.01f, 5.0f);
    float *dsmall = up(small, (size_t)n * dim * 4);
    memcpy(want, src, (size_t)n_src * dim * 4);
    cpu->ops->scatter_rows(cpu, want, rows, small, n, dim);
    float *dst = up(src, (size_t)n_src * dim * 4);
    gpu->ops->scatter_rows(gpu, dst, drows, dsmall, n, dim);
    got = down(dst, (size_t)n_src * dim);
    compare("scatter_rows", "17 rows into 50 x 1536", got, want, (size_t)n_src * dim, TOL_EXACT);
    free(got);
    /* copy_rows: a column block of a wider matrix (the per-layer input slice) */
    const int L = 35, P = 256, T = 7;
    float *wide = rand_floats((size_t)T * L * P, 0.01f, 5.0f);
    float *dwide = up(wide, (size_t)T * L * P * 4);
    float *dslice = poisoned((size_t)T * P);
    cpu->ops->copy_rows(cpu, want, P, wide + 5 * P, L * P, T, P);
    gpu->ops->copy_rows(gpu, dslice, P, dwide + 5 * P, L * P, T, P);
    got = down(dslice, (size_t)T * P);
    compare("copy_rows", "7 rows x 256 from a 8960-wide matrix", got, want, (size_t)T * P, TOL_EXACT);
    free(got);
    /* copy, to_device, to_host round trip */
    float *dcopy = poisoned((size_t)n_src * dim);
    gpu->ops->copy(gpu, dcopy, dsrc, (size_t)n_src * dim * 4);
    got = down(dcopy, (size_t)n_src * dim);
    compare("copy", "device to device, 300 KiB", got, src, (size_t)n_src * dim, TOL_EXACT);
    free(got);
    release(dsrc), release(drows), release(dout), release(dsmall), release(dst), release(dwide), release(dslice),
        release(dcopy);
    free(src), free(want), free(small), free(wide);
}

static void test_vision_ops(void) {
    /* 2-D RoPE: 50 patches, 12 heads of 64 (E2B-like tower), positions up to 40 */
    {
        const int n = 50, H = 12, D = 64;
        const size_t total = (size_t)n * H * D;
        float *x = rand_floats(total, 0.01f, 3.0f), *want = malloc(total * 4);
        int32_t pos[100];
        for (int t = 0; t < n; t++) pos[2 * t] = rand_int(40), pos[2 * t + 1] = rand_int(40);
        memcpy(want, x, total * 4);
        cpu->ops->rope_2d(cpu, want, n, H, D, pos, 100.0f);
        float *dx = up(x, total * 4);
        int32_t *dpos = up(pos, sizeof pos);
        gpu->ops->rope_2d(gpu, dx, n, H, D, dpos, 100.0f);
        float *got = down(dx, total);
        compare("rope_2d", "50 patches, 12 heads x 64", got, want, total, TOL_ELEMENTWISE);
        release(dx), release(dpos);
        free(x), free(want), free(got);
    }
    /* pooling: 90 patches into 10 slots (some skipped) */
    {
        const int n_in = 90, n_out = 10, dim = 768;
        float *in = rand_floats((size_t)n_in * dim, 0.01f, 4.0f), *want = malloc((size_t)n_out * dim * 4);
        int32_t slot[90];
        for (int r = 0; r < n_in; r++) slot[r] = r % 13 == 5 ? -1 : rand_int(n_out);
        cpu->ops->pool_rows(cpu, want, in, slot, n_in, n_out, dim, 9.2376f);
        float *din = up(in, (size_t)n_in * dim * 4), *dout = poisoned((size_t)n_out * dim);
        int32_t *dslot = up(slot, sizeof slot);
        gpu->ops->pool_rows(gpu, dout, din, dslot, n_in, n_out, dim, 9.2376f);
        float *got = down(dout, (size_t)n_out * dim);
        compare("pool_rows", "90 rows into 10 x 768", got, want, (size_t)n_out * dim, TOL_ELEMENTWISE);
        release(din), release(dout), release(dslot);
        free(in), free(want), free(got);
    }
}

/* The audio tower's ops (and LayerNorm, which the 12B's vision embedder uses)
 * at the E2B conformer's sizes. */
static void test_audio_ops(void) {
    /* elementwise: scale_rows, relu, silu, glu */
    {
        const int rows = 37, dim = 1024;
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(2 * n, 0.01f, 4.0f), *s = rand_floats((size_t)rows, 0.01f, 1.0f);
        float *want = malloc(n * 4);
        float *dx = up(x, 2 * n * 4), *ds = up(s, (size_t)rows * 4), *dout = poisoned(n);
        cpu->ops->scale_rows(cpu, want, x, s, rows, dim);
        gpu->ops->scale_rows(gpu, dout, dx, ds, rows, dim);
        float *got = down(dout, n);
        compare("scale_rows", "37 x 1024", got, want, n, TOL_ELEMENTWISE);
        free(got);
        cpu->ops->relu(cpu, want, x, n);
        gpu->ops->relu(gpu, dout, dx, n);
        got = down(dout, n);
        compare("relu", "37 x 1024", got, want, n, TOL_ELEMENTWISE);
        free(got);
        cpu->ops->silu(cpu, want, x, n);
        gpu->ops->silu(gpu, dout, dx, n);
        got = down(dout, n);
        compare("silu", "37 x 1024", got, want, n, TOL_ELEMENTWISE);
        free(got);
        cpu->ops->glu(cpu, want, x, rows, dim);
        gpu->ops->glu(gpu, dout, dx, rows, dim);
        got = down(dout, n);
        compare("glu", "37 x 2048 -> 1024", got, want, n, TOL_ELEMENTWISE);
        free(got);
        release(dx), release(ds), release(dout);
        free(x), free(s), free(want);
    }
    /* layer_norm with and without weight/bias, widths of the conformer and the 12B embedder */
    {
        const int rows = 19, dims[] = {32, 1024, 6912};
        for (int k = 0; k < 3; k++) {
            const int dim = dims[k];
            const size_t n = (size_t)rows * dim;
            float *x = rand_floats(n, 0.01f, 4.0f), *w = rand_floats((size_t)dim, 0.5f, 1.5f);
            float *b = rand_floats((size_t)dim, 0.01f, 0.2f), *want = malloc(n * 4);
            float *dx = up(x, n * 4), *dw = up(w, (size_t)dim * 4), *db = up(b, (size_t)dim * 4), *dout = poisoned(n);
            cpu->ops->layer_norm(cpu, want, x, w, k == 1 ? NULL : b, rows, dim, 1e-5f);
            gpu->ops->layer_norm(gpu, dout, dx, dw, k == 1 ? NULL : db, rows, dim, 1e-5f);
            float *got = down(dout, n);
            compare("layer_norm", dim == 32 ? "19 x 32" : dim == 1024 ? "19 x 1024, no bias" : "19 x 6912", got, want, n,
                    TOL_ELEMENTWISE);
            release(dx), release(dw), release(db), release(dout);
            free(x), free(w), free(b), free(want), free(got);
        }
    }
    /* conv2d: the subsampling convolutions (1 -> 128 and 128 -> 32 channels, 3x3, stride 2, pad 1) */
    {
        const int H = 61, W = 128, shapes[2][2] = {{1, 128}, {128, 32}};
        for (int k = 0; k < 2; k++) {
            const int ci = shapes[k][0], co = shapes[k][1], h = k ? 31 : H, w = k ? 64 : W;
            const int Ho = (h + 2 - 3) / 2 + 1, Wo = (w + 2 - 3) / 2 + 1;
            const size_t nx = (size_t)h * w * ci, nw = (size_t)co * 9 * ci, no = (size_t)Ho * Wo * co;
            float *x = rand_floats(nx, 0.01f, 2.0f), *wt = rand_floats(nw, 0.01f, 0.3f), *want = malloc(no * 4);
            float *dx = up(x, nx * 4), *dw = up(wt, nw * 4), *dout = poisoned(no);
            cpu->ops->conv2d(cpu, want, x, wt, h, w, ci, co, 3, 3, 2, 1);
            gpu->ops->conv2d(gpu, dout, dx, dw, h, w, ci, co, 3, 3, 2, 1);
            float *got = down(dout, no);
            compare("conv2d", k ? "31 x 64 x 128 -> 32" : "61 x 128 x 1 -> 128", got, want, no, TOL_REDUCE);
            release(dx), release(dw), release(dout);
            free(x), free(wt), free(want), free(got);
        }
    }
    /* causal depthwise conv1d: kernel 5 over 1024 channels */
    {
        const int T = 75, C = 1024, K = 5;
        float *x = rand_floats((size_t)T * C, 0.01f, 2.0f), *w = rand_floats((size_t)C * K, 0.01f, 0.5f);
        float *want = malloc((size_t)T * C * 4);
        float *dx = up(x, (size_t)T * C * 4), *dw = up(w, (size_t)C * K * 4), *dout = poisoned((size_t)T * C);
        cpu->ops->depthwise_conv1d_causal(cpu, want, x, w, T, C, K);
        gpu->ops->depthwise_conv1d_causal(gpu, dout, dx, dw, T, C, K);
        float *got = down(dout, (size_t)T * C);
        compare("depthwise_conv1d", "75 x 1024, kernel 5", got, want, (size_t)T * C, TOL_ELEMENTWISE);
        release(dx), release(dw), release(dout);
        free(x), free(w), free(want), free(got);
    }
    /* chunked attention: 8 heads of 128, chunk 12, 12 past frames, 13 relative keys, padding at the end */
    {
        g4_chunked_attn_params p = {.n_frames = 75, .n_heads = 8, .head_dim = 128, .chunk = 12, .past = 12,
                                    .future = 0, .n_rel = 13, .max_past_dist = 11, .max_future_dist = 0,
                                    .logit_cap = 50.0f, .invalid_logit = -1e9f};
        const size_t n = (size_t)p.n_frames * p.n_heads * p.head_dim, nr = (size_t)p.n_rel * p.n_heads * p.head_dim;
        float *q = rand_floats(n, 0.01f, 0.3f), *k = rand_floats(n, 0.01f, 0.3f), *v = rand_floats(n, 0.01f, 2.0f);
        float *rk = rand_floats(nr, 0.01f, 0.3f), *want = malloc(n * 4);
        int32_t valid[75];
        for (int i = 0; i < 75; i++) valid[i] = i < 70;
        float *dq = up(q, n * 4), *dk = up(k, n * 4), *dv = up(v, n * 4), *drk = up(rk, nr * 4), *dout = poisoned(n);
        int32_t *dvalid = up(valid, sizeof valid);
        for (int inv = 0; inv < 2; inv++) {
            p.invert_mask = inv;
            cpu->ops->chunked_attention(cpu, want, q, k, v, rk, valid, &p);
            gpu->ops->chunked_attention(gpu, dout, dq, dk, dv, drk, dvalid, &p);
            float *got = down(dout, n);
            compare("chunked_attention", inv ? "75 frames x 8 heads x 128, inverted mask" : "75 frames x 8 heads x 128",
                    got, want, n, TOL_REDUCE);
            free(got);
        }
        release(dq), release(dk), release(dv), release(drk), release(dout), release(dvalid);
        free(q), free(k), free(v), free(rk), free(want);
    }
}

/* ---- KV cache and attention ---- */

typedef struct {
    const char *label;
    int n_heads, n_kv, head_dim, block_size;
    int sliding, window;
    int n_seqs;
    int lens[8];
    int prefill;   /* 0: the last token of every sequence (decode); 1: the last chunk of sequence 0;
                      2: the last chunk of every sequence, one batch (a server's mixed prefill) */
    int chunk;     /* positions stored per kv_store call (and the prefill chunk) */
    int bidir;     /* widen a run of query tokens to see each other (image block) */
    int empty_row; /* one query token with an empty range */
} attn_case;

static void upload_batch(const g4_attn_batch *h, g4_attn_batch *d, int n_seqs, void **bufs) {
    *d = *h;
    d->pos = bufs[0] = up(h->pos, (size_t)h->n_tokens * 4);
    d->seq = bufs[1] = up(h->seq, (size_t)h->n_tokens * 4);
    d->kv_range = bufs[2] = up(h->kv_range, (size_t)h->n_tokens * 16);
    d->full_tables = bufs[3] = up(h->full_tables, (size_t)n_seqs * h->full_table_stride * 4);
    d->sliding_tables = bufs[4] = up(h->sliding_tables, (size_t)n_seqs * h->ring_blocks * 4);
}

static void shuffle(int32_t *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = rand_int(i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* Backends with the tensor-core prefill attention on (tuning attn=auto:
 * the flash kernel; attn=tc: the older kernel; attn_tc_split: keys per
 * piece when each tile's keys are split over blocks, "" by shape) and off
 * (attn=cores, last), made once. */
#define ATTN_TC_VARIANTS 8
static const char *const attn_tc_knob[ATTN_TC_VARIANTS][2] = {
    {"auto", ""}, {"auto", "0"}, {"auto", "32"}, {"auto", "256"}, {"tc", "0"}, {"tc", "64"}, {"tc", "256"}, {"cores", ""}};
static const char *attn_tc_name[ATTN_TC_VARIANTS];
static g4_backend *attn_tc_be[ATTN_TC_VARIANTS];
static int attn_tc_made;
/* decode under other settings: key pieces of at least 64 positions */
#define ATTN_DECODE_VARIANTS 1
static const char *const attn_decode_knob[ATTN_DECODE_VARIANTS][2] = {{"attn_min_split", "64"}};
static char attn_decode_name[ATTN_DECODE_VARIANTS][64];
static g4_backend *attn_decode_be[ATTN_DECODE_VARIANTS];

static void attn_tc_backends(void) {
    if (attn_tc_made) return;
    attn_tc_made = 1;
    static char names[ATTN_TC_VARIANTS][64];
    for (int v = 0; v < ATTN_TC_VARIANTS; v++) {
        snprintf(names[v], sizeof names[v], "attn=%s%s%s", attn_tc_knob[v][0],
                 attn_tc_knob[v][1][0] ? ",attn_tc_split=" : "", attn_tc_knob[v][1]);
        attn_tc_name[v] = names[v];
        attn_tc_be[v] = knob_backend(attn_tc_name[v]);
    }
    for (int v = 0; v < ATTN_DECODE_VARIANTS; v++) {
        snprintf(attn_decode_name[v], sizeof attn_decode_name[v], "%s=%s", attn_decode_knob[v][0],
                 attn_decode_knob[v][1]);
        attn_decode_be[v] = knob_backend(attn_decode_name[v]);
    }
}

static void attn_tc_destroy(void) {
    for (int v = 0; v < ATTN_TC_VARIANTS; v++) {
        if (!attn_tc_be[v]) continue;
        CHECK(g4_cuda_status(attn_tc_be[v]) == G4_OK, "no CUDA failure recorded with %s: %s", attn_tc_name[v],
              g4_error_message());
        g4_backend_destroy(attn_tc_be[v]);
        attn_tc_be[v] = NULL;
    }
    for (int v = 0; v < ATTN_DECODE_VARIANTS; v++) {
        if (!attn_decode_be[v]) continue;
        CHECK(g4_cuda_status(attn_decode_be[v]) == G4_OK, "no CUDA failure recorded with %s: %s", attn_decode_name[v],
              g4_error_message());
        g4_backend_destroy(attn_decode_be[v]);
        attn_decode_be[v] = NULL;
    }
    attn_tc_made = 0;
}

static int attn_tc_eligible(int n_tokens, int G, int D) {
    return !(n_tokens <= 32 && G <= 32) && D >= 64 && D <= 512 && D % 16 == 0;
}

/* The KV cache type check_attention runs over (test_attention sets each). */
static g4_kv_type attn_kv_type = G4_KV_F32;

static void check_attention(const attn_case *ac) {
    const int Hq = ac->n_heads, Hkv = ac->n_kv, D = ac->head_dim, bs = ac->block_size, S = ac->n_seqs;
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = ac->lens[s] > max_len ? ac->lens[s] : max_len;
    const int stride = (max_len + bs - 1) / bs;
    const int ring = g4_kv_ring_blocks(ac->window, ac->chunk, bs);
    const int n_blocks = ac->sliding ? S * ring : S * stride + 3;
    int32_t *full_tables = malloc((size_t)S * stride * 4), *sliding_tables = malloc((size_t)S * ring * 4);
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    shuffle(perm, n_blocks);
    for (int i = 0; i < S * stride; i++) full_tables[i] = perm[i % n_blocks];
    for (int i = 0; i < S * ring; i++) sliding_tables[i] = perm[i % n_blocks];
    void *kc = cpu->ops->kv_alloc(cpu, n_blocks, bs, Hkv, D, attn_kv_type);
    void *kg = gpu->ops->kv_alloc(gpu, n_blocks, bs, Hkv, D, attn_kv_type);
    CHECK(kc && kg, "%s: kv_alloc %s", ac->label, g4_kv_type_name(attn_kv_type));
    const size_t kv_row = (size_t)Hkv * D;
    const size_t cap = (size_t)max_len + (size_t)S * ac->chunk + S; /* positions a batch can hold */
    int32_t *pos = malloc(cap * 4), *seq = malloc(cap * 4);
    int32_t *ranges = malloc(cap * 16);
    /* store every sequence in chunks, as a session would */
    for (int s = 0; s < S; s++) {
        for (int start = 0; start < ac->lens[s]; start += ac->chunk) {
            const int n = ac->lens[s] - start < ac->chunk ? ac->lens[s] - start : ac->chunk;
            for (int t = 0; t < n; t++) pos[t] = start + t, seq[t] = s, ranges[4 * t] = ranges[4 * t + 1] = 0;
            g4_attn_batch hb = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges,
                                .full_tables = full_tables, .full_table_stride = stride,
                                .sliding_tables = sliding_tables, .ring_blocks = ring, .block_size = bs};
            g4_attn_batch db;
            void *bufs[5];
            upload_batch(&hb, &db, S, bufs);
            float *k = rand_floats((size_t)n * kv_row, 0.01f, 2.0f), *v = rand_floats((size_t)n * kv_row, 0.01f, 2.0f);
            float *dk = up(k, (size_t)n * kv_row * 4), *dv = up(v, (size_t)n * kv_row * 4);
            cpu->ops->kv_store(cpu, kc, k, v, &hb, ac->sliding);
            gpu->ops->kv_store(gpu, kg, dk, dv, &db, ac->sliding);
            release(dk), release(dv);
            for (int i = 0; i < 5; i++) release(bufs[i]);
            free(k), free(v);
        }
    }
    /* the queries */
    int n = 0;
    if (!ac->prefill) {
        for (int s = 0; s < S; s++) pos[n] = ac->lens[s] - 1, seq[n] = s, n++;
    } else {
        for (int s = 0; s < (ac->prefill == 2 ? S : 1); s++) {
            const int last = (ac->lens[s] - 1) / ac->chunk * ac->chunk;
            for (int p = last; p < ac->lens[s]; p++) pos[n] = p, seq[n] = s, n++;
        }
    }
    for (int t = 0; t < n; t++) {
        const int p = pos[t];
        ranges[4 * t + 0] = p - ac->window + 1 < 0 ? 0 : p - ac->window + 1;
        ranges[4 * t + 1] = p;
        ranges[4 * t + 2] = 0;
        ranges[4 * t + 3] = p;
    }
    if (ac->bidir && n > 6) /* tokens 2..5 see each other: ranges reach token 5 */
        for (int t = 2; t <= 5; t++) ranges[4 * t + 1] = ranges[4 * t + 3] = pos[5];
    if (ac->empty_row) ranges[4 * (n - 1) + 0] = ranges[4 * (n - 1) + 2] = pos[n - 1] + 1;
    g4_attn_batch hb = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = full_tables,
                        .full_table_stride = stride, .sliding_tables = sliding_tables, .ring_blocks = ring,
                        .block_size = bs};
    g4_attn_batch db;
    void *bufs[5];
    upload_batch(&hb, &db, S, bufs);
    const size_t nq = (size_t)n * Hq * D;
    {
        /* both pools hold the same bits: kv_read of the queries' positions */
        const size_t nr = (size_t)n * kv_row;
        float *kc_r = malloc(nr * 4), *vc_r = malloc(nr * 4), *dk = poisoned(nr), *dv = poisoned(nr);
        cpu->ops->kv_read(cpu, kc, kc_r, vc_r, &hb, ac->sliding);
        gpu->ops->kv_read(gpu, kg, dk, dv, &db, ac->sliding);
        float *kg_r = down(dk, nr), *vg_r = down(dv, nr);
        CHECK(!memcmp(kc_r, kg_r, nr * 4) && !memcmp(vc_r, vg_r, nr * 4), "%s %s: stored K/V differ from the CPU's",
              ac->label, g4_kv_type_name(attn_kv_type));
        release(dk), release(dv);
        free(kc_r), free(vc_r), free(kg_r), free(vg_r);
    }
    float *q = rand_floats(nq, 0.01f, 2.0f), *want = malloc(nq * 4);
    const float scale = ac->head_dim == 72 ? 0.125f : 1.0f;
    cpu->ops->attention(cpu, want, q, kc, &hb, ac->sliding, Hq, scale);
    float *dq = up(q, nq * 4), *dout = poisoned(nq);
    gpu->ops->attention(gpu, dout, dq, kg, &db, ac->sliding, Hq, scale);
    float *got = down(dout, nq);
    char what[160];
    snprintf(what, sizeof what, "%s: %d x %d/%d heads x %d, %s cache", ac->label, n, Hq, Hkv, D,
             g4_kv_type_name(attn_kv_type));
    compare("attention", what, got, want, nq, TOL_REDUCE);
    /* decode cases again under the other decode settings */
    for (int v = 0; v < ATTN_DECODE_VARIANTS && !ac->prefill; v++) {
        g4_backend *be = attn_decode_be[v];
        if (!be) continue;
        float *o = poisoned(nq);
        gpu->ops->synchronize(gpu);
        be->ops->attention(be, o, dq, kg, &db, ac->sliding, Hq, scale);
        be->ops->synchronize(be);
        float *res = down(o, nq);
        release(o);
        snprintf(what, sizeof what, "%s: %d x %d/%d heads x %d, %s", ac->label, n, Hq, Hkv, D, attn_decode_name[v]);
        compare("attention", what, res, want, nq, TOL_REDUCE);
        free(res);
    }
    /* prefill cases again with the tensor-core kernel on (each rows-per-block
     * choice) and off: same tolerance; where the shape is the kernel's, bits
     * other than the CUDA-core kernel's show that it ran */
    if (ac->prefill) {
        float *res[ATTN_TC_VARIANTS] = {NULL};
        for (int v = 0; v < ATTN_TC_VARIANTS; v++) {
            g4_backend *be = attn_tc_be[v];
            if (!be) continue;
            float *o = poisoned(nq);
            /* another backend, another stream: its inputs must be in place
             * before it runs, and its result before `gpu` copies it back */
            gpu->ops->synchronize(gpu);
            be->ops->attention(be, o, dq, kg, &db, ac->sliding, Hq, scale);
            be->ops->synchronize(be);
            res[v] = down(o, nq);
            release(o);
            snprintf(what, sizeof what, "%s: %d x %d/%d heads x %d, %s", ac->label, n, Hq, Hkv, D, attn_tc_name[v]);
            compare(v + 1 < ATTN_TC_VARIANTS ? "attention_tc" : "attention", what, res[v], want, nq, TOL_REDUCE);
        }
        const float *off = res[ATTN_TC_VARIANTS - 1];
        for (int v = 0; off && v + 1 < ATTN_TC_VARIANTS; v++)
            if (res[v] && attn_tc_eligible(n, Hq / Hkv, D))
                CHECK(memcmp(res[v], off, nq * sizeof *off) != 0,
                      "%s: %s gave the CUDA-core kernel's bits", ac->label, attn_tc_name[v]);
        for (int v = 0; v < ATTN_TC_VARIANTS; v++) free(res[v]);
    }
    release(dq), release(dout);
    for (int i = 0; i < 5; i++) release(bufs[i]);
    cpu->ops->kv_free(cpu, kc);
    gpu->ops->kv_free(gpu, kg);
    free(q), free(want), free(got), free(pos), free(seq), free(ranges), free(full_tables), free(sliding_tables),
        free(perm);
}

/* kv_copy_blocks (the prefix cache's window snapshots): whole blocks, K and
 * V (and fp8's row scales), each a copy of its source bit for bit on either
 * backend; runs of consecutive blocks and single ones, every other block
 * untouched; at every KV type. The CUDA pool equals the CPU's where their
 * stores round alike (f32, bf16). */
static void test_kv_copy_blocks(void) {
    enum { NB = 12, BS = 4, HKV = 2, D = 64, N = NB * BS };
    const size_t row = (size_t)HKV * D, bytes = (size_t)N * row * 4;
    int32_t table[NB], pos[N], seq[N], ranges[4 * N];
    for (int b = 0; b < NB; b++) table[b] = b;
    for (int t = 0; t < N; t++) pos[t] = t, seq[t] = 0, ranges[4 * t] = ranges[4 * t + 1] = ranges[4 * t + 2] = ranges[4 * t + 3] = 0;
    g4_attn_batch hb = {.n_tokens = N, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = table,
                        .full_table_stride = NB, .sliding_tables = table, .ring_blocks = NB, .block_size = BS};
    g4_attn_batch db;
    void *bufs[5];
    upload_batch(&hb, &db, 1, bufs);
    const int32_t src[] = {0, 1, 2, 7, 5}, dst[] = {8, 9, 10, 3, 11};
    const int n = (int)(sizeof src / sizeof *src);
    const g4_kv_type types[] = {G4_KV_F32, G4_KV_BF16, G4_KV_FP8};
    for (int ti = 0; ti < 3; ti++) {
        const g4_kv_type type = types[ti];
        void *kc = cpu->ops->kv_alloc(cpu, NB, BS, HKV, D, type), *kg = gpu->ops->kv_alloc(gpu, NB, BS, HKV, D, type);
        float *k = rand_floats((size_t)N * row, 0.01f, 2.0f), *v = rand_floats((size_t)N * row, 0.01f, 2.0f);
        float *dk = up(k, bytes), *dv = up(v, bytes);
        cpu->ops->kv_store(cpu, kc, k, v, &hb, 0);
        gpu->ops->kv_store(gpu, kg, dk, dv, &db, 0);
        /* what each pool holds before the copies, as read back */
        float *ck0 = malloc(bytes), *cv0 = malloc(bytes);
        cpu->ops->kv_read(cpu, kc, ck0, cv0, &hb, 0);
        gpu->ops->kv_read(gpu, kg, dk, dv, &db, 0);
        float *gk0 = down(dk, (size_t)N * row), *gv0 = down(dv, (size_t)N * row);
        cpu->ops->kv_copy_blocks(cpu, kc, src, dst, n);
        gpu->ops->kv_copy_blocks(gpu, kg, src, dst, n);
        float *ck = malloc(bytes), *cv = malloc(bytes);
        cpu->ops->kv_read(cpu, kc, ck, cv, &hb, 0);
        gpu->ops->kv_read(gpu, kg, dk, dv, &db, 0);
        float *gk = down(dk, (size_t)N * row), *gv = down(dv, (size_t)N * row);
        const int same = !memcmp(ck, gk, bytes) && !memcmp(cv, gv, bytes);
        /* each block holds its source's values (as stored), or its own */
        int right = 1;
        for (int b = 0; b < NB; b++) {
            int from = b;
            for (int i = 0; i < n; i++)
                if (dst[i] == b) from = src[i];
            const size_t off = (size_t)b * BS * row, src_off = (size_t)from * BS * row, len = (size_t)BS * row * 4;
            right &= !memcmp(gk + off, gk0 + src_off, len) && !memcmp(gv + off, gv0 + src_off, len);
            right &= !memcmp(ck + off, ck0 + src_off, len) && !memcmp(cv + off, cv0 + src_off, len);
        }
        const char *name = type == G4_KV_F32 ? "f32" : type == G4_KV_BF16 ? "bf16" : "fp8";
        printf("  kv_copy_blocks %s, %d blocks (3 consecutive, 2 single): %s, CUDA %s the CPU\n", name, n,
               right ? "exact copies" : "WRONG", same ? "equals" : "differs from");
        CHECK(right, "kv_copy_blocks %s: a block does not hold its source's K and V", name);
        if (type != G4_KV_FP8) CHECK(same, "kv_copy_blocks %s: CUDA pool differs from the CPU's", name);
        free(k), free(v), free(ck), free(cv), free(gk), free(gv), free(ck0), free(cv0), free(gk0), free(gv0);
        release(dk), release(dv);
        cpu->ops->kv_free(cpu, kc);
        gpu->ops->kv_free(gpu, kg);
    }
    for (int i = 0; i < 5; i++) release(bufs[i]);
}

static void test_attention(void) {
    const attn_case cases[] = {
        /* decode: one token of each of 6 sequences of different lengths */
        {"decode full E2B-global", 8, 1, 512, 16, 0, 1 << 30, 6, {1, 17, 300, 64, 999, 128}, 0, 64, 0, 0},
        {"decode sliding E2B, ring wraps", 8, 1, 256, 16, 1, 512, 4, {3, 700, 1500, 513}, 0, 64, 0, 0},
        {"decode full 31B-global GQA 8", 32, 4, 512, 16, 0, 1 << 30, 3, {40, 2000, 257}, 0, 128, 0, 0},
        {"decode sliding 31B GQA 2", 32, 16, 256, 16, 1, 1024, 2, {1100, 90}, 0, 128, 0, 0},
        {"decode 26B-global GQA 8", 16, 2, 512, 16, 0, 1 << 30, 1, {5000}, 0, 512, 0, 0},
        {"decode long context", 8, 1, 256, 16, 0, 1 << 30, 1, {9000}, 0, 512, 0, 0},
        /* prefill chunks of one sequence */
        {"prefill full 512", 8, 1, 512, 16, 0, 1 << 30, 1, {230}, 1, 100, 0, 0},
        {"prefill sliding 256 ring wrap", 8, 1, 256, 16, 1, 128, 1, {600}, 1, 64, 0, 0},
        {"prefill 31B sliding GQA 2", 32, 16, 256, 16, 1, 1024, 1, {150}, 1, 150, 0, 0},
        {"prefill 26B sliding GQA 2", 16, 8, 256, 16, 1, 1024, 1, {300}, 1, 100, 0, 1},
        {"prefill with an image block", 8, 1, 256, 16, 1, 16, 1, {60}, 1, 40, 1, 0},
        {"prefill full with an image block", 4, 2, 64, 16, 0, 1 << 30, 1, {60}, 1, 40, 1, 0},
        /* odd sizes: tiny fixture heads, vision-like 72 with one block */
        {"fixture-like 32", 4, 1, 32, 16, 0, 1 << 30, 2, {30, 7}, 0, 8, 0, 0},
        {"fixture-like 32 prefill", 4, 1, 32, 16, 1, 8, 1, {45}, 1, 5, 0, 0},
        {"vision-like 72, one block", 4, 4, 72, 96, 0, 1 << 30, 1, {96}, 1, 96, 0, 0},
        {"odd head_dim 40", 6, 3, 40, 8, 0, 1 << 30, 2, {50, 33}, 0, 16, 0, 1},
        {"odd head_dim 18 (scalar loads)", 2, 1, 18, 16, 0, 1 << 30, 1, {20}, 1, 20, 0, 0},
        /* prefill chunks of more than 32 tokens (the tensor-core kernel's
         * batches): ring wraps, image blocks, odd head sizes, empty rows */
        {"prefill full 512, 102 tokens", 8, 1, 512, 16, 0, 1 << 30, 1, {230}, 1, 128, 0, 0},
        {"prefill sliding 256 ring wrap, 74 tokens", 8, 1, 256, 16, 1, 128, 1, {650}, 1, 96, 0, 0},
        {"prefill sliding with an image block, 36 tokens", 8, 1, 256, 16, 1, 16, 1, {100}, 1, 64, 1, 0},
        {"prefill full image block, head_dim 64", 4, 2, 64, 16, 0, 1 << 30, 1, {100}, 1, 64, 1, 0},
        {"prefill head_dim 80, empty row", 6, 3, 80, 8, 0, 1 << 30, 1, {90}, 1, 50, 0, 1},
        {"prefill head_dim 96, sliding ring wrap", 4, 1, 96, 16, 1, 40, 1, {230}, 1, 48, 0, 0},
        {"prefill head_dim 128 GQA 4, one block", 8, 2, 128, 64, 0, 1 << 30, 1, {64}, 1, 64, 0, 0},
        /* model-sized prefill: 512 tokens of the 31B and the E2B, sliding
         * layers (the last chunk of several: the ring has wrapped) and
         * global ones */
        {"prefill 31B sliding 1024, 512 tokens", 32, 16, 256, 16, 1, 1024, 1, {2048}, 1, 512, 0, 0},
        {"prefill 31B global, 512 tokens", 32, 4, 512, 16, 0, 1 << 30, 1, {512}, 1, 512, 0, 0},
        {"prefill E2B sliding 512, 512 tokens", 8, 1, 256, 16, 1, 512, 1, {1536}, 1, 512, 0, 0},
        {"prefill E2B global, 512 tokens", 8, 1, 512, 16, 0, 1 << 30, 1, {512}, 1, 512, 0, 0},
        /* one batch of several sequences' chunks: a block's rows span
         * sequences (runs), as in the server's mixed steps */
        {"prefill chunks of 3 sequences, E2B sliding", 8, 1, 256, 16, 1, 512, 3, {70, 45, 300}, 2, 40, 0, 0},
        {"prefill chunks of 2 sequences, 31B sliding", 32, 16, 256, 16, 1, 1024, 2, {150, 77}, 2, 50, 0, 1},
        {"prefill chunks of 2 sequences, global 512", 8, 1, 512, 16, 0, 1 << 30, 2, {100, 60}, 2, 36, 0, 0},
    };
    attn_tc_backends();
    /* every case over each KV type: the CPU's exact attention over the same
     * stored values is the reference, at the float32 cache's tolerance */
    for (int type = G4_KV_F32; type <= G4_KV_FP8; type++) {
        attn_kv_type = (g4_kv_type)type;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention(&cases[i]);
    }
    attn_kv_type = G4_KV_F32;
    attn_tc_destroy(); /* (each holds pinned staging buffers) */
}

/* ---- top_logits (sampling support) ---- */

/* Random logits in [-30, 30]; ties: 1 rounds them to quarters (thousands of
 * equal values, +0 and -0 among them), 2 makes most of the row one value. */
static float *top_logits_input(int rows, int vocab, int ties) {
    float *x = rand_floats((size_t)rows * vocab, 0.001f, 30.0f);
    for (size_t i = 0; i < (size_t)rows * vocab; i++) {
        if (ties == 1) x[i] = roundf(x[i] * 4.0f) / 4.0f; /* small magnitudes round to +0 or -0 */
        if (ties == 2 && rand_int(10)) x[i] = 7.25f;
    }
    return x;
}

/* The CUDA op against the CPU op: ids exactly, values bitwise, lse within
 * 1e-6 relative; a row with a NaN must give lse NaN (the rest is unspecified). */
static void check_top_logits(int rows, int vocab, int k, int ties, int nan_row) {
    float *x = top_logits_input(rows, vocab, ties);
    if (nan_row >= 0) x[(size_t)nan_row * vocab + vocab / 2] = NAN;
    const size_t nk = (size_t)rows * k;
    int32_t *want_ids = malloc(nk * 4), *got_ids = malloc(nk * 4);
    float *want_v = malloc(nk * 4), *got_v = malloc(nk * 4);
    double *want_lse = malloc((size_t)rows * 8), *got_lse = malloc((size_t)rows * 8);
    cpu->ops->top_logits(cpu, want_ids, want_v, want_lse, x, rows, vocab, k);
    float *dx = up(x, (size_t)rows * vocab * 4), *dv = poisoned(nk);
    int32_t *di = (int32_t *)poisoned(nk);
    double *dl = (double *)poisoned((size_t)rows * 2);
    gpu->ops->top_logits(gpu, di, dv, dl, dx, rows, vocab, k);
    gpu->ops->to_host(gpu, got_ids, di, nk * 4);
    gpu->ops->to_host(gpu, got_v, dv, nk * 4);
    gpu->ops->to_host(gpu, got_lse, dl, (size_t)rows * 8);
    double worst = 0;
    int ids_ok = 1, values_ok = 1, lse_ok = 1;
    for (int r = 0; r < rows; r++) {
        if (r == nan_row) {
            lse_ok &= isnan(got_lse[r]);
            continue;
        }
        ids_ok &= !memcmp(got_ids + (size_t)r * k, want_ids + (size_t)r * k, (size_t)k * 4);
        values_ok &= !memcmp(got_v + (size_t)r * k, want_v + (size_t)r * k, (size_t)k * 4);
        double err = fabs(got_lse[r] - want_lse[r]) / fmax(fabs(want_lse[r]), 1.0); /* relative, absolute near 0 */
        if (!(err <= worst)) worst = err; /* NaN counts as worst */
    }
    lse_ok &= worst <= 1e-6;
    char what[128];
    snprintf(what, sizeof what, "%d x %d, k=%d%s%s", rows, vocab, k, ties == 1 ? ", quarters" : ties == 2 ? ", 90% equal" : "",
             nan_row >= 0 ? ", a NaN row" : "");
    printf("  %-12s %-52s ids %s, values %s, lse rel %.2e\n", "top_logits", what, ids_ok ? "equal" : "DIFFER",
           values_ok ? "bitwise" : "DIFFER", worst);
    CHECK(ids_ok, "top_logits %s: ids differ from the CPU", what);
    CHECK(values_ok, "top_logits %s: values differ from the CPU", what);
    CHECK(lse_ok, "top_logits %s: lse off by %.3e relative (or a NaN row without NaN)", what, worst);
    record("top_logits", worst, 1e-6);
    release(dx), release(dv), release(di), release(dl);
    free(x), free(want_ids), free(got_ids), free(want_v), free(got_v), free(want_lse), free(got_lse);
}

static void test_top_logits(void) {
    const int ks[] = {1, 40, 64, 1024};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            check_top_logits(1, 262144, ks[i], t, -1);
            check_top_logits(8, 262144, ks[i], t, -1);
        }
    /* odd sizes: fewer logits than k, chunks that do not divide the row */
    const int vocabs[] = {1, 7, 1000, 4099, 100003};
    for (int v = 0; v < 5; v++)
        for (int i = 0; i < 4; i++) check_top_logits(3, vocabs[v], ks[i], v % 2, -1);
    check_top_logits(8, 262144, 40, 0, 5);
    check_top_logits(8, 262144, 1, 1, 0);
    check_top_logits(2, 1000, 1024, 2, 1);
}

/* ---- mixture of experts ---- */

/* n tokens' top-k of E router logits against the CPU: the same experts in
 * the same order (ties to the lower index), weights within tolerance. Ties
 * (two experts at 9.0 in every third token), -inf and NaN logits (NaN is
 * never chosen ahead of a number) are planted. */
static void check_moe_route(int n, int E, int k) {
    float *logits = rand_floats((size_t)n * E, 0.01f, 4.0f), *scale = rand_floats(E, 0.5f, 2.0f);
    for (int e = 0; e < E; e++) scale[e] = fabsf(scale[e]);
    for (int t = 0; t < n; t += 3) logits[(size_t)t * E + 77 % E] = logits[(size_t)t * E + 12] = 9.0f; /* ties */
    for (int t = 1; t < n; t += 5) {
        logits[(size_t)t * E + 5] = -INFINITY;
        if (k < E) logits[(size_t)t * E + E - 1] = NAN; /* (chosen, it would make every weight NaN) */
    }
    int32_t *want_ids = malloc((size_t)n * k * 4);
    float *want_w = malloc((size_t)n * k * 4);
    cpu->ops->moe_route(cpu, want_ids, want_w, logits, scale, n, E, k);
    float *dl = up(logits, (size_t)n * E * 4), *ds = up(scale, E * 4), *dw = poisoned((size_t)n * k);
    int32_t *di = (int32_t *)poisoned((size_t)n * k);
    gpu->ops->moe_route(gpu, di, dw, dl, ds, n, E, k);
    int32_t *got_ids = malloc((size_t)n * k * 4);
    gpu->ops->to_host(gpu, got_ids, di, (size_t)n * k * 4);
    float *got_w = down(dw, (size_t)n * k);
    char what[64];
    snprintf(what, sizeof what, "%d tokens, top-%d of %d, with ties", n, k, E);
    CHECK(!memcmp(got_ids, want_ids, (size_t)n * k * 4), "moe_route %s: chosen experts differ from the CPU", what);
    compare("moe_route", what, got_w, want_w, (size_t)n * k, TOL_ELEMENTWISE);
    release(dl), release(ds), release(dw), release(di);
    free(logits), free(scale), free(want_ids), free(want_w), free(got_ids), free(got_w);
}

static void test_moe_route(void) {
    check_moe_route(37, 128, 8); /* the 26B-A4B's router */
    check_moe_route(1, 128, 8);
    check_moe_route(9, 200, 32); /* other register counts, the most choices */
    check_moe_route(5, 1000, 3);
    check_moe_route(4, 20, 20); /* every expert */
}

/* Stacked experts: HF (gate_up [E, 2I, d] bf16, down [E, d, I]) or MLX
 * (separate gate, up, down in a quantised format). */
/* Experts' gate, up and down weights on host and device: HF layout (gate
 * and up stacked in one tensor, hf) or MLX (separate tensors). */
typedef struct {
    int hf;
    test_matrix gu, gm, um, dm;
    g4_expert_matrix hg, hu, hd; /* host views */
    g4_expert_matrix dg, du, dd; /* device views */
} moe_weights;

static void moe_weights_make(moe_weights *m, int hf, g4_weight_format f, int bits, int group, int E, int width, int d) {
    memset(m, 0, sizeof *m);
    m->hf = hf;
    m->hg.n_experts = E;
    m->hg.rows_per_expert = width;
    m->hu = m->hg;
    m->hd = m->hg;
    m->hd.rows_per_expert = d;
    m->hd.expert_stride = d;
    make_matrix(&m->dm, f, bits, group, G4_DTYPE_BF16, (int64_t)E * d, width);
    m->hd.all = m->dm.host;
    if (hf) {
        make_matrix(&m->gu, f, bits, group, G4_DTYPE_BF16, (int64_t)E * 2 * width, d);
        m->hg.all = m->hu.all = m->gu.host;
        m->hg.expert_stride = m->hu.expert_stride = 2 * width;
        m->hu.row_offset = width;
    } else {
        make_matrix(&m->gm, f, bits, group, G4_DTYPE_BF16, (int64_t)E * width, d);
        make_matrix(&m->um, f, bits, group, G4_DTYPE_BF16, (int64_t)E * width, d);
        m->hg.all = m->gm.host;
        m->hu.all = m->um.host;
        m->hg.expert_stride = m->hu.expert_stride = width;
    }
    m->dg = m->hg, m->du = m->hu, m->dd = m->hd;
    m->dd.all = m->dm.dev;
    if (hf)
        m->dg.all = m->du.all = m->gu.dev;
    else
        m->dg.all = m->gm.dev, m->du.all = m->um.dev;
}

static void moe_weights_free(moe_weights *m) {
    free_matrix(&m->dm);
    if (m->hf)
        free_matrix(&m->gu);
    else
        free_matrix(&m->gm), free_matrix(&m->um);
}

/* Each of n tokens picks k distinct experts (every fifth token experts
 * 0..k-1, so that some tokens share them). */
static int32_t *moe_random_ids(int n, int k, int E) {
    int32_t *ids = malloc((size_t)n * k * 4);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = t % 5 == 0 ? j : rand_int(E);
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[(size_t)t * k + i] == e;
            } while (dup);
            ids[(size_t)t * k + j] = e;
        }
    return ids;
}

static void check_moe(g4_backend *be, const char *label, int hf, g4_weight_format f, int bits, int group, int E,
                      int width, int d, int k, const int *ns, int count, double grouped_tol) {
    moe_weights m;
    moe_weights_make(&m, hf, f, bits, group, E, width, d);
    for (int c = 0; c < count; c++) {
        const int n = ns[c];
        float *x = rand_floats((size_t)n * d, 0.05f, 2.0f), *w = rand_floats((size_t)n * k, 0.05f, 0.5f);
        int32_t *ids = moe_random_ids(n, k, E);
        float *want = malloc((size_t)n * d * 4);
        cpu->ops->moe_experts(cpu, want, x, n, ids, w, k, &m.hg, &m.hu, &m.hd);
        float *dx = up(x, (size_t)n * d * 4), *dw = up(w, (size_t)n * k * 4), *dout = poisoned((size_t)n * d);
        int32_t *dids = up(ids, (size_t)n * k * 4);
        gpu->ops->synchronize(gpu); /* be may be another backend with its own stream */
        be->ops->moe_experts(be, dout, dx, n, dids, dw, k, &m.dg, &m.du, &m.dd);
        be->ops->synchronize(be);
        float *got = down(dout, (size_t)n * d);
        char what[160];
        snprintf(what, sizeof what, "%s %s E=%d k=%d %dx%d n=%d", label, m.dm.name, E, k, width, d, n);
        compare(n <= 8 ? "moe/gemv" : grouped_tol > TOL_SPLIT ? "moe/grouped-bf16" : "moe/grouped", what, got, want,
                (size_t)n * d, n <= 8 ? TOL_REDUCE : grouped_tol);
        release(dx), release(dw), release(dout), release(dids);
        free(x), free(w), free(ids), free(want), free(got);
    }
    moe_weights_free(&m);
}

/* one MoE shape of check_moe: label, layout (HF or MLX), format, experts,
 * width, hidden size and choices per token */
typedef struct {
    const char *label;
    int hf;
    g4_weight_format f;
    int bits, group, E, width, d, k;
} moe_case;

/* the cases at 40 and 150 tokens (grouped prefill sizes) on a backend
 * created with var=value */
static void check_moe_knob(const char *tune, const moe_case *cases, int count) {
    g4_backend *be = knob_backend(tune);
    if (!be) return;
    const int prefill_ns[] = {40, 150};
    gpu->ops->synchronize(gpu);
    for (int i = 0; i < count; i++) {
        const moe_case *m = &cases[i];
        check_moe(be, m->label, m->hf, m->f, m->bits, m->group, m->E, m->width, m->d, m->k, prefill_ns, 2, TOL_SPLIT);
    }
    CHECK(g4_cuda_status(be) == G4_OK, "no CUDA failure recorded with %s: %s", tune, g4_error_message());
    g4_backend_destroy(be);
}

static void test_moe_experts(void) {
    const int ns[] = {1, 5, 8, 40, 150};
    /* 26B-A4B expert widths (704 x 2816) with 32 of the 128 experts to keep the CPU reference quick */
    check_moe(gpu, "HF", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8, ns, 5, TOL_SPLIT);
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8, ns, 5, TOL_SPLIT);
    check_moe(gpu, "MLX", 0, G4_WEIGHT_MXFP4, 4, 32, 32, 704, 2816, 8, ns, 5, TOL_SPLIT);
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 8, 64, 16, 128, 256, 4, ns, 5, TOL_SPLIT);
    /* the 4-bit down projection with the tokens' sums in one kernel (decode
     * sizes; MXFP4 and groups of 64 above): groups of 128, three choices
     * (fewer than its eight warps), and ten choices (more: the GEMV per
     * slot, then the sums) */
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 128, 16, 768, 1024, 3, ns, 3, TOL_SPLIT);
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 64, 16, 256, 512, 10, ns, 3, TOL_SPLIT);
    /* the same on the fp16 kernel's run: groups of 32, and groups of 64 with the integer kernel off */
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 32, 16, 256, 512, 5, ns, 3, TOL_SPLIT);
    g4_backend *fp16 = knob_backend("gemv=fp16");
    if (fp16) {
        check_moe(fp16, "MLX gemv=fp16", 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8, ns, 3, TOL_SPLIT);
        check_moe(fp16, "MLX gemv=fp16", 0, G4_WEIGHT_AFFINE, 4, 128, 16, 768, 1024, 3, ns, 3, TOL_SPLIT);
        g4_backend_destroy(fp16);
    }
    /* the grouped prefill kernel's affine paths at every group size (one, two
     * and four k tiles a group) and both bit widths, with tiles of at most
     * and of more than 32 slots (its two warp layouts) */
    {
        const int grouped_ns[] = {40, 150};
        check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 128, 16, 768, 1024, 3, grouped_ns, 2, TOL_SPLIT);
        check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 4, 32, 16, 256, 512, 5, grouped_ns, 2, TOL_SPLIT);
        check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 8, 32, 8, 256, 512, 6, grouped_ns, 2, TOL_SPLIT);
        check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 8, 128, 8, 256, 512, 6, grouped_ns, 2, TOL_SPLIT);
    }
    /* 8 bits at 26B-A4B widths and groups of 32 (tensor-core GEMV per slot, decode sizes) */
    check_moe(gpu, "MLX", 0, G4_WEIGHT_AFFINE, 8, 32, 32, 704, 2816, 8, ns, 3, TOL_SPLIT);
    /* gate and up rows of one quantised tensor: gated pairs per slot */
    check_moe(gpu, "stacked", 1, G4_WEIGHT_AFFINE, 8, 64, 16, 128, 256, 4, ns, 3, TOL_SPLIT);
    check_moe(gpu, "stacked", 1, G4_WEIGHT_AFFINE, 4, 64, 16, 128, 256, 4, ns, 3, TOL_SPLIT);
    /* float experts' down projection with the tokens' sums (decode sizes: gemv_moe_down_kernel) in f16 and
     * f32, three and eight choices, rows not a multiple of its four */
    check_moe(gpu, "HF f16", 1, G4_WEIGHT_F16, 0, 0, 8, 64, 90, 3, ns, 3, TOL_SPLIT);
    check_moe(gpu, "HF f32", 1, G4_WEIGHT_F32, 0, 0, 12, 96, 130, 8, ns, 3, TOL_SPLIT);
    /* fixture-like odd widths: the generic per-slot path at every size */
    check_moe(gpu, "HF odd", 1, G4_WEIGHT_BF16, 0, 0, 8, 24, 72, 2, ns, 5, TOL_SPLIT);
    /* bf16 experts' prefill through cuBLAS's batched GEMM (cuda_moe_cublas.cu;
     * by default from 64 tokens on, so the 150-token cases above took it):
     * here from one token on, so at 40 too, with gate and up in one stacked
     * tensor (HF) and apart (MLX layout); moe_random_ids sends every fifth
     * token to experts 0..k-1, so the experts fall in several buckets. And
     * the grouped kernel with cuBLAS off. (The plain-bf16 mode's case is in
     * test_fast_prefill.) */
    const moe_case blas[] = {{"HF cuBLAS", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8},
                             {"HF cuBLAS", 1, G4_WEIGHT_BF16, 0, 0, 16, 128, 256, 3},
                             {"MLX-layout cuBLAS", 0, G4_WEIGHT_BF16, 0, 0, 16, 128, 256, 3}};
    check_moe_knob("moe_cublas=1", blas, 3);
    const moe_case own[] = {{"HF moe_cublas=0", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8}};
    check_moe_knob("moe_cublas=0", own, 1);
    /* the experts' prefill through the general grouped kernel too (the
     * default is the pipelined one) */
    const moe_case unpiped[] = {{"HF unpipelined", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8},
                                {"MLX unpipelined", 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8},
                                {"MLX unpipelined", 0, G4_WEIGHT_MXFP4, 4, 32, 32, 704, 2816, 8}};
    check_moe_knob("moe=mma", unpiped, 3);
}

/* moe_route_experts (the routing riding on the experts' first pre-pass for
 * a few tokens): the same ids, weights and output bits as moe_route then
 * moe_experts on the GPU, and the CPU's within rounding */
static void check_route_experts(const char *label, int hf, g4_weight_format f, int bits, int group, int E, int width,
                                int d, int k, const int *ns, int count) {
    moe_weights m;
    moe_weights_make(&m, hf, f, bits, group, E, width, d);
    for (int c = 0; c < count; c++) {
        const int n = ns[c];
        float *x = rand_floats((size_t)n * d, 0.05f, 2.0f), *logits = rand_floats((size_t)n * E, -3.0f, 3.0f);
        float *scale = rand_floats((size_t)E, 0.5f, 1.5f);
        int32_t *want_ids = malloc((size_t)n * k * 4);
        float *want_w = malloc((size_t)n * k * 4), *want = malloc((size_t)n * d * 4);
        cpu->ops->moe_route(cpu, want_ids, want_w, logits, scale, n, E, k);
        cpu->ops->moe_experts(cpu, want, x, n, want_ids, want_w, k, &m.hg, &m.hu, &m.hd);
        float *dx = up(x, (size_t)n * d * 4), *dlogits = up(logits, (size_t)n * E * 4);
        float *dscale = up(scale, (size_t)E * 4);
        int32_t *got_ids[2];
        float *got_w[2], *got[2];
        for (int v = 0; v < 2; v++) { /* v 0: one call, 1: the two */
            int32_t *dids = (int32_t *)poisoned((size_t)n * k);
            float *dw = poisoned((size_t)n * k), *dout = poisoned((size_t)n * d);
            if (v == 0)
                gpu->ops->moe_route_experts(gpu, dout, dx, n, dids, dw, dlogits, dscale, E, k, &m.dg, &m.du, &m.dd);
            else {
                gpu->ops->moe_route(gpu, dids, dw, dlogits, dscale, n, E, k);
                gpu->ops->moe_experts(gpu, dout, dx, n, dids, dw, k, &m.dg, &m.du, &m.dd);
            }
            got_ids[v] = (int32_t *)down(dids, (size_t)n * k), got_w[v] = down(dw, (size_t)n * k);
            got[v] = down(dout, (size_t)n * d);
            release(dids), release(dw), release(dout);
        }
        char what[160];
        snprintf(what, sizeof what, "%s %s E=%d k=%d %dx%d n=%d", label, m.dm.name, E, k, width, d, n);
        CHECK(memcmp(got_ids[0], want_ids, (size_t)n * k * 4) == 0, "moe_route_experts %s: the CPU's choices", what);
        compare("moe_route_experts weights", what, got_w[0], want_w, (size_t)n * k, TOL_ELEMENTWISE);
        compare("moe_route_experts", what, got[0], want, (size_t)n * d, n <= 8 ? TOL_REDUCE : TOL_SPLIT);
        CHECK(memcmp(got_ids[0], got_ids[1], (size_t)n * k * 4) == 0 &&
                  memcmp(got_w[0], got_w[1], (size_t)n * k * 4) == 0 &&
                  memcmp(got[0], got[1], (size_t)n * d * 4) == 0,
              "moe_route_experts %s: the same bits as moe_route then moe_experts", what);
        release(dx), release(dlogits), release(dscale);
        for (int v = 0; v < 2; v++) free(got_ids[v]), free(got_w[v]), free(got[v]);
        free(x), free(logits), free(scale), free(want_ids), free(want_w), free(want);
    }
    moe_weights_free(&m);
}

static void test_moe_route_experts(void) {
    const int ns[] = {1, 3, 8, 40}, one[] = {1};
    /* 26B-A4B's routing (top-8 of 128) and expert widths */
    check_route_experts("MLX", 0, G4_WEIGHT_AFFINE, 4, 64, 128, 704, 2816, 8, ns, 4); /* integer pre-pass */
    check_route_experts("MLX", 0, G4_WEIGHT_MXFP4, 4, 32, 128, 704, 2816, 8, ns, 4);  /* fp16 pre-pass */
    check_route_experts("HF", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8, ns, 4);      /* no pre-pass: a launch */
    check_route_experts("MLX", 0, G4_WEIGHT_AFFINE, 8, 64, 16, 128, 256, 4, ns, 4);   /* 8 bits, small */
    check_route_experts("MLX", 0, G4_WEIGHT_AFFINE, 4, 64, 200, 64, 256, 2, one, 1);  /* more experts than ride */
}

/* The tensor-core GEMV (cuda_gemv_tc.cu): 1..8 tokens of 4-bit and 8-bit
 * affine (every group size and scale type) and MXFP4, at real shapes, odd
 * shapes (rows not a multiple of 16, columns not of 128) and wide rows
 * (columns split over several blocks); the gelu_mul epilogue, gated pairs
 * and MoE slots are in test_matmul_gelu_mul, test_matmul_gated and
 * test_moe_experts. */
/* the formats of test_gemv_tc's table checked at 21504 x 5376 too (the CPU
 * reference is slow) */
static int big_format(size_t k) { return k == 0 || k == 3 || k == 8 || k == 9 || k == 10 || k == 13 || k == 18; }

static void test_gemv_tc(void) {
    const int tokens[] = {1, 2, 3, 5, 8};
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {
        {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_BF16},  {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16},
        {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F32},   {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_F16},   {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_F32},
        {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_BF16}, {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F16},
        {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F32},  {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8},
        {G4_WEIGHT_AFFINE, 8, 32, G4_DTYPE_BF16},  {G4_WEIGHT_AFFINE, 8, 32, G4_DTYPE_F16},
        {G4_WEIGHT_AFFINE, 8, 32, G4_DTYPE_F32},   {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
        {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_F16},   {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_F32},
        {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_BF16}, {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F16},
        {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F32},
    };
    const size_t n_formats = sizeof formats / sizeof formats[0];
    /* E2B q_proj, and odd shapes: 77 and 333 rows, 96 / 160 / 192 / 384 columns */
    const int64_t shapes[][2] = {{2048, 1536}, {77, 96}, {333, 160}, {45, 192}, {19, 384}};
    for (size_t k = 0; k < n_formats; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (shapes[s][1] % formats[k].group != 0) continue; /* not a valid matrix */
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, shapes[s][0], shapes[s][1]);
            check_matmul(&t, tokens, 5);
            free_matrix(&t);
        }
    /* one token of 8 bits runs the integer kernel here (groups of 32 and 64;
     * 128: the float32 GEMV; by default only from 2^25 weights, here from 0,
     * see main); on the float32 GEMV (gemv=float32) it must be right too */
    g4_backend *f32_8 = knob_backend("gemv=float32");
    for (size_t k = 0; k < n_formats; k++)
        for (size_t s = 0; formats[k].bits == 8 && s < sizeof shapes / sizeof shapes[0]; s++) {
            if (shapes[s][1] % formats[k].group != 0) continue;
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, shapes[s][0], shapes[s][1]);
            if (f32_8) check_matmul_on(f32_8, "i8 off ", &t.host, &t.dev, t.name, 1, TOL_SPLIT);
            free_matrix(&t);
        }
    if (f32_8) g4_backend_destroy(f32_8);
    /* a 31B MLP-sized matrix and wide rows (72 x 21504: columns in parts) */
    const int64_t big[][2] = {{21504, 5376}, {72, 21504}};
    for (size_t k = 0; k < n_formats; k++)
        for (size_t s = 0; s < 2; s++) {
            /* the large shape for a few formats only: the CPU reference is slow */
            if (s == 0 && !big_format(k)) continue;
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, big[s][0], big[s][1]);
            check_matmul(&t, tokens, 5);
            free_matrix(&t);
        }
    /* the one-token fp16 4-bit kernel (pipelined) on every 4-bit format and
     * shape above with the integer kernel off (gemv=fp16: affine groups of
     * 64 and 128 run it by default), also on gated pairs and MoE slots */
    const char *stages[] = {"gemv=fp16"};
    for (int v = 0; v < 1; v++) {
        g4_backend *pipe = knob_backend(stages[v]);
        if (!pipe) continue;
        char tag[32];
        snprintf(tag, sizeof tag, "tc-pipe %s ", stages[v]);
        for (size_t k = 0; k < n_formats; k++) {
            if (formats[k].bits != 4) continue;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                if (shapes[s][1] % formats[k].group != 0) continue;
                test_matrix t;
                make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, shapes[s][0],
                            shapes[s][1]);
                check_matmul_on(pipe, tag, &t.host, &t.dev, t.name, 1, TOL_SPLIT);
                free_matrix(&t);
            }
            for (size_t s = 0; s < 2; s++) {
                if (s == 0 && (v > 0 || !big_format(k))) continue;
                test_matrix t;
                make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, big[s][0], big[s][1]);
                check_matmul_on(pipe, tag, &t.host, &t.dev, t.name, 1, TOL_SPLIT);
                free_matrix(&t);
            }
        }
        if (v == 0) {
            /* gated pairs (test_matmul_gated's 4-bit cases) and one token per MoE slot (test_moe_experts') */
            const struct {
                g4_weight_format f;
                int group;
                g4_dtype sdt;
                int64_t rows, cols;
            } gated[] = {{G4_WEIGHT_AFFINE, 64, G4_DTYPE_BF16, 2 * 2112, 2816}, {G4_WEIGHT_MXFP4, 32, G4_DTYPE_U8, 2 * 300, 2816},
                         {G4_WEIGHT_AFFINE, 32, G4_DTYPE_F16, 2 * 77, 96},     {G4_WEIGHT_AFFINE, 128, G4_DTYPE_F32, 2 * 40, 21504},
                         {G4_WEIGHT_MXFP4, 32, G4_DTYPE_U8, 2 * 19, 160}};
            for (size_t k = 0; k < sizeof gated / sizeof gated[0]; k++) {
                test_matrix t;
                make_matrix(&t, gated[k].f, 4, gated[k].group, gated[k].sdt, gated[k].rows, gated[k].cols);
                check_gated_on(pipe, tag, &t, 1);
                free_matrix(&t);
            }
            const int moe_ns[] = {1, 5};
            char mlx[48], stacked[48];
            snprintf(mlx, sizeof mlx, "MLX %s", tag);
            snprintf(stacked, sizeof stacked, "stacked %s", tag);
            check_moe(pipe, mlx, 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8, moe_ns, 2, TOL_SPLIT);
            check_moe(pipe, mlx, 0, G4_WEIGHT_MXFP4, 4, 32, 32, 704, 2816, 8, moe_ns, 2, TOL_SPLIT);
            check_moe(pipe, stacked, 1, G4_WEIGHT_AFFINE, 4, 64, 16, 128, 256, 4, moe_ns, 2, TOL_SPLIT);
        }
        g4_backend_destroy(pipe);
    }
    /* the integer GEMV's prepared activations in one copy and in three
     * (gemv_copies, default 4: tile t reads copy t % copies), on
     * every quantised format and shape above (the fp16 kernels keep one
     * copy), one and three tokens, a gated pair and MoE slots */
    const char *copies[] = {"1", "3"};
    for (int v = 0; v < 2; v++) {
        char spec[32];
        snprintf(spec, sizeof spec, "gemv_copies=%s", copies[v]);
        g4_backend *cb = knob_backend(spec);
        if (!cb) continue;
        char tag[32];
        snprintf(tag, sizeof tag, "copies %s ", copies[v]);
        for (size_t k = 0; k < n_formats; k++) {
            if (formats[k].f != G4_WEIGHT_AFFINE && formats[k].f != G4_WEIGHT_MXFP4) continue;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                if (shapes[s][1] % formats[k].group != 0) continue;
                test_matrix t;
                make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, shapes[s][0],
                            shapes[s][1]);
                check_matmul_on(cb, tag, &t.host, &t.dev, t.name, 1, TOL_SPLIT);
                check_matmul_on(cb, tag, &t.host, &t.dev, t.name, 3, TOL_SPLIT);
                free_matrix(&t);
            }
        }
        test_matrix t;
        make_matrix(&t, G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, 2 * 2112, 2816);
        check_gated_on(cb, tag, &t, 1);
        free_matrix(&t);
        const int moe_ns[] = {1, 5};
        check_moe(cb, tag, 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8, moe_ns, 2, TOL_SPLIT);
        check_moe(cb, tag, 0, G4_WEIGHT_MXFP4, 4, 32, 32, 704, 2816, 8, moe_ns, 2, TOL_SPLIT);
        g4_backend_destroy(cb);
    }
}

/* G4_PRECISION_FAST: one bf16 product per prefill tile. */
static void test_fast_prefill(void) {
    g4_backend *fast = NULL;
    const g4_status st = g4_backend_cuda_create(0, &fast);
    CHECK(st == G4_OK, "CUDA backend: %s", g4_error_message());
    if (st != G4_OK) return;
    fast->ops->set_precision(fast, G4_PRECISION_FAST);
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } q[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}, {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    for (size_t k = 0; k < sizeof q / sizeof q[0]; k++) {
        test_matrix t;
        make_matrix(&t, q[k].f, q[k].bits, q[k].group, q[k].sdt, 2048, 1536);
        check_matmul_on(fast, "bf16-mode ", &t.host, &t.dev, t.name, 64, TOL_BF16);
        check_matmul_on(fast, "bf16-mode ", &t.host, &t.dev, t.name, 200, TOL_BF16);
        free_matrix(&t);
    }
    const int ns[] = {40, 150};
    check_moe(fast, "bf16-mode HF", 1, G4_WEIGHT_BF16, 0, 0, 32, 704, 2816, 8, ns, 2, TOL_BF16);
    check_moe(fast, "bf16-mode MLX", 0, G4_WEIGHT_AFFINE, 4, 64, 32, 704, 2816, 8, ns, 2, TOL_BF16);
    CHECK(g4_cuda_status(fast) == G4_OK, "bf16-mode backend status: %s", g4_error_message());
    g4_backend_destroy(fast);
}

/* ---- speed (printed, never failing: the bench command owns the limits) ---- */

static double time_op(g4_backend *be, void (*op)(void *), void *arg, int reps) {
    op(arg); /* warm-up */
    be->ops->synchronize(be);
    double t0 = g4_now_seconds();
    for (int i = 0; i < reps; i++) op(arg);
    be->ops->synchronize(be);
    return (g4_now_seconds() - t0) / reps;
}

typedef struct {
    g4_backend *be;
    const g4_matrix *w;
    float *x, *out;
    int n;
} matmul_arg;

static void run_matmul(void *p) {
    matmul_arg *a = p;
    a->be->ops->matmul(a->be, a->out, a->x, a->n, a->w);
}

typedef struct {
    g4_backend *be;
    float *out, *q;
    void *kv;
    g4_attn_batch b;
    int heads;
} attn_arg;

static void run_attention(void *p) {
    attn_arg *a = p;
    a->be->ops->attention(a->be, a->out, a->q, a->kv, &a->b, 0, a->heads, 1.0f);
}

/* One-token GEMV over the matrices of an E2B and a 31B decode step with the
 * column split forced off and on (gemv_split), each also checked
 * against the CPU: which one the shape heuristic should pick. */
static void gemv_split_speed(double bw) {
    g4_backend *variant[2] = {knob_backend("gemv_split=0"), knob_backend("gemv_split=1")};
    /* E2B's, then the 31B's q|k|v, gate|up, o and down */
    const int64_t shapes[][2] = {{2048, 1536}, {256, 1536}, {1536, 2048}, {6144, 1536}, {12288, 1536}, {1536, 6144},
                                 {1536, 256}, {262144, 1536}, {16384, 5376}, {43008, 5376}, {5376, 8192},
                                 {5376, 21504}};
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}};
    printf("  one-token GEMV, columns split over the block: off / on / as picked\n");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
            float *x = rand_floats((size_t)cols, 0.05f, 2.0f);
            float *dx = up(x, (size_t)cols * 4), *dout = poisoned((size_t)rows);
            const double bytes = (double)g4_matrix_bytes(&t.host);
            double us[3] = {0, 0, 0};
            g4_backend *bes[3] = {variant[0], variant[1], gpu};
            for (int v = 0; v < 3; v++) {
                if (!bes[v]) continue;
                matmul_arg a = {bes[v], &t.dev, dx, dout, 1};
                us[v] = time_op(bes[v], run_matmul, &a, 50) * 1e6;
                if (v < 2) check_matmul_on(bes[v], v ? "split " : "nosplit ", &t.host, &t.dev, t.name, 1, TOL_SPLIT);
            }
            printf("  gemv %-18s %6lldx%-5lld %6.1f / %6.1f / %6.1f us  (%4.0f / %4.0f GB/s, %.0f%% of copy as picked)\n",
                   t.name, (long long)rows, (long long)cols, us[0], us[1], us[2], bytes / us[0] / 1e3,
                   bytes / us[1] / 1e3, 100 * bytes / us[2] / 1e3 / bw);
            release(dx), release(dout);
            free(x);
            free_matrix(&t);
        }
    for (int v = 0; v < 2; v++)
        if (variant[v]) g4_backend_destroy(variant[v]);
}

typedef struct {
    float *x;
    int32_t *ids;
    float *values;
    double *lse;
    int rows, vocab, k;
} top_arg;

static void run_top_logits(void *p) {
    top_arg *a = p;
    gpu->ops->top_logits(gpu, a->ids, a->values, a->lse, a->x, a->rows, a->vocab, a->k);
}

/* One token's decode attention over `len` keys of a table of `capacity`
 * positions. */
static void attention_decode_speed(int Hq, int Hkv, int D, int len, int capacity) {
    const int bs = 16, blocks = capacity / bs;
    void *kv = gpu->ops->kv_alloc(gpu, blocks, bs, Hkv, D, G4_KV_F32);
    int32_t *table = malloc((size_t)blocks * 4), pos = len - 1, seq = 0, range[4] = {0, len - 1, 0, len - 1};
    for (int i = 0; i < blocks; i++) table[i] = i;
    attn_arg a;
    a.be = gpu;
    a.kv = kv;
    a.heads = Hq;
    a.q = poisoned((size_t)Hq * D);
    a.out = poisoned((size_t)Hq * D);
    float *qh = rand_floats((size_t)Hq * D, 0.01f, 1.0f);
    gpu->ops->to_device(gpu, a.q, qh, (size_t)Hq * D * 4);
    a.b = (g4_attn_batch){.n_tokens = 1, .pos = up(&pos, 4), .seq = up(&seq, 4), .kv_range = up(range, 16),
                          .full_tables = up(table, (size_t)blocks * 4), .full_table_stride = blocks,
                          .sliding_tables = up(table, 4), .ring_blocks = 1, .block_size = bs};
    /* random keys and values (never time on zeros) */
    int32_t *all_pos = malloc((size_t)len * 4), *all_seq = calloc((size_t)len, 4);
    for (int i = 0; i < len; i++) all_pos[i] = i;
    float *k = rand_floats((size_t)len * Hkv * D, 0.01f, 1.0f), *v = rand_floats((size_t)len * Hkv * D, 0.01f, 1.0f);
    g4_attn_batch fill = a.b;
    fill.n_tokens = len;
    fill.pos = up(all_pos, (size_t)len * 4);
    fill.seq = up(all_seq, (size_t)len * 4);
    float *dk = up(k, (size_t)len * Hkv * D * 4), *dv = up(v, (size_t)len * Hkv * D * 4);
    gpu->ops->kv_store(gpu, kv, dk, dv, &fill, 0);
    release(dk), release(dv), release((void *)fill.pos), release((void *)fill.seq);
    free(k), free(v), free(all_pos), free(all_seq);
    const double bytes = 2.0 * len * Hkv * D * 4;
    /* the default, then the other decode settings (the KV pool is this
     * backend's memory: same device, the other backends read it) */
    attn_tc_backends();
    for (int v = -1; v < ATTN_DECODE_VARIANTS; v++) {
        g4_backend *be = v < 0 ? gpu : attn_decode_be[v];
        if (!be) continue;
        gpu->ops->synchronize(gpu);
        a.be = be;
        const double s = time_op(be, run_attention, &a, 50);
        printf("  attention decode %d/%d heads x %d, %d keys (table of %d): %7.1f us (%.0f GB/s of float32 K/V)%s%s\n",
               Hq, Hkv, D, len, capacity, s * 1e6, bytes / s / 1e9, v < 0 ? "" : ", ", v < 0 ? "" : attn_decode_name[v]);
    }
    gpu->ops->kv_free(gpu, kv);
    release(a.q), release(a.out), release((void *)a.b.pos), release((void *)a.b.seq), release((void *)a.b.kv_range),
        release((void *)a.b.full_tables), release((void *)a.b.sliding_tables);
    free(table), free(qh);
}

/* Prefill attention of `n` tokens of one sequence from position 0 (causal,
 * keys limited to `window`), the CUDA-core kernel against the tensor-core
 * one (attn=auto), each checked against the CPU. */
static void attention_prefill_speed(int Hq, int Hkv, int D, int window, int n) {
    attn_tc_backends();
    const int bs = 16, blocks = (n + bs - 1) / bs;
    void *kv = gpu->ops->kv_alloc(gpu, blocks, bs, Hkv, D, G4_KV_F32), *kc = cpu->ops->kv_alloc(cpu, blocks, bs, Hkv, D, G4_KV_F32);
    int32_t *table = malloc((size_t)blocks * 4), *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    int32_t *range = malloc((size_t)n * 16);
    double pairs = 0;
    for (int i = 0; i < blocks; i++) table[i] = i;
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        range[4 * t] = range[4 * t + 2] = t - window + 1 < 0 ? 0 : t - window + 1;
        range[4 * t + 1] = range[4 * t + 3] = t;
        pairs += t - range[4 * t + 2] + 1;
    }
    g4_attn_batch hb = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = range, .full_tables = table,
                        .full_table_stride = blocks, .sliding_tables = table, .ring_blocks = 1, .block_size = bs};
    const size_t nq = (size_t)n * Hq * D, nkv = (size_t)n * Hkv * D;
    float *q = rand_floats(nq, 0.01f, 1.0f), *k = rand_floats(nkv, 0.01f, 1.0f), *v = rand_floats(nkv, 0.01f, 1.0f);
    float *want = malloc(nq * 4);
    attn_arg a;
    a.kv = kv;
    a.heads = Hq;
    a.q = up(q, nq * 4);
    a.out = poisoned(nq);
    a.b = (g4_attn_batch){.n_tokens = n, .pos = up(pos, (size_t)n * 4), .seq = up(seq, (size_t)n * 4),
                          .kv_range = up(range, (size_t)n * 16), .full_tables = up(table, (size_t)blocks * 4),
                          .full_table_stride = blocks, .sliding_tables = up(table, 4), .ring_blocks = 1,
                          .block_size = bs};
    float *dk = up(k, nkv * 4), *dv = up(v, nkv * 4);
    gpu->ops->kv_store(gpu, kv, dk, dv, &a.b, 0);
    cpu->ops->kv_store(cpu, kc, k, v, &hb, 0);
    cpu->ops->attention(cpu, want, q, kc, &hb, 0, Hq, 1.0f);
    /* each variant of attn_tc_backends (32 or 64 rows per block are the
     * same kernel at head_dim 512), the CUDA-core kernel last */
    for (int variant = 0; variant < ATTN_TC_VARIANTS; variant++) {
        g4_backend *be = attn_tc_be[variant];
        if (!be || (D > 256 && !strcmp(attn_tc_knob[variant][0], "tc"))) continue;
        a.be = be;
        const double s = time_op(be, run_attention, &a, 10);
        char knob[80];
        snprintf(knob, sizeof knob, ", %s", attn_tc_name[variant]);
        printf("  attention prefill %d/%d heads x %d, %d tokens, window %d: %8.1f us (%.1f TFLOP/s)%s\n", Hq, Hkv, D, n,
               window, s * 1e6, 4.0 * pairs * Hq * D / s / 1e12, knob);
        float *got = down(a.out, nq);
        char what[160];
        snprintf(what, sizeof what, "speed case %d/%d x %d, %d tokens%s", Hq, Hkv, D, n, knob);
        compare(variant + 1 < ATTN_TC_VARIANTS ? "attention_tc" : "attention", what, got, want, nq, TOL_REDUCE);
        free(got);
    }
    gpu->ops->kv_free(gpu, kv);
    cpu->ops->kv_free(cpu, kc);
    release(dk), release(dv), release(a.q), release(a.out), release((void *)a.b.pos), release((void *)a.b.seq),
        release((void *)a.b.kv_range), release((void *)a.b.full_tables), release((void *)a.b.sliding_tables);
    free(table), free(pos), free(seq), free(range), free(q), free(k), free(v), free(want);
}

/* Decode attention: the 31B-like long context, E2B's layers at a bench's
 * context, a short context in a long session (the server's default 4096
 * positions and more). Prefill attention at 512 tokens: 31B sliding and
 * global layers, E2B's; then a longer prompt, whose keys reach the 31B's
 * window. */
static void attention_speeds(void) {
    attention_decode_speed(32, 8, 256, 4096, 4096);
    attention_decode_speed(8, 1, 256, 144, 160);
    attention_decode_speed(16, 8, 256, 144, 160);
    attention_decode_speed(8, 1, 256, 600, 2048);
    attention_decode_speed(8, 1, 512, 600, 2048);
    attention_decode_speed(8, 1, 512, 1000, 32768);
    attention_decode_speed(32, 4, 512, 4000, 32768);
    attention_prefill_speed(32, 16, 256, 1024, 512);
    attention_prefill_speed(32, 4, 512, 1 << 30, 512);
    attention_prefill_speed(8, 1, 256, 512, 512);
    attention_prefill_speed(8, 1, 512, 1 << 30, 512);
    attention_prefill_speed(32, 16, 256, 1024, 2048);
}

typedef struct {
    g4_backend *be;
    const moe_weights *m;
    float *x, *w, *out;
    int32_t *ids;
    int n, k;
} moe_arg;

static void run_moe(void *p) {
    moe_arg *a = p;
    a->be->ops->moe_experts(a->be, a->out, a->x, a->n, a->ids, a->w, a->k, &a->m->dg, &a->m->du, &a->m->dd);
}

/* The 26B-A4B's routed experts (128 of 704 x 2816, 8 per token) for decode
 * batches: time per call and the chosen experts' bytes over it (issue 8
 * quotes vLLM's fused MoE at about 10% of bandwidth at batch 1). */
static void moe_speed(double bw) {
    struct {
        g4_weight_format f;
        int bits, group;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64}, {G4_WEIGHT_AFFINE, 8, 64}, {G4_WEIGHT_MXFP4, 4, 32}};
    const int E = 128, width = 704, d = 2816, k = 8;
    /* the experts' prefill through the general grouped kernel and, for bf16
     * experts, our pipelined kernel (cuBLAS off), for comparison */
    g4_backend *unpiped = knob_backend("moe=mma"), *own = knob_backend("moe_cublas=0");
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        moe_weights m;
        const int hf = formats[f].f == G4_WEIGHT_BF16;
        moe_weights_make(&m, hf, formats[f].f, formats[f].bits, formats[f].group, E, width, d);
        const double expert_bytes = ((double)g4_matrix_bytes(hf ? &m.gu.host : &m.gm.host) * (hf ? 1 : 2) +
                                     (double)g4_matrix_bytes(&m.dm.host)) / E;
        const int ns[] = {1, 8, 512};
        for (int i = 0; i < 3; i++) {
            const int n = ns[i];
            float *x = rand_floats((size_t)n * d, 0.05f, 2.0f), *w = rand_floats((size_t)n * k, 0.05f, 0.5f);
            int32_t *ids = moe_random_ids(n, k, E);
            int used[128] = {0}, distinct = 0; /* experts read at least once */
            for (int j = 0; j < n * k; j++) distinct += !used[ids[j]]++;
            moe_arg a = {gpu, &m, up(x, (size_t)n * d * 4), up(w, (size_t)n * k * 4), poisoned((size_t)n * d),
                         up(ids, (size_t)n * k * 4), n, k};
            const double s = time_op(gpu, run_moe, &a, 30);
            const double bytes = distinct * expert_bytes;
            const double flops = 2.0 * 3.0 * n * k * (double)width * d;
            printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s of %d experts' weights (%.0f%% of copy)"
                   ", %.1f TFLOP/s\n",
                   m.dm.name, E, k, width, d, n, s * 1e6, bytes / s / 1e9, distinct, 100 * bytes / s / 1e9 / bw,
                   flops / s / 1e12);
            if (n == 512 && hf && own) {
                gpu->ops->synchronize(gpu);
                a.be = own;
                const double s1 = time_op(own, run_moe, &a, 10);
                printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s, %.1f TFLOP/s, moe_cublas=0\n",
                       m.dm.name, E, k, width, d, n, s1 * 1e6, bytes / s1 / 1e9, flops / s1 / 1e12);
                a.be = gpu;
            }
            if (n == 512 && unpiped) {
                gpu->ops->synchronize(gpu);
                a.be = unpiped;
                const double s0 = time_op(unpiped, run_moe, &a, 10);
                printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s, %.1f TFLOP/s, moe=mma\n",
                       m.dm.name, E, k, width, d, n, s0 * 1e6, bytes / s0 / 1e9, flops / s0 / 1e12);
            }
            release(a.x), release(a.w), release(a.out), release(a.ids);
            free(x), free(w), free(ids);
        }
        moe_weights_free(&m);
    }
    if (unpiped) g4_backend_destroy(unpiped);
    if (own) g4_backend_destroy(own);
}

/* The one-token 4-bit tensor-core GEMVs at the 31B's q|k|v, gate, o, down
 * and gate|up-sized shapes and E2B's q|k|v, o, gate|up and down: the default
 * (integer mma for affine groups of 64 and 128; MXFP4 the fp16 kernel), the
 * default with one copy of the prepared activations, and the fp16 kernels (gemv=fp16: pipelined over 5 stages). */
static void gemv_pipe_speed(double bw) {
    const char *const knobs[] = {"gemv_copies=1", "gemv=fp16"};
    enum { N_KNOBS = sizeof knobs / sizeof knobs[0] };
    g4_backend *bes[1 + N_KNOBS] = {gpu};
    for (int v = 0; v < N_KNOBS; v++) bes[1 + v] = knob_backend(knobs[v]);
    const int64_t shapes[][2] = {{16384, 5376}, {21504, 5376}, {5376, 8192}, {5376, 21504}, {43008, 5376},
                                 {2560, 1536},  {1536, 2048},  {12288, 1536}, {1536, 6144}};
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}, {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8},
                   {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16}};
    printf("  one-token 4- and 8-bit GEMV: default / gemv_copies=1 (one copy of the prepared activations) / "
           "gemv=fp16 (4 bits: fp16, pipelined; 8 bits: float32)\n");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
            float *x = rand_floats((size_t)cols, 0.05f, 2.0f);
            float *dx = up(x, (size_t)cols * 4), *dout = poisoned((size_t)rows);
            const double bytes = (double)g4_matrix_bytes(&t.host);
            printf("  gemv %-18s %lldx%lld n=1 ", t.name, (long long)rows, (long long)cols);
            for (int v = 0; v < 1 + N_KNOBS; v++) {
                /* (MXFP4 runs the fp16 kernels whatever gemv says) */
                if (!bes[v]) continue;
                matmul_arg a = {bes[v], &t.dev, dx, dout, 1};
                const double us = time_op(bes[v], run_matmul, &a, 50) * 1e6;
                printf(" %s%.1f us (%.0f%%)", v ? " / " : "", us, 100 * bytes / (us * 1e-6) / 1e9 / bw);
            }
            printf("\n");
            for (int v = 1; v < 1 + N_KNOBS; v++)
                if (bes[v]) check_matmul_on(bes[v], "gemv4 speed ", &t.host, &t.dev, t.name, 1, TOL_SPLIT);
            release(dx), release(dout);
            free(x);
            free_matrix(&t);
        }
    for (int v = 1; v < 1 + N_KNOBS; v++)
        if (bes[v]) g4_backend_destroy(bes[v]);
}

static void speed(void) {
    const double bw = g4_cuda_probe_bandwidth(gpu);
    printf("\nspeed (device copy bandwidth %.0f GB/s):\n", bw);
    /* decode GEMV: a 31B MLP-sized matrix (21504 x 5376) in each format, one token */
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
                   {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}, {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16},
                   {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    const int64_t rows = 21504, cols = 5376;
    float *x = rand_floats((size_t)512 * cols, 0.05f, 2.0f);
    float *dx = up(x, (size_t)512 * cols * 4), *dout = poisoned((size_t)512 * rows);
    /* the float32 GEMV that 4-bit formats used before the tensor-core one */
    g4_backend *f32 = knob_backend("gemv=float32");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++) {
        test_matrix t;
        make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
        const double bytes = (double)g4_matrix_bytes(&t.host);
        const int ns[] = {1, 2, 4, 8, 512};
        for (int i = 0; i < 5; i++) {
            matmul_arg a = {gpu, &t.dev, dx, dout, ns[i]};
            double s = time_op(gpu, run_matmul, &a, ns[i] == 512 ? 5 : 20);
            if (ns[i] <= 8) {
                printf("  gemv %-18s %lldx%lld n=%-3d %8.1f us  %6.0f GB/s (%.0f%% of copy)\n", t.name, (long long)rows,
                       (long long)cols, ns[i], s * 1e6, bytes / s / 1e9, 100 * bytes / s / 1e9 / bw);
                if (ns[i] == 1) check_matmul_on(gpu, "", &t.host, &t.dev, t.name, 1, TOL_SPLIT); /* columns in parts */
            }
            else
                printf("  gemm %-18s %lldx%lld n=%-3d %8.1f us  %6.1f TFLOP/s\n", t.name, (long long)rows,
                       (long long)cols, ns[i], s * 1e6, 2.0 * rows * cols * ns[i] / s / 1e12);
        }
        for (int n = 1; f32 && formats[k].bits >= 4 && n <= 8; n *= 8) {
            matmul_arg a = {f32, &t.dev, dx, dout, n};
            double s = time_op(f32, run_matmul, &a, 20);
            printf("  gemv %-18s %lldx%lld n=%-3d %8.1f us  %6.0f GB/s (%.0f%% of copy), float32 GEMV (gemv=float32)\n",
                   t.name, (long long)rows, (long long)cols, n, s * 1e6, bytes / s / 1e9, 100 * bytes / s / 1e9 / bw);
            /* the variant must also be right */
            if (n == 1) check_matmul_on(f32, "f32 gemv ", &t.host, &t.dev, t.name, 1, TOL_SPLIT);
        }
        free_matrix(&t);
    }
    if (f32) g4_backend_destroy(f32);
    release(dx), release(dout);
    free(x);
    gemv_split_speed(bw);
    gemv_pipe_speed(bw);
    /* top_logits over the 262144-logit LM head: what a decode step adds to copy back candidates */
    {
        const int V = 262144, ks[] = {1, 40, 64, 1024};
        float *x = top_logits_input(8, V, 0);
        float *dx = up(x, (size_t)8 * V * 4), *dv = poisoned(8 * 1024);
        int32_t *di = (int32_t *)poisoned(8 * 1024);
        double *dl = (double *)poisoned(16);
        for (int rows = 1; rows <= 8; rows += 7)
            for (int i = 0; i < 4; i++) {
                top_arg a = {dx, di, dv, dl, rows, V, ks[i]};
                double t = time_op(gpu, run_top_logits, &a, 50);
                printf("  top_logits %d x %d, k=%-4d %8.1f us\n", rows, V, ks[i], t * 1e6);
            }
        release(dx), release(dv), release(di), release(dl);
        free(x);
    }
    moe_speed(bw);
    attention_speeds();
}

/* ---- the merged attention input: stacked q|k|v weights, qkv_prepare ---- */

/* Host bytes of one array of the parts, one after the other (which: 0 data,
 * 1 scales, 2 biases): the stacked matrix as the CPU reference sees it. */
static void *concat_parts(g4_matrix *const *parts, int n, int which, size_t row_bytes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)parts[i]->rows * row_bytes;
    unsigned char *buf = malloc(total ? total : 1), *at = buf;
    for (int i = 0; i < n; i++) {
        const void *src = which == 0 ? parts[i]->data : which == 1 ? parts[i]->scales : parts[i]->biases;
        memcpy(at, src, (size_t)parts[i]->rows * row_bytes);
        at += (size_t)parts[i]->rows * row_bytes;
    }
    return buf;
}

/* prepare_stacked of q, k (and v) at real shapes in several formats: the
 * stacked matrix and each part's view against the CPU on the host parts. */
/* matmul_gated over one matrix of gate rows then up rows, against the CPU's
 * matmul and gelu_mul: the paired GEMV (tensor-core and float32 kernels),
 * the unpaired fallback (2-bit) and the prefill path */
static void test_matmul_gated(void) {
    const struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
        int64_t rows, cols;
    } cases[] = {
        {G4_WEIGHT_BF16, 0, 0, 0, 2 * 6144, 1536},                    /* E2B MLP */
        {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, 2 * 2112, 2816},    /* 26B dense MLP, mlx4 */
        {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16, 2 * 2112, 2816},    /* the same at 8 bits */
        {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, 2 * 300, 2816},
        {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16, 2 * 77, 96},         /* odd tiles */
        {G4_WEIGHT_AFFINE, 4, 128, G4_DTYPE_F32, 2 * 40, 21504},     /* wide rows: columns in parts */
        {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, 2 * 19, 160},          /* odd tiles, columns not of 128 */
        {G4_WEIGHT_AFFINE, 8, 128, G4_DTYPE_F16, 2 * 40, 21504},     /* 8 bits, columns in parts */
        {G4_WEIGHT_AFFINE, 8, 32, G4_DTYPE_F32, 2 * 19, 160},        /* 8 bits, odd tiles */
        {G4_WEIGHT_AFFINE, 2, 64, G4_DTYPE_BF16, 2 * 130, 512},      /* no pairs: the fallback */
        {G4_WEIGHT_F16, 0, 0, 0, 2 * 33, 40},                        /* odd shape: the generic kernel */
    };
    const int ns[] = {1, 2, 3, 5, 8, 20};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        test_matrix t;
        make_matrix(&t, cases[k].f, cases[k].bits, cases[k].group, cases[k].sdt, cases[k].rows, cases[k].cols);
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) check_gated_on(gpu, "", &t, ns[j]);
        free_matrix(&t);
    }
}

static void test_prepare_stacked(void) {
    const struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
        int q_rows, kv_rows, cols, n_parts;
    } cases[] = {
        {G4_WEIGHT_BF16, 0, 0, G4_DTYPE_BF16, 2048, 256, 1536, 3},        /* E2B sliding */
        {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16, 4096, 512, 1536, 3},     /* E2B global, mlx4 */
        {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16, 8192, 2048, 5376, 2},    /* 31B global k_eq_v, mlx8 */
        {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8, 4096, 4096, 2816, 3},       /* 26B sliding */
        {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16, 64, 32, 64, 3},           /* fixture-sized */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        test_matrix tm[3];
        const int n = cases[k].n_parts;
        for (int i = 0; i < n; i++)
            make_matrix(&tm[i], cases[k].f, cases[k].bits, cases[k].group, cases[k].sdt,
                        i == 0 ? cases[k].q_rows : cases[k].kv_rows, cases[k].cols);
        g4_matrix host_parts[3], dev_parts[3];
        g4_matrix *hp[3], *dp[3];
        for (int i = 0; i < n; i++) {
            host_parts[i] = dev_parts[i] = tm[i].host;
            hp[i] = &host_parts[i];
            dp[i] = &dev_parts[i];
        }
        g4_matrix stacked;
        g4_status st = gpu->ops->prepare_stacked(gpu, dp, n, &stacked);
        CHECK(st == G4_OK, "prepare_stacked %s: %s", tm[0].name, g4_error_message());
        if (st != G4_OK) {
            for (int i = 0; i < n; i++) free_matrix(&tm[i]);
            continue;
        }
        g4_matrix host_stacked = tm[0].host;
        host_stacked.rows = 0;
        for (int i = 0; i < n; i++) host_stacked.rows += host_parts[i].rows;
        void *bufs[3] = {concat_parts(hp, n, 0, host_stacked.row_bytes), NULL, NULL};
        host_stacked.data = bufs[0];
        if (host_stacked.scales) host_stacked.scales = bufs[1] = concat_parts(hp, n, 1, host_stacked.scale_row_bytes);
        if (host_stacked.biases) host_stacked.biases = bufs[2] = concat_parts(hp, n, 2, host_stacked.scale_row_bytes);
        /* the parts are views of the stacked rows, adjacent */
        size_t off = 0;
        int views = stacked.rows == host_stacked.rows;
        for (int i = 0; i < n; i++) {
            views &= dev_parts[i].data == (const unsigned char *)stacked.data + off * stacked.row_bytes;
            if (stacked.scales)
                views &= dev_parts[i].scales == (const unsigned char *)stacked.scales + off * stacked.scale_row_bytes;
            off += (size_t)dev_parts[i].rows;
        }
        CHECK(views, "prepare_stacked %s: the parts are not adjacent views of the stacked matrix", tm[0].name);
        char tag[32];
        snprintf(tag, sizeof tag, "stacked %d: ", n);
        const int ns[] = {1, 3, 70};
        for (int j = 0; j < 3; j++) check_matmul_on(gpu, tag, &host_stacked, &stacked, tm[0].name, ns[j], TOL_SPLIT);
        for (int i = 0; i < n; i++) check_matmul_on(gpu, "stacked part: ", &host_parts[i], &dev_parts[i], tm[i].name, 1,
                                                    TOL_SPLIT);
        for (int i = 0; i < 3; i++) free(bufs[i]);
        for (int i = 0; i < n; i++) free_matrix(&tm[i]);
    }
    /* parts of different formats are refused, leaving them as they were */
    test_matrix a, b;
    make_matrix(&a, G4_WEIGHT_BF16, 0, 0, G4_DTYPE_BF16, 64, 128);
    make_matrix(&b, G4_WEIGHT_F16, 0, 0, G4_DTYPE_F16, 64, 128);
    g4_matrix pa = a.host, pb = b.host, stacked;
    g4_matrix *parts[2] = {&pa, &pb};
    CHECK(gpu->ops->prepare_stacked(gpu, parts, 2, &stacked) == G4_ERR_UNSUPPORTED && pa.data == a.host.data,
          "prepare_stacked of bf16 and f16 parts must be refused untouched");
    free_matrix(&a);
    free_matrix(&b);
}

typedef struct {
    const char *label;
    int n_q, n_kv, D, n_pairs;
    float theta;
    int k_eq_v, sliding, window, block_size;
    int n_seqs, len, chunk;
    int no_kv; /* q only (KV-shared layers) */
} qkv_case;

/* qkv_prepare on the GPU against the CPU's (itself bitwise equal to the op
 * sequence it replaces, test_qkv_prepare): q, and every cache position
 * still held after storing len positions of each sequence chunk by chunk.
 * The GPU's own unfused sequence is compared too (rmsnorm_rope, rmsnorm,
 * kv_store there). */
/* The cache type check_qkv_prepare stores into (test_qkv_prepare sets
 * each) and the tolerance of its cache comparison: the GPU's normalised
 * values are within TOL_ELEMENTWISE of the CPU's, and a bf16 or fp8
 * rounding they straddle moves a value by a step (rare: relative RMS well
 * under these). */
static g4_kv_type qkv_kv_type = G4_KV_F32;
static double qkv_cache_tol(void) {
    return qkv_kv_type == G4_KV_F32 ? TOL_ELEMENTWISE : qkv_kv_type == G4_KV_BF16 ? 1e-3 : 1e-2;
}

static void check_qkv_prepare(const qkv_case *c) {
    const int Hq = c->n_q, Hkv = c->n_kv, D = c->D, bs = c->block_size, S = c->n_seqs;
    const int stride_blocks = (c->len + bs - 1) / bs;
    const int ring = g4_kv_ring_blocks(c->window, c->chunk, bs);
    const int n_blocks = c->sliding ? S * ring : S * stride_blocks + 3;
    int32_t *full = malloc((size_t)S * stride_blocks * 4), *slide = malloc((size_t)S * ring * 4);
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    shuffle(perm, n_blocks);
    for (int i = 0; i < S * stride_blocks; i++) full[i] = perm[i % n_blocks];
    for (int i = 0; i < S * ring; i++) slide[i] = perm[i % n_blocks];
    void *kc = c->no_kv ? NULL : cpu->ops->kv_alloc(cpu, n_blocks, bs, Hkv, D, qkv_kv_type);
    void *kg = c->no_kv ? NULL : gpu->ops->kv_alloc(gpu, n_blocks, bs, Hkv, D, qkv_kv_type);
    void *kg2 = c->no_kv ? NULL : gpu->ops->kv_alloc(gpu, n_blocks, bs, Hkv, D, qkv_kv_type); /* the unfused sequence's */
    CHECK(c->no_kv || (kc && kg && kg2), "%s: kv_alloc", c->label);
    float *qn = rand_floats((size_t)D, 0.5f, 2.0f), *kn = rand_floats((size_t)D, 0.5f, 2.0f);
    float *dqn = up(qn, (size_t)D * 4), *dkn = up(kn, (size_t)D * 4);
    g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .k_eq_v = c->k_eq_v, .q_norm = qn,
                       .k_norm = kn, .theta = c->theta, .n_pairs = c->n_pairs, .eps = 1e-6f};
    g4_qkv_params dp = p;
    dp.q_norm = dqn;
    dp.k_norm = dkn;
    const int width = (Hq + (c->k_eq_v ? 1 : 2) * Hkv) * D, kv_w = Hkv * D;
    const int max_n = S * c->chunk;
    int32_t *pos = malloc((size_t)max_n * 4), *seq = malloc((size_t)max_n * 4), *ranges = calloc((size_t)max_n, 16);
    float *want_q = malloc((size_t)max_n * Hq * D * 4);
    double worst_q = 0, worst_q_unfused = 0;
    for (int start = 0; start < c->len; start += c->chunk) {
        const int per = c->len - start < c->chunk ? c->len - start : c->chunk;
        int n = 0;
        for (int s = 0; s < S; s++)
            for (int t = 0; t < per; t++) pos[n] = start + t, seq[n] = s, n++;
        g4_attn_batch hb = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = full,
                            .full_table_stride = stride_blocks, .sliding_tables = slide, .ring_blocks = ring,
                            .block_size = bs};
        g4_attn_batch db;
        void *bufs[5];
        upload_batch(&hb, &db, S, bufs);
        const size_t nq = (size_t)n * Hq * D, nkv = (size_t)n * kv_w;
        float *qkv = rand_floats((size_t)n * width, 0.01f, 3.0f);
        cpu->ops->qkv_prepare(cpu, want_q, qkv, &p, kc, &hb, c->sliding);
        float *dqkv = up(qkv, (size_t)n * width * 4), *dq = poisoned(nq);
        gpu->ops->qkv_prepare(gpu, dq, dqkv, &dp, kg, &db, c->sliding);
        float *got = down(dq, nq);
        double err = test_rel_rms(got, want_q, nq);
        if (err > worst_q) worst_q = err;
        free(got);
        /* the GPU's unfused sequence on the same rows */
        float *dq2 = poisoned(nq);
        gpu->ops->copy_rows(gpu, dq2, Hq * D, dqkv, width, n, Hq * D);
        gpu->ops->rmsnorm_rope(gpu, dq2, dqn, n, Hq, D, db.pos, c->theta, c->n_pairs, 1e-6f);
        if (kg2) {
            float *dk = poisoned(nkv), *dv = poisoned(nkv);
            gpu->ops->copy_rows(gpu, dk, kv_w, dqkv + (size_t)Hq * D, width, n, kv_w);
            gpu->ops->copy_rows(gpu, dv, kv_w, dqkv + (size_t)(Hq + (c->k_eq_v ? 0 : Hkv)) * D, width, n, kv_w);
            gpu->ops->rmsnorm_rope(gpu, dk, dkn, n, Hkv, D, db.pos, c->theta, c->n_pairs, 1e-6f);
            gpu->ops->rmsnorm(gpu, dv, dv, NULL, n * Hkv, D, 1e-6f);
            gpu->ops->kv_store(gpu, kg2, dk, dv, &db, c->sliding);
            release(dk), release(dv);
        }
        got = down(dq2, nq);
        err = test_rel_rms(got, want_q, nq);
        if (err > worst_q_unfused) worst_q_unfused = err;
        free(got);
        release(dqkv), release(dq), release(dq2);
        for (int i = 0; i < 5; i++) release(bufs[i]);
        free(qkv);
    }
    char what[160];
    snprintf(what, sizeof what, "%s: q, %d x %d heads x %d", c->label, max_n, Hq, D);
    printf("  %-12s %-52s rel_rms %.2e (tol %.0e); unfused on GPU %.2e\n", "qkv_prepare", what, worst_q,
           TOL_ELEMENTWISE, worst_q_unfused);
    CHECK(worst_q <= TOL_ELEMENTWISE, "%s: q rel_rms %.3e", c->label, worst_q);
    record("qkv_prepare", worst_q, TOL_ELEMENTWISE);
    if (!c->no_kv) {
        /* every position still held */
        const int kept = c->sliding ? (c->len < ring * bs ? c->len : ring * bs) : c->len;
        const int n_read = S * kept;
        int32_t *rpos = malloc((size_t)n_read * 4), *rseq = malloc((size_t)n_read * 4);
        int32_t *rranges = calloc((size_t)n_read, 16);
        for (int s = 0, i = 0; s < S; s++)
            for (int t = c->len - kept; t < c->len; t++, i++) rpos[i] = t, rseq[i] = s;
        g4_attn_batch hb = {.n_tokens = n_read, .pos = rpos, .seq = rseq, .kv_range = rranges, .full_tables = full,
                            .full_table_stride = stride_blocks, .sliding_tables = slide, .ring_blocks = ring,
                            .block_size = bs};
        g4_attn_batch db;
        void *bufs[5];
        upload_batch(&hb, &db, S, bufs);
        const size_t nkv = (size_t)n_read * kv_w;
        float *wk = malloc(nkv * 4), *wv = malloc(nkv * 4);
        cpu->ops->kv_read(cpu, kc, wk, wv, &hb, c->sliding);
        float *dk = poisoned(nkv), *dv = poisoned(nkv);
        gpu->ops->kv_read(gpu, kg, dk, dv, &db, c->sliding);
        float *gk = down(dk, nkv), *gv = down(dv, nkv);
        snprintf(what, sizeof what, "%s: cache K (%s), %d positions", c->label, g4_kv_type_name(qkv_kv_type), n_read);
        compare("qkv_prepare", what, gk, wk, nkv, qkv_cache_tol());
        snprintf(what, sizeof what, "%s: cache V (%s), %d positions", c->label, g4_kv_type_name(qkv_kv_type), n_read);
        compare("qkv_prepare", what, gv, wv, nkv, qkv_cache_tol());
        free(gk), free(gv);
        gpu->ops->kv_read(gpu, kg2, dk, dv, &db, c->sliding);
        gk = down(dk, nkv), gv = down(dv, nkv);
        printf("  %-12s %-52s K %.2e, V %.2e from the CPU\n", "", "  (GPU unfused sequence)", test_rel_rms(gk, wk, nkv),
               test_rel_rms(gv, wv, nkv));
        free(gk), free(gv), free(wk), free(wv), free(rpos), free(rseq), free(rranges);
        release(dk), release(dv);
        for (int i = 0; i < 5; i++) release(bufs[i]);
        cpu->ops->kv_free(cpu, kc);
        gpu->ops->kv_free(gpu, kg);
        gpu->ops->kv_free(gpu, kg2);
    }
    release(dqn), release(dkn);
    free(qn), free(kn), free(full), free(slide), free(perm), free(pos), free(seq), free(ranges), free(want_q);
}

static void test_qkv_prepare(void) {
    const qkv_case cases[] = {
        /* label, Hq, Hkv, D, pairs, theta, k_eq_v, sliding, window, bs, seqs, len, chunk, no_kv */
        {"E2B sliding 256, ring wraps, decode", 8, 1, 256, 128, 10000.0f, 0, 1, 48, 16, 1, 90, 1, 0},
        {"E2B global 512, 25% RoPE, prefill", 8, 1, 512, 64, 1000000.0f, 0, 0, 0, 16, 1, 300, 128, 0},
        {"31B sliding GQA 2, 3 sequences", 32, 16, 256, 128, 10000.0f, 0, 1, 64, 16, 3, 90, 7, 0},
        {"31B global k_eq_v GQA 8", 32, 4, 512, 64, 1000000.0f, 1, 0, 0, 16, 2, 40, 9, 0},
        {"26B sliding k_eq_v, chunks wrap", 16, 8, 256, 128, 10000.0f, 1, 1, 32, 16, 1, 200, 20, 0},
        {"E2B KV-shared layer: q only", 8, 1, 512, 64, 1000000.0f, 0, 0, 0, 16, 1, 20, 20, 1},
        {"odd head_dim 18, partial pairs", 4, 2, 18, 5, 500.0f, 0, 1, 12, 4, 2, 41, 3, 0},
        {"fixture-like 32", 2, 1, 32, 16, 10000.0f, 1, 0, 0, 16, 1, 25, 25, 0},
    };
    for (int type = G4_KV_F32; type <= G4_KV_FP8; type++) {
        qkv_kv_type = (g4_kv_type)type;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_qkv_prepare(&cases[i]);
    }
    qkv_kv_type = G4_KV_F32;
}

/* A failed op (here attention with 3 query heads over 2 KV heads) is kept
 * and reported by the status op, naming what failed: the decoder turns it
 * into an error instead of returning garbage. */
static void test_failure_status(void) {
    g4_backend *be = NULL;
    if (g4_backend_cuda_create(0, &be) != G4_OK) {
        CHECK(0, "CUDA backend: %s", g4_error_message());
        return;
    }
    CHECK(be->ops->status && be->ops->status(be) == G4_OK, "a fresh CUDA backend reports no failure");
    void *kv = be->ops->kv_alloc(be, 1, 16, 2, 64, G4_KV_F32);
    int32_t pos = 0, seq = 0, range[4] = {0, 0, 0, 0}, table = 0;
    g4_attn_batch b = {.n_tokens = 1, .pos = up(&pos, 4), .seq = up(&seq, 4), .kv_range = up(range, 16),
                       .full_tables = up(&table, 4), .full_table_stride = 1, .sliding_tables = up(&table, 4),
                       .ring_blocks = 1, .block_size = 16};
    float *q = poisoned(3 * 64), *out = poisoned(3 * 64);
    be->ops->attention(be, out, q, kv, &b, 0, 3, 1.0f);
    const g4_status st = be->ops->status(be);
    CHECK(st != G4_OK && strstr(g4_error_message(), "attention") != NULL,
          "a failed attention is reported by the status op (got %d: %s)", (int)st, g4_error_message());
    release(q), release(out), release((void *)b.pos), release((void *)b.seq), release((void *)b.kv_range),
        release((void *)b.full_tables), release((void *)b.sliding_tables);
    be->ops->kv_free(be, kv);
    g4_backend_destroy(be);
}

int main(void) {
    /* 8-bit weights take the integer GEMV only from 2^25 weights on; here it
     * takes every 8-bit case (the float32 GEMV's are checked by "i8 off") */
    setenv("G4_CUDA_TUNE", "i8_min8=0", 1);
    g4_status st = g4_backend_cuda_create(0, &gpu);
    if (st == G4_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", g4_error_message());
        return 77;
    }
    CHECK(st == G4_OK, "CUDA backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    printf("CUDA device: %s\n", g4_cuda_device_name(gpu));
    if (getenv("G4_ONLY_GEMV_TC")) { /* the tensor-core GEMV's cases alone */
        test_gemv_tc();
        CHECK(g4_cuda_status(gpu) == G4_OK, "no CUDA failure recorded: %s", g4_error_message());
        g4_backend_destroy(gpu);
        g4_backend_destroy(cpu);
        return test_finish();
    }
    if (getenv("G4_ONLY_MOE")) { /* the experts' cases alone (for compute-sanitizer) */
        test_moe_experts();
        test_fast_prefill();
        CHECK(g4_cuda_status(gpu) == G4_OK, "no CUDA failure recorded: %s", g4_error_message());
        g4_backend_destroy(gpu);
        g4_backend_destroy(cpu);
        return test_finish();
    }
    if (getenv("G4_ONLY_SPEED")) { /* for profiling the speed section alone (=gemv4: its one-token 4-bit GEMVs;
                                     =attn: the attention cases; =moe: the experts') */
        if (!strcmp(getenv("G4_ONLY_SPEED"), "gemv4"))
            gemv_pipe_speed(g4_cuda_probe_bandwidth(gpu));
        else if (!strcmp(getenv("G4_ONLY_SPEED"), "attn"))
            attention_speeds();
        else if (!strcmp(getenv("G4_ONLY_SPEED"), "moe"))
            moe_speed(g4_cuda_probe_bandwidth(gpu));
        else
            speed();
        attn_tc_destroy();
        g4_backend_destroy(gpu);
        g4_backend_destroy(cpu);
        return test_finish();
    }
    test_failure_status();
    test_elementwise();
    test_rmsnorm();
    test_rmsnorm_pair();
    test_add_rmsnorm();
    test_add_rmsnorm_moe();
    test_moe_route_experts();
    test_moe_residual();
    test_matmul_gelu_mul();
    test_rope(0);
    test_rope(1);
    test_embed();
    test_rows_and_copies();
    test_vision_ops();
    test_audio_ops();
    test_moe_route();
    test_top_logits();
    test_attention();
    test_kv_copy_blocks();
    test_qkv_prepare();
    test_prepare_stacked();
    test_matmul_gated();
    test_matmul();
    test_moe_experts();
    test_gemv_tc();
    test_fast_prefill();
    if (!getenv("G4_SKIP_SPEED")) speed();
    CHECK(g4_cuda_status(gpu) == G4_OK, "no CUDA failure recorded: %s", g4_error_message());
    attn_tc_destroy();
    printf("\n| op | cases | worst rel_rms | tolerance |\n|---|---|---|---|\n");
    for (int i = 0; i < n_stats; i++)
        printf("| %s | %d | %.2e | %.0e |\n", stats[i].op, stats[i].cases, stats[i].worst, stats[i].tol);
    g4_backend_destroy(gpu);
    g4_backend_destroy(cpu);
    return test_finish();
}
