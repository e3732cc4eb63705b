/* KV cache element types (backend.h g4_kv_type) on the CPU:
 *  1. fp8 e4m3 conversions against ml_dtypes' float8_e4m3fn (every byte's
 *     value; rounding of ties, subnormals, edges and random values), vendored
 *     in tests/data/fp8 by tests/tools/make_fp8_refs.py;
 *  2. kv_store then kv_read: bf16 gives exactly the bf16 rounding of each
 *     value, fp8 the value within half a step of its row's scaled e4m3 grid;
 *     qkv_prepare into a typed cache stores exactly what kv_store of its
 *     float32 results stores (rings wrapping, blocks crossed, GQA, K = V);
 *  3. whole models (fixtures with sliding and full layers, K = V, KV-shared
 *     layers, head_dim 256/512): every position's logits with a bf16 and an
 *     fp8 cache against the float32 cache, chunked prefill and one-token
 *     decode crossing ring wraps and block boundaries, within the tolerances
 *     below; and speculative-style rollback (truncate, then decode again)
 *     giving the same logits as the straight run at each type. */
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
#include "tensor/fp8.h"
#include "test_util.h"

/* Logits against the float32 cache's over every position. The fixtures'
 * random weights amplify a change of K or V about 40-fold (bf16's 2^-9
 * rounding gives 6-10% relative RMS in the logits; float32 roundings that
 * flip a bf16 rounding give 1e-3 between chunked and one-token prefill), so
 * these check that each layer kind reads its type (an unrelated run agrees
 * on ~0 of 72 top-1 ids and differs by ~1.4 relative RMS); the quality
 * itself is measured on the trained model (test_kv_quality.sh,
 * bench/RESULTS.md). Measured: bf16 0.06-0.10 and 58-71/72 top-1; fp8
 * 0.49-0.75 and 22-58/72. */
#define LOGITS_BF16_TOL 0.2
#define LOGITS_FP8_TOL 1.0
#define TOP1_BF16_MIN 50
#define TOP1_FP8_MIN 15
#define CHUNKED_TYPED_TOL 3e-2 /* chunked against one-token prefill with a typed cache (f32: 1e-4) */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rnd(float lo, float hi) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((double)(rng_state >> 11) / 9007199254740992.0);
}

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_e4m3_refs(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/fp8/e4m3_refs.txt", getenv("G4_TEST_DATA") ? getenv("G4_TEST_DATA") : "tests/data");
    FILE *f = fopen(path, "r");
    CHECK(f, "cannot open %s", path);
    if (!f) return;
    char line[128];
    int n_decode = 0, n_round = 0, bad_decode = 0, bad_round = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned a, b;
        if (line[0] == 'd' && sscanf(line + 1, "%u %x", &a, &b) == 2) {
            const float want = f32_of_bits(b), got = g4_e4m3_to_f32((uint8_t)a);
            n_decode++;
            if (isnan(want) ? !isnan(got) : memcmp(&want, &got, 4) != 0) {
                if (bad_decode++ < 5) fprintf(stderr, "decode 0x%02x: got %g, want %g\n", a, got, want);
            }
        } else if (line[0] == 'r' && sscanf(line + 1, "%x %u", &a, &b) == 2) {
            const uint8_t got = g4_f32_to_e4m3(f32_of_bits(a));
            n_round++;
            if (got != b && bad_round++ < 5)
                fprintf(stderr, "round %.9g: got 0x%02x, want 0x%02x\n", f32_of_bits(a), got, b);
        }
    }
    fclose(f);
    CHECK(n_decode == 256 && n_round > 2000, "%d decode and %d rounding references read", n_decode, n_round);
    CHECK(bad_decode == 0, "%d of 256 bytes decode differently from ml_dtypes", bad_decode);
    CHECK(bad_round == 0, "%d of %d roundings differ from ml_dtypes", bad_round, n_round);
    /* beyond the references (ml_dtypes gives NaN above 464): saturation, NaN */
    CHECK(g4_f32_to_e4m3(1e6f) == 0x7e && g4_f32_to_e4m3(-500.0f) == 0xfe && g4_f32_to_e4m3(INFINITY) == 0x7e,
          "saturation to +-448");
    CHECK((g4_f32_to_e4m3(NAN) & 0x7f) == 0x7f, "NaN stays NaN");
}

