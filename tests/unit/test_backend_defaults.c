/* The defaults of the fused backend entries (backend_defaults.c) on the CPU.
 * A "primitives" backend is the CPU's table with every fused entry emptied and
 * refilled by g4_backend_fill_defaults. Checked: each default against the
 * CPU's own fused kernel where it has one (add_rmsnorm, qkv_prepare), bit for
 * bit; matmul_gated over a stacked matrix and attention_input over stacked
 * q|k|v against the unstacked parts, bit for bit, and matmul_gated against a
 * float64 reference; and the fixtures end to end on the primitives backend
 * against the CPU backend, logits bit for bit (prefill and decode): the model
 * issues one sequence of calls whatever a backend fuses. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "fixture_model.h"
#include "model/kv_cache.h"
#include "runtime/session.h"
#include "tensor/dtype.h"
#include "test_util.h"

static g4_backend *cpu;
static g4_backend_ops prim_ops;
static g4_backend prim;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static float rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0) * 4.0f - 2.0f;
}

static float *rand_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rnd();
    return p;
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The CPU's table without its fused entries, refilled with the defaults. */
static void make_primitives(void) {
    prim_ops = *cpu->ops;
    prim_ops.matmul_gelu_mul = NULL;
    prim_ops.matmul_gated = NULL;
    prim_ops.matmul_gate_up = NULL;
    prim_ops.rmsnorm_pair = NULL;
    prim_ops.rmsnorm_rope = NULL;
    prim_ops.add_rmsnorm = NULL;
    prim_ops.add_rmsnorm_moe = NULL;
    prim_ops.moe_residual = NULL;
    prim_ops.moe_route_experts = NULL;
    prim_ops.qkv_prepare = NULL;
    prim_ops.attention_input = NULL;
    g4_backend_fill_defaults(&prim_ops);
    prim.ops = &prim_ops;
    prim.impl = cpu->impl;
}

static void test_add_rmsnorm(void) {
    const int rows = 5, dim = 96;
    const size_t n = (size_t)rows * dim;
    float *h0 = rand_floats(n), *x = rand_floats(n), *w = rand_floats(dim), *nw = rand_floats(dim);
    const float scales[] = {1.0f, 0.37f};
    int same = 1;
    for (int i = 0; i < 2; i++)
        for (int next = 0; next < 2; next++) {
            float *ha = malloc(n * 4), *hb = malloc(n * 4), *oa = calloc(n, 4), *ob = calloc(n, 4);
            memcpy(ha, h0, n * 4);
            memcpy(hb, h0, n * 4);
            cpu->ops->add_rmsnorm(cpu, ha, x, w, rows, dim, 1e-6f, scales[i], next ? oa : NULL, nw);
            prim.ops->add_rmsnorm(&prim, hb, x, w, rows, dim, 1e-6f, scales[i], next ? ob : NULL, nw);
            same &= same_bits(ha, hb, n * 4) && same_bits(oa, ob, n * 4);
            free(ha), free(hb), free(oa), free(ob);
        }
    CHECK(same, "add_rmsnorm: the default differs from the CPU's fused kernel");
    printf("  add_rmsnorm (scale 1 / 0.37, with and without the next norm): default %s\n",
           same ? "identical" : "DIFFERS");
    free(h0), free(x), free(w), free(nw);
}

/* A bf16 matrix [rows][cols] of random values (its storage in *buf). */
static g4_matrix bf16_matrix(int64_t rows, int64_t cols, uint16_t **buf) {
    *buf = malloc((size_t)rows * cols * 2);
    for (int64_t i = 0; i < rows * cols; i++) (*buf)[i] = g4_f32_to_bf16(rnd() * 0.2f);
    return (g4_matrix){.format = G4_WEIGHT_BF16, .rows = rows, .cols = cols, .data = *buf, .row_bytes = cols * 2};
}

