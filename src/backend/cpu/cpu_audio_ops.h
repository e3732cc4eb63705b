/* CPU ops of the audio tower: elementwise activations, per-row scale and
 * bias, LayerNorm, channels-last conv2d, causal depthwise conv1d and the
 * chunked local attention. Semantics are documented in backend/backend.h. */
#ifndef G4_BACKEND_CPU_AUDIO_OPS_H
#define G4_BACKEND_CPU_AUDIO_OPS_H

#include "backend/backend.h"

void cpu_scale_rows(g4_backend *be, float *out, const float *a, const float *s, int rows, int dim);
void cpu_add_rows(g4_backend *be, float *out, const float *a, const float *v, int rows, int dim);
void cpu_clamp(g4_backend *be, float *out, const float *x, float lo, float hi, size_t n);
void cpu_relu(g4_backend *be, float *out, const float *x, size_t n);
void cpu_silu(g4_backend *be, float *out, const float *x, size_t n);
void cpu_glu(g4_backend *be, float *out, const float *x, int rows, int dim);
void cpu_layer_norm(g4_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int dim,
                    float eps);
void cpu_conv2d(g4_backend *be, float *out, const float *x, const float *w, int H, int W, int c_in, int c_out,
                int kh, int kw, int stride, int pad);
void cpu_depthwise_conv1d_causal(g4_backend *be, float *out, const float *x, const float *w, int T, int C, int K);
void cpu_chunked_attention(g4_backend *be, float *out, const float *q, const float *k, const float *v,
                           const float *rel_k, const int32_t *valid, const g4_chunked_attn_params *p);

#endif
