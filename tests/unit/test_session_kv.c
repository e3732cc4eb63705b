/* A session's KV cache is sized by its context: when n_ctx is shorter than
 * the sliding window plus a prefill chunk, the sliding layers get no more
 * blocks than the full ones (a 12B session of 72 positions allocated 737 MB
 * of ring for a 1024-position window before), and the logits are the same
 * bits as those of a session with the full ring. The model is synthetic, the
 * `dense` fixture's shape with a 512-position window. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

#define N_POS 40

/* Logits of every position: a prefill of 20, 10 single steps, a prefill of 10. */
static float *run(const g4_model *m, int n_ctx, uint64_t *kv_bytes, int *ring) {
    const int V = m->config.text.vocab_size;
    g4_session_options opt = {.n_ctx = n_ctx};
    g4_session *s;
    float *logits = malloc((size_t)N_POS * V * sizeof *logits);
    if (!logits || g4_session_create(m, &opt, &s) != G4_OK) {
        free(logits);
        return NULL;
    }
    *kv_bytes = g4_kv_pool_bytes(s->kv, m);
    *ring = s->kv->ring_blocks;
    int32_t ids[N_POS];
    for (int i = 0; i < N_POS; i++) ids[i] = (i * 37 + 5) % (V - 4) + 2;
    g4_status st = g4_session_eval(s, ids, 20, NULL, G4_LOGITS_ALL, logits);
    for (int i = 20; st == G4_OK && i < 30; i++)
        st = g4_session_eval(s, &ids[i], 1, NULL, G4_LOGITS_ALL, logits + (size_t)i * V);
    if (st == G4_OK) st = g4_session_eval(s, ids + 30, 10, NULL, G4_LOGITS_ALL, logits + (size_t)30 * V);
    g4_session_destroy(s);
    if (st != G4_OK) {
        free(logits);
        return NULL;
    }
    return logits;
}

int main(void) {
    char path[1024], *json = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/config.json", test_fixture("dense"));
    g4_status st = g4_read_file(path, 1 << 20, &json, &len);
    CHECK(st == G4_OK, "%s: %s", path, g4_error_message());
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    if (!root) return test_finish();
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "text_config"), "sliding_window", cJSON_CreateNumber(512));
    char *config = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    g4_backend *be;
    g4_model *m = NULL;
    st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_synthesize_json(config, strlen(config), "dense-w512", "bf16", be, NULL, &m);
    free(config);
    CHECK(st == G4_OK, "model: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    CHECK(m->config.text.sliding_window == 512, "window %d", m->config.text.sliding_window);
    uint64_t small_bytes = 0, big_bytes = 0;
    int small_ring = 0, big_ring = 0;
    float *small = run(m, N_POS, &small_bytes, &small_ring), *big = run(m, 2048, &big_bytes, &big_ring);
    CHECK(small && big, "eval: %s", g4_error_message());
    /* 40 positions in blocks of 16: 3 blocks for every layer kind */
    CHECK(small_ring == 3, "n_ctx %d: ring of %d blocks, expected 3", N_POS, small_ring);
    CHECK(big_ring == (512 + 512 - 1 + 15) / 16 + 1, "n_ctx 2048: ring of %d blocks", big_ring);
    uint64_t own_kv = 0; /* per position, float32 K and V of layers with their own cache */
    for (int i = 0; i < m->config.text.n_layers; i++) {
        const g4_layer_config *lc = &m->config.text.layers[i];
        if (lc->kv_donor < 0) own_kv += (uint64_t)lc->n_kv_heads * lc->head_dim * 2 * 4;
    }
    CHECK(small_bytes == own_kv * 48, "n_ctx %d: %llu KV bytes, expected %llu (48 positions)", N_POS,
          (unsigned long long)small_bytes, (unsigned long long)(own_kv * 48));
    if (small && big) {
        const size_t n = (size_t)N_POS * m->config.text.vocab_size;
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) differ += memcmp(&small[i], &big[i], sizeof *small) != 0;
        CHECK(differ == 0, "%zu of %zu logits differ between the short and the long context (max %g)", differ, n,
              test_max_abs_diff(small, big, n));
    }
    free(small);
    free(big);
    g4_model_release(m);
    g4_backend_destroy(be);
    return test_finish();
}
