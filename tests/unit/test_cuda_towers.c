/* The CUDA backend's vision and audio tower ops against the float64
 * references (tests/support/op_reference.c): 2-D RoPE and pooling (the
 * vision tower), and the audio conformer's scale_rows, relu, silu, glu,
 * LayerNorm (also the 12B's vision embedder), the subsampling conv2d, the
 * causal depthwise conv1d and the chunked local attention with its relative
 * keys, logit cap and padding (both mask conventions), at the E2B tower's
 * sizes. Exits 77 (skipped) without a usable GPU.
 *
 * Tolerances (relative RMS, and the worst row's max error over its RMS;
 * support/op_check.h): provisional, the class bounds this test used against
 * the CPU backend (1e-6 elementwise, 1e-5 for the reductions: conv2d,
 * chunked attention) and ten times those per row, until an H200 run gives
 * the reached values (the final table's "3x"). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/cuda_harness.h"

static const op_tolerance tolerances[] = {
    {"rope_2d", 1e-6, 1e-5},     {"pool_rows", 1e-6, 1e-5}, {"elementwise", 1e-6, 1e-5},
    {"silu/glu", 1e-6, 1e-5},    {"layer_norm", 1e-6, 1e-5}, {"conv2d", 1e-5, 1e-4},
    {"depthwise_conv1d", 1e-6, 1e-5}, {"chunked_attention", 1e-5, 1e-4},
};

static void test_vision_ops(void) {
    /* 2-D RoPE: 50 patches, 12 heads of 64 (E2B-like tower), positions up to 40 */
    {
        const int n = 50, H = 12, D = 64;
        const size_t total = (size_t)n * H * D;
        float *x = rand_floats(total, 0.01f, 3.0f);
        double *want = doubles(total);
        int32_t pos[100];
        for (int t = 0; t < n; t++) pos[2 * t] = rand_int(40), pos[2 * t + 1] = rand_int(40);
        ref_rope_2d(want, x, n, H, D, pos, 100.0);
        float *dx = up(x, total * 4);
        int32_t *dpos = up(pos, sizeof pos);
        gpu->ops->rope_2d(gpu, dx, n, H, D, dpos, 100.0f);
        float *got = down(dx, total);
        op_check("rope_2d", "50 patches, 12 heads x 64", got, want, (size_t)n * H, (size_t)D);
        release(dx), release(dpos);
        free(x), free(want), free(got);
    }
    /* pooling: 90 patches into 10 slots (some skipped) */
    {
        const int n_in = 90, n_out = 10, dim = 768;
        float *in = rand_floats((size_t)n_in * dim, 0.01f, 4.0f);
        double *want = doubles((size_t)n_out * dim);
        int32_t slot[90];
        for (int r = 0; r < n_in; r++) slot[r] = r % 13 == 5 ? -1 : rand_int(n_out);
        ref_pool_rows(want, in, slot, n_in, n_out, dim, 9.2376f);
        float *din = up(in, (size_t)n_in * dim * 4), *dout = poisoned((size_t)n_out * dim);
        int32_t *dslot = up(slot, sizeof slot);
        gpu->ops->pool_rows(gpu, dout, din, dslot, n_in, n_out, dim, 9.2376f);
        float *got = down(dout, (size_t)n_out * dim);
        op_check("pool_rows", "90 rows into 10 x 768", got, want, (size_t)n_out, (size_t)dim);
        release(din), release(dout), release(dslot);
        free(in), free(want), free(got);
    }
}

/* The audio tower's ops (and LayerNorm, which the 12B's vision embedder uses)
 * at the E2B conformer's sizes. */
