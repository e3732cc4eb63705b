/* What the CUDA op tests (tests/unit/test_cuda_*.c) and bench/cuda_ops_bench
 * share: the device backend under test, device buffers (outputs poisoned
 * with NaN so that an unwritten element fails), weight matrices in every
 * format prepared on the device beside their host copies (which the float64
 * references read), backends created with tuning overrides (G4_CUDA_TUNE
 * syntax), and paged
 * attention batches.
 *
 * G4_TEST_DEVICE=cpu runs a test's logic with the CPU backend in the
 * device's place (every "knob" backend is then another CPU backend): a dry
 * run of the cases and references on a machine without a GPU, slow at the
 * real-model shapes; not what the tolerances are for. */
#ifndef G4_TESTS_CUDA_HARNESS_H
#define G4_TESTS_CUDA_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "support/op_check.h"
#include "support/op_reference.h"
#include "support/test_random.h"
#include "test_util.h"

static g4_backend *gpu; /* the backend under test */
static int gpu_is_cpu;  /* G4_TEST_DEVICE=cpu */

/* A backend of the kind under test (CUDA, or the CPU in a dry run). */
static inline g4_status device_backend_create(g4_backend **out) {
    return gpu_is_cpu ? g4_backend_cpu_create(0, out) : g4_backend_cuda_create(0, out);
}

/* The first failure a backend kept (G4_OK when none, or for the CPU). */
static inline g4_status backend_status(g4_backend *be) { return be->ops->status ? be->ops->status(be) : G4_OK; }

/* Opens the device backend; 77 (skip) without a GPU, 1 on failure, 0 when ready. */
static inline int harness_open(void) {
    const char *dev = getenv("G4_TEST_DEVICE");
    gpu_is_cpu = dev && !strcmp(dev, "cpu");
    /* 8-bit weights take the integer GEMV only from 2^25 weights on; here it
     * takes every 8-bit case (the float32 GEMV's are checked with it off) */
    setenv("G4_CUDA_TUNE", "i8_min8=0", 1);
    const g4_status st = device_backend_create(&gpu);
    if (st == G4_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", g4_error_message());
        return 77;
    }
    CHECK(st == G4_OK, "device backend: %s", g4_error_message());
    if (st != G4_OK) return 1;
    printf("device: %s\n", gpu_is_cpu ? "the CPU backend (G4_TEST_DEVICE=cpu, a dry run)" : g4_cuda_device_name(gpu));
    return 0;
}

/* Checks that no failure was recorded, destroys the backend; the exit status. */
static inline int harness_close(void) {
    CHECK(backend_status(gpu) == G4_OK, "no failure recorded on the device: %s", g4_error_message());
    g4_backend_destroy(gpu);
    return test_finish();
}

/* Another backend created with tuning overrides ("key=value,...", README.md
 * "CUDA tuning") to check an alternative path; NULL, with a failed check, if
 * it cannot be. (In a dry run: another CPU backend.) */
static inline g4_backend *knob_backend(const char *tune) {
    g4_backend *be = NULL;
    const g4_status st = gpu_is_cpu ? g4_backend_cpu_create(0, &be) : g4_backend_cuda_create_tuned(0, tune, &be);
    CHECK(st == G4_OK, "backend with %s: %s", tune, g4_error_message());
    return st == G4_OK ? be : NULL;
}

/* The integer GEMV with its prepared activations in one copy and in three
 * (gemv_copies; the default is 4: tile t reads copy t % copies): variant
 * v < GEMV_COPIES_VARIANTS as a knob backend (NULL after a failed check)
 * and its tag, "copies N ". */
enum { GEMV_COPIES_VARIANTS = 2 };
static inline g4_backend *gemv_copies_backend(int v, char *tag, size_t tag_size) {
    static const char *const copies[GEMV_COPIES_VARIANTS] = {"1", "3"};
    char spec[32];
    snprintf(spec, sizeof spec, "gemv_copies=%s", copies[v]);
    snprintf(tag, tag_size, "copies %s ", copies[v]);
    return knob_backend(spec);
}

/* ---- device buffers ---- */

static inline void *up(const void *host, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes ? bytes : 4);
    if (d && bytes) gpu->ops->to_device(gpu, d, host, bytes);
    return d;
}

