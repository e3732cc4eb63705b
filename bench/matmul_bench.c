/* CPU matmul speed for the real Gemma 4 shapes, beside this machine's limits.
 *
 *   matmul_bench [--isa avx512vnni|avx512|avx2|scalar|all] [--only decode|prefill|tower] [--quick] [--tokens N]
 *                [--precision exact|fast]   (default fast: cpu_matmul_fast)
 *
 * Decode (1 token): GB/s of weights streamed (g4_matrix_bytes / median time)
 * and the fraction of the measured memory bandwidth (and the best call's GB/s). Small matrices are cycled
 * through copies that together exceed the last-level cache, as the weights of
 * a whole model would. Prefill (512 tokens): GFLOP/s (2 * rows * cols *
 * tokens / best time) and the fraction of the measured FMA peak. Tower
 * (--only tower): the vision tower's shapes at 2520 patches (280 soft
 * tokens), cpu_matmul beside cpu_matmul_precise. Weights are
 * random: speed does not depend on their values. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_probe.h"
#include "base/file.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"

enum { PREFILL_TOKENS = 512 };
static const size_t CYCLE_BYTES = (size_t)512 << 20; /* copies of a matrix to stream through */

typedef struct {
    const char *name;
    int64_t rows, cols;
} shape;

static const shape decode_shapes[] = {
    {"e2b q/o-ish 2048x1536", 2048, 1536},
    {"e2b mlp up 6144x1536", 6144, 1536},
    {"e2b mlp down 1536x6144", 1536, 6144},
    {"e2b lm head 262144x1536", 262144, 1536},
    {"31b mlp 5376x21504", 5376, 21504},
};
/* vision towers: E2B/E4B (width 768, MLP 3072) and 26B/31B (1152, 4304) */
static const shape tower_shapes[] = {
    {"e2b vision qkvo 768x768", 768, 768},
    {"e2b vision mlp 3072x768", 3072, 768},
    {"e2b vision down 768x3072", 768, 3072},
    {"31b vision mlp 4304x1152", 4304, 1152},
    {"31b vision down 1152x4304", 1152, 4304},
};
enum { TOWER_TOKENS = 2520 };
static const shape prefill_shapes[] = {
    {"e2b q/o-ish 2048x1536", 2048, 1536},
    {"e2b mlp up 6144x1536", 6144, 1536},
    {"e2b mlp down 1536x6144", 1536, 6144},
    {"31b mlp 5376x21504", 5376, 21504},
};

typedef struct {
    const char *name;
    g4_weight_format format;
    int bits, group;
} format_spec;

static const format_spec formats[] = {
    {"bf16", G4_WEIGHT_BF16, 0, 0},
    {"affine4 g64", G4_WEIGHT_AFFINE, 4, 64},
    {"affine8 g64", G4_WEIGHT_AFFINE, 8, 64},
    {"mxfp4", G4_WEIGHT_MXFP4, 4, 32},
};

static uint64_t rng = 88172645463325252ull;
static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void *alloc_random(size_t bytes) {
    unsigned char *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) return NULL;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = next_random();
        memcpy(p + i, &v, 8);
    }
    return p;
}

/* Random weights of the format; scales keep every value finite. */
static int make_matrix(g4_matrix *m, const format_spec *f, int64_t rows, int64_t cols) {
    memset(m, 0, sizeof *m);
    m->format = f->format;
    m->rows = rows;
    m->cols = cols;
    m->bits = f->bits;
    m->group_size = f->group;
    if (f->format == G4_WEIGHT_BF16) {
        m->row_bytes = (size_t)cols * 2;
        uint16_t *d = alloc_random((size_t)rows * m->row_bytes);
        if (!d) return 0;
        for (size_t i = 0; i < (size_t)(rows * cols); i++) d[i] = g4_f32_to_bf16((float)(int16_t)d[i] * 1e-6f);
        m->data = d;
        return 1;
    }
    m->row_bytes = (size_t)(cols * f->bits / 8);
    m->data = alloc_random((size_t)rows * m->row_bytes);
    const size_t n_params = (size_t)(rows * (cols / f->group));
    if (f->format == G4_WEIGHT_MXFP4) {
        m->scale_dtype = G4_DTYPE_U8;
        m->scale_row_bytes = (size_t)(cols / 32);
        unsigned char *s = malloc(n_params);
        if (!s) return 0;
        for (size_t i = 0; i < n_params; i++) s[i] = (unsigned char)(118 + next_random() % 6);
        m->scales = s;
    } else {
        m->scale_dtype = G4_DTYPE_BF16;
        m->scale_row_bytes = (size_t)(cols / f->group) * 2;
        uint16_t *s = malloc(n_params * 2), *b = malloc(n_params * 2);
        if (!s || !b) return 0;
        for (size_t i = 0; i < n_params; i++) {
            s[i] = g4_f32_to_bf16(0.01f);
            b[i] = g4_f32_to_bf16(-0.08f);
        }
        m->scales = s;
        m->biases = b;
    }
    return m->data != NULL;
}

