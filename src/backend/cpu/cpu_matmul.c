/* Matrix multiplication over stored weights: picks the SIMD level, splits the
 * work over OpenMP threads and chooses between two shapes of loop:
 *
 *  decode (few tokens): memory bound. Each thread streams a run of rows and
 *  the per-ISA gemv decodes every weight byte once, with up to
 *  CPU_DECODE_TOKENS tokens in registers.
 *
 *  prefill (many tokens): compute bound. Tokens are packed into blocks of nr
 *  (x transposed, k-major), a tile of W (rows x TILE_COLS) is dequantised
 *  into float32 scratch that stays in cache and a register-tiled FMA
 *  micro-kernel runs it against every token block of a chunk. */
#include "backend/cpu/cpu_matmul.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

enum {
    TILE_ROW_TARGET = 64,    /* rows of W dequantised at once (rounded to mr) */
    TILE_COLS = 256,         /* columns of W dequantised at once (multiple of 32) */
    CHUNK_BLOCKS = 8,        /* token blocks of nr per work item (128 tokens on AVX2: each W tile
                              * converted once per 128 tokens, not 64; the bf16 tile conversion went
                              * from 8.8% to 5.4% of an E2B mlp-up prefill, issue 26) */
    PRECISE_CHUNK_BLOCKS = 16, /* the same for precise: fewer widenings of each W tile to double */
    DECODE_CHUNK_BYTES = 32768, /* weight bytes per decode work item */
    PACKED_X_CACHED = 8 << 20, /* packed tokens (bytes) that stay in the last-level cache */
    PANEL_COLS = 6144,       /* 4-bit decode of wider rows goes in column panels of about this many */
    SERIAL_WORK = 1 << 18,   /* multiply-adds (~10 us on one core) below which threads cost more than they give */
};

const cpu_kernel_table *cpu_kernels_for(cpu_isa level) {
#if defined(__x86_64__)
    if (level >= CPU_ISA_AVX512) return &cpu_kernels_avx512; /* VNNI adds only fast kernels (cpu_fast.h) */
    if (level == CPU_ISA_AVX2) return &cpu_kernels_avx2;
#endif
    (void)level;
    return &cpu_kernels_scalar;
}

int cpu_kernels_fast_layout(const g4_matrix *w) {
    if (w->format != G4_WEIGHT_AFFINE && w->format != G4_WEIGHT_MXFP4) return 1;
    if (w->group_size <= 0 || w->group_size % 32 != 0 || w->cols % w->group_size != 0) return 0;
    if (w->format == G4_WEIGHT_MXFP4) return w->bits == 4;
    return w->bits >= 2 && w->bits <= 8;
}

const char *cpu_isa_name(void) { return cpu_isa_level_name(cpu_isa_active()); }

/* Any layout the fast kernels refuse: dequantise rows with the reference
 * accessors and dot (float64 sums: this path is slow anyway, and so it also
 * serves cpu_matmul_precise). */
static void matmul_generic(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    const int64_t rows = w->rows, cols = w->cols;
#pragma omp parallel
    {
        float *row = malloc((size_t)cols * sizeof *row);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!row) continue;
            g4_matrix_rows_to_f32(w, r, 1, row);
            for (int64_t t = 0; t < n_tokens; t++) {
                const float *xt = x + t * cols;
                double acc = 0;
                for (int64_t c = 0; c < cols; c++) acc += (double)row[c] * (double)xt[c];
                out[t * rows + r] = (float)acc;
            }
        }
        free(row);
    }
}

