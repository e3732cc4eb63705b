/* cpu_matmul and cpu_matrix_row against the reference (g4_matmul_reference,
 * float64 accumulation, and g4_matrix_get) for every weight format, at every
 * SIMD level this processor has, for decode and prefill token counts, odd
 * shapes, row views and expert views.
 *
 * Matrices are built here directly in their packed formats from a fixed-seed
 * PRNG, with realistic scales. Every buffer ends on a guard page, so a kernel
 * that reads one byte past a matrix faults; outputs are filled with NaN
 * before each call, so an element left unwritten fails. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_matmul.h"
#include "tensor/dtype.h"
#include "tensor/matrix.h"
#include "test_util.h"

/* Error bounds. A float32 dot product of n terms in blocked accumulation
 * errs by a few eps * sqrt(n) relative to ||w|| ||x||; these are a few times
 * the worst seen over the whole suite (printed with G4_TEST_VERBOSE=1). */
#define ELEMENT_TOL 1e-6 /* |out - ref| <= ELEMENT_TOL * ||w_r|| * ||x_t|| */
#define RMS_TOL 2e-6     /* ||out - ref|| / ||ref|| over outputs of RMS_MIN_COUNT or more */
enum { RMS_MIN_COUNT = 200 }; /* (one output near zero by chance makes a small one meaningless) */

/* decode kernels take up to 8 (AVX-512) or 4 (AVX2) tokens at once, and the
 * prefill path starts at 16 (AVX-512) or 8: 4, 7, 8, 15 and 16 cover the edges */
static const int token_counts[] = {1, 2, 3, 4, 7, 8, 15, 16, 64, 129};

/* The sanitizer build (G4_TEST_SANITIZED=1) leaves out the 250-row matrices
 * over 4096+ columns: the Release build checks their values, and every
 * kernel and tail runs on the smaller shapes too. */
static int sanitized(void) {
    const char *v = getenv("G4_TEST_SANITIZED");
    return v && !strcmp(v, "1");
}
enum { MAX_TOKENS = 129 };

/* ---- PRNG (splitmix64) ---- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)((rng_next() >> 40) * 0x1p-24); }

/* ---- buffers that end on a guard page ---- */
typedef struct {
    void *map;
    size_t map_bytes;
    unsigned char *data; /* `bytes` usable bytes ending at the guard page */
} guarded;

static unsigned char *guarded_alloc(guarded *g, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + page - 1) / page * page;
    g->map_bytes = body + page;
    g->map = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED) {
        fprintf(stderr, "mmap failed\n");
        exit(2);
    }
    mprotect((unsigned char *)g->map + body, page, PROT_NONE);
    g->data = (unsigned char *)g->map + body - bytes;
    return g->data;
}

static void guarded_free(guarded *g) {
    if (g->map) munmap(g->map, g->map_bytes);
    g->map = NULL;
}

/* ---- test matrices in packed form ---- */
typedef struct {
    g4_matrix m;
    guarded data, scales, biases;
    const char *label;
} test_matrix;

