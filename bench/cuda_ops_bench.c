/* Timings of the CUDA backend's ops at real-model shapes (what was the
 * speed section of the op test): one-token GEMVs over a 31B MLP-sized matrix
 * in each format and the prefill GEMM, the GEMV column split off/on, the
 * 4- and 8-bit GEMVs under their settings, top_logits over the 262144-logit
 * head, the 26B-A4B's experts, decode and prefill attention under every
 * setting. Printed, never failing: the limits are the bench command's
 * (bench/RESULTS.md); every path timed here is checked for correctness by
 * tests/unit/test_cuda_{matmul,moe,attention,sampling}.c.
 *
 *   cuda_ops_bench [all|gemv4|attn|moe]    (bench/cuda_h200.sh SPEED=...)
 *
 * gemv4: the one-token 4- and 8-bit GEMVs alone; attn: the attention cases;
 * moe: the experts'. Exits 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "support/cuda_harness.h"

/* Random logits in [-30, 30]; ties: 1 rounds them to quarters (thousands of
 * equal values, +0 and -0 among them), 2 makes most of the row one value. */
static float *top_logits_input(int rows, int vocab, int ties) {
    float *x = rand_floats((size_t)rows * vocab, 0.001f, 30.0f);
    for (size_t i = 0; i < (size_t)rows * vocab; i++) {
        if (ties == 1) x[i] = roundf(x[i] * 4.0f) / 4.0f; /* small magnitudes round to +0 or -0 */
        if (ties == 2 && rand_int(10)) x[i] = 7.25f;
    }
    return x;
}


static double time_op(g4_backend *be, void (*op)(void *), void *arg, int reps) {
    op(arg); /* warm-up */
    be->ops->synchronize(be);
    double t0 = g4_now_seconds();
    for (int i = 0; i < reps; i++) op(arg);
    be->ops->synchronize(be);
    return (g4_now_seconds() - t0) / reps;
}

typedef struct {
    g4_backend *be;
    const g4_matrix *w;
    float *x, *out;
    int n;
} matmul_arg;

static void run_matmul(void *p) {
    matmul_arg *a = p;
    a->be->ops->matmul(a->be, a->out, a->x, a->n, a->w);
}

typedef struct {
    g4_backend *be;
    float *out, *q;
    void *kv;
    g4_attn_batch b;
    int heads;
} attn_arg;

static void run_attention(void *p) {
    attn_arg *a = p;
    a->be->ops->attention(a->be, a->out, a->q, a->kv, &a->b, 0, a->heads, 1.0f);
}

/* One-token GEMV over the matrices of an E2B and a 31B decode step with the
 * column split forced off and on (gemv_split): which one the shape
 * heuristic should pick. */
static void gemv_split_speed(double bw) {
    g4_backend *variant[2] = {knob_backend("gemv_split=0"), knob_backend("gemv_split=1")};
    /* E2B's, then the 31B's q|k|v, gate|up, o and down */
    const int64_t shapes[][2] = {{2048, 1536}, {256, 1536}, {1536, 2048}, {6144, 1536}, {12288, 1536}, {1536, 6144},
                                 {1536, 256}, {262144, 1536}, {16384, 5376}, {43008, 5376}, {5376, 8192},
                                 {5376, 21504}};
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}};
    printf("  one-token GEMV, columns split over the block: off / on / as picked\n");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
            float *x = rand_floats((size_t)cols, 0.05f, 2.0f);
            float *dx = up(x, (size_t)cols * 4), *dout = poisoned((size_t)rows);
            const double bytes = (double)g4_matrix_bytes(&t.host);
            double us[3] = {0, 0, 0};
            g4_backend *bes[3] = {variant[0], variant[1], gpu};
            for (int v = 0; v < 3; v++) {
                if (!bes[v]) continue;
                matmul_arg a = {bes[v], &t.dev, dx, dout, 1};
                us[v] = time_op(bes[v], run_matmul, &a, 50) * 1e6;
            }
            printf("  gemv %-18s %6lldx%-5lld %6.1f / %6.1f / %6.1f us  (%4.0f / %4.0f GB/s, %.0f%% of copy as picked)\n",
                   t.name, (long long)rows, (long long)cols, us[0], us[1], us[2], bytes / us[0] / 1e3,
                   bytes / us[1] / 1e3, 100 * bytes / us[2] / 1e3 / bw);
            release(dx), release(dout);
            free(x);
            free_matrix(&t);
        }
    for (int v = 0; v < 2; v++)
        if (variant[v]) g4_backend_destroy(variant[v]);
}

