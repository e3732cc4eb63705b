/* The fast products (see cpu_fast.h for the arithmetic): activations rounded
 * to bf16 or quantised to int8, then the per-ISA dot-product kernels.
 *
 *  decode (few tokens), int8: each thread streams a run of rows; the kernel
 *  decodes each weight byte once against up to 8 quantised tokens.
 *
 *  prefill: tokens packed into blocks of nr (pairs of bf16 or fours of int8
 *  along k, the operand layout of vdpbf16ps / vpdpbusd), a tile of W
 *  (rows x TILE_COLS) copied as bf16 or as one byte per code into scratch
 *  that stays in L1/L2, and a register-tiled micro-kernel over every token
 *  block of a chunk. Work items (row tile x token chunk) are handed out one
 *  at a time, so that both threads stay busy to the end.
 *
 * Anything the level has no kernel for goes to cpu_matmul (float32). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_matmul.h"

enum {
    TILE_ROW_TARGET = 64,       /* rows of W copied at once (rounded to mr) */
    TILE_COLS = 256,            /* columns of W copied at once (rounded to the group size) */
    CHUNK_TOKENS = 128,         /* tokens per work item (each tile of W is decoded once per item) */
    DECODE_CHUNK_BYTES = 32768, /* weight bytes per decode work item */
    PACKED_X_CACHED = 4 << 20,  /* packed tokens (bytes) that stay in the last-level cache */
    SERIAL_WORK = 1 << 18,      /* multiply-adds below which threads cost more than they give */
};

const cpu_fast_table *cpu_fast_for(cpu_isa level) {
#if defined(__x86_64__)
    if (level == CPU_ISA_AVX512_VNNI) return &cpu_fast_avx512vnni;
    if (level >= CPU_ISA_AVX2) return &cpu_fast_avx2; /* (AVX-512 without VNNI too) */
#endif
    (void)level;
    return &cpu_fast_scalar;
}

static int takes_q8(const cpu_fast_table *f, const g4_matrix *w) {
    return f->q8_gemv && w->format == G4_WEIGHT_AFFINE && (w->bits == 4 || w->bits == 8) && w->group_size > 0 &&
           w->group_size % 32 == 0 && w->cols % w->group_size == 0 && w->scales && w->biases;
}

static int takes_bf16(const cpu_fast_table *f, const g4_matrix *w) {
    return f->bf16_micro && w->format == G4_WEIGHT_BF16 && w->cols % 2 == 0;
}

/* Round to nearest even without a libm call (nearbyintf is one without
 * SSE4.1): adding and subtracting 1.5 * 2^23 leaves the integer part, exact
 * for |v| < 2^22 (here |v| <= 127). The build never uses -ffast-math, which
 * could fold the pair away (test_cpu_fast would see it). */
static float round_even(float v) {
    const float magic = 12582912.0f;
    return (v + magic) - magic;
}

void cpu_quantize_token_q8(const float *x, int64_t cols, int block, int8_t *q, float *d, float *sum) {
    for (int64_t b = 0; b < cols / block; b++) {
        const float *xb = x + b * block;
        float amax = 0.0f;
        for (int i = 0; i < block; i++) {
            const float a = fabsf(xb[i]);
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < block; i++) {
            float v = round_even(xb[i] * inv);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[b * block + i] = (int8_t)v;
            s += (int32_t)v;
        }
        d[b] = scale;
        sum[b] = scale * (float)s;
    }
}

void cpu_quantize_q8(const float *x, int64_t n_tokens, int64_t cols, int block, int8_t *q, float *d, float *sum) {
    const int64_t n_blocks = cols / block;
    for (int64_t t = 0; t < n_tokens; t++)
        cpu_quantize_token_q8(x + t * cols, cols, block, q + t * cols, d + t * n_blocks, sum + t * n_blocks);
}