static void write_param(unsigned char *p, g4_dtype dt, int64_t i, float v) {
    if (dt == G4_DTYPE_F32) {
        memcpy(p + 4 * i, &v, 4);
    } else {
        uint16_t h = dt == G4_DTYPE_BF16 ? g4_f32_to_bf16(v) : g4_f32_to_f16(v);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* Appends `bits`-bit code q at element c of a little-endian bit-stream row. */
static void put_code(unsigned char *row, int bits, int64_t c, unsigned q) {
    uint64_t bit = (uint64_t)c * (uint64_t)bits;
    for (int i = 0; i < bits; i++, bit++)
        if (q >> i & 1u) row[bit / 8] |= (unsigned char)(1u << (bit % 8));
}

static void make_float_matrix(test_matrix *t, g4_weight_format f, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    size_t elem = f == G4_WEIGHT_F32 ? 4 : 2;
    t->m.format = f;
    t->m.rows = rows;
    t->m.cols = cols;
    t->m.row_bytes = (size_t)cols * elem;
    unsigned char *d = guarded_alloc(&t->data, (size_t)rows * t->m.row_bytes);
    for (int64_t i = 0; i < rows * cols; i++) {
        float v = rng_uniform(-0.08f, 0.08f);
        if (f == G4_WEIGHT_F32) write_param(d, G4_DTYPE_F32, i, v);
        else write_param(d, f == G4_WEIGHT_BF16 ? G4_DTYPE_BF16 : G4_DTYPE_F16, i, v);
    }
    t->m.data = d;
}

static void make_affine_matrix(test_matrix *t, int bits, int group, g4_dtype sdt, int64_t rows, int64_t cols) {
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
    memset(d, 0, (size_t)rows * t->m.row_bytes);
    const unsigned levels = 1u << bits;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) put_code(d + r * t->m.row_bytes, bits, c, (unsigned)(rng_next() % levels));
        for (int64_t g = 0; g < n_groups; g++) {
            /* as MLX quantises: the group's range split into 2^bits - 1 steps, bias near -range/2 */
            float range = rng_uniform(0.05f, 0.2f);
            float scale = range / (float)(levels - 1);
            float bias = -range * rng_uniform(0.35f, 0.65f);
            write_param(s, sdt, r * n_groups + g, scale);
            write_param(b, sdt, r * n_groups + g, bias);
        }
    }
    t->m.data = d;
    t->m.scales = s;
    t->m.biases = b;
}

static void make_mxfp4_matrix(test_matrix *t, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    t->m.format = G4_WEIGHT_MXFP4;
    t->m.rows = rows;
    t->m.cols = cols;
    t->m.bits = 4;
    t->m.group_size = 32;
    t->m.scale_dtype = G4_DTYPE_U8;
    t->m.row_bytes = (size_t)cols / 2;
    t->m.scale_row_bytes = (size_t)cols / 32;
    unsigned char *d = guarded_alloc(&t->data, (size_t)rows * t->m.row_bytes);
    unsigned char *s = guarded_alloc(&t->scales, (size_t)rows * t->m.scale_row_bytes);
    for (size_t i = 0; i < (size_t)rows * t->m.row_bytes; i++) d[i] = (unsigned char)rng_next();
    /* 2^-9 .. 2^-4: weights of magnitude up to ~0.4, as in gpt-oss style checkpoints */
    for (size_t i = 0; i < (size_t)rows * t->m.scale_row_bytes; i++) s[i] = (unsigned char)(118 + rng_next() % 6);
    t->m.data = d;
    t->m.scales = s;
}

static void free_matrix(test_matrix *t) {
    guarded_free(&t->data);
    guarded_free(&t->scales);
    guarded_free(&t->biases);
}

/* ---- checking ---- */
static double worst_element_seen, worst_rms_seen;

/* Compares out (n_tokens x rows of view v) with ref (x full) where v's row i
 * is row first + i of the full matrix full_rows wide. */
static int outputs_match(const float *out, const float *ref, const double *row_norm, const double *x_norm,
                         int64_t n_tokens, int64_t rows, int64_t first, int64_t full_rows, const char *what) {
    double num = 0, den = 0, worst = 0;
    int64_t worst_t = 0, worst_r = 0;
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t i = 0; i < rows; i++) {
            double o = out[t * rows + i], e = ref[t * full_rows + first + i];
            double d = fabs(o - e);
            if (isnan(o)) d = INFINITY;
            num += d * d;
            den += e * e;
            double rel = d / (row_norm[first + i] * x_norm[t]);
            if (!(rel <= worst)) {
                worst = rel;
                worst_t = t;
                worst_r = i;
            }
        }
    double rms = n_tokens * rows >= RMS_MIN_COUNT ? sqrt(num / den) : 0.0;
    if (worst > worst_element_seen) worst_element_seen = worst;
    if (rms > worst_rms_seen) worst_rms_seen = rms;
    int ok = worst <= ELEMENT_TOL && rms <= RMS_TOL;
    if (!ok)
        fprintf(stderr, "  %s: worst element (t=%lld, r=%lld) err %.3g of |w||x|, rel rms %.3g\n", what,
                (long long)worst_t, (long long)worst_r, worst, rms);
    return ok;
}