/* A batch of n tokens of one sequence at positions p0.. over a shuffled full
 * table and a ring. */
typedef struct {
    int32_t pos[256], seq[256], range[4 * 256], table[64], ring[8];
    g4_attn_batch b;
} batch;

static void make_batch(batch *x, int p0, int n, int bs, int ring_blocks, int window) {
    for (int t = 0; t < n; t++) {
        const int p = p0 + t;
        x->pos[t] = p, x->seq[t] = 0;
        x->range[4 * t] = p - window + 1 > 0 ? p - window + 1 : 0, x->range[4 * t + 1] = p;
        x->range[4 * t + 2] = 0, x->range[4 * t + 3] = p;
    }
    for (int i = 0; i < 64; i++) x->table[i] = (i * 7 + 3) % 64;
    for (int i = 0; i < ring_blocks; i++) x->ring[i] = 60 - 2 * i;
    x->b = (g4_attn_batch){.n_tokens = n, .pos = x->pos, .seq = x->seq, .kv_range = x->range,
                           .full_tables = x->table, .full_table_stride = 64, .sliding_tables = x->ring,
                           .ring_blocks = ring_blocks, .block_size = bs};
}

static void test_store_read(g4_backend *be) {
    enum { BS = 16, BLOCKS = 64, HKV = 2, D = 256, N = 100 };
    const size_t row = (size_t)HKV * D;
    float *k = malloc(N * row * sizeof *k), *v = malloc(N * row * sizeof *v);
    float *k2 = malloc(N * row * sizeof *k2), *v2 = malloc(N * row * sizeof *v2);
    for (size_t i = 0; i < N * row; i++) k[i] = rnd(-3, 3), v[i] = rnd(-1, 1) * (i % 97 == 0 ? 40.0f : 1.0f);
    for (size_t i = 0; i < D; i++) k[5 * row + i] = 0.0f; /* an all-zero row (token 5, head 0) */
    batch x;
    make_batch(&x, 0, N, BS, 8, 1000);
    for (int sliding = 0; sliding < 2; sliding++)
        for (int type = G4_KV_F32; type <= G4_KV_FP8; type++) {
            void *kv = be->ops->kv_alloc(be, BLOCKS, BS, HKV, D, (g4_kv_type)type);
            CHECK(kv, "kv_alloc");
            if (!kv) continue;
            be->ops->kv_store(be, kv, k, v, &x.b, sliding);
            be->ops->kv_read(be, kv, k2, v2, &x.b, sliding);
            int bad = 0;
            for (size_t r = 0; r < (size_t)N * HKV; r++) {
                float kpeak = 0, vpeak = 0;
                for (int d = 0; d < D; d++) kpeak = fmaxf(kpeak, fabsf(k[r * D + d])), vpeak = fmaxf(vpeak, fabsf(v[r * D + d]));
                for (int d = 0; d < D; d++) {
                    const size_t i = r * D + d;
                    if (type == G4_KV_F32) {
                        bad += k2[i] != k[i] || v2[i] != v[i];
                    } else if (type == G4_KV_BF16) {
                        bad += k2[i] != g4_round_bf16(k[i]) || v2[i] != g4_round_bf16(v[i]);
                    } else {
                        /* half a step of e4m3 at the value (2^-4 relative), or of the subnormal grid */
                        const double kt = fmax(fabs(k[i]) / 16, kpeak / 448.0 / 1024) * (1 + 1e-6);
                        const double vt = fmax(fabs(v[i]) / 16, vpeak / 448.0 / 1024) * (1 + 1e-6);
                        bad += !(fabs(k2[i] - k[i]) <= kt) || !(fabs(v2[i] - v[i]) <= vt);
                    }
                }
            }
            CHECK(bad == 0, "%s %s: %d values read back outside the type's rounding", g4_kv_type_name((g4_kv_type)type),
                  sliding ? "ring" : "full", bad);
            be->ops->kv_free(be, kv);
        }
    free(k), free(v), free(k2), free(v2);
}

/* qkv_prepare into each type stores what kv_store of the float32 cache's
 * contents stores: chunks of 24 tokens over a ring of 4 blocks of 16 (wraps)
 * and a full table; GQA 8/2, head_dim 512 and 256, K = V too. */