static void free_matrix(g4_matrix *m) {
    free((void *)m->data);
    free((void *)m->scales);
    free((void *)m->biases);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* cached: one copy only (a matrix that fits in L2 then shows the kernel's
 * compute speed, the ceiling decode reaches on a machine with bandwidth to
 * spare) */
static int decode_tokens = 1; /* --tokens N: decode batch (the server's concurrent streams) */

typedef void (*matmul_fn)(float *, const float *, int64_t, const g4_matrix *);
/* --precision exact|fast: cpu_matmul (float32) or cpu_matmul_fast */
static matmul_fn product = cpu_matmul_fast;
static const char *product_label = "fast";

static void bench_decode(const format_spec *f, const shape *s, double bandwidth, int cached) {
    g4_matrix probe;
    if (!make_matrix(&probe, f, s->rows, s->cols)) {
        printf("  %-26s %-12s out of memory\n", s->name, f->name);
        return;
    }
    const size_t bytes = g4_matrix_bytes(&probe);
    int n_copies = cached ? 1 : (int)((CYCLE_BYTES + bytes - 1) / bytes);
    if (n_copies > 64) n_copies = 64;
    g4_matrix *m = calloc((size_t)n_copies, sizeof *m);
    m[0] = probe;
    for (int i = 1; i < n_copies; i++) make_matrix(&m[i], f, s->rows, s->cols);
    const int nt = decode_tokens;
    float *x = malloc((size_t)(nt * s->cols) * sizeof *x), *out = malloc((size_t)(nt * s->rows) * sizeof *out);
    for (int64_t c = 0; c < nt * s->cols; c++) x[c] = (float)(next_random() % 2001) * 1e-3f - 1.0f;

    /* warm up, then enough calls for ~0.5 s, at least 10 */
    for (int i = 0; i < n_copies; i++) product(out, x, nt, &m[i]);
    double t0 = g4_now_seconds();
    product(out, x, nt, &m[0]);
    double one = g4_now_seconds() - t0;
    int reps = (int)(0.5 / (one > 1e-6 ? one : 1e-6));
    if (reps < 10) reps = 10;
    if (reps > 5000) reps = 5000;
    double *times = malloc((size_t)reps * sizeof *times);
    for (int i = 0; i < reps; i++) {
        double a = g4_now_seconds();
        product(out, x, nt, &m[i % n_copies]);
        times[i] = g4_now_seconds() - a;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double med = times[reps / 2], best = times[0];
    double gbs = (double)bytes / med / 1e9, best_gbs = (double)bytes / best / 1e9;
    if (cached)
        printf("  %-26s %-12s %7.1f MB %9.1f us %7.1f GB/s %6.1f Gweights/s (best %.1f)\n", s->name, f->name,
               bytes / 1e6, med * 1e6, gbs, (double)(s->rows * s->cols) / med / 1e9,
               (double)(s->rows * s->cols) / best / 1e9);
    else
        printf("  %-26s %-12s %7.1f MB %9.1f us %7.1f GB/s %4.0f%% of bandwidth (best %.1f GB/s), %.1f GFLOP/s\n",
               s->name, f->name, bytes / 1e6, med * 1e6, gbs, 100.0 * gbs / bandwidth, best_gbs,
               2.0 * (double)(s->rows * s->cols) * nt / med / 1e9);
    for (int i = 0; i < n_copies; i++) free_matrix(&m[i]);
    free(m);
    free(x);
    free(out);
    free(times);
}

static void bench_prefill(const format_spec *f, const shape *s, double peak, int64_t n, matmul_fn matmul,
                          const char *label) {
    g4_matrix m;
    if (!make_matrix(&m, f, s->rows, s->cols)) {
        printf("  %-26s %-12s out of memory\n", s->name, f->name);
        return;
    }
    float *x = malloc((size_t)(n * s->cols) * sizeof *x), *out = malloc((size_t)(n * s->rows) * sizeof *out);
    for (int64_t i = 0; i < n * s->cols; i++) x[i] = (float)(next_random() % 2001) * 1e-3f - 1.0f;
    matmul(out, x, n, &m);
    const double flops = 2.0 * (double)s->rows * (double)s->cols * (double)n;
    double times[5];
    int reps = flops > 5e10 ? 2 : 5;
    for (int i = 0; i < reps; i++) {
        double a = g4_now_seconds();
        matmul(out, x, n, &m);
        times[i] = g4_now_seconds() - a;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    double gf = flops / times[0] / 1e9;
    printf("  %-26s %-12s %-8s %9.1f ms %8.1f GFLOP/s %5.0f%% of peak\n", s->name, f->name, label, times[0] * 1e3,
           gf, 100.0 * gf / peak);
    free_matrix(&m);
    free(x);
    free(out);
}

int main(int argc, char **argv) {
    const char *isa_arg = "all";
    int quick = 0;
    const char *only = "";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) isa_arg = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) decode_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc) {
            product_label = argv[++i];
            product = strcmp(product_label, "exact") == 0 ? cpu_matmul : cpu_matmul_fast;
        }
        else {
            fprintf(stderr, "usage: %s [--isa avx512vnni|avx512|avx2|scalar|all] [--only decode|prefill|tower] [--quick] [--tokens N] [--precision exact|fast]\n", argv[0]);
            return 2;
        }
    }
    printf("threads %d, precision %s, best level %s\n", omp_get_max_threads(), product_label, cpu_isa_level_name(cpu_isa_supported()));
    for (int level = (int)cpu_isa_supported(); level >= CPU_ISA_SCALAR; level--) {
        if (strcmp(isa_arg, "all") != 0 && strcmp(isa_arg, cpu_isa_level_name((cpu_isa)level)) != 0) continue;
        cpu_isa_force((cpu_isa)level);
        double bandwidth = g4_measure_memory_bandwidth();
        double peak = g4_measure_cpu_flops();
        printf("\n== %s: memory bandwidth %.1f GB/s, FMA peak %.1f GFLOP/s\n", cpu_isa_name(), bandwidth, peak);
        if (strcmp(only, "tower") == 0) {
            printf("vision tower, %d tokens (bf16):\n", TOWER_TOKENS);
            for (size_t si = 0; si < sizeof tower_shapes / sizeof tower_shapes[0]; si++) {
                bench_prefill(&formats[0], &tower_shapes[si], peak, TOWER_TOKENS, cpu_matmul, "float32");
                bench_prefill(&formats[0], &tower_shapes[si], peak, TOWER_TOKENS, cpu_matmul_precise, "precise");
            }
            continue;
        }
        if (strcmp(only, "prefill") != 0) printf("decode, %d token(s):\n", decode_tokens);
        for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++)
            for (size_t si = 0; si < sizeof decode_shapes / sizeof decode_shapes[0]; si++) {
                if ((quick && si != 1) || strcmp(only, "prefill") == 0) continue;
                bench_decode(&formats[fi], &decode_shapes[si], bandwidth, 0);
            }
        if (strcmp(only, "prefill") != 0) {
            printf("decode, 1 token, from cache (256 x 1536, one copy):\n");
            const shape small = {"cached 256x1536", 256, 1536};
            for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) bench_decode(&formats[fi], &small, bandwidth, 1);
        }
        if (strcmp(only, "decode") != 0) printf("prefill, %d tokens:\n", PREFILL_TOKENS);
        for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++)
            for (size_t si = 0; si < sizeof prefill_shapes / sizeof prefill_shapes[0]; si++) {
                if ((quick && si != 1) || strcmp(only, "decode") == 0) continue;
                /* the 31B shape takes minutes without SIMD */
                if (level == CPU_ISA_SCALAR && prefill_shapes[si].cols > 8192) continue;
                bench_prefill(&formats[fi], &prefill_shapes[si], peak, PREFILL_TOKENS, product, product_label);
            }
    }
    return 0;
}