static void *alloc_floats(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

void cpu_interleave_x(float *dst, const float *x, int64_t cols, int64_t wide_cols, int per_word, int lanes) {
    const int64_t block = (int64_t)per_word * lanes;
    for (int64_t b = 0; b < wide_cols; b += block)
        for (int s = 0; s < per_word; s++)
            for (int i = 0; i < lanes; i++) dst[b + s * lanes + i] = x[b + (int64_t)per_word * i + s];
    memcpy(dst + wide_cols, x + wide_cols, (size_t)(cols - wide_cols) * sizeof *dst);
}

/* Per-thread scratch for decode's small per-call arrays: grows, never shrinks,
 * so that the hot path does not allocate. A thread-specific key frees it when
 * its thread ends (engine threads come and go with their engines). */
typedef struct {
    float *data;
    size_t floats;
} decode_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void free_scratch(void *p) {
    decode_scratch *s = p;
    free(s->data);
    free(s);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

float *cpu_scratch_floats(size_t n) {
    pthread_once(&scratch_once, make_scratch_key);
    decode_scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->floats) {
        float *p = alloc_floats(n);
        if (!p) return NULL;
        free(s->data);
        s->data = p;
        s->floats = n;
    }
    return s->data;
}

/* One token against 4-bit rows much wider than L1 holds x for (the 31B's
 * 21504): each thread takes one run of rows and goes through it a column
 * panel at a time, so that the panel of x stays in L1 while the rows'
 * segments stream past. Measured on two Zen 5 cores: affine4 14 -> 20 GB/s,
 * mxfp4 13 -> 23 GB/s; the memory-bound formats (bf16, 8-bit) lost 5-25%
 * this way, so only 4-bit takes it. partial has room for all rows. */
static int wants_panels(const g4_matrix *w, int64_t n_tokens) {
    const int four_bit = w->format == G4_WEIGHT_MXFP4 || (w->format == G4_WEIGHT_AFFINE && w->bits == 4);
    return n_tokens == 1 && four_bit && w->cols >= 2 * PANEL_COLS;
}

static void decode_in_panels(const cpu_kernel_table *k, float *out, const float *x, const float *xsum,
                             const g4_matrix *w, float *partial, int threaded) {
    const int64_t rows = w->rows, cols = w->cols, gs = w->group_size;
    /* panels: whole 128-code blocks and whole groups (lcm(group size, 128)
     * columns: a group of 96 does not divide 128), about PANEL_COLS wide */
    int64_t unit = 128;
    while (unit % gs != 0) unit += 128;
    const int64_t n_panels = (cols + PANEL_COLS - 1) / PANEL_COLS;
    int64_t panel = (cols / n_panels + unit - 1) / unit * unit;
    if (panel <= 0 || panel > cols) panel = cols;
    const size_t param_bytes = w->format == G4_WEIGHT_MXFP4 ? 1 : g4_dtype_size(w->scale_dtype);
#pragma omp parallel if (threaded)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t r0 = rows * id / nt, r1 = rows * (id + 1) / nt;
        for (int64_t r = r0; r < r1; r++) out[r] = 0.0f;
        for (int64_t c0 = 0; c0 < cols && r0 < r1; c0 += panel) {
            g4_matrix v = *w;
            v.cols = cols - c0 < panel ? cols - c0 : panel;
            v.data = (const unsigned char *)w->data + c0 / 2;
            v.scales = (const unsigned char *)w->scales + (size_t)(c0 / gs) * param_bytes;
            if (w->biases) v.biases = (const unsigned char *)w->biases + (size_t)(c0 / gs) * param_bytes;
            cpu_gemv_args a = {
                .w = &v, .x = x + c0, .xsum = xsum ? xsum + c0 / gs : NULL, .n_tok = 1, .out = partial, .ldo = rows};
            k->gemv(&a, r0, r1);
            for (int64_t r = r0; r < r1; r++) out[r] += partial[r];
        }
    }
}

