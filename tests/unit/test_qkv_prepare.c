/* qkv_prepare (a layer's attention input from its merged q|k|v projection in
 * one op) against the op sequence it replaces, on the CPU, bit for bit:
 * random rows over head_dim 256 and 512 (and odd small ones), GQA, sliding
 * rings that wrap and full layers, k_eq_v, several tokens, sequences and
 * positions, and q alone (KV-shared layers). Then the decoder's merged path
 * end to end: the fixtures on a CPU backend that stacks q|k|v (by copying,
 * test only) against the plain CPU backend, logits compared bit for bit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "fixture_model.h"
#include "model/kv_cache.h"
#include "runtime/session.h"
#include "test_util.h"

static g4_backend *cpu;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int rand_int(int n) { return (int)(next_u64() % (uint64_t)n); }

/* A magnitude in [lo, hi] with a random sign: never zero. */
static float rnd(float lo, float hi) {
    float v = lo + (hi - lo) * (float)((double)(next_u64() >> 11) / 9007199254740992.0);
    return (next_u64() & 1) ? -v : v;
}

static float *rand_floats(size_t n, float lo, float hi) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = rnd(lo, hi);
    return p;
}

typedef struct {
    const char *label;
    int n_q, n_kv, D, n_pairs;
    float theta;
    int k_eq_v, sliding, window, block_size;
    int n_seqs;
    int len;   /* positions stored per sequence */
    int chunk; /* tokens per call (each call: one chunk of every sequence) */
    int no_norm_w; /* q/k norms without a weight */
} qkv_case;

/* The unfused sequence: q, k, v parts copied out, rmsnorm_rope q and k,
 * rmsnorm v (no weight), kv_store. */
