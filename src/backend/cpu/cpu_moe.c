#include "backend/cpu/cpu_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"

void cpu_moe_route(g4_backend *be, int32_t *ids, float *weights, const float *logits, const float *expert_scale,
                   int n, int n_experts, int k) {
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *z = logits + (size_t)t * n_experts;
        int32_t *id = ids + (size_t)t * k;
        float *w = weights + (size_t)t * k;
        /* top-k by logit (softmax is monotonic); ties go to the lower index */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_experts; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= id[i] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            id[j] = best;
        }
        /* softmax over all experts, then renormalise over the chosen ones:
         * the full normaliser cancels, so only the chosen logits matter. */
        double max_z = z[id[0]], total = 0;
        double p[256];
        for (int j = 0; j < k && j < 256; j++) {
            p[j] = exp((double)z[id[j]] - max_z);
            total += p[j];
        }
        for (int j = 0; j < k && j < 256; j++) w[j] = (float)(p[j] / total) * expert_scale[id[j]];
    }
}

void cpu_moe_experts(g4_backend *be, float *out, const float *x, int n, const int32_t *ids, const float *weights,
                     int k, const g4_expert_matrix *gate, const g4_expert_matrix *up,
                     const g4_expert_matrix *down) {
    const g4_precision precision = cpu_backend_precision(be);
    const int64_t d = down->rows_per_expert, width = gate->rows_per_expert;
    memset(out, 0, (size_t)n * (size_t)d * sizeof *out);
    int *tokens = malloc((size_t)n * sizeof *tokens);
    float *tok_w = malloc((size_t)n * sizeof *tok_w);
    float *xs = malloc((size_t)n * (size_t)gate->all.cols * sizeof *xs);
    float *g = malloc((size_t)n * (size_t)width * sizeof *g);
    float *u = malloc((size_t)n * (size_t)width * sizeof *u);
    float *y = malloc((size_t)n * (size_t)d * sizeof *y);
    if (tokens && tok_w && xs && g && u && y) {
        for (int e = 0; e < gate->n_experts; e++) {
            int m = 0;
            for (int t = 0; t < n; t++)
                for (int j = 0; j < k; j++)
                    if (ids[(size_t)t * k + j] == e) {
                        tokens[m] = t;
                        tok_w[m] = weights[(size_t)t * k + j];
                        memcpy(xs + (size_t)m * gate->all.cols, x + (size_t)t * gate->all.cols,
                               (size_t)gate->all.cols * sizeof *xs);
                        m++;
                    }
            if (m == 0) continue;
            g4_matrix wg = g4_expert_view(gate, e), wu = g4_expert_view(up, e), wd = g4_expert_view(down, e);
            cpu_matmul_with(precision, g, xs, m, &wg);
            cpu_matmul_with(precision, u, xs, m, &wu);
            for (size_t i = 0; i < (size_t)m * (size_t)width; i++) {
                float a = g[i];
                g[i] = 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a))) * u[i];
            }
            cpu_matmul_with(precision, y, g, m, &wd);
            for (int i = 0; i < m; i++) {
                float *o = out + (size_t)tokens[i] * d;
                const float *yi = y + (size_t)i * d;
                for (int64_t c = 0; c < d; c++) o[c] += tok_w[i] * yi[c];
            }
        }
    }
    free(tokens);
    free(tok_w);
    free(xs);
    free(g);
    free(u);
    free(y);
}
