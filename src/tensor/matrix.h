/* A weight matrix in its stored format, used where it lies (no float copy).
 *
 * Logical shape [rows][cols]; a linear layer computes y[r] = sum_c W[r][c] x[c],
 * so rows = output features and cols = input features (PyTorch's [out, in]).
 * Row r's data starts at data + r * row_bytes; for quantised formats row r's
 * group parameters start at scales/biases + r * scale_row_bytes.
 *
 * Formats:
 *  F32 / BF16 / F16  plain values.
 *  AFFINE  MLX affine quantisation: each row is a little-endian bit stream of
 *          `bits`-bit codes packed into uint32 words (element k of a 4-bit row
 *          sits in bits 4k..4k+3 of word k/8); w = scale[g] * q + bias[g] for
 *          group g = c / group_size. Scales and biases are BF16, F16 or F32.
 *  MXFP4   OCP microscaling FP4: 4-bit E2M1 codes packed like AFFINE 4-bit,
 *          one E8M0 (uint8) scale per 32 values: w = e2m1(q) * 2^(s - 127).
 *
 * Pointers may be host or device addresses; only the backend that owns the
 * matrix dereferences them. Row views (g4_matrix_rows) are pointer arithmetic
 * and so work for either. */
#ifndef G4_TENSOR_MATRIX_H
#define G4_TENSOR_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"

typedef enum {
    G4_WEIGHT_F32 = 0,
    G4_WEIGHT_BF16,
    G4_WEIGHT_F16,
    G4_WEIGHT_AFFINE,
    G4_WEIGHT_MXFP4,
} g4_weight_format;

typedef struct {
    g4_weight_format format;
    int64_t rows, cols;
    const void *data;
    size_t row_bytes;
    int bits;             /* AFFINE: 2..8; MXFP4: 4 */
    int group_size;       /* AFFINE: 32/64/128...; MXFP4: 32 */
    const void *scales;   /* AFFINE/MXFP4 */
    const void *biases;   /* AFFINE only */
    g4_dtype scale_dtype; /* AFFINE: BF16/F16/F32 (biases too); MXFP4: U8 */
    size_t scale_row_bytes;
} g4_matrix;

/* Experts stacked in one tensor: expert e's matrix is rows
 * [e*expert_stride + row_offset, ... + rows_per_expert) of `all`.
 * HF gate_up_proj [E, 2I, d] gives gate (offset 0) and up (offset I) with
 * stride 2I; MLX switch_glu.{gate,up}_proj give stride I, offset 0. */
typedef struct {
    g4_matrix all;
    int n_experts;
    int64_t rows_per_expert;
    int64_t expert_stride;
    int64_t row_offset;
} g4_expert_matrix;

const char *g4_weight_format_name(g4_weight_format f);

/* Rows [first, first + count) of m as a matrix of its own. */
g4_matrix g4_matrix_rows(const g4_matrix *m, int64_t first, int64_t count);
g4_matrix g4_expert_view(const g4_expert_matrix *m, int expert);

/* Bytes of m's storage (data + scales + biases). */
size_t g4_matrix_bytes(const g4_matrix *m);

/* Value of an E2M1 FP4 code (0..15). */
float g4_e2m1_value(unsigned code);
/* 2^(e - 127) for an E8M0 scale byte (255 = NaN). */
float g4_e8m0_value(unsigned e);

/* ---- host reference path (clear, slow, exact): the fast kernels are tested
 * against these. Only valid for host-resident matrices. ---- */

/* Element (r, c) as float. */
float g4_matrix_get(const g4_matrix *m, int64_t r, int64_t c);
/* Dequantise/convert rows [r0, r0+n) into dst[n][cols] (float32). */
void g4_matrix_rows_to_f32(const g4_matrix *m, int64_t r0, int64_t n, float *dst);
/* Columns [c0, c0+nc) of rows [r0, r0+n) into dst[n][nc]. For AFFINE/MXFP4,
 * c0 and nc must be multiples of the group size (and of 32/bits codes). */
void g4_matrix_tile_to_f32(const g4_matrix *m, int64_t r0, int64_t n, int64_t c0, int64_t nc, float *dst);
/* out[t][r] = sum_c W[r][c] x[t][c], double accumulation, single thread. */
void g4_matmul_reference(float *out, const float *x, int64_t n_tokens, const g4_matrix *w);

#endif