typedef struct {
    float *x;
    int32_t *ids;
    float *values;
    double *lse;
    int rows, vocab, k;
} top_arg;

static void run_top_logits(void *p) {
    top_arg *a = p;
    gpu->ops->top_logits(gpu, a->ids, a->values, a->lse, a->x, a->rows, a->vocab, a->k);
}

/* One token's decode attention over `len` keys of a table of `capacity`
 * positions. */
static void attention_decode_speed(int Hq, int Hkv, int D, int len, int capacity) {
    const int bs = 16, blocks = capacity / bs;
    void *kv = gpu->ops->kv_alloc(gpu, blocks, bs, Hkv, D, G4_KV_F32);
    int32_t *table = malloc((size_t)blocks * 4), pos = len - 1, seq = 0, range[4] = {0, len - 1, 0, len - 1};
    for (int i = 0; i < blocks; i++) table[i] = i;
    attn_arg a;
    a.be = gpu;
    a.kv = kv;
    a.heads = Hq;
    a.q = poisoned((size_t)Hq * D);
    a.out = poisoned((size_t)Hq * D);
    float *qh = rand_floats((size_t)Hq * D, 0.01f, 1.0f);
    gpu->ops->to_device(gpu, a.q, qh, (size_t)Hq * D * 4);
    a.b = (g4_attn_batch){.n_tokens = 1, .pos = up(&pos, 4), .seq = up(&seq, 4), .kv_range = up(range, 16),
                          .full_tables = up(table, (size_t)blocks * 4), .full_table_stride = blocks,
                          .sliding_tables = up(table, 4), .ring_blocks = 1, .block_size = bs};
    /* random keys and values (never time on zeros) */
    int32_t *all_pos = malloc((size_t)len * 4), *all_seq = calloc((size_t)len, 4);
    for (int i = 0; i < len; i++) all_pos[i] = i;
    float *k = rand_floats((size_t)len * Hkv * D, 0.01f, 1.0f), *v = rand_floats((size_t)len * Hkv * D, 0.01f, 1.0f);
    g4_attn_batch fill = a.b;
    fill.n_tokens = len;
    fill.pos = up(all_pos, (size_t)len * 4);
    fill.seq = up(all_seq, (size_t)len * 4);
    float *dk = up(k, (size_t)len * Hkv * D * 4), *dv = up(v, (size_t)len * Hkv * D * 4);
    gpu->ops->kv_store(gpu, kv, dk, dv, &fill, 0);
    release(dk), release(dv), release((void *)fill.pos), release((void *)fill.seq);
    free(k), free(v), free(all_pos), free(all_seq);
    const double bytes = 2.0 * len * Hkv * D * 4;
    /* the default, then the other decode settings (the KV pool is this
     * backend's memory: same device, the other backends read it) */
    attn_tc_backends();
    for (int v = -1; v < ATTN_DECODE_VARIANTS; v++) {
        g4_backend *be = v < 0 ? gpu : attn_decode_be[v];
        if (!be) continue;
        gpu->ops->synchronize(gpu);
        a.be = be;
        const double s = time_op(be, run_attention, &a, 50);
        printf("  attention decode %d/%d heads x %d, %d keys (table of %d): %7.1f us (%.0f GB/s of float32 K/V)%s%s\n",
               Hq, Hkv, D, len, capacity, s * 1e6, bytes / s / 1e9, v < 0 ? "" : ", ", v < 0 ? "" : attn_decode_name[v]);
    }
    gpu->ops->kv_free(gpu, kv);
    release(a.q), release(a.out), release((void *)a.b.pos), release((void *)a.b.seq), release((void *)a.b.kv_range),
        release((void *)a.b.full_tables), release((void *)a.b.sliding_tables);
    free(table), free(qh);
}