static void unfused(float *q, const float *qkv, const g4_qkv_params *p, void *kv, const g4_attn_batch *b,
                    int sliding) {
    const int n = b->n_tokens, D = p->head_dim, Hq = p->n_q_heads, Hkv = kv ? p->n_kv_heads : 0;
    const int stride = (p->n_q_heads + (p->k_eq_v ? 1 : 2) * p->n_kv_heads) * D;
    cpu->ops->copy_rows(cpu, q, Hq * D, qkv, stride, n, Hq * D);
    cpu->ops->rmsnorm_rope(cpu, q, p->q_norm, n, Hq, D, b->pos, p->theta, p->n_pairs, p->eps);
    if (!kv) return;
    float *k = malloc((size_t)n * Hkv * D * 4), *v = malloc((size_t)n * Hkv * D * 4);
    cpu->ops->copy_rows(cpu, k, Hkv * D, qkv + (size_t)Hq * D, stride, n, Hkv * D);
    cpu->ops->copy_rows(cpu, v, Hkv * D, qkv + (size_t)(Hq + (p->k_eq_v ? 0 : Hkv)) * D, stride, n, Hkv * D);
    cpu->ops->rmsnorm_rope(cpu, k, p->k_norm, n, Hkv, D, b->pos, p->theta, p->n_pairs, p->eps);
    cpu->ops->rmsnorm(cpu, v, v, NULL, n * Hkv, D, p->eps);
    cpu->ops->kv_store(cpu, kv, k, v, b, sliding);
    free(k), free(v);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static void check_case(const qkv_case *c) {
    const int Hq = c->n_q, Hkv = c->n_kv, D = c->D, bs = c->block_size, S = c->n_seqs;
    const int stride_blocks = (c->len + bs - 1) / bs;
    const int ring = g4_kv_ring_blocks(c->window, c->chunk, bs);
    const int n_blocks = c->sliding ? S * ring : S * stride_blocks + 2;
    int32_t *full = malloc((size_t)S * stride_blocks * 4), *slide = malloc((size_t)S * ring * 4);
    /* blocks handed out in a shuffled order, as a pool would */
    int32_t *perm = malloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = rand_int(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < S * stride_blocks; i++) full[i] = perm[i % n_blocks];
    for (int i = 0; i < S * ring; i++) slide[i] = perm[i % n_blocks];
    free(perm);
    void *kv_a = cpu->ops->kv_alloc(cpu, n_blocks, bs, Hkv, D, G4_KV_F32), *kv_b = cpu->ops->kv_alloc(cpu, n_blocks, bs, Hkv, D, G4_KV_F32);
    float *qn = rand_floats((size_t)D, 0.5f, 2.0f), *kn = rand_floats((size_t)D, 0.5f, 2.0f);
    const g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .k_eq_v = c->k_eq_v,
                             .q_norm = c->no_norm_w ? NULL : qn, .k_norm = c->no_norm_w ? NULL : kn,
                             .theta = c->theta, .n_pairs = c->n_pairs, .eps = 1e-6f};
    const int width = (Hq + (c->k_eq_v ? 1 : 2) * Hkv) * D;
    const int max_n = S * c->chunk;
    int32_t *pos = malloc((size_t)max_n * 4), *seq = malloc((size_t)max_n * 4), *ranges = calloc((size_t)max_n, 16);
    float *qa = malloc((size_t)max_n * Hq * D * 4), *qb = malloc((size_t)max_n * Hq * D * 4);
    int calls = 0, q_same = 1, kv_same = 1;
    for (int start = 0; start < c->len; start += c->chunk) {
        const int per = c->len - start < c->chunk ? c->len - start : c->chunk;
        int n = 0;
        for (int s = 0; s < S; s++)
            for (int t = 0; t < per; t++) pos[n] = start + t, seq[n] = s, n++;
        const g4_attn_batch b = {.n_tokens = n, .pos = pos, .seq = seq, .kv_range = ranges, .full_tables = full,
                                 .full_table_stride = stride_blocks, .sliding_tables = slide, .ring_blocks = ring,
                                 .block_size = bs};
        float *qkv = rand_floats((size_t)n * width, 0.01f, 3.0f);
        memset(qb, 0xff, (size_t)n * Hq * D * 4); /* NaN: an unwritten element fails */
        unfused(qa, qkv, &p, kv_a, &b, c->sliding);
        cpu->ops->qkv_prepare(cpu, qb, qkv, &p, kv_b, &b, c->sliding);
        q_same &= same_bits(qa, qb, (size_t)n * Hq * D);
        free(qkv);
        calls++;
    }
    /* every position still held: the whole sequence on full layers, the
     * last ring's worth on sliding ones */
    const int kept = c->sliding ? (c->len < ring * bs ? c->len : ring * bs) : c->len;
    const int n_read = S * kept;
    int32_t *rpos = malloc((size_t)n_read * 4), *rseq = malloc((size_t)n_read * 4);
    for (int s = 0, i = 0; s < S; s++)
        for (int t = c->len - kept; t < c->len; t++, i++) rpos[i] = t, rseq[i] = s;
    const g4_attn_batch rb = {.n_tokens = n_read, .pos = rpos, .seq = rseq, .full_tables = full,
                              .full_table_stride = stride_blocks, .sliding_tables = slide, .ring_blocks = ring,
                              .block_size = bs};
    const size_t kv_elems = (size_t)n_read * Hkv * D;
    float *ka = malloc(kv_elems * 4), *va = malloc(kv_elems * 4), *kb = malloc(kv_elems * 4),
          *vb = malloc(kv_elems * 4);
    cpu->ops->kv_read(cpu, kv_a, ka, va, &rb, c->sliding);
    cpu->ops->kv_read(cpu, kv_b, kb, vb, &rb, c->sliding);
    kv_same = same_bits(ka, kb, kv_elems) && same_bits(va, vb, kv_elems);
    /* and not trivially: the cache holds normalised values (not the zeros it started with) */
    double ss = 0;
    for (int d = 0; d < D; d++) ss += (double)vb[d] * vb[d];
    CHECK(ss > 0.5 * D && ss < 1.5 * D, "%s: a stored V head has mean square %.3f, not about 1", c->label, ss / D);
    printf("  %-40s %d calls, %d x %d/%d heads x %d: q %s, cache (%d positions) %s\n", c->label, calls, max_n, Hq,
           Hkv, D, q_same ? "identical" : "DIFFERS", n_read, kv_same ? "identical" : "DIFFERS");
    CHECK(q_same, "%s: fused q differs from rmsnorm_rope", c->label);
    CHECK(kv_same, "%s: fused cache differs from rmsnorm_rope + rmsnorm + kv_store", c->label);
    cpu->ops->kv_free(cpu, kv_a), cpu->ops->kv_free(cpu, kv_b);
    free(full), free(slide), free(qn), free(kn), free(pos), free(seq), free(ranges), free(qa), free(qb), free(rpos),
        free(rseq), free(ka), free(va), free(kb), free(vb);
}