static void test_qkv_prepare_types(g4_backend *be) {
    const int shapes[][3] = {{8, 2, 256}, {4, 1, 512}};
    for (size_t sh = 0; sh < 2; sh++)
        for (int k_eq_v = 0; k_eq_v < 2; k_eq_v++) {
            const int Hq = shapes[sh][0], Hkv = shapes[sh][1], D = shapes[sh][2], CH = 24, LEN = 96;
            const int stride = (Hq + (k_eq_v ? 1 : 2) * Hkv) * D;
            float *qkv = malloc((size_t)CH * stride * sizeof *qkv), *q = malloc((size_t)CH * Hq * D * sizeof *q);
            float *kn = malloc((size_t)D * sizeof *kn), *qn = malloc((size_t)D * sizeof *qn);
            float *k32 = malloc((size_t)LEN * Hkv * D * sizeof *k32), *v32 = malloc((size_t)LEN * Hkv * D * sizeof *v32);
            float *ka = malloc((size_t)LEN * Hkv * D * sizeof *ka), *va = malloc((size_t)LEN * Hkv * D * sizeof *va);
            float *kb = malloc((size_t)LEN * Hkv * D * sizeof *kb), *vb = malloc((size_t)LEN * Hkv * D * sizeof *vb);
            for (int d = 0; d < D; d++) kn[d] = rnd(0.5f, 2.0f), qn[d] = rnd(0.5f, 2.0f);
            const g4_qkv_params p = {.n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .k_eq_v = k_eq_v,
                                     .q_norm = qn, .k_norm = kn, .theta = 10000.0f, .n_pairs = D / 4, .eps = 1e-6f};
            for (int sliding = 0; sliding < 2; sliding++)
                for (int type = G4_KV_BF16; type <= G4_KV_FP8; type++) {
                    void *c32 = be->ops->kv_alloc(be, 64, 16, Hkv, D, G4_KV_F32);
                    void *ct = be->ops->kv_alloc(be, 64, 16, Hkv, D, (g4_kv_type)type);
                    void *cu = be->ops->kv_alloc(be, 64, 16, Hkv, D, (g4_kv_type)type);
                    int bad = 0;
                    for (int p0 = 0; p0 < LEN; p0 += CH) {
                        for (size_t i = 0; i < (size_t)CH * stride; i++) qkv[i] = rnd(-2, 2);
                        batch x;
                        make_batch(&x, p0, CH, 16, 4, 40);
                        be->ops->qkv_prepare(be, q, qkv, &p, c32, &x.b, sliding);
                        be->ops->qkv_prepare(be, q, qkv, &p, ct, &x.b, sliding);
                        /* the float32 results stored through kv_store */
                        be->ops->kv_read(be, c32, k32, v32, &x.b, sliding);
                        be->ops->kv_store(be, cu, k32, v32, &x.b, sliding);
                        be->ops->kv_read(be, ct, ka, va, &x.b, sliding);
                        be->ops->kv_read(be, cu, kb, vb, &x.b, sliding);
                        bad += memcmp(ka, kb, (size_t)CH * Hkv * D * sizeof *ka) != 0 ||
                               memcmp(va, vb, (size_t)CH * Hkv * D * sizeof *va) != 0;
                    }
                    CHECK(bad == 0, "qkv_prepare %d/%d x %d k_eq_v %d %s %s: %d chunks differ from kv_store", Hq, Hkv,
                          D, k_eq_v, sliding ? "ring" : "full", g4_kv_type_name((g4_kv_type)type), bad);
                    be->ops->kv_free(be, c32), be->ops->kv_free(be, ct), be->ops->kv_free(be, cu);
                }
            free(qkv), free(q), free(kn), free(qn), free(k32), free(v32), free(ka), free(va), free(kb), free(vb);
        }
}

enum { N_POS = 72 };

/* Every position's logits: prefill chunks of `chunk` over the first 40,
 * then one token at a time; with `rollback`, after position 56 the session
 * goes back to 50 (as a rejected draft) and decodes 50.. again. */