/* Prefill attention of `n` tokens of one sequence from position 0 (causal,
 * keys limited to `window`), the CUDA-core kernel against the tensor-core
 * one (attn=auto). */
static void attention_prefill_speed(int Hq, int Hkv, int D, int window, int n) {
    attn_tc_backends();
    const int bs = 16, blocks = (n + bs - 1) / bs;
    void *kv = gpu->ops->kv_alloc(gpu, blocks, bs, Hkv, D, G4_KV_F32);
    int32_t *table = malloc((size_t)blocks * 4), *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    int32_t *range = malloc((size_t)n * 16);
    double pairs = 0;
    for (int i = 0; i < blocks; i++) table[i] = i;
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        range[4 * t] = range[4 * t + 2] = t - window + 1 < 0 ? 0 : t - window + 1;
        range[4 * t + 1] = range[4 * t + 3] = t;
        pairs += t - range[4 * t + 2] + 1;
    }
    const size_t nq = (size_t)n * Hq * D, nkv = (size_t)n * Hkv * D;
    float *q = rand_floats(nq, 0.01f, 1.0f), *k = rand_floats(nkv, 0.01f, 1.0f), *v = rand_floats(nkv, 0.01f, 1.0f);
    attn_arg a;
    a.kv = kv;
    a.heads = Hq;
    a.q = up(q, nq * 4);
    a.out = poisoned(nq);
    a.b = (g4_attn_batch){.n_tokens = n, .pos = up(pos, (size_t)n * 4), .seq = up(seq, (size_t)n * 4),
                          .kv_range = up(range, (size_t)n * 16), .full_tables = up(table, (size_t)blocks * 4),
                          .full_table_stride = blocks, .sliding_tables = up(table, 4), .ring_blocks = 1,
                          .block_size = bs};
    float *dk = up(k, nkv * 4), *dv = up(v, nkv * 4);
    gpu->ops->kv_store(gpu, kv, dk, dv, &a.b, 0);
    /* each variant of attn_tc_backends (32 or 64 rows per block are the
     * same kernel at head_dim 512), the CUDA-core kernel last */
    for (int variant = 0; variant < ATTN_TC_VARIANTS; variant++) {
        g4_backend *be = attn_tc_be[variant];
        if (!be || (D > 256 && !strcmp(attn_tc_knob[variant][0], "tc"))) continue;
        a.be = be;
        const double s = time_op(be, run_attention, &a, 10);
        char knob[80];
        snprintf(knob, sizeof knob, ", %s", attn_tc_name[variant]);
        printf("  attention prefill %d/%d heads x %d, %d tokens, window %d: %8.1f us (%.1f TFLOP/s)%s\n", Hq, Hkv, D, n,
               window, s * 1e6, 4.0 * pairs * Hq * D / s / 1e12, knob);
    }
    gpu->ops->kv_free(gpu, kv);
    release(dk), release(dv), release(a.q), release(a.out), release((void *)a.b.pos), release((void *)a.b.seq),
        release((void *)a.b.kv_range), release((void *)a.b.full_tables), release((void *)a.b.sliding_tables);
    free(table), free(pos), free(seq), free(range), free(q), free(k), free(v);
}

/* Decode attention: the 31B-like long context, E2B's layers at a bench's
 * context, a short context in a long session (the server's default 4096
 * positions and more). Prefill attention at 512 tokens: 31B sliding and
 * global layers, E2B's; then a longer prompt, whose keys reach the 31B's
 * window. */
