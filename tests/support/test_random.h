/* Fixed-seed random inputs shared by the op tests: floats of realistic
 * magnitude that are never zero, and weight matrices built directly in each
 * packed format (f32, bf16, f16, MLX affine 2..8 bits with bf16/f16/f32
 * scales, MXFP4) on the host. */
#ifndef G4_TESTS_TEST_RANDOM_H
#define G4_TESTS_TEST_RANDOM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"
#include "tensor/matrix.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static inline uint64_t next_u64(void) { /* xorshift64 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static inline double uniform01(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static inline int rand_int(int n) { return (int)(next_u64() % (uint64_t)n); }

/* A magnitude in [lo, hi] with a random sign: never zero. */
static inline float rnd(float lo, float hi) {
    float v = lo + (hi - lo) * (float)uniform01();
    return (next_u64() & 1) ? -v : v;
}

static inline float *rand_floats(size_t n, float lo, float hi) {
    float *p = calloc(n ? n : 1, sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rnd(lo, hi);
    return p;
}

static inline void shuffle(int32_t *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = rand_int(i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* A host matrix and the buffers it owns. */
typedef struct {
    g4_matrix m;
    void *bufs[3];
    char name[64];
} host_matrix;

/* rows x cols in format f (bits, group and scale type for AFFINE; MXFP4 uses
 * groups of 32 and E8M0 scales near 1): weights of magnitude 0.005..0.08,
 * quantised codes uniformly random. */
static inline void host_matrix_make(host_matrix *t, g4_weight_format f, int bits, int group, g4_dtype sdt,
                                    int64_t rows, int64_t cols) {
    memset(t, 0, sizeof *t);
    g4_matrix *m = &t->m;
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
}

static inline void host_matrix_free(host_matrix *t) {
    for (int i = 0; i < 3; i++) free(t->bufs[i]);
    memset(t, 0, sizeof *t);
}

#endif