static void test_matmul_gated(void) {
    const int n = 3, F = 40, d = 64;
    uint16_t *buf;
    const g4_matrix both = bf16_matrix(2 * F, d, &buf);
    const g4_matrix gate = g4_matrix_rows(&both, 0, F), up = g4_matrix_rows(&both, F, F);
    float *x = rand_floats((size_t)n * d), *stacked = malloc((size_t)n * F * 4), *apart = malloc((size_t)n * F * 4),
          *work = malloc((size_t)n * F * 4), *g = malloc((size_t)n * F * 4), *u = malloc((size_t)n * F * 4);
    prim.ops->matmul_gated(&prim, stacked, x, n, &both);
    const g4_matrix_group parts = {.part = {&gate, &up}, .n = 2, .stacked = NULL};
    prim.ops->matmul_gate_up(&prim, apart, work, x, n, &parts);
    g4_matmul_reference(g, x, n, &gate);
    g4_matmul_reference(u, x, n, &up);
    double worst = 0;
    for (int i = 0; i < n * F; i++) {
        const double k = 0.7978845608028654, a = g[i];
        const double want = 0.5 * a * (1.0 + tanh(k * (a + 0.044715 * a * a * a))) * u[i];
        const double err = fabs(stacked[i] - want) / (fabs(want) + 1e-3);
        if (err > worst) worst = err;
    }
    const int same = same_bits(stacked, apart, (size_t)n * F * 4);
    CHECK(same, "matmul_gated over stacked gate|up differs from matmul_gate_up over the parts");
    CHECK(worst < 1.5e-5, "matmul_gated: relative error %.3e against float64", worst);
    printf("  matmul_gated (stacked bf16 %d x %d, %d tokens): parts %s, float64 reference rel %.1e\n", 2 * F, d, n,
           same ? "identical" : "DIFFER", worst);
    free(buf), free(x), free(stacked), free(apart), free(work), free(g), free(u);
}

/* qkv_prepare's default and the CPU's, and attention_input over stacked
 * q|k|v and over the parts, on a full layer of 2 sequences. */