/* cpu_matmul_precise against float64 dot products of the same dequantised
 * weights (cpu_matrix_row; affine dequantisation may fuse scale * q + bias
 * into one rounding where the reference accessor does not): both are
 * float64 sums of exact products in different orders, so each output lies
 * within one float32 rounding of the other, plus 1e-12 |w||x| for the sums'
 * own rounding. */
static float *same_weights_reference(const g4_matrix *w, const float *x, int64_t n_tokens) {
    const int64_t rows = w->rows, cols = w->cols;
    float *row = malloc((size_t)cols * sizeof *row), *ref = malloc((size_t)(n_tokens * rows) * sizeof *ref);
    for (int64_t r = 0; r < rows; r++) {
        cpu_matrix_row(w, r, 1.0f, row);
        for (int64_t t = 0; t < n_tokens; t++) {
            double acc = 0;
            for (int64_t c = 0; c < cols; c++) acc += (double)row[c] * x[t * cols + c];
            ref[t * rows + r] = (float)acc;
        }
    }
    free(row);
    return ref;
}

static int precise_matches(const float *out, const float *ref, const double *row_norm, const double *x_norm,
                           int64_t n_tokens, int64_t rows, const char *what) {
    int ok = 1;
    for (int64_t t = 0; t < n_tokens && ok; t++)
        for (int64_t r = 0; r < rows; r++) {
            double o = out[t * rows + r], e = ref[t * rows + r];
            if (!(fabs(o - e) <= fabs(e) * 0x1p-23 + 1e-12 * row_norm[r] * x_norm[t])) {
                fprintf(stderr, "  %s: (t=%lld, r=%lld) %.9g, reference %.9g\n", what, (long long)t, (long long)r, o,
                        e);
                ok = 0;
                break;
            }
        }
    return ok;
}

static float *poisoned(size_t n) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

/* One matrix: reference once for MAX_TOKENS tokens, then every level and
 * token count, a row view, expert views and single-row dequantisation. */