static void matmul_decode(const cpu_kernel_table *k, float *out, const float *x, int64_t n_tokens,
                          const g4_matrix *w) {
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t n_groups = w->format == G4_WEIGHT_AFFINE ? cols / w->group_size : 0;
    const int per_word = k->x_interleave(w);
    const int64_t wide_cols = per_word ? cpu_wide_cols(w, per_word, k->lanes) : 0;
    const size_t xsum_floats = (size_t)(n_tokens * n_groups);
    const int panels = wants_panels(w, n_tokens);
    const size_t x_floats = wide_cols ? (size_t)(n_tokens * cols) : 0;
    float *scratch = cpu_scratch_floats(xsum_floats + x_floats + (panels ? (size_t)rows : 0) + 1);
    if (!scratch) {
        matmul_generic(out, x, n_tokens, w);
        return;
    }
    float *xsum = n_groups ? scratch : NULL;
    for (int64_t t = 0; t < n_tokens && xsum; t++)
        for (int64_t g = 0; g < n_groups; g++) {
            const float *xg = x + t * cols + g * w->group_size;
            double s = 0;
            for (int i = 0; i < w->group_size; i++) s += xg[i];
            xsum[t * n_groups + g] = (float)s;
        }
    if (wide_cols) {
        float *xi = scratch + xsum_floats;
        for (int64_t t = 0; t < n_tokens; t++) cpu_interleave_x(xi + t * cols, x + t * cols, cols, wide_cols, per_word, k->lanes);
        x = xi;
    }
    const size_t bytes_per_row = w->row_bytes + 2 * w->scale_row_bytes;
    int64_t chunk_rows = (int64_t)(DECODE_CHUNK_BYTES / (bytes_per_row ? bytes_per_row : 1));
    if (chunk_rows < 1) chunk_rows = 1;
    const int64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
    const int threaded = n_chunks > 1 && rows * cols * n_tokens >= SERIAL_WORK;
    if (panels) {
        decode_in_panels(k, out, x, xsum, w, scratch + xsum_floats + x_floats, threaded);
        return;
    }
    /* guided: each thread starts on one long run of rows (a single stream the
     * prefetchers follow: twice the bandwidth of interleaved 32 KB chunks,
     * measured), and smaller runs at the end even out the finish */
#pragma omp parallel for schedule(guided) if (threaded)
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const int64_t r0 = ch * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
        for (int64_t t0 = 0; t0 < n_tokens; t0 += k->max_tok) {
            cpu_gemv_args a = {
                .w = w,
                .x = x + t0 * cols,
                .xsum = xsum ? xsum + t0 * n_groups : NULL,
                .n_tok = (int)(n_tokens - t0 < k->max_tok ? n_tokens - t0 : k->max_tok),
                .out = out + t0 * rows,
                .ldo = rows,
            };
            k->gemv(&a, r0, r1);
        }
    }
}

/* Tokens in block b: nr, or nr/2 for a last block that needs no more.
 * (Each token is a lane of the micro-kernels: the same sums in the same
 * order in either width, so its result does not depend on the block.) */
static int block_width(int64_t b, int64_t n_tokens, int nr) {
    const int64_t left = n_tokens - b * nr;
    return left <= nr / 2 ? nr / 2 : nr;
}

/* Block b of width wb at xp + b*cols*nr: xp[.. + c*wb + j] = x[b*nr + j][c],
 * zero past the last token. Called inside a parallel region. */
static void pack_tokens(float *xp, const float *x, int64_t n_tokens, int64_t cols, int nr, int64_t n_blocks) {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n_blocks; b++) {
        const int wb = block_width(b, n_tokens, nr);
        const int valid = (int)(n_tokens - b * nr < wb ? n_tokens - b * nr : wb);
        const float *xb = x + b * nr * cols;
        float *dst = xp + b * cols * nr;
        /* written in order; the wb rows of x are read side by side */
        for (int64_t c = 0; c < cols; c++) {
            for (int j = 0; j < valid; j++) dst[c * wb + j] = xb[j * cols + c];
            for (int j = valid; j < wb; j++) dst[c * wb + j] = 0.0f;
        }
    }
}

typedef void (*gemm_micro_fn)(const float *, int64_t, int64_t, const float *, float *, int64_t);

/* Precise prefill's inner step: the float32 W tile (n_rows x nc, row stride
 * TILE_COLS) widened into dtile (rows padded with zeros to f64_mr),
 * then float64 micro-kernels over every token block of the chunk into the
 * float64 accumulators. Products of two floats are exact in double, so the
 * only rounding left is the float64 sum's. */