static inline float *poisoned(size_t n) {
    float *nan = malloc((n ? n : 1) * sizeof *nan);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    float *d = up(nan, n * sizeof *nan);
    free(nan);
    return d;
}

static inline float *down(const void *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    gpu->ops->to_host(gpu, h, d, n * sizeof *h);
    return h;
}

static inline void release(void *d) { gpu->ops->release(gpu, d); }

/* ---- weight matrices: the host copy (what the references read) and the device's ---- */

typedef struct {
    g4_matrix host, dev;
    host_matrix owned;
    char name[64];
} test_matrix;

static inline void make_matrix(test_matrix *t, g4_weight_format f, int bits, int group, g4_dtype sdt, int64_t rows,
                               int64_t cols) {
    memset(t, 0, sizeof *t);
    host_matrix_make(&t->owned, f, bits, group, sdt, rows, cols);
    t->host = t->dev = t->owned.m;
    snprintf(t->name, sizeof t->name, "%s", t->owned.name);
    const g4_status st = gpu->ops->prepare_matrix(gpu, &t->dev);
    CHECK(st == G4_OK, "prepare_matrix %s: %s", t->name, g4_error_message());
}

static inline void free_matrix(test_matrix *t) {
    host_matrix_free(&t->owned); /* device copies belong to the backend */
    memset(t, 0, sizeof *t);
}

/* ---- attention batches ---- */

/* The batch's arrays copied to the device; bufs[5] to release. */
static inline void upload_batch(const g4_attn_batch *h, g4_attn_batch *d, int n_seqs, void **bufs) {
    *d = *h;
    d->pos = bufs[0] = up(h->pos, (size_t)h->n_tokens * 4);
    d->seq = bufs[1] = up(h->seq, (size_t)h->n_tokens * 4);
    d->kv_range = bufs[2] = up(h->kv_range, (size_t)h->n_tokens * 16);
    d->full_tables = bufs[3] = up(h->full_tables, (size_t)n_seqs * h->full_table_stride * 4);
    d->sliding_tables = bufs[4] = up(h->sliding_tables, (size_t)n_seqs * h->ring_blocks * 4);
}


/* ---- matmul against the reference (shared by the matmul and MoE tests and the bench) ---- */

/* The family a matmul of n tokens falls in: one-token-to-8 GEMVs, prefill
 * GEMMs (split bf16 products; float32 weights on the float32 kernel), and
 * the plain-bf16 mode's GEMMs (G4_PRECISION_FAST). */
static inline const char *matmul_family(const g4_matrix *m, int n, int bf16_mode) {
    if (n <= 8) return "matmul/gemv";
    if (bf16_mode) return "matmul/gemm-bf16";
    return m->format == G4_WEIGHT_F32 ? "matmul/gemm-f32" : "matmul/gemm";
}

/* matmul of ns[0..count) tokens on be over hm (host) / dm (be's copy), each
 * against the float64 reference (one reference pass over all the counts:
 * the matrix is decoded once). */
static inline void check_matmul_set(g4_backend *be, const char *tag, const g4_matrix *hm, const g4_matrix *dm,
                                    const char *name, const int *ns, int count, int bf16_mode) {
    const int64_t rows = hm->rows, cols = hm->cols;
    int total = 0;
    for (int i = 0; i < count; i++) total += ns[i];
    float *x = rand_floats((size_t)total * cols, 0.05f, 2.0f);
    double *want = doubles((size_t)total * rows);
    ref_matmul(want, x, total, hm);
    for (int i = 0, at = 0; i < count; at += ns[i], i++) {
        const int n = ns[i];
        float *dx = up(x + (size_t)at * cols, (size_t)n * cols * 4), *dout = poisoned((size_t)n * rows);
        gpu->ops->synchronize(gpu); /* be may be another backend with its own stream */
        be->ops->matmul(be, dout, dx, n, dm);
        be->ops->synchronize(be);
        float *got = down(dout, (size_t)n * rows);
        char what[128];
        snprintf(what, sizeof what, "%s%s %lldx%lld n=%d", tag, name, (long long)rows, (long long)cols, n);
        op_check(matmul_family(hm, n, bf16_mode), what, got, want + (size_t)at * rows, (size_t)n, (size_t)rows);
        release(dx), release(dout);
        free(got);
    }
    free(x), free(want);
}

