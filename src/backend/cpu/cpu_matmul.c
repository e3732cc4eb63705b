#include "backend/cpu/cpu_matmul.h"

#include <stdlib.h>

/* Portable version: dequantise a block of rows to float32 scratch, then dot
 * with every token. */
#define ROWS_PER_BLOCK 16

void cpu_matmul(float *out, const float *x, int64_t n_tokens, const g4_matrix *w) {
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t n_blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
#pragma omp parallel
    {
        float *tile = malloc((size_t)ROWS_PER_BLOCK * (size_t)cols * sizeof *tile);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < n_blocks; b++) {
            int64_t r0 = b * ROWS_PER_BLOCK;
            int64_t nr = rows - r0 < ROWS_PER_BLOCK ? rows - r0 : ROWS_PER_BLOCK;
            g4_matrix_rows_to_f32(w, r0, nr, tile);
            for (int64_t t = 0; t < n_tokens; t++) {
                const float *xt = x + t * cols;
                for (int64_t i = 0; i < nr; i++) {
                    const float *wr = tile + i * cols;
                    float lanes[32] = {0};
                    int64_t c = 0;
                    for (; c + 32 <= cols; c += 32)
                        for (int l = 0; l < 32; l++) lanes[l] += wr[c + l] * xt[c + l];
                    for (; c < cols; c++) lanes[c & 31] += wr[c] * xt[c];
                    for (int w = 16; w > 0; w /= 2)
                        for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];
                    out[t * rows + r0 + i] = lanes[0];
                }
            }
        }
        free(tile);
    }
}

void cpu_matrix_row(const g4_matrix *w, int64_t r, float scale, float *out) {
    g4_matrix_rows_to_f32(w, r, 1, out);
    if (scale != 1.0f)
        for (int64_t c = 0; c < w->cols; c++) out[c] *= scale;
}

const char *cpu_isa_name(void) { return "scalar"; }