static void attention_speeds(void) {
    attention_decode_speed(32, 8, 256, 4096, 4096);
    attention_decode_speed(8, 1, 256, 144, 160);
    attention_decode_speed(16, 8, 256, 144, 160);
    attention_decode_speed(8, 1, 256, 600, 2048);
    attention_decode_speed(8, 1, 512, 600, 2048);
    attention_decode_speed(8, 1, 512, 1000, 32768);
    attention_decode_speed(32, 4, 512, 4000, 32768);
    attention_prefill_speed(32, 16, 256, 1024, 512);
    attention_prefill_speed(32, 4, 512, 1 << 30, 512);
    attention_prefill_speed(8, 1, 256, 512, 512);
    attention_prefill_speed(8, 1, 512, 1 << 30, 512);
    attention_prefill_speed(32, 16, 256, 1024, 2048);
}

typedef struct {
    g4_backend *be;
    const moe_weights *m;
    float *x, *w, *out;
    int32_t *ids;
    int n, k;
} moe_arg;

static void run_moe(void *p) {
    moe_arg *a = p;
    a->be->ops->moe_experts(a->be, a->out, a->x, a->n, a->ids, a->w, a->k, &a->m->dg, &a->m->du, &a->m->dd);
}

/* The 26B-A4B's routed experts (128 of 704 x 2816, 8 per token) for decode
 * batches: time per call and the chosen experts' bytes over it (issue 8
 * quotes vLLM's fused MoE at about 10% of bandwidth at batch 1). */
static void moe_speed(double bw) {
    struct {
        g4_weight_format f;
        int bits, group;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0}, {G4_WEIGHT_AFFINE, 4, 64}, {G4_WEIGHT_AFFINE, 8, 64}, {G4_WEIGHT_MXFP4, 4, 32}};
    const int E = 128, width = 704, d = 2816, k = 8;
    /* the experts' prefill through the general grouped kernel and, for bf16
     * experts, our pipelined kernel (cuBLAS off), for comparison */
    g4_backend *unpiped = knob_backend("moe=mma"), *own = knob_backend("moe_cublas=0");
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        moe_weights m;
        const int hf = formats[f].f == G4_WEIGHT_BF16;
        moe_weights_make(&m, hf, formats[f].f, formats[f].bits, formats[f].group, E, width, d);
        const double expert_bytes = ((double)g4_matrix_bytes(hf ? &m.gu.host : &m.gm.host) * (hf ? 1 : 2) +
                                     (double)g4_matrix_bytes(&m.dm.host)) / E;
        const int ns[] = {1, 8, 512};
        for (int i = 0; i < 3; i++) {
            const int n = ns[i];
            float *x = rand_floats((size_t)n * d, 0.05f, 2.0f), *w = rand_floats((size_t)n * k, 0.05f, 0.5f);
            int32_t *ids = moe_random_ids(n, k, E);
            int used[128] = {0}, distinct = 0; /* experts read at least once */
            for (int j = 0; j < n * k; j++) distinct += !used[ids[j]]++;
            moe_arg a = {gpu, &m, up(x, (size_t)n * d * 4), up(w, (size_t)n * k * 4), poisoned((size_t)n * d),
                         up(ids, (size_t)n * k * 4), n, k};
            const double s = time_op(gpu, run_moe, &a, 30);
            const double bytes = distinct * expert_bytes;
            const double flops = 2.0 * 3.0 * n * k * (double)width * d;
            printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s of %d experts' weights (%.0f%% of copy)"
                   ", %.1f TFLOP/s\n",
                   m.dm.name, E, k, width, d, n, s * 1e6, bytes / s / 1e9, distinct, 100 * bytes / s / 1e9 / bw,
                   flops / s / 1e12);
            if (n == 512 && hf && own) {
                gpu->ops->synchronize(gpu);
                a.be = own;
                const double s1 = time_op(own, run_moe, &a, 10);
                printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s, %.1f TFLOP/s, moe_cublas=0\n",
                       m.dm.name, E, k, width, d, n, s1 * 1e6, bytes / s1 / 1e9, flops / s1 / 1e12);
                a.be = gpu;
            }
            if (n == 512 && unpiped) {
                gpu->ops->synchronize(gpu);
                a.be = unpiped;
                const double s0 = time_op(unpiped, run_moe, &a, 10);
                printf("  moe %-14s E=%d k=%d %dx%d n=%-3d %8.1f us  %6.0f GB/s, %.1f TFLOP/s, moe=mma\n",
                       m.dm.name, E, k, width, d, n, s0 * 1e6, bytes / s0 / 1e9, flops / s0 / 1e12);
            }
            release(a.x), release(a.w), release(a.out), release(a.ids);
            free(x), free(w), free(ids);
        }
        moe_weights_free(&m);
    }
    if (unpiped) g4_backend_destroy(unpiped);
    if (own) g4_backend_destroy(own);
}

