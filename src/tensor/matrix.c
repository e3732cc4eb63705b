#include "tensor/matrix.h"

#include <math.h>
#include <stdlib.h>

const char *g4_weight_format_name(g4_weight_format f) {
    switch (f) {
    case G4_WEIGHT_F32: return "f32";
    case G4_WEIGHT_BF16: return "bf16";
    case G4_WEIGHT_F16: return "f16";
    case G4_WEIGHT_AFFINE: return "affine";
    case G4_WEIGHT_MXFP4: return "mxfp4";
    }
    return "?";
}

g4_matrix g4_matrix_rows(const g4_matrix *m, int64_t first, int64_t count) {
    g4_matrix v = *m;
    v.rows = count;
    v.data = (const unsigned char *)m->data + (size_t)first * m->row_bytes;
    if (m->scales) v.scales = (const unsigned char *)m->scales + (size_t)first * m->scale_row_bytes;
    if (m->biases) v.biases = (const unsigned char *)m->biases + (size_t)first * m->scale_row_bytes;
    return v;
}

g4_matrix g4_expert_view(const g4_expert_matrix *m, int expert) {
    return g4_matrix_rows(&m->all, (int64_t)expert * m->expert_stride + m->row_offset, m->rows_per_expert);
}

size_t g4_matrix_bytes(const g4_matrix *m) {
    size_t bytes = (size_t)m->rows * m->row_bytes;
    if (m->scales) bytes += (size_t)m->rows * m->scale_row_bytes;
    if (m->biases) bytes += (size_t)m->rows * m->scale_row_bytes;
    return bytes;
}

float g4_e2m1_value(unsigned code) {
    static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = magnitude[code & 7];
    return (code & 8) ? -v : v;
}

float g4_e8m0_value(unsigned e) {
    if (e == 255) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

/* Code c of a row stored as a little-endian bit stream of `bits`-bit codes. */
static unsigned read_code(const unsigned char *row, int bits, int64_t c) {
    uint64_t bit = (uint64_t)c * (uint64_t)bits;
    const unsigned char *p = row + bit / 8;
    unsigned shift = (unsigned)(bit % 8);
    unsigned v = p[0] >> shift;
    if (shift + (unsigned)bits > 8) v |= (unsigned)p[1] << (8 - shift);
    return v & ((1u << bits) - 1u);
}

float g4_matrix_get(const g4_matrix *m, int64_t r, int64_t c) {
    /* safetensors does not promise aligned tensors (mlx-vlm writes bf16 at odd
     * offsets), so values are read through memcpy, never typed pointers */
    const unsigned char *row = (const unsigned char *)m->data + (size_t)r * m->row_bytes;
    switch (m->format) {
    case G4_WEIGHT_F32: return g4_load_as_f32(row, G4_DTYPE_F32, (size_t)c);
    case G4_WEIGHT_BF16: return g4_load_as_f32(row, G4_DTYPE_BF16, (size_t)c);
    case G4_WEIGHT_F16: return g4_load_as_f32(row, G4_DTYPE_F16, (size_t)c);
    case G4_WEIGHT_AFFINE: {
        const unsigned char *s = (const unsigned char *)m->scales + (size_t)r * m->scale_row_bytes;
        const unsigned char *b = (const unsigned char *)m->biases + (size_t)r * m->scale_row_bytes;
        int64_t g = c / m->group_size;
        float scale = g4_load_as_f32(s, m->scale_dtype, (size_t)g);
        float bias = g4_load_as_f32(b, m->scale_dtype, (size_t)g);
        return scale * (float)read_code(row, m->bits, c) + bias;
    }
    case G4_WEIGHT_MXFP4: {
        const unsigned char *s = (const unsigned char *)m->scales + (size_t)r * m->scale_row_bytes;
        return g4_e2m1_value(read_code(row, 4, c)) * g4_e8m0_value(s[c / m->group_size]);
    }
    }
    return NAN;
}

void g4_matrix_tile_to_f32(const g4_matrix *m, int64_t r0, int64_t n, int64_t c0, int64_t nc, float *dst) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < nc; c++) dst[i * nc + c] = g4_matrix_get(m, r0 + i, c0 + c);
}

void g4_matrix_rows_to_f32(const g4_matrix *m, int64_t r0, int64_t n, float *dst) {
    g4_matrix_tile_to_f32(m, r0, n, 0, m->cols, dst);
}

void g4_matmul_reference(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!row) return;
    for (int64_t r = 0; r < w->rows; r++) {
        g4_matrix_rows_to_f32(w, r, 1, row);
        for (int64_t t = 0; t < n_tokens; t++) {
            const float *xt = x + t * w->cols;
            double acc = 0;
            for (int64_t c = 0; c < w->cols; c++) acc += (double)row[c] * (double)xt[c];
            out[t * w->rows + r] = (float)acc;
        }
    }
    free(row);
}