static void *alloc_bytes(size_t n) {
    size_t bytes = (n + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* ---- decode ---- */

void cpu_split_nibble_order(int8_t *q, int64_t cols) {
    int8_t tmp[64];
    for (int64_t c = 0; c < cols; c += 64) {
        for (int j = 0; j < 32; j++) tmp[j] = q[c + 2 * j], tmp[32 + j] = q[c + 2 * j + 1];
        memcpy(q + c, tmp, sizeof tmp);
    }
}

static int q8_decode(const cpu_fast_table *f, float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    const int64_t rows = w->rows, cols = w->cols, gs = w->group_size, n_blocks = cols / gs;
    const size_t q_floats = ((size_t)(n_tokens * cols) + 3) / 4;
    float *scratch = cpu_scratch_floats(q_floats + 2 * (size_t)(n_tokens * n_blocks));
    if (!scratch) return 0;
    int8_t *q = (int8_t *)scratch;
    float *d = scratch + q_floats, *sum = d + n_tokens * n_blocks;
    const int split = f->q8_split_nibbles && w->bits == 4 && gs % 64 == 0;
    for (int64_t t = 0; t < n_tokens; t++) {
        f->quantize_q8(x + t * cols, cols, (int)gs, q + t * cols, d + t * n_blocks, sum + t * n_blocks);
        if (split) cpu_split_nibble_order(q + t * cols, cols);
    }
    const size_t bytes_per_row = w->row_bytes + 2 * w->scale_row_bytes;
    int64_t chunk_rows = (int64_t)(DECODE_CHUNK_BYTES / bytes_per_row);
    if (chunk_rows < 1) chunk_rows = 1;
    const int64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
    const int threaded = n_chunks > 1 && rows * cols * n_tokens >= SERIAL_WORK;
    /* guided: one long run of rows per thread first (see cpu_matmul.c) */
#pragma omp parallel for schedule(guided) if (threaded)
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const int64_t r0 = ch * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
        for (int64_t t0 = 0; t0 < n_tokens; t0 += CPU_DECODE_TOKENS) {
            cpu_q8_gemv_args a = {
                .w = w,
                .x = {.q = q + t0 * cols, .d = d + t0 * n_blocks, .sum = sum + t0 * n_blocks, .cols = cols,
                      .n_blocks = n_blocks, .block = (int)gs},
                .n_tok = (int)(n_tokens - t0 < CPU_DECODE_TOKENS ? n_tokens - t0 : CPU_DECODE_TOKENS),
                .out = out + t0 * rows,
                .ldo = rows,
            };
            f->q8_gemv(&a, r0, r1);
        }
    }
    return 1;
}

/* ---- prefill ---- */

/* Tokens in block b: nr, or nr/2 for a last block that needs no more. */
static int block_width(int64_t b, int64_t n_tokens, int nr) {
    const int64_t left = n_tokens - b * nr;
    return left <= nr / 2 ? nr / 2 : nr;
}

static int block_valid(int64_t b, int64_t n_tokens, int nr, int wb) {
    const int64_t left = n_tokens - b * nr;
    return (int)(left < wb ? left : wb);
}

/* The shape of one prefill: row tiles x token chunks, and the order of the
 * work items. */
typedef struct {
    int64_t rows, cols, n_tokens;
    int mr, nr;
    int64_t tile_rows, tile_cols, n_blocks, chunk_blocks, n_row_tiles, n_chunks, ldc;
    int chunk_major, threaded;
} prefill_shape;

static prefill_shape make_shape(const g4_matrix *w, int64_t n_tokens, int mr, int nr, int64_t tile_cols,
                                size_t packed_bytes) {
    prefill_shape s;
    s.rows = w->rows;
    s.cols = w->cols;
    s.n_tokens = n_tokens;
    s.mr = mr;
    s.nr = nr;
    s.tile_rows = mr * (TILE_ROW_TARGET / mr);
    s.tile_cols = tile_cols;
    s.n_blocks = (n_tokens + nr - 1) / nr;
    s.n_row_tiles = (s.rows + s.tile_rows - 1) / s.tile_rows;
    s.chunk_blocks = CHUNK_TOKENS / nr > 1 ? CHUNK_TOKENS / nr : 1;
    s.n_chunks = (s.n_blocks + s.chunk_blocks - 1) / s.chunk_blocks;
    s.ldc = s.chunk_blocks * nr;
    s.chunk_major = packed_bytes > PACKED_X_CACHED;
    s.threaded = s.n_row_tiles * s.n_chunks > 1 && s.rows * s.cols * n_tokens >= SERIAL_WORK;
    return s;
}

/* Work item -> (first row, first block, rows, blocks). Neighbouring items
 * share a row tile while the packed tokens stay in cache; past that they
 * share a token chunk, so that each chunk comes from memory once. */
static void item_range(const prefill_shape *s, int64_t item, int64_t *r0, int64_t *b0, int64_t *n_rows,
                       int64_t *nb) {
    const int64_t rt = s->chunk_major ? item % s->n_row_tiles : item / s->n_chunks;
    const int64_t chunk = s->chunk_major ? item / s->n_row_tiles : item % s->n_chunks;
    *r0 = rt * s->tile_rows;
    *b0 = chunk * s->chunk_blocks;
    *n_rows = s->rows - *r0 < s->tile_rows ? s->rows - *r0 : s->tile_rows;
    *nb = s->n_blocks - *b0 < s->chunk_blocks ? s->n_blocks - *b0 : s->chunk_blocks;
}

static void store_item(const prefill_shape *s, float *out, const float *acc, int64_t r0, int64_t b0, int64_t n_rows,
                       int64_t nb) {
    const int64_t t0 = b0 * s->nr, t1 = t0 + nb * s->nr < s->n_tokens ? t0 + nb * s->nr : s->n_tokens;
    cpu_kernels_for(cpu_isa_active())->store_transposed(out + t0 * s->rows + r0, s->rows, acc, s->ldc, n_rows, t1 - t0);
}

/* Block b of x as bf16 pairs along k: dst[(k/2)*2*wb + 2*j + k%2] =
 * x[b*nr + j][k]. Each token's row is rounded in one pass into row (cols
 * bf16), then its pairs go out as 32-bit words. */
static void pack_bf16_block(const cpu_fast_table *f, uint16_t *dst, uint16_t *row, const float *x,
                            const prefill_shape *s, int64_t b) {
    const int wb = block_width(b, s->n_tokens, s->nr), valid = block_valid(b, s->n_tokens, s->nr, wb);
    const float *xb = x + b * s->nr * s->cols;
    for (int j = 0; j < wb; j++) {
        if (j < valid && f->to_bf16) {
            f->to_bf16(xb + j * s->cols, s->cols, row);
        } else {
            for (int64_t k = 0; k < s->cols; k++) row[k] = j < valid ? g4_f32_to_bf16(xb[j * s->cols + k]) : 0;
        }
        for (int64_t k2 = 0; k2 < s->cols / 2; k2++) memcpy(dst + (k2 * wb + j) * 2, row + 2 * k2, 4);
    }
}

static int bf16_prefill(const cpu_fast_table *f, float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    const prefill_shape s = make_shape(w, n_tokens, f->bf16_mr, f->bf16_nr, TILE_COLS,
                                       (size_t)(((n_tokens + f->bf16_nr - 1) / f->bf16_nr) * w->cols * f->bf16_nr) * 2);
    const size_t xp_bytes = (size_t)(s.n_blocks * s.cols * s.nr) * sizeof(uint16_t);
    /* (the tile also holds one token's row while the tokens are packed) */
    size_t tile_bytes = (size_t)(s.tile_rows * s.tile_cols) * sizeof(uint16_t);
    if (tile_bytes < (size_t)s.cols * sizeof(uint16_t)) tile_bytes = ((size_t)s.cols * sizeof(uint16_t) + 63) & ~(size_t)63;
    const size_t acc_bytes = (size_t)(s.tile_rows * s.ldc) * sizeof(float);
    const int n_threads = s.threaded ? omp_get_max_threads() : 1;
    const size_t per_thread = tile_bytes + acc_bytes;
    unsigned char *scratch = alloc_bytes(xp_bytes + (size_t)n_threads * per_thread);
    if (!scratch) return 0;
    uint16_t *xp = (uint16_t *)scratch;
#pragma omp parallel if (s.threaded) num_threads(n_threads)
    {
        uint16_t *tile = (uint16_t *)(scratch + xp_bytes + (size_t)omp_get_thread_num() * per_thread);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < s.n_blocks; b++) pack_bf16_block(f, xp + b * s.cols * s.nr, tile, x, &s, b);
        float *acc = (float *)((unsigned char *)tile + tile_bytes);
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < s.n_row_tiles * s.n_chunks; item++) {
            int64_t r0, b0, n_rows, nb;
            item_range(&s, item, &r0, &b0, &n_rows, &nb);
            const int64_t padded = (n_rows + s.mr - 1) / s.mr * s.mr;
            memset(acc, 0, acc_bytes);
            for (int64_t c0 = 0; c0 < s.cols; c0 += s.tile_cols) {
                const int64_t nc = s.cols - c0 < s.tile_cols ? s.cols - c0 : s.tile_cols;
                /* copied: weight rows need not be 2-byte aligned, and the last
                 * rows of a tile are padded with zeros to mr */
                for (int64_t i = 0; i < n_rows; i++)
                    memcpy(tile + i * s.tile_cols, (const unsigned char *)w->data + (size_t)(r0 + i) * w->row_bytes + c0 * 2,
                           (size_t)nc * 2);
                for (int64_t i = n_rows; i < padded; i++) memset(tile + i * s.tile_cols, 0, (size_t)nc * 2);
                if (c0 + s.tile_cols < s.cols)
                    cpu_prefetch_tile(w, r0, n_rows, c0 + s.tile_cols,
                                      s.cols - c0 - s.tile_cols < s.tile_cols ? s.cols - c0 - s.tile_cols : s.tile_cols);
                for (int64_t b = 0; b < nb; b++) {
                    const int wb = block_width(b0 + b, n_tokens, s.nr);
                    const uint16_t *xb = xp + (b0 + b) * s.cols * s.nr + c0 * wb;
                    for (int64_t i = 0; i < padded; i += s.mr) {
                        if (wb == s.nr) f->bf16_micro(tile + i * s.tile_cols, s.tile_cols, nc, xb, acc + i * s.ldc + b * s.nr, s.ldc);
                        else f->bf16_micro_half(tile + i * s.tile_cols, s.tile_cols, nc, xb, acc + i * s.ldc + b * s.nr, s.ldc);
                    }
                }
            }
            store_item(&s, out, acc, r0, b0, n_rows, nb);
        }
    }
    free(scratch);
    return 1;
}

