#include "model/synth_weights.h"

#include <stdlib.h>
#include <string.h>

/* bf16 values in blocks of 4096, each block seeded by its index so that any
 * block can be made without the ones before it. Random bits, but never NaN,
 * infinity or denormal. */
static void fill_bf16(uint16_t *dst, uint64_t first, size_t n, uint64_t seed, g4_synth_fill fill) {
    const size_t B = 4096;
    const uint64_t first_block = first / B, n_blocks = (n + B - 1) / B;
#pragma omp parallel for schedule(static)
    for (uint64_t k = 0; k < n_blocks; k++) {
        uint64_t block = first_block + k;
        uint64_t x = seed ^ (block * 0x9e3779b97f4a7c15ull) ^ 0xd1b54a32d192ed03ull;
        size_t end = (k + 1) * B < n ? (k + 1) * B : n;
        for (size_t i = k * B; i < end; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint16_t mant = (uint16_t)(x & 0x7f), exp = (uint16_t)(117 + ((x >> 8) & 7)); /* 2^-10 .. 2^-3 */
            uint16_t sign = fill == G4_SYNTH_WEIGHTS ? (uint16_t)((x >> 12) & 1) : fill == G4_SYNTH_BIASES;
            if (fill == G4_SYNTH_SCALES) exp = 119; /* ~0.004 */
            dst[i] = (uint16_t)(sign << 15 | exp << 7 | mant);
        }
    }
}

/* Bytes in blocks of 65536, seeded like fill_bf16's. */
static void fill_u8(unsigned char *dst, uint64_t first, size_t n, uint64_t seed, int e8m0) {
    const size_t B = 65536;
    const uint64_t first_block = first / B, n_blocks = (n + B - 1) / B;
#pragma omp parallel for schedule(static)
    for (uint64_t k = 0; k < n_blocks; k++) {
        uint64_t block = first_block + k;
        uint64_t x = seed ^ (block * 0x9e3779b97f4a7c15ull) ^ 0x94d049bb133111ebull;
        size_t end = (k + 1) * B < n ? (k + 1) * B : n;
        for (size_t i = k * B; i < end; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            dst[i] = e8m0 ? (unsigned char)(118 + (x & 3)) : (unsigned char)(x >> 24);
        }
    }
}

void g4_synth_fill_bytes(g4_synth_fill fill, uint64_t seed, uint64_t offset, void *dst, size_t n) {
    switch (fill) {
    case G4_SYNTH_CODES:
    case G4_SYNTH_E8M0:
        fill_u8(dst, offset, n, seed, fill == G4_SYNTH_E8M0);
        break;
    case G4_SYNTH_ONES: {
        uint16_t *p = dst;
        for (size_t i = 0; i < n / 2; i++) p[i] = 0x3f80; /* bf16 1.0 */
        break;
    }
    default:
        fill_bf16(dst, offset / 2, n / 2, seed, fill);
        break;
    }
}

void g4_synth_record_add(g4_synth_record *r, const char *name, g4_dtype dtype, int ndim, const int64_t *shape,
                         g4_synth_fill fill, uint64_t seed, g4_quant_params quant) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 256;
        g4_synth_tensor *grown = realloc(r->tensors, cap * sizeof *grown);
        if (!grown) {
            r->out_of_memory = 1;
            return;
        }
        r->tensors = grown;
        r->cap = cap;
    }
    g4_synth_tensor *t = &r->tensors[r->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) {
        r->out_of_memory = 1;
        return;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->fill = fill;
    t->seed = seed;
    t->quant = quant;
    r->n++;
}

uint64_t g4_synth_tensor_bytes(const g4_synth_tensor *t) {
    uint64_t bytes = g4_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) bytes *= (uint64_t)t->shape[d];
    return bytes;
}

void g4_synth_record_free(g4_synth_record *r) {
    for (size_t i = 0; i < r->n; i++) free(r->tensors[i].name);
    free(r->tensors);
    memset(r, 0, sizeof *r);
}