static void check_matrix(test_matrix *t, const char *label) {
    const g4_matrix *w = &t->m;
    const int64_t rows = w->rows, cols = w->cols;
    float *x = malloc((size_t)(MAX_TOKENS * cols) * sizeof *x);
    for (int64_t i = 0; i < MAX_TOKENS * cols; i++) x[i] = rng_uniform(-1.0f, 1.0f);
    float *ref = malloc((size_t)(MAX_TOKENS * rows) * sizeof *ref);
    g4_matmul_reference(ref, x, MAX_TOKENS, w);

    double *row_norm = malloc((size_t)rows * sizeof *row_norm), *x_norm = malloc(MAX_TOKENS * sizeof *x_norm);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        g4_matrix_rows_to_f32(w, r, 1, row);
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += (double)row[c] * row[c];
        row_norm[r] = sqrt(s);
    }
    for (int64_t tk = 0; tk < MAX_TOKENS; tk++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++) s += (double)x[tk * cols + c] * x[tk * cols + c];
        x_norm[tk] = sqrt(s);
    }

    char what[256];
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        CHECK(cpu_isa_force((cpu_isa)level) == (cpu_isa)level, "forcing level %d", level);
        CHECK(strcmp(cpu_isa_name(), cpu_isa_level_name((cpu_isa)level)) == 0, "isa name %s", cpu_isa_name());
        const char *isa = cpu_isa_name();
        for (size_t k = 0; k < sizeof token_counts / sizeof token_counts[0]; k++) {
            const int64_t n = token_counts[k];
            float *out = poisoned((size_t)(n * rows));
            cpu_matmul(out, x, n, w);
            snprintf(what, sizeof what, "%s %lldx%lld %s n_tokens=%lld", label, (long long)rows, (long long)cols, isa,
                     (long long)n);
            CHECK(outputs_match(out, ref, row_norm, x_norm, n, rows, 0, rows, what), "%s", what);
            free(out);
        }

        /* the float64-accumulating variant the vision tower uses, against this
         * level's own dequantisation */
        static const int64_t precise_counts[] = {1, 15, 33}; /* a half block, one, a full block and a half */
        float *same_w_ref = same_weights_reference(w, x, 33);
        for (size_t k = 0; k < sizeof precise_counts / sizeof precise_counts[0]; k++) {
            const int64_t n = precise_counts[k];
            float *out = poisoned((size_t)(n * rows));
            cpu_matmul_precise(out, x, n, w);
            snprintf(what, sizeof what, "%s %lldx%lld %s precise n_tokens=%lld", label, (long long)rows,
                     (long long)cols, isa, (long long)n);
            CHECK(precise_matches(out, same_w_ref, row_norm, x_norm, n, rows, what), "%s", what);
            free(out);
        }
        free(same_w_ref);

        /* a row view from the middle */
        if (rows >= 3) {
            const int64_t first = 1, count = rows - 2;
            g4_matrix v = g4_matrix_rows(w, first, count);
            for (int pass = 0; pass < 2; pass++) {
                const int64_t n = pass ? 64 : 3;
                float *out = poisoned((size_t)(n * count));
                cpu_matmul(out, x, n, &v);
                snprintf(what, sizeof what, "%s %s rows view [%lld,+%lld) n_tokens=%lld", label, isa, (long long)first,
                         (long long)count, (long long)n);
                CHECK(outputs_match(out, ref, row_norm, x_norm, n, count, first, rows, what), "%s", what);
                free(out);
            }
        }

        /* experts stacked as in HF gate_up_proj: stride 2I, second half */
        if (rows >= 4 && rows % 2 == 0) {
            g4_expert_matrix e = {.all = *w, .n_experts = 2, .rows_per_expert = rows / 4,
                                  .expert_stride = rows / 2, .row_offset = rows / 4};
            for (int ex = 0; ex < e.n_experts; ex++) {
                g4_matrix v = g4_expert_view(&e, ex);
                const int64_t first = ex * e.expert_stride + e.row_offset;
                for (int pass = 0; pass < 2; pass++) {
                    const int64_t n = pass ? 129 : 1;
                    float *out = poisoned((size_t)(n * v.rows));
                    cpu_matmul(out, x, n, &v);
                    snprintf(what, sizeof what, "%s %s expert %d n_tokens=%lld", label, isa, ex, (long long)n);
                    CHECK(outputs_match(out, ref, row_norm, x_norm, n, v.rows, first, rows, what), "%s", what);
                    free(out);
                }
            }
        }

        /* single rows (embedding lookup), scaled */
        const int64_t probe_rows[3] = {0, rows / 2, rows - 1};
        for (int pr = 0; pr < 3; pr++) {
            const int64_t r = probe_rows[pr];
            const float scale = pr == 1 ? 1.0f : 39.191835f; /* sqrt(1536) as Gemma scales embeddings */
            float *out = poisoned((size_t)cols);
            cpu_matrix_row(w, r, scale, out);
            int64_t bad = -1;
            for (int64_t c = 0; c < cols && bad < 0; c++) {
                float e = g4_matrix_get(w, r, c) * scale;
                /* AFFINE may fuse scale*q + bias into one rounding: allow an ulp of each part */
                double tol = 0;
                if (w->format == G4_WEIGHT_AFFINE) {
                    int64_t g = c / w->group_size;
                    float b = g4_load_as_f32((const unsigned char *)w->biases + r * w->scale_row_bytes, w->scale_dtype,
                                             (size_t)g);
                    tol = 2.5e-7 * (fabs(e) + 2.0 * fabs(b) * scale);
                }
                if (!(fabs((double)out[c] - e) <= tol)) bad = c;
            }
            snprintf(what, sizeof what, "%s %s cpu_matrix_row(%lld)", label, isa, (long long)r);
            CHECK(bad < 0, "%s: column %lld differs", what, (long long)bad);
            free(out);
        }
    }
    cpu_isa_force(cpu_isa_supported());
    free(x);
    free(ref);
    free(row_norm);
    free(x_norm);
    free(row);
}

