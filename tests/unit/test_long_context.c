/* A long prompt on a fixture-sized model whose context is raised: the
 * `e2b` fixture's shape (sliding and full layers, KV-shared layers, GQA 2)
 * with max_position_embeddings 16384, a 256-position window and 2 query
 * heads on 1 KV head (half the attention work), random
 * weights, 8,256 tokens. The logits of every position are the same, within
 * the float32 path's tolerance, whether the prompt is prefilled in chunks
 * of 512, in chunks of 1,000 (other ring wraps and block boundaries), or in
 * chunks up to 8,192 and then one token at a time; with a bf16 and an fp8
 * cache they stay within those types' tolerances of the float32 cache's
 * (test_kv_types.c says why the fixtures' amplification makes them wide).
 * The chunked prefill's working memory is the chunk's, not the prompt's.
 * On the fast path (float32 attention): both runs use the same kernels, so
 * the float32 tolerance holds. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/kv_cache.h"
#include "model/text_decoder.h"
#include "runtime/session.h"
#include "test_util.h"

enum { CTX = 16384 };
/* 8,256 tokens (8,192 prefilled, 64 one at a time); the sanitizer build
 * (G4_TEST_SANITIZED=1) 2,112 (2,048 + 64): the same paths and ring wraps,
 * a quarter of the work. */
static int N = 8256, PREFIX = 8192;

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* every row's logits: prefill chunks of `chunk` (the session's own chunking
 * inside each eval of up to `call` tokens) up to `prefix`, then one token at
 * a time */
static float *run(const g4_model *m, g4_kv_type type, int chunk, int call, int prefix, const int32_t *ids) {
    const int V = m->config.text.vocab_size;
    g4_session_options so = {.n_ctx = N + 8, .chunk = chunk, .kv_type = type};
    g4_session *s;
    float *logits = malloc((size_t)N * V * sizeof *logits);
    if (!logits || g4_session_create(m, &so, &s) != G4_OK) {
        free(logits);
        return NULL;
    }
    CHECK(g4_text_scratch_capacity(s->scratch) == chunk, "scratch sized by the chunk (%d), not the prompt",
          g4_text_scratch_capacity(s->scratch));
    g4_status st = G4_OK;
    for (int i = 0; st == G4_OK && i < prefix; i += call) {
        const int n = prefix - i < call ? prefix - i : call;
        st = g4_session_eval(s, ids + i, n, NULL, G4_LOGITS_ALL, logits + (size_t)i * V);
    }
    for (int i = prefix; st == G4_OK && i < N; i++)
        st = g4_session_eval(s, ids + i, 1, NULL, G4_LOGITS_ALL, logits + (size_t)i * V);
    CHECK(st == G4_OK, "eval: %s", g4_error_message());
    g4_session_destroy(s);
    if (st != G4_OK) free(logits);
    return st == G4_OK ? logits : NULL;
}

int main(void) {
    const char *sanitized = getenv("G4_TEST_SANITIZED");
    if (sanitized && !strcmp(sanitized, "1")) N = 2112, PREFIX = 2048;
    char path[1024], *json = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", test_fixture("e2b"));
    g4_status st = g4_read_file(path, 1 << 20, &json, &len);
    CHECK(st == G4_OK, "%s: %s", path, g4_error_message());
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    if (!root) return test_finish();
    cJSON *text = cJSON_GetObjectItem(root, "text_config");
    cJSON_ReplaceItemInObject(text, "sliding_window", cJSON_CreateNumber(256));
    cJSON_ReplaceItemInObject(text, "max_position_embeddings", cJSON_CreateNumber(CTX));
    /* two query heads on one KV head (GQA 2) instead of 4 on 2: half the attention, the same paths */
    cJSON_ReplaceItemInObject(text, "num_attention_heads", cJSON_CreateNumber(2));
    cJSON_ReplaceItemInObject(text, "num_key_value_heads", cJSON_CreateNumber(1));
    char *config = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    g4_backend *be;
    g4_model *m = NULL;
    st = g4_backend_cpu_create(0, &be);
    /* the fast path's float32 attention (the exact one sums 8K keys in float64 per head: minutes) */
    if (st == G4_OK) be->ops->set_precision(be, G4_PRECISION_FAST);
    if (st == G4_OK) st = g4_model_synthesize_json(config, strlen(config), "e2b-16k", "bf16", be, NULL, &m);
    free(config);
    CHECK(st == G4_OK, "model: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    CHECK(m->config.text.max_position == CTX && m->config.text.sliding_window == 256, "raised context");
    const int V = m->config.text.vocab_size;
    int32_t *ids = malloc(N * sizeof *ids);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919u + 13) % (unsigned)(V - 4)) + 2;
    const size_t n = (size_t)N * V;
    float *base = run(m, G4_KV_F32, 512, 4096, N, ids);
    float *other = run(m, G4_KV_F32, 1000, 1000, PREFIX, ids);
    if (base && other) {
        const double e = test_rel_rms(other, base, n);
        const double tail = test_rel_rms(other + (size_t)PREFIX * V, base + (size_t)PREFIX * V, (size_t)(N - PREFIX) * V);
        printf("f32: chunks of 1000 + one-token decode against chunks of 512: rel rms %.3g (decoded tail %.3g)\n", e,
               tail);
        CHECK(e <= 1e-4 && tail <= 1e-4, "f32 chunkings and one-token decode differ: %.3g (tail %.3g)", e, tail);
    }
    /* the typed caches against the float32 one, chunked and decoded */
    const double tol[] = {0, 0, 0.2, 1.0}; /* by g4_kv_type: bf16, fp8 (test_kv_types.c) */
    for (int t = G4_KV_BF16; base && t <= G4_KV_FP8; t++) {
        float *typed = run(m, (g4_kv_type)t, 1000, 1000, PREFIX, ids);
        if (!typed) continue;
        const double e = test_rel_rms(typed, base, n);
        int agree = 0;
        for (int i = 0; i < N; i++) agree += argmax(typed + (size_t)i * V, V) == argmax(base + (size_t)i * V, V);
        printf("%s: against f32 rel rms %.3g, top-1 %d/%d\n", g4_kv_type_name((g4_kv_type)t), e, agree, N);
        CHECK(e <= tol[t] && agree >= (t == G4_KV_BF16 ? N * 7 / 10 : N / 5), "%s: rel rms %.3g, top-1 %d/%d",
              g4_kv_type_name((g4_kv_type)t), e, agree, N);
        free(typed);
    }
    free(base), free(other), free(ids);
    g4_model_release(m);
    g4_backend_destroy(be);
    return test_finish();
}