static void test_audio_ops(void) {
    /* elementwise: scale_rows, relu, silu, glu */
    {
        const int rows = 37, dim = 1024;
        const size_t n = (size_t)rows * dim;
        float *x = rand_floats(2 * n, 0.01f, 4.0f), *s = rand_floats((size_t)rows, 0.01f, 1.0f);
        double *want = doubles(n);
        float *dx = up(x, 2 * n * 4), *ds = up(s, (size_t)rows * 4), *dout = poisoned(n);
        ref_scale_rows(want, x, s, rows, dim);
        gpu->ops->scale_rows(gpu, dout, dx, ds, rows, dim);
        float *got = down(dout, n);
        op_check("elementwise", "scale_rows 37 x 1024", got, want, (size_t)rows, (size_t)dim);
        free(got);
        ref_relu(want, x, n);
        gpu->ops->relu(gpu, dout, dx, n);
        got = down(dout, n);
        op_check("elementwise", "relu 37 x 1024", got, want, (size_t)rows, (size_t)dim);
        free(got);
        ref_silu(want, x, n);
        gpu->ops->silu(gpu, dout, dx, n);
        got = down(dout, n);
        op_check("silu/glu", "silu 37 x 1024", got, want, (size_t)rows, (size_t)dim);
        free(got);
        ref_glu(want, x, rows, dim);
        gpu->ops->glu(gpu, dout, dx, rows, dim);
        got = down(dout, n);
        op_check("silu/glu", "glu 37 x 2048 -> 1024", got, want, (size_t)rows, (size_t)dim);
        free(got);
        release(dx), release(ds), release(dout);
        free(x), free(s), free(want);
    }
    /* layer_norm with and without weight/bias, widths of the conformer and the 12B embedder */
    {
        const int rows = 19, dims[] = {32, 1024, 6912};
        for (int k = 0; k < 3; k++) {
            const int dim = dims[k];
            const size_t n = (size_t)rows * dim;
            float *x = rand_floats(n, 0.01f, 4.0f), *w = rand_floats((size_t)dim, 0.5f, 1.5f);
            float *b = rand_floats((size_t)dim, 0.01f, 0.2f);
            double *want = doubles(n);
            float *dx = up(x, n * 4), *dw = up(w, (size_t)dim * 4), *db = up(b, (size_t)dim * 4), *dout = poisoned(n);
            ref_layer_norm(want, x, w, k == 1 ? NULL : b, rows, dim, 1e-5f);
            gpu->ops->layer_norm(gpu, dout, dx, dw, k == 1 ? NULL : db, rows, dim, 1e-5f);
            float *got = down(dout, n);
            op_check("layer_norm", dim == 32 ? "19 x 32" : dim == 1024 ? "19 x 1024, no bias" : "19 x 6912", got, want,
                     (size_t)rows, (size_t)dim);
            release(dx), release(dw), release(db), release(dout);
            free(x), free(w), free(b), free(want), free(got);
        }
    }
    /* conv2d: the subsampling convolutions (1 -> 128 and 128 -> 32 channels, 3x3, stride 2, pad 1) */
    {
        const int H = 61, W = 128, shapes[2][2] = {{1, 128}, {128, 32}};
        for (int k = 0; k < 2; k++) {
            const int ci = shapes[k][0], co = shapes[k][1], h = k ? 31 : H, w = k ? 64 : W;
            const int Ho = (h + 2 - 3) / 2 + 1, Wo = (w + 2 - 3) / 2 + 1;
            const size_t nx = (size_t)h * w * ci, nw = (size_t)co * 9 * ci, no = (size_t)Ho * Wo * co;
            float *x = rand_floats(nx, 0.01f, 2.0f), *wt = rand_floats(nw, 0.01f, 0.3f);
            double *want = doubles(no);
            float *dx = up(x, nx * 4), *dw = up(wt, nw * 4), *dout = poisoned(no);
            ref_conv2d(want, x, wt, h, w, ci, co, 3, 3, 2, 1);
            gpu->ops->conv2d(gpu, dout, dx, dw, h, w, ci, co, 3, 3, 2, 1);
            float *got = down(dout, no);
            op_check("conv2d", k ? "31 x 64 x 128 -> 32" : "61 x 128 x 1 -> 128", got, want, (size_t)Ho * Wo, (size_t)co);
            release(dx), release(dw), release(dout);
            free(x), free(wt), free(want), free(got);
        }
    }
    /* causal depthwise conv1d: kernel 5 over 1024 channels */
    {
        const int T = 75, C = 1024, K = 5;
        float *x = rand_floats((size_t)T * C, 0.01f, 2.0f), *w = rand_floats((size_t)C * K, 0.01f, 0.5f);
        double *want = doubles((size_t)T * C);
        float *dx = up(x, (size_t)T * C * 4), *dw = up(w, (size_t)C * K * 4), *dout = poisoned((size_t)T * C);
        ref_depthwise_conv1d_causal(want, x, w, T, C, K);
        gpu->ops->depthwise_conv1d_causal(gpu, dout, dx, dw, T, C, K);
        float *got = down(dout, (size_t)T * C);
        op_check("depthwise_conv1d", "75 x 1024, kernel 5", got, want, (size_t)T, (size_t)C);
        release(dx), release(dw), release(dout);
        free(x), free(w), free(want), free(got);
    }
    /* chunked attention: 8 heads of 128, chunk 12, 12 past frames, 13 relative keys, padding at the end */
    {
        g4_chunked_attn_params p = {.n_frames = 75, .n_heads = 8, .head_dim = 128, .chunk = 12, .past = 12,
                                    .future = 0, .n_rel = 13, .max_past_dist = 11, .max_future_dist = 0,
                                    .logit_cap = 50.0f, .invalid_logit = -1e9f};
        const size_t n = (size_t)p.n_frames * p.n_heads * p.head_dim, nr = (size_t)p.n_rel * p.n_heads * p.head_dim;
        float *q = rand_floats(n, 0.01f, 0.3f), *k = rand_floats(n, 0.01f, 0.3f), *v = rand_floats(n, 0.01f, 2.0f);
        float *rk = rand_floats(nr, 0.01f, 0.3f);
        double *want = doubles(n);
        int32_t valid[75];
        for (int i = 0; i < 75; i++) valid[i] = i < 70;
        float *dq = up(q, n * 4), *dk = up(k, n * 4), *dv = up(v, n * 4), *drk = up(rk, nr * 4), *dout = poisoned(n);
        int32_t *dvalid = up(valid, sizeof valid);
        for (int inv = 0; inv < 2; inv++) {
            p.invert_mask = inv;
            ref_chunked_attention(want, q, k, v, rk, valid, &p);
            gpu->ops->chunked_attention(gpu, dout, dq, dk, dv, drk, dvalid, &p);
            float *got = down(dout, n);
            op_check("chunked_attention", inv ? "75 frames x 8 heads x 128, inverted mask" : "75 frames x 8 heads x 128",
                     got, want, (size_t)p.n_frames * p.n_heads, (size_t)p.head_dim);
            free(got);
        }
        release(dq), release(dk), release(dv), release(drk), release(dout), release(dvalid);
        free(q), free(k), free(v), free(rk), free(want);
    }
}

int main(void) {
    const int rc = harness_open();
    if (rc) return rc == 77 ? 77 : test_finish();
    op_check_init(tolerances, (int)(sizeof tolerances / sizeof tolerances[0]));
    test_vision_ops();
    test_audio_ops();
    op_report();
    return harness_close();
}