static void test_attention_input(int k_eq_v) {
    enum { Hq = 4, Hkv = 2, D = 32, d = 48, bs = 4, S = 2, per = 5, n = S * per, blocks = 4 };
    const int wq = Hq * D, wkv = Hkv * D, width = wq + (k_eq_v ? 1 : 2) * wkv;
    int32_t full[S * 2] = {3, 0, 1, 2}, pos[S * per], seq[S * per], ranges[S * per * 4];
    for (int i = 0; i < n; i++) {
        pos[i] = i % per, seq[i] = i / per;
        ranges[4 * i] = ranges[4 * i + 2] = 0;
        ranges[4 * i + 1] = ranges[4 * i + 3] = pos[i];
    }
    const g4_attn_batch b = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = full,
                             .full_table_stride = 2, .sliding_tables = full, .ring_blocks = 2, .block_size = bs};
    float *qn = rand_floats(D), *kn = rand_floats(D);
    const g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .k_eq_v = k_eq_v, .q_norm = qn,
                             .k_norm = kn, .theta = 10000.0f, .n_pairs = D / 2, .eps = 1e-6f};
    uint16_t *buf;
    const g4_matrix all = bf16_matrix(width, d, &buf);
    const g4_matrix q = g4_matrix_rows(&all, 0, wq), k = g4_matrix_rows(&all, wq, wkv),
                    v = k_eq_v ? k : g4_matrix_rows(&all, wq + wkv, wkv);
    const g4_matrix_group stacked = {.part = {&q, &k, &v}, .n = k_eq_v ? 2 : 3, .stacked = &all};
    const g4_matrix_group apart = {.part = {&q, &k, &v}, .n = k_eq_v ? 2 : 3, .stacked = NULL};
    float *x = rand_floats((size_t)n * d), *qkv = malloc((size_t)n * width * 4),
          *work = malloc((size_t)n * (Hq + 2 * Hkv) * D * 4);
    cpu->ops->matmul(cpu, qkv, x, n, &all);
    void *kv[4];
    float *qo[4];
    for (int i = 0; i < 4; i++) {
        kv[i] = cpu->ops->kv_alloc(cpu, blocks, bs, Hkv, D, G4_KV_F32);
        qo[i] = malloc((size_t)n * wq * 4);
        memset(qo[i], 0xff, (size_t)n * wq * 4);
    }
    cpu->ops->qkv_prepare(cpu, qo[0], qkv, &p, kv[0], &b, 0);
    prim.ops->qkv_prepare(&prim, qo[1], qkv, &p, kv[1], &b, 0);
    prim.ops->attention_input(&prim, qo[2], work, x, &stacked, &p, kv[2], &b, 0);
    prim.ops->attention_input(&prim, qo[3], work, x, &apart, &p, kv[3], &b, 0);
    float *ka = malloc((size_t)n * wkv * 4), *va = malloc((size_t)n * wkv * 4), *kb = malloc((size_t)n * wkv * 4),
          *vb = malloc((size_t)n * wkv * 4);
    cpu->ops->kv_read(cpu, kv[0], ka, va, &b, 0);
    const char *what[] = {"", "qkv_prepare default", "attention_input stacked", "attention_input apart"};
    for (int i = 1; i < 4; i++) {
        cpu->ops->kv_read(cpu, kv[i], kb, vb, &b, 0);
        const int same = same_bits(qo[0], qo[i], (size_t)n * wq * 4) && same_bits(ka, kb, (size_t)n * wkv * 4) &&
                         same_bits(va, vb, (size_t)n * wkv * 4);
        CHECK(same, "%s%s: q or the cache differs from the CPU's qkv_prepare", what[i], k_eq_v ? " (k_eq_v)" : "");
        printf("  %-24s%s: q and cache %s\n", what[i], k_eq_v ? " (k_eq_v)" : "", same ? "identical" : "DIFFER");
    }
    /* q alone (a KV-shared layer): no cache */
    const g4_matrix_group q_only = {.part = {&q}, .n = 1, .stacked = NULL};
    float *qa = malloc((size_t)n * wq * 4);
    prim.ops->attention_input(&prim, qa, work, x, &q_only, &p, NULL, &b, 0);
    CHECK(same_bits(qa, qo[0], (size_t)n * wq * 4), "attention_input of q alone differs");
    for (int i = 0; i < 4; i++) cpu->ops->kv_free(cpu, kv[i]), free(qo[i]);
    free(qa), free(ka), free(va), free(kb), free(vb), free(x), free(qkv), free(work), free(buf), free(qn), free(kn);
}

static void test_fixtures(void) {
    const char *fixtures[] = {"dense", "moe", "e2b", "moe-mlx4", "unified"};
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        fixture_ref ref;
        g4_model *plain, *composed;
        if (!fixture_model_open(fixtures[f], cpu, &ref, &plain)) continue;
        g4_status st = g4_model_load_dir(test_fixture(fixtures[f]), &prim, &composed);
        CHECK(st == G4_OK, "%s: load on the primitives backend: %s", fixtures[f], g4_error_message());
        if (st == G4_OK) {
            int n_all;
            int32_t *all = fixture_ref_ids(&ref, "text", "all_ids", &n_all);
            const size_t count = (size_t)2 * n_all * plain->config.text.vocab_size;
            float *want = test_prefill_decode_logits(plain, all, n_all), *got = test_prefill_decode_logits(composed, all, n_all);
            const int same = same_bits(want, got, count * sizeof *got);
            CHECK(same, "%s: logits on the primitives backend differ from the CPU backend's", fixtures[f]);
            printf("  %-10s %d tokens, prefill and decode on the primitives backend: logits %s\n", fixtures[f],
                   n_all, same ? "identical" : "DIFFER");
            free(want), free(got), free(all);
            g4_model_release(composed);
        }
        g4_model_release(plain);
        fixture_ref_close(&ref);
    }
}

int main(void) {
    g4_status st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    make_primitives();
    test_add_rmsnorm();
    test_matmul_gated();
    test_attention_input(0);
    test_attention_input(1);
    test_fixtures();
    g4_backend_destroy(cpu);
    return test_finish();
}