static inline void check_matmul_on(g4_backend *be, const char *tag, const g4_matrix *hm, const g4_matrix *dm,
                                   const char *name, int n) {
    check_matmul_set(be, tag, hm, dm, name, &n, 1, 0);
}

/* matmul_gated of n tokens on be over t (gate rows, then as many up rows) */
static inline void check_gated_on(g4_backend *be, const char *tag, const test_matrix *t, int n) {
    if (!be->ops->matmul_gated) {
        printf("  matmul_gated: not in this backend's table\n");
        return;
    }
    const int64_t F = t->host.rows / 2, cols = t->host.cols;
    float *x = rand_floats((size_t)n * cols, 0.05f, 2.0f);
    double *want = doubles((size_t)n * F);
    ref_matmul_gated(want, x, n, &t->host);
    float *dx = up(x, (size_t)n * cols * 4), *dout = poisoned((size_t)n * F);
    gpu->ops->synchronize(gpu);
    be->ops->matmul_gated(be, dout, dx, n, &t->dev);
    be->ops->synchronize(be);
    float *got = down(dout, (size_t)n * F);
    char what[128];
    snprintf(what, sizeof what, "%s%s %lldx%lld n=%d", tag, t->name, (long long)t->host.rows, (long long)cols, n);
    op_check(n <= 8 ? "matmul_gated" : "matmul_gated/gemm", what, got, want, (size_t)n, (size_t)F);
    release(dx), release(dout);
    free(x), free(want), free(got);
}


/* ---- experts (the MoE test and the bench) ---- */

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

static inline void moe_weights_make(moe_weights *m, int hf, g4_weight_format f, int bits, int group, int E, int width, int d) {
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

static inline void moe_weights_free(moe_weights *m) {
    free_matrix(&m->dm);
    if (m->hf)
        free_matrix(&m->gu);
    else
        free_matrix(&m->gm), free_matrix(&m->um);
}

/* Each of n tokens picks k distinct experts (every fifth token experts
 * 0..k-1, so that some tokens share them). */
static inline int32_t *moe_random_ids(int n, int k, int E) {
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

/* ---- attention settings (the attention test and the bench) ---- */

/* Backends with the tensor-core prefill attention on (tuning attn=auto:
 * the flash kernel; attn=tc: the older kernel; attn_tc_split: keys per
 * piece when each tile's keys are split over blocks, "" by shape) and off
 * (attn=cores, last), made once; and decode under other settings (key
 * pieces of at least 64 positions). */
enum { ATTN_TC_VARIANTS = 8, ATTN_DECODE_VARIANTS = 1 };
static const char *const attn_tc_knob[ATTN_TC_VARIANTS][2] = {
    {"auto", ""}, {"auto", "0"}, {"auto", "32"}, {"auto", "256"}, {"tc", "0"}, {"tc", "64"}, {"tc", "256"}, {"cores", ""}};
static const char *attn_tc_name[ATTN_TC_VARIANTS];
static g4_backend *attn_tc_be[ATTN_TC_VARIANTS];
static int attn_tc_made;
static const char *const attn_decode_knob[ATTN_DECODE_VARIANTS][2] = {{"attn_min_split", "64"}};
static char attn_decode_name[ATTN_DECODE_VARIANTS][64];
static g4_backend *attn_decode_be[ATTN_DECODE_VARIANTS];

static inline void attn_tc_backends(void) {
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

static inline void attn_tc_destroy(void) {
    for (int v = 0; v < ATTN_TC_VARIANTS; v++) {
        if (!attn_tc_be[v]) continue;
        CHECK(backend_status(attn_tc_be[v]) == G4_OK, "no CUDA failure recorded with %s: %s", attn_tc_name[v],
              g4_error_message());
        g4_backend_destroy(attn_tc_be[v]);
        attn_tc_be[v] = NULL;
    }
    for (int v = 0; v < ATTN_DECODE_VARIANTS; v++) {
        if (!attn_decode_be[v]) continue;
        CHECK(backend_status(attn_decode_be[v]) == G4_OK, "no CUDA failure recorded with %s: %s", attn_decode_name[v],
              g4_error_message());
        g4_backend_destroy(attn_decode_be[v]);
        attn_decode_be[v] = NULL;
    }
    attn_tc_made = 0;
}

#endif