static const int64_t row_counts[] = {1, 3, 17, 250};

static void test_float_formats(void) {
    const g4_weight_format formats[] = {G4_WEIGHT_F32, G4_WEIGHT_BF16, G4_WEIGHT_F16};
    /* any column count: vector tails included */
    const int64_t col_counts[] = {1, 7, 32, 33, 250, 4096 + 64 + 5};
    char label[64];
    for (int f = 0; f < 3; f++)
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 6; ci++) {
                if (row_counts[ri] == 250 && col_counts[ci] < 250) continue;
                if (sanitized() && row_counts[ri] == 250 && col_counts[ci] > 4096) continue;
                test_matrix t;
                make_float_matrix(&t, formats[f], row_counts[ri], col_counts[ci]);
                snprintf(label, sizeof label, "%s", g4_weight_format_name(formats[f]));
                check_matrix(&t, label);
                free_matrix(&t);
            }
}

static void test_affine(void) {
    const int bit_counts[] = {2, 3, 4, 5, 6, 8};
    const int groups[] = {32, 64, 128};
    const g4_dtype dtypes[] = {G4_DTYPE_BF16, G4_DTYPE_F16, G4_DTYPE_F32};
    char label[64];
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int di = 0; di < 3; di++) {
                const int g = groups[gi];
                /* shapes: one group, a few groups, 4096 + a group wide, and more
                 * groups than the kernels convert parameters for at once (256;
                 * from group 64 on also wide enough for decode in column panels) */
                const int64_t shapes[5][2] = {{1, g}, {3, 4096 + g}, {17, 3 * g}, {2, 259 * g}, {250, 4096 + g}};
                for (int s = 0; s < (sanitized() ? 4 : 5); s++) {
                    /* the largest shape: every group size with bf16 parameters (as MLX
                     * stores them), the others at group 64 only, to keep the run short */
                    if (s == 3 && dtypes[di] != G4_DTYPE_BF16 && g != 64) continue;
                    test_matrix t;
                    make_affine_matrix(&t, bit_counts[bi], g, dtypes[di], shapes[s][0], shapes[s][1]);
                    snprintf(label, sizeof label, "affine%d g%d %s", bit_counts[bi], g, g4_dtype_name(dtypes[di]));
                    check_matrix(&t, label);
                    free_matrix(&t);
                }
            }
}

/* Group sizes MLX does not use but the format allows: 256 (several 128-code
 * blocks under one scale) and 96 (groups that do not tile 128-code blocks). */
static void test_affine_other_groups(void) {
    const int bit_counts[] = {3, 4, 8};
    const int groups[] = {96, 256};
    char label[64];
    for (int bi = 0; bi < 3; bi++)
        for (int gi = 0; gi < 2; gi++) {
            const int g = groups[gi];
            /* the last two decode one token in column panels; 200 groups of 96
             * put a panel edge inside a group unless panels are lcm(96, 128) wide */
            const int64_t shapes[4][2] = {{3, 43 * g}, {17, g}, {2, 259 * g}, {1, 200 * g}};
            for (int s = 0; s < 4; s++) {
                test_matrix t;
                make_affine_matrix(&t, bit_counts[bi], g, G4_DTYPE_BF16, shapes[s][0], shapes[s][1]);
                snprintf(label, sizeof label, "affine%d g%d bf16", bit_counts[bi], g);
                check_matrix(&t, label);
                free_matrix(&t);
            }
        }
}