static void test_op(void) {
    const qkv_case cases[] = {
        /* label, Hq, Hkv, D, pairs, theta, k_eq_v, sliding, window, bs, seqs, len, chunk, no_norm_w */
        {"E2B sliding 256, ring wraps, decode", 8, 1, 256, 128, 10000.0f, 0, 1, 48, 16, 1, 150, 1, 0},
        {"E2B global 512, 25% RoPE, prefill", 8, 1, 512, 64, 1000000.0f, 0, 0, 0, 16, 1, 100, 37, 0},
        {"31B sliding GQA 2, 3 sequences", 32, 16, 256, 128, 10000.0f, 0, 1, 64, 16, 3, 90, 7, 0},
        {"31B global k_eq_v GQA 8", 32, 4, 512, 64, 1000000.0f, 1, 0, 0, 16, 2, 40, 9, 0},
        {"26B sliding k_eq_v, chunks wrap", 16, 8, 256, 128, 10000.0f, 1, 1, 32, 16, 1, 200, 20, 0},
        {"no norm weights, GQA 4", 8, 2, 128, 64, 10000.0f, 0, 0, 0, 8, 2, 30, 30, 1},
        {"odd head_dim 18, partial pairs", 4, 2, 18, 5, 500.0f, 0, 1, 12, 4, 2, 41, 3, 0},
        {"fixture-like 32", 2, 1, 32, 16, 10000.0f, 1, 0, 0, 16, 1, 25, 25, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

/* q alone (KV-shared layers): rows of q only, and q|k|v rows with no cache */
static void test_q_only(void) {
    const int n = 6, Hq = 8, D = 256;
    int32_t pos[6] = {0, 1, 77, 4095, 131071, 9};
    int32_t seq[6] = {0};
    for (int layout = 0; layout < 2; layout++) {
        const int Hkv = layout ? 2 : 0;
        float *qn = rand_floats((size_t)D, 0.5f, 2.0f);
        const g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .q_norm = qn,
                                 .theta = 10000.0f, .n_pairs = 128, .eps = 1e-6f};
        const g4_attn_batch b = {.n_tokens = n, .pos = pos, .seq = seq, .block_size = 16};
        const size_t width = (size_t)(Hq + 2 * Hkv) * D;
        float *qkv = rand_floats(n * width, 0.01f, 3.0f), *qa = malloc((size_t)n * Hq * D * 4),
              *qb = malloc((size_t)n * Hq * D * 4);
        memset(qb, 0xff, (size_t)n * Hq * D * 4);
        unfused(qa, qkv, &p, NULL, &b, 0);
        cpu->ops->qkv_prepare(cpu, qb, qkv, &p, NULL, &b, 0);
        CHECK(same_bits(qa, qb, (size_t)n * Hq * D), "q only (%s): differs from rmsnorm_rope",
              layout ? "q|k|v rows" : "q rows");
        printf("  q only, %-33s %d tokens x %d heads x %d: %s\n", layout ? "q|k|v rows, no cache" : "q rows", n, Hq,
               D, same_bits(qa, qb, (size_t)n * Hq * D) ? "identical" : "DIFFERS");
        free(qn), free(qkv), free(qa), free(qb);
    }
}

/* ---- the decoder's merged path on the CPU ---- */

/* prepare_stacked by copying (weights are mmapped; the CPU backend itself
 * never stacks): makes the decoder take its merged path on the CPU. */
static void *stacked_bufs[1024];
static int n_stacked_bufs;

static void *stack_array(g4_matrix *const *parts, int n, int which, size_t row_bytes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)parts[i]->rows * row_bytes;
    unsigned char *buf = malloc(total ? total : 1), *at = buf;
    for (int i = 0; i < n; i++) {
        const void *src = which == 0 ? parts[i]->data : which == 1 ? parts[i]->scales : parts[i]->biases;
        memcpy(at, src, (size_t)parts[i]->rows * row_bytes);
        at += (size_t)parts[i]->rows * row_bytes;
    }
    if (n_stacked_bufs < 1024) stacked_bufs[n_stacked_bufs++] = buf;
    return buf;
}

static int n_stacked_calls;

static g4_status copy_stacked(g4_backend *be, g4_matrix *const *parts, int n, g4_matrix *stacked) {
    (void)be;
    if (n_stacked_bufs + 3 > 1024) return g4_fail(G4_ERR_UNSUPPORTED, "test: too many stacked matrices");
    g4_matrix s = *parts[0];
    s.rows = 0;
    for (int i = 0; i < n; i++) s.rows += parts[i]->rows;
    s.data = stack_array(parts, n, 0, s.row_bytes);
    if (s.scales) s.scales = stack_array(parts, n, 1, s.scale_row_bytes);
    if (s.biases) s.biases = stack_array(parts, n, 2, s.scale_row_bytes);
    *stacked = s;
    int64_t first = 0;
    for (int i = 0; i < n; i++) {
        const int64_t r = parts[i]->rows;
        *parts[i] = g4_matrix_rows(&s, first, r);
        first += r;
    }
    n_stacked_calls++;
    return G4_OK;
}

static void test_decoder(void) {
    g4_backend_ops stacking_ops = *cpu->ops;
    stacking_ops.prepare_stacked = copy_stacked;
    /* (matmul_gated over the stacked gate|up: the default, matmul then gelu_mul) */
    g4_backend stacking = {.ops = &stacking_ops, .impl = cpu->impl};
    const char *fixtures[] = {"dense",    "moe",       "e2b",      "realdims", "dense-mlx8",
                              "moe-mlx4", "moe-mxfp4", "e2b-mlx4", "unified"};
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        fixture_ref ref;
        g4_model *plain, *merged;
        if (!fixture_model_open(fixtures[f], cpu, &ref, &plain)) continue;
        const int calls_before = n_stacked_calls;
        g4_status st = g4_model_load_dir(test_fixture(fixtures[f]), &stacking, &merged);
        CHECK(st == G4_OK, "%s: load with stacking: %s", fixtures[f], g4_error_message());
        if (st != G4_OK) {
            g4_model_release(plain);
            fixture_ref_close(&ref);
            continue;
        }
        const g4_text_config *tc = &merged->config.text;
        int with_kv = 0, n_merged = 0, n_k_eq_v = 0, n_gated = 0;
        for (int i = 0; i < tc->n_layers; i++) {
            with_kv += tc->layers[i].kv_donor < 0;
            n_merged += merged->text.layers[i].qkv.data != NULL;
            n_k_eq_v += merged->text.layers[i].qkv.data != NULL && tc->layers[i].k_eq_v;
            n_gated += merged->text.layers[i].gate_up.data != NULL;
        }
        /* one stacking per q|k|v and one per gate|up */
        CHECK(n_merged == with_kv && n_gated == tc->n_layers && n_stacked_calls - calls_before == with_kv + n_gated,
              "%s: %d of %d layers with their own K/V got a merged q|k|v, %d of %d a stacked gate|up", fixtures[f],
              n_merged, with_kv, n_gated, tc->n_layers);
        CHECK(merged->n_params == plain->n_params, "%s: parameters counted %llu, unmerged %llu", fixtures[f],
              (unsigned long long)merged->n_params, (unsigned long long)plain->n_params);
        int n_all;
        int32_t *all = fixture_ref_ids(&ref, "text", "all_ids", &n_all);
        const size_t count = (size_t)2 * n_all * tc->vocab_size;
        float *want = test_prefill_decode_logits(plain, all, n_all), *got = test_prefill_decode_logits(merged, all, n_all);
        /* Prefill identical. Decode too, except with 4-bit weights: the CPU's
         * one-token 4-bit GEMV sums rows four at a time within runs of rows
         * and the rest one at a time, rounding differently; merging moves the
         * runs' edges. (qkv_prepare itself is bitwise: test_op.) */
        const size_t half = count / 2;
        const int prefill_same = same_bits(got, want, half), decode_same = same_bits(got + half, want + half, half);
        const double decode_err = test_rel_rms(got + half, want + half, half);
        const g4_matrix *q0 = &merged->text.layers[0].q;
        const int four_bit = q0->format == G4_WEIGHT_MXFP4 || (q0->format == G4_WEIGHT_AFFINE && q0->bits == 4);
        printf("  %-10s %d/%d layers merged (%d k_eq_v), %d tokens: prefill logits %s, decode logits %s "
               "(rel_rms %.2e)\n",
               fixtures[f], n_merged, tc->n_layers, n_k_eq_v, n_all, prefill_same ? "identical" : "DIFFER",
               decode_same ? "identical" : "differ", decode_err);
        CHECK(prefill_same, "%s: prefill logits through the merged q|k|v path differ", fixtures[f]);
        /* 4e-5: with gate|up stacked too, the tiny fixtures' logits amplify
         * the reordered sums to 1.7e-5 (moe-mlx4); a wrong row is O(1) */
        if (four_bit)
            CHECK(decode_err < 4e-5, "%s: decode logits through the merged path: rel_rms %.3e", fixtures[f],
                  decode_err);
        else
            CHECK(decode_same, "%s: decode logits through the merged q|k|v path differ", fixtures[f]);
        free(want), free(got), free(all);
        g4_model_release(merged);
        g4_model_release(plain);
        fixture_ref_close(&ref);
    }
    for (int i = 0; i < n_stacked_bufs; i++) free(stacked_bufs[i]);
}

int main(void) {
    g4_status st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    test_op();
    test_q_only();
    test_decoder();
    g4_backend_destroy(cpu);
    return test_finish();
}