/* The one-token 4-bit tensor-core GEMVs at the 31B's q|k|v, gate, o, down
 * and gate|up-sized shapes and E2B's q|k|v, o, gate|up and down: the default
 * (integer mma for affine groups of 64 and 128; MXFP4 the fp16 kernel), the
 * default with one copy of the prepared activations, and the fp16 kernels (gemv=fp16: pipelined over 5 stages). */
static void gemv_pipe_speed(double bw) {
    const char *const knobs[] = {"gemv_copies=1", "gemv=fp16"};
    enum { N_KNOBS = sizeof knobs / sizeof knobs[0] };
    g4_backend *bes[1 + N_KNOBS] = {gpu};
    for (int v = 0; v < N_KNOBS; v++) bes[1 + v] = knob_backend(knobs[v]);
    const int64_t shapes[][2] = {{16384, 5376}, {21504, 5376}, {5376, 8192}, {5376, 21504}, {43008, 5376},
                                 {2560, 1536},  {1536, 2048},  {12288, 1536}, {1536, 6144}};
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}, {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8},
                   {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16}};
    printf("  one-token 4- and 8-bit GEMV: default / gemv_copies=1 (one copy of the prepared activations) / "
           "gemv=fp16 (4 bits: fp16, pipelined; 8 bits: float32)\n");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            test_matrix t;
            make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
            float *x = rand_floats((size_t)cols, 0.05f, 2.0f);
            float *dx = up(x, (size_t)cols * 4), *dout = poisoned((size_t)rows);
            const double bytes = (double)g4_matrix_bytes(&t.host);
            printf("  gemv %-18s %lldx%lld n=1 ", t.name, (long long)rows, (long long)cols);
            for (int v = 0; v < 1 + N_KNOBS; v++) {
                /* (MXFP4 runs the fp16 kernels whatever gemv says) */
                if (!bes[v]) continue;
                matmul_arg a = {bes[v], &t.dev, dx, dout, 1};
                const double us = time_op(bes[v], run_matmul, &a, 50) * 1e6;
                printf(" %s%.1f us (%.0f%%)", v ? " / " : "", us, 100 * bytes / (us * 1e-6) / 1e9 / bw);
            }
            printf("\n");
            release(dx), release(dout);
            free(x);
            free_matrix(&t);
        }
    for (int v = 1; v < 1 + N_KNOBS; v++)
        if (bes[v]) g4_backend_destroy(bes[v]);
}