static float *run_model(const g4_model *m, g4_kv_type type, int chunk, int rollback) {
    const int V = m->config.text.vocab_size;
    g4_session_options opt = {.n_ctx = N_POS + 8, .chunk = chunk, .kv_type = type};
    g4_session *s;
    float *logits = malloc((size_t)N_POS * V * sizeof *logits);
    if (!logits || g4_session_create(m, &opt, &s) != G4_OK) {
        free(logits);
        return NULL;
    }
    int32_t ids[N_POS];
    for (int i = 0; i < N_POS; i++) ids[i] = (i * 37 + 11) % (V - 4) + 2;
    g4_status st = g4_session_eval(s, ids, 40, NULL, G4_LOGITS_ALL, logits);
    for (int i = 40; st == G4_OK && i < N_POS; i++) {
        st = g4_session_eval(s, &ids[i], 1, NULL, G4_LOGITS_ALL, logits + (size_t)i * V);
        if (rollback && i == 56 && st == G4_OK) {
            /* a rejected draft of other tokens, then back to position 50 */
            int32_t wrong[6] = {3, 4, 5, 6, 7, 8};
            float *junk = malloc((size_t)6 * V * sizeof *junk);
            st = junk ? g4_session_eval(s, wrong, 6, NULL, G4_LOGITS_ALL, junk) : G4_ERR_OUT_OF_MEMORY;
            free(junk);
            g4_kv_seq_truncate(&s->seq, 50);
            i = 49;
            rollback = 0;
        }
    }
    g4_session_destroy(s);
    if (st != G4_OK) {
        free(logits);
        return NULL;
    }
    return logits;
}

static void test_models(g4_backend *be) {
    const char *names[] = {"e2b", "dense", "realdims"};
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        fixture_ref ref;
        g4_model *m;
        if (!fixture_model_open(names[f], be, &ref, &m)) continue;
        const int V = m->config.text.vocab_size;
        const size_t n = (size_t)N_POS * V;
        float *base = run_model(m, G4_KV_F32, 16, 0);
        CHECK(base, "%s f32: %s", names[f], g4_error_message());
        for (int type = G4_KV_F32; base && type <= G4_KV_FP8; type++) {
            float *chunked = run_model(m, (g4_kv_type)type, 16, 0);
            float *small = run_model(m, (g4_kv_type)type, 1, 0); /* every position one decode step */
            float *rolled = run_model(m, (g4_kv_type)type, 16, 1);
            CHECK(chunked && small && rolled, "%s %s: %s", names[f], g4_kv_type_name((g4_kv_type)type),
                  g4_error_message());
            if (chunked && small && rolled) {
                const double e = test_rel_rms(chunked, base, n), e1 = test_rel_rms(small, chunked, n);
                int agree = 0;
                for (int i = 0; i < N_POS; i++)
                    agree += test_argmax(chunked + (size_t)i * V, V) == test_argmax(base + (size_t)i * V, V);
                const double tol = type == G4_KV_F32 ? 0 : type == G4_KV_BF16 ? LOGITS_BF16_TOL : LOGITS_FP8_TOL;
                printf("%s %s: logits rel rms %.3g against f32 (top-1 %d/%d), one-token prefill %.3g\n", names[f],
                       g4_kv_type_name((g4_kv_type)type), e, agree, N_POS, e1);
                const int top1_min = type == G4_KV_F32 ? N_POS : type == G4_KV_BF16 ? TOP1_BF16_MIN : TOP1_FP8_MIN;
                CHECK(e <= tol && agree >= top1_min,
                      "%s %s: logits rel rms %.3g against the f32 cache (max %.3g), top-1 %d/%d (min %d)", names[f],
                      g4_kv_type_name((g4_kv_type)type), e, tol, agree, N_POS, top1_min);
                /* chunked prefill and one-token decode: the float32 path's tolerance, or its flips of the rounding */
                const double tol1 = type == G4_KV_F32 ? 1e-4 : CHUNKED_TYPED_TOL;
                CHECK(e1 <= tol1, "%s %s: one-token prefill against chunked %.3g > %.3g", names[f],
                      g4_kv_type_name((g4_kv_type)type), e1, tol1);
                CHECK(memcmp(rolled, chunked, n * sizeof *rolled) == 0, "%s %s: logits after a rollback differ",
                      names[f], g4_kv_type_name((g4_kv_type)type));
            }
            free(chunked), free(small), free(rolled);
        }
        free(base);
        g4_model_release(m);
        fixture_ref_close(&ref);
    }
}

int main(void) {
    g4_backend *be;
    CHECK(g4_backend_cpu_create(0, &be) == G4_OK, "cpu backend");
    test_e4m3_refs();
    test_store_read(be);
    test_qkv_prepare_types(be);
    test_models(be);
    g4_backend_destroy(be);
    return test_finish();
}