static void tile_f64(const cpu_kernel_table *k, const float *tile, double *dtile, int64_t n_rows, int64_t nc,
                     const float *xp, int64_t cols, int64_t c0, int64_t b0, int64_t nb, int64_t n_tokens,
                     double *dacc, int64_t ldc) {
    const int64_t padded = (n_rows + k->f64_mr - 1) / k->f64_mr * k->f64_mr;
    for (int64_t i = 0; i < n_rows; i++) {
        const float *src = tile + i * TILE_COLS;
        double *dst = dtile + i * TILE_COLS;
        for (int64_t c = 0; c < nc; c++) dst[c] = (double)src[c];
    }
    for (int64_t i = n_rows; i < padded; i++) memset(dtile + i * TILE_COLS, 0, (size_t)nc * sizeof *dtile);
    for (int64_t b = 0; b < nb; b++) {
        const int wb = block_width(b0 + b, n_tokens, k->nr);
        const float *xb = xp + (b0 + b) * cols * k->nr + c0 * wb;
        for (int64_t i = 0; i < padded; i += k->f64_mr)
            for (int j = 0; j < wb; j += k->f64_nr)
                k->gemm_micro_f64(dtile + i * TILE_COLS, TILE_COLS, nc, xb + j, wb, dacc + i * ldc + b * k->nr + j,
                                  ldc);
    }
}

/* precise: W tiles widened to float64 and float64 sums throughout (see
 * tile_f64); otherwise float32 throughout. */
static void matmul_prefill(const cpu_kernel_table *k, float *out, const float *x, int64_t n_tokens,
                           const g4_matrix *w, int precise) {
    const int64_t rows = w->rows, cols = w->cols;
    const int mr = k->mr, nr = k->nr;
    const int64_t tile_rows = mr * (TILE_ROW_TARGET / mr);
    const int64_t n_blocks = (n_tokens + nr - 1) / nr;
    const int64_t chunk_blocks = precise ? PRECISE_CHUNK_BLOCKS : CHUNK_BLOCKS;
    const int64_t ldc = chunk_blocks * nr;
    const int64_t n_row_tiles = (rows + tile_rows - 1) / tile_rows;
    const int64_t n_chunks = (n_blocks + chunk_blocks - 1) / chunk_blocks;
    const int threaded = n_row_tiles * n_chunks > 1 && rows * cols * n_tokens >= SERIAL_WORK;
    const int chunk_major = (size_t)(n_blocks * cols * nr) * sizeof(float) > PACKED_X_CACHED;
    /* all scratch at once (packed tokens, then per thread a W tile, an
     * accumulator tile and -- precise -- the W tile in float64), so that a
     * failed allocation can still take a slower path rather than leave
     * outputs unwritten. Doubles take two floats; every part stays 8-byte
     * aligned (all sizes are even). */
    const size_t xp_floats = (size_t)(n_blocks * cols * nr);
    const size_t tile_floats = (size_t)(tile_rows * TILE_COLS);
    const size_t acc_floats = (size_t)(tile_rows * ldc) * (precise ? 2 : 1);
    const size_t per_thread = tile_floats + acc_floats + (precise ? 2 * tile_floats : 0);
    const int n_threads = threaded ? omp_get_max_threads() : 1;
    float *scratch = alloc_floats(xp_floats + (size_t)n_threads * per_thread);
    if (!scratch) {
        if (precise) matmul_generic(out, x, n_tokens, w);
        else matmul_decode(k, out, x, n_tokens, w);
        return;
    }
    float *xp = scratch;
#pragma omp parallel if (threaded) num_threads(n_threads)
    {
        pack_tokens(xp, x, n_tokens, cols, nr, n_blocks); /* ends with a barrier */
        float *tile = scratch + xp_floats + (size_t)omp_get_thread_num() * per_thread;
        float *acc = tile + tile_floats;
        double *dacc = (double *)acc, *dtile = (double *)(acc + acc_floats);
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_row_tiles * n_chunks; item++) {
            /* Neighbouring items share a row tile while the packed tokens stay in
             * cache; past that they share a token chunk, so that each chunk comes
             * from memory once rather than once per row tile. */
            const int64_t rt = chunk_major ? item % n_row_tiles : item / n_chunks;
            const int64_t chunk = chunk_major ? item / n_row_tiles : item % n_chunks;
            const int64_t r0 = rt * tile_rows, b0 = chunk * chunk_blocks;
            const int64_t n_rows = rows - r0 < tile_rows ? rows - r0 : tile_rows;
            const int64_t padded_rows = (n_rows + mr - 1) / mr * mr;
            const int64_t nb = n_blocks - b0 < chunk_blocks ? n_blocks - b0 : chunk_blocks;
            memset(acc, 0, (size_t)(tile_rows * ldc) * (precise ? sizeof *dacc : sizeof *acc));
            for (int64_t c0 = 0; c0 < cols; c0 += TILE_COLS) {
                const int64_t nc = cols - c0 < TILE_COLS ? cols - c0 : TILE_COLS;
                for (int64_t i = 0; i < n_rows; i++) k->dequant_row(w, r0 + i, c0, nc, tile + i * TILE_COLS);
                if (c0 + TILE_COLS < cols)
                    cpu_prefetch_tile(w, r0, n_rows, c0 + TILE_COLS,
                                      cols - c0 - TILE_COLS < TILE_COLS ? cols - c0 - TILE_COLS : TILE_COLS);
                if (precise) {
                    tile_f64(k, tile, dtile, n_rows, nc, xp, cols, c0, b0, nb, n_tokens, dacc, ldc);
                    continue;
                }
                for (int64_t i = n_rows; i < padded_rows; i++) memset(tile + i * TILE_COLS, 0, (size_t)nc * sizeof *tile);
                for (int64_t b = 0; b < nb; b++) {
                    const int wb = block_width(b0 + b, n_tokens, nr);
                    const float *xb = xp + (b0 + b) * cols * nr + c0 * wb;
                    gemm_micro_fn micro = wb == nr ? k->gemm_micro : k->gemm_micro_half;
                    for (int64_t i = 0; i < padded_rows; i += mr)
                        micro(tile + i * TILE_COLS, TILE_COLS, nc, xb, acc + i * ldc + b * nr, ldc);
                }
            }
            const int64_t t0 = b0 * nr, t1 = t0 + nb * nr < n_tokens ? t0 + nb * nr : n_tokens;
            if (!precise) {
                k->store_transposed(out + t0 * rows + r0, rows, acc, ldc, n_rows, t1 - t0);
                continue;
            }
            for (int64_t t = t0; t < t1; t++)
                for (int64_t i = 0; i < n_rows; i++) out[t * rows + r0 + i] = (float)dacc[i * ldc + (t - t0)];
        }
    }
    free(scratch);
}