/* Block b of quantised x in fours along k: dst[(k/4)*4*wb + 4*j + k%4]; its
 * scales and sums as dd[g*wb + j], ds[g*wb + j]; zero past the last token. */
static void pack_q8_block(int8_t *dst, float *dd, float *ds, const int8_t *q, const float *d, const float *sum,
                          const prefill_shape *s, int64_t n_groups, int64_t b) {
    const int wb = block_width(b, s->n_tokens, s->nr), valid = block_valid(b, s->n_tokens, s->nr, wb);
    const int64_t t0 = b * s->nr;
    for (int64_t k = 0; k < s->cols; k += 4) {
        int8_t *o = dst + k * wb;
        for (int j = 0; j < valid; j++) memcpy(o + 4 * j, q + (t0 + j) * s->cols + k, 4);
        memset(o + 4 * valid, 0, (size_t)(4 * (wb - valid)));
    }
    for (int64_t g = 0; g < n_groups; g++)
        for (int j = 0; j < wb; j++) {
            dd[g * wb + j] = j < valid ? d[(t0 + j) * n_groups + g] : 0.0f;
            ds[g * wb + j] = j < valid ? sum[(t0 + j) * n_groups + g] : 0.0f;
        }
}

static int q8_prefill(const cpu_fast_table *f, float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    const int64_t gs = w->group_size, n_groups = w->cols / gs;
    const int64_t tile_cols = gs >= TILE_COLS ? gs : TILE_COLS / gs * gs;
    const int nr = f->q8_nr;
    const int64_t n_blocks = (n_tokens + nr - 1) / nr;
    const prefill_shape s = make_shape(w, n_tokens, f->q8_mr, nr, tile_cols, (size_t)(n_blocks * w->cols * nr));
    const int64_t tile_groups = tile_cols / gs;
    /* scratch: quantised x, its packed copy, their scales and sums; per
     * thread a code tile, its parameters and the accumulators */
    const size_t q_bytes = (size_t)(n_tokens * s.cols), xp_bytes = (size_t)(s.n_blocks * s.cols * s.nr);
    const size_t dq_bytes = (size_t)(n_tokens * n_groups) * sizeof(float);
    const size_t dp_bytes = (size_t)(s.n_blocks * n_groups * s.nr) * sizeof(float);
    const size_t shared = ((q_bytes + 63) & ~(size_t)63) + ((xp_bytes + 63) & ~(size_t)63) + 2 * dq_bytes + 2 * dp_bytes;
    const size_t tile_bytes = (size_t)(s.tile_rows * tile_cols);
    const size_t param_bytes = (size_t)(s.tile_rows * tile_groups) * sizeof(float);
    const size_t acc_bytes = (size_t)(s.tile_rows * s.ldc) * sizeof(float);
    const size_t per_thread = ((tile_bytes + 63) & ~(size_t)63) + 2 * param_bytes + acc_bytes;
    const int n_threads = s.threaded ? omp_get_max_threads() : 1;
    unsigned char *scratch = alloc_bytes(shared + (size_t)n_threads * per_thread);
    if (!scratch) return 0;
    int8_t *q = (int8_t *)scratch;
    int8_t *xp = (int8_t *)(scratch + ((q_bytes + 63) & ~(size_t)63));
    float *d = (float *)((unsigned char *)xp + ((xp_bytes + 63) & ~(size_t)63));
    float *sum = d + n_tokens * n_groups;
    float *dp = sum + n_tokens * n_groups, *sp = dp + s.n_blocks * n_groups * s.nr;
#pragma omp parallel if (s.threaded) num_threads(n_threads)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n_tokens; t++)
            f->quantize_q8(x + t * s.cols, s.cols, (int)gs, q + t * s.cols, d + t * n_groups, sum + t * n_groups);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < s.n_blocks; b++)
            pack_q8_block(xp + b * s.cols * s.nr, dp + b * n_groups * s.nr, sp + b * n_groups * s.nr, q, d, sum, &s,
                          n_groups, b);
        unsigned char *mine = scratch + shared + (size_t)omp_get_thread_num() * per_thread;
        uint8_t *codes = mine;
        float *scale = (float *)(mine + ((tile_bytes + 63) & ~(size_t)63)), *bias = scale + s.tile_rows * tile_groups;
        float *acc = bias + s.tile_rows * tile_groups;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < s.n_row_tiles * s.n_chunks; item++) {
            int64_t r0, b0, n_rows, nb;
            item_range(&s, item, &r0, &b0, &n_rows, &nb);
            const int64_t padded = (n_rows + s.mr - 1) / s.mr * s.mr;
            memset(acc, 0, acc_bytes);
            for (int64_t c0 = 0; c0 < s.cols; c0 += tile_cols) {
                const int64_t nc = s.cols - c0 < tile_cols ? s.cols - c0 : tile_cols, g0 = c0 / gs;
                for (int64_t i = 0; i < n_rows; i++) {
                    f->q8_codes(w, r0 + i, c0, nc, codes + i * tile_cols);
                    const unsigned char *srow = (const unsigned char *)w->scales + (size_t)(r0 + i) * w->scale_row_bytes;
                    const unsigned char *brow = (const unsigned char *)w->biases + (size_t)(r0 + i) * w->scale_row_bytes;
                    for (int64_t g = 0; g < nc / gs; g++) {
                        scale[i * tile_groups + g] = cpu_load_param(srow, w->scale_dtype, g0 + g);
                        bias[i * tile_groups + g] = cpu_load_param(brow, w->scale_dtype, g0 + g);
                    }
                }
                if (c0 + tile_cols < s.cols)
                    cpu_prefetch_tile(w, r0, n_rows, c0 + tile_cols,
                                      s.cols - c0 - tile_cols < tile_cols ? s.cols - c0 - tile_cols : tile_cols);
                for (int64_t i = n_rows; i < padded; i++) {
                    memset(codes + i * tile_cols, 0, (size_t)nc);
                    for (int64_t g = 0; g < nc / gs; g++) scale[i * tile_groups + g] = bias[i * tile_groups + g] = 0.0f;
                }
                for (int64_t b = 0; b < nb; b++) {
                    const int wb = block_width(b0 + b, n_tokens, s.nr);
                    cpu_q8_tile t = {
                        .ldw = tile_cols,
                        .ldp = tile_groups,
                        .x = xp + (b0 + b) * s.cols * s.nr + c0 * wb,
                        .xd = dp + (b0 + b) * n_groups * s.nr + g0 * wb,
                        .xs = sp + (b0 + b) * n_groups * s.nr + g0 * wb,
                        .kc = nc,
                        .group = (int)gs,
                        .bits = w->bits,
                        .ldc = s.ldc,
                    };
                    for (int64_t i = 0; i < padded; i += s.mr) {
                        t.w = codes + i * tile_cols;
                        t.scale = scale + i * tile_groups;
                        t.bias = bias + i * tile_groups;
                        t.c = acc + i * s.ldc + b * s.nr;
                        if (wb == s.nr) f->q8_micro(&t);
                        else f->q8_micro_half(&t);
                    }
                }
            }
            store_item(&s, out, acc, r0, b0, n_rows, nb);
        }
    }
    free(scratch);
    return 1;
}