static void test_mxfp4(void) {
    /* the last is wide enough for one-token decode in column panels */
    const int64_t shapes[7][2] = {{1, 32},      {3, 4096 + 64}, {17, 96},       {250, 4096 + 64},
                                  {2, 4096 + 32}, {2, 259 * 32}, {3, 12800 + 64}};
    for (int s = 0; s < 7; s++) {
        if (sanitized() && shapes[s][0] == 250) continue;
        test_matrix t;
        make_mxfp4_matrix(&t, shapes[s][0], shapes[s][1]);
        check_matrix(&t, "mxfp4");
        free_matrix(&t);
    }
}

/* A group size the fast kernels do not take (16) goes the generic way. */
static void test_generic_layout(void) {
    test_matrix t;
    make_affine_matrix(&t, 4, 16, G4_DTYPE_BF16, 17, 48);
    check_matrix(&t, "affine4 g16 (generic path)");
    free_matrix(&t);
}

/* Special E8M0 scales: 0 (2^-127, subnormal products) and 254 (2^127). */
static void test_mxfp4_extreme_scales(void) {
    test_matrix t;
    make_mxfp4_matrix(&t, 4, 64);
    unsigned char *s = (unsigned char *)t.m.scales;
    s[0] = 0;   /* row 0 group 0 */
    s[3] = 200; /* row 1 group 1 */
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        cpu_isa_force((cpu_isa)level);
        float out[64];
        for (int r = 0; r < 4; r++) {
            cpu_matrix_row(&t.m, r, 1.0f, out);
            int same = 1;
            for (int c = 0; c < 64; c++) same &= out[c] == g4_matrix_get(&t.m, r, c);
            CHECK(same, "mxfp4 extreme scales %s row %d", cpu_isa_name(), r);
        }
    }
    cpu_isa_force(cpu_isa_supported());
    free_matrix(&t);
}

/* Every MXFP4 weight is a bf16 value: E2M1 has at most two significant bits
 * and E8M0 is a power of two (subnormal products included). The CUDA
 * prefill relies on it to multiply MXFP4 weights without a lo part. Every
 * scale byte but NaN's (one row each), every code (twice per row). */
static void test_mxfp4_values_are_bf16(void) {
    test_matrix t;
    make_mxfp4_matrix(&t, 255, 32);
    unsigned char *d = (unsigned char *)t.m.data, *s = (unsigned char *)t.m.scales;
    for (int r = 0; r < 255; r++) {
        s[r] = (unsigned char)r;
        for (int b = 0; b < 16; b++) d[r * 16 + b] = (unsigned char)((2 * b) % 16 | ((2 * b + 1) % 16) << 4);
    }
    int inexact = 0, checked = 0;
    for (int r = 0; r < 255; r++)
        for (int c = 0; c < 32; c++) {
            const float v = g4_matrix_get(&t.m, r, c), rounded = g4_round_bf16(v);
            inexact += memcmp(&v, &rounded, sizeof v) != 0;
            checked++;
        }
    CHECK(checked == 255 * 32 && inexact == 0, "mxfp4: %d of %d decoded weights are not bf16 values", inexact, checked);
    free_matrix(&t);
}

/* cpu_matmul_precise over more tokens than one work item holds (512 on
 * AVX-512), at every level, against float64 dot products of the same
 * weights. */