static void speed(void) {
    const double bw = g4_cuda_probe_bandwidth(gpu);
    printf("\nspeed (device copy bandwidth %.0f GB/s):\n", bw);
    /* decode GEMV: a 31B MLP-sized matrix (21504 x 5376) in each format, one token */
    struct {
        g4_weight_format f;
        int bits, group;
        g4_dtype sdt;
    } formats[] = {{G4_WEIGHT_BF16, 0, 0, 0}, {G4_WEIGHT_AFFINE, 8, 64, G4_DTYPE_BF16},
                   {G4_WEIGHT_AFFINE, 4, 64, G4_DTYPE_BF16}, {G4_WEIGHT_AFFINE, 4, 32, G4_DTYPE_F16},
                   {G4_WEIGHT_MXFP4, 4, 32, G4_DTYPE_U8}};
    const int64_t rows = 21504, cols = 5376;
    float *x = rand_floats((size_t)512 * cols, 0.05f, 2.0f);
    float *dx = up(x, (size_t)512 * cols * 4), *dout = poisoned((size_t)512 * rows);
    /* the float32 GEMV that 4-bit formats used before the tensor-core one */
    g4_backend *f32 = knob_backend("gemv=float32");
    for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++) {
        test_matrix t;
        make_matrix(&t, formats[k].f, formats[k].bits, formats[k].group, formats[k].sdt, rows, cols);
        const double bytes = (double)g4_matrix_bytes(&t.host);
        const int ns[] = {1, 2, 4, 8, 512};
        for (int i = 0; i < 5; i++) {
            matmul_arg a = {gpu, &t.dev, dx, dout, ns[i]};
            double s = time_op(gpu, run_matmul, &a, ns[i] == 512 ? 5 : 20);
            if (ns[i] <= 8) {
                printf("  gemv %-18s %lldx%lld n=%-3d %8.1f us  %6.0f GB/s (%.0f%% of copy)\n", t.name, (long long)rows,
                       (long long)cols, ns[i], s * 1e6, bytes / s / 1e9, 100 * bytes / s / 1e9 / bw);
            }
            else
                printf("  gemm %-18s %lldx%lld n=%-3d %8.1f us  %6.1f TFLOP/s\n", t.name, (long long)rows,
                       (long long)cols, ns[i], s * 1e6, 2.0 * rows * cols * ns[i] / s / 1e12);
        }
        for (int n = 1; f32 && formats[k].bits >= 4 && n <= 8; n *= 8) {
            matmul_arg a = {f32, &t.dev, dx, dout, n};
            double s = time_op(f32, run_matmul, &a, 20);
            printf("  gemv %-18s %lldx%lld n=%-3d %8.1f us  %6.0f GB/s (%.0f%% of copy), float32 GEMV (gemv=float32)\n",
                   t.name, (long long)rows, (long long)cols, n, s * 1e6, bytes / s / 1e9, 100 * bytes / s / 1e9 / bw);
        }
        free_matrix(&t);
    }
    if (f32) g4_backend_destroy(f32);
    release(dx), release(dout);
    free(x);
    gemv_split_speed(bw);
    gemv_pipe_speed(bw);
    /* top_logits over the 262144-logit LM head: what a decode step adds to copy back candidates */
    {
        const int V = 262144, ks[] = {1, 40, 64, 1024};
        float *x = top_logits_input(8, V, 0);
        float *dx = up(x, (size_t)8 * V * 4), *dv = poisoned(8 * 1024);
        int32_t *di = (int32_t *)poisoned(8 * 1024);
        double *dl = (double *)poisoned(16);
        for (int rows = 1; rows <= 8; rows += 7)
            for (int i = 0; i < 4; i++) {
                top_arg a = {dx, di, dv, dl, rows, V, ks[i]};
                double t = time_op(gpu, run_top_logits, &a, 50);
                printf("  top_logits %d x %d, k=%-4d %8.1f us\n", rows, V, ks[i], t * 1e6);
            }
        release(dx), release(dv), release(di), release(dl);
        free(x);
    }
    moe_speed(bw);
    attention_speeds();
}


int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "all";
    if (strcmp(part, "all") && strcmp(part, "1") && strcmp(part, "gemv4") && strcmp(part, "attn") && strcmp(part, "moe")) {
        fprintf(stderr, "usage: cuda_ops_bench [all|gemv4|attn|moe]\n");
        return 2;
    }
    const int rc = harness_open();
    if (rc) return rc == 77 ? 77 : test_finish();
    if (gpu_is_cpu) { /* (the probes and settings are CUDA's) */
        printf("skipped: the bench times the CUDA backend (G4_TEST_DEVICE=cpu is for the tests)\n");
        g4_backend_destroy(gpu);
        return 77;
    }
    if (!strcmp(part, "gemv4"))
        gemv_pipe_speed(g4_cuda_probe_bandwidth(gpu));
    else if (!strcmp(part, "attn"))
        attention_speeds();
    else if (!strcmp(part, "moe"))
        moe_speed(g4_cuda_probe_bandwidth(gpu));
    else
        speed();
    attn_tc_destroy();
    return harness_close();
}