/* Few tokens against bf16 weights: memory bound, so the float32 kernels on
 * activations rounded to bf16 (so that a token's result does not depend on
 * how many others share its product). */
static int bf16_decode(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    /* (not the thread's scratch: cpu_matmul uses that too) */
    float *xr = malloc((size_t)(n_tokens * w->cols) * sizeof *xr);
    if (!xr) return 0;
    for (int64_t i = 0; i < n_tokens * w->cols; i++) xr[i] = g4_round_bf16(x[i]);
    cpu_matmul(out, xr, n_tokens, w);
    free(xr);
    return 1;
}

/* Whether cpu_matmul_fast has a fast kernel for w at the active level. */
int cpu_fast_takes(const g4_matrix *w, int64_t n_tokens) {
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    if (takes_q8(f, w)) return n_tokens < f->prefill_min_tokens || f->q8_micro;
    return takes_bf16(f, w);
}

void cpu_matmul_fast(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    if (n_tokens <= 0 || w->rows <= 0 || w->cols <= 0) {
        cpu_matmul(out, x, n_tokens, w);
        return;
    }
    const cpu_fast_table *f = cpu_fast_for(cpu_isa_active());
    int done = 0;
    if (takes_q8(f, w) && n_tokens < f->prefill_min_tokens)
        done = q8_decode(f, out, x, n_tokens, w);
    else if (takes_q8(f, w) && f->q8_micro)
        done = q8_prefill(f, out, x, n_tokens, w);
    else if (takes_bf16(f, w))
        done = n_tokens < f->prefill_min_tokens ? bf16_decode(out, x, n_tokens, w) : bf16_prefill(f, out, x, n_tokens, w);
    if (!done) cpu_matmul(out, x, n_tokens, w);
}

void cpu_matmul_with(g4_precision precision, float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    if (precision == G4_PRECISION_EXACT) cpu_matmul_invariant(out, x, n_tokens, w);
    else cpu_matmul_fast(out, x, n_tokens, w);
}