static void test_precise_many_tokens(void) {
    test_matrix t;
    make_affine_matrix(&t, 4, 64, G4_DTYPE_BF16, 70, 384);
    const g4_matrix *w = &t.m;
    const int64_t n = 1100, rows = w->rows, cols = w->cols;
    float *x = malloc((size_t)(n * cols) * sizeof *x), *out = malloc((size_t)(n * rows) * sizeof *out);
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_uniform(-1.0f, 1.0f);
    double *row_norm = malloc((size_t)rows * sizeof *row_norm), *x_norm = malloc((size_t)n * sizeof *x_norm);
    for (int64_t r = 0; r < rows; r++) row_norm[r] = 1.0;
    for (int64_t k = 0; k < n; k++) x_norm[k] = 1.0;
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        cpu_isa_force((cpu_isa)level);
        float *ref = same_weights_reference(w, x, n);
        for (int64_t i = 0; i < n * rows; i++) out[i] = NAN;
        cpu_matmul_precise(out, x, n, w);
        char what[96];
        snprintf(what, sizeof what, "affine4 g64 70x384 %s precise n_tokens=%lld", cpu_isa_name(), (long long)n);
        CHECK(precise_matches(out, ref, row_norm, x_norm, n, rows, what), "%s", what);
        free(ref);
    }
    cpu_isa_force(cpu_isa_supported());
    free(x), free(out), free(row_norm), free(x_norm);
    free_matrix(&t);
}

/* Each level's prefill store puts acc[i * ldc + t] at out[t * ldo + i]
 * bit for bit, for edges of every size against its 8 x 8 blocks, and writes
 * nothing outside the n_rows x n_tok it is given. */
static void test_store_transposed(void) {
    const int64_t row_counts_st[] = {1, 7, 8, 9, 64, 67}, tok_counts[] = {1, 7, 8, 16, 19, 128};
    for (int level = CPU_ISA_SCALAR; level <= (int)cpu_isa_supported(); level++) {
        const cpu_kernel_table *k = cpu_kernels_for((cpu_isa)level);
        int bad = 0, outside = 0;
        for (size_t a = 0; a < sizeof row_counts_st / sizeof row_counts_st[0]; a++)
            for (size_t b = 0; b < sizeof tok_counts / sizeof tok_counts[0]; b++) {
                const int64_t n_rows = row_counts_st[a], n_tok = tok_counts[b];
                const int64_t ldc = n_tok + 5, ldo = n_rows + 3;
                float *acc = malloc((size_t)(n_rows * ldc) * sizeof *acc);
                float *out = malloc((size_t)(n_tok * ldo) * sizeof *out);
                for (int64_t i = 0; i < n_rows * ldc; i++) acc[i] = rng_uniform(-1.0f, 1.0f);
                for (int64_t i = 0; i < n_tok * ldo; i++) out[i] = NAN;
                k->store_transposed(out, ldo, acc, ldc, n_rows, n_tok);
                for (int64_t t = 0; t < n_tok; t++)
                    for (int64_t i = 0; i < ldo; i++) {
                        const float o = out[t * ldo + i];
                        if (i < n_rows) bad += memcmp(&o, &acc[i * ldc + t], sizeof o) != 0;
                        else outside += !isnan(o);
                    }
                free(acc), free(out);
            }
        CHECK(bad == 0 && outside == 0, "store_transposed at %s: %d values wrong, %d written outside",
              cpu_isa_level_name((cpu_isa)level), bad, outside);
    }
}

int main(int argc, char **argv) {
    /* Hundreds of small matmuls with serial reference work between them:
     * libgomp's idle threads would spin through all of it, which on a shared
     * machine takes the cores the test needs. libgomp reads OMP_WAIT_POLICY
     * when it loads, so set it and start again. */
    if (!getenv("OMP_WAIT_POLICY") && argc > 0) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
    }
    printf("cpu_matmul: supported level %s\n", cpu_isa_level_name(cpu_isa_supported()));
    test_store_transposed();
    test_float_formats();
    test_mxfp4();
    test_mxfp4_extreme_scales();
    test_mxfp4_values_are_bf16();
    test_generic_layout();
    test_affine();
    test_affine_other_groups();
    test_precise_many_tokens();
    const char *verbose = getenv("G4_TEST_VERBOSE");
    if (verbose && *verbose == '1')
        printf("worst element error %.3g of |w||x|, worst rel rms %.3g\n", worst_element_seen, worst_rms_seen);
    return test_finish();
}