static void matmul_entry(float *out, const float *x, int64_t n_tokens, const g4_matrix *w, int precise,
                         int invariant) {
    if (n_tokens <= 0 || w->rows <= 0) return;
    if (w->cols <= 0) {
        memset(out, 0, (size_t)(n_tokens * w->rows) * sizeof *out);
        return;
    }
    if (!cpu_kernels_fast_layout(w)) {
        matmul_generic(out, x, n_tokens, w);
        return;
    }
    const cpu_kernel_table *k = cpu_kernels_for(cpu_isa_active());
    if (!precise && !invariant && n_tokens < k->prefill_min_tokens) matmul_decode(k, out, x, n_tokens, w);
    else matmul_prefill(k, out, x, n_tokens, w, precise);
}

void cpu_matmul(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    matmul_entry(out, x, n_tokens, w, 0, 0);
}

void cpu_matmul_invariant(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    matmul_entry(out, x, n_tokens, w, 0, 1);
}

void cpu_matmul_precise(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    matmul_entry(out, x, n_tokens, w, 1, 0);
}

void cpu_matrix_row(const g4_matrix *w, int64_t r, float scale, float *out) {
    if (cpu_kernels_fast_layout(w)) cpu_kernels_for(cpu_isa_active())->dequant_row(w, r, 0, w->cols, out);
    else g4_matrix_rows_to_f32(w, r, 1, out);
    if (scale != 1.0f)
        for (int64_t c = 0; c < w->cols; c++) out[c] *= scale;
}
