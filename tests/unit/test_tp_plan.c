/* The tensor-parallel weight plan (src/model/tp_plan.h) on every real
 * Gemma 4 config (tests/data/hub: E2B, 26B-A4B, 31B and the mlx-community
 * 4-bit 26B-A4B) at 1, 2, 4 and 8 GPUs: the ranks' query heads, MLP columns,
 * experts and vocabulary rows tile their whole range exactly once; each
 * rank's KV heads are exactly those its query heads read (query head h reads
 * KV head h / (heads / KV heads)), shared between ranks only where a layer
 * has fewer KV heads than ranks; MLP splits fall on the unit (the
 * quantisation group); and the counts that cannot split are refused with
 * their name. Expected values are worked out from the configs by hand
 * where stated. No GPU needed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "model/tp_plan.h"
#include "test_util.h"

static const char *data_path(const char *rel) {
    static char buf[1024];
    const char *root = getenv("G4_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "tests/data", rel);
    return buf;
}

/* ranges r[0..n) tile [0, total) in order */
static int tiles(const g4_range *r, int n, int total) {
    int at = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].begin != at || r[i].end <= r[i].begin) return 0;
        at = r[i].end;
    }
    return at == total;
}

static void check_config(const char *file, int unit) {
    g4_config cfg;
    if (g4_config_load(data_path(file), &cfg) != G4_OK) {
        CHECK(0, "%s: %s", file, g4_error_message());
        return;
    }
    const g4_text_config *c = &cfg.text;
    const int counts[] = {1, 2, 4, 8};
    for (int k = 0; k < 4; k++) {
        const int n = counts[k];
        g4_tp_shard s[8];
        int ok = 1;
        for (int r = 0; r < n && ok; r++) {
            const g4_status st = g4_tp_plan(c, n, r, unit, &s[r]);
            CHECK(st == G4_OK, "%s, %d GPUs, rank %d: %s", file, n, r, g4_error_message());
            ok = st == G4_OK;
            if (!ok)
                for (int q = 0; q < r; q++) g4_tp_shard_free(&s[q]);
        }
        if (!ok) continue;
        g4_range v[8], e[8], q[8], m[8];
        for (int r = 0; r < n; r++) v[r] = s[r].vocab, e[r] = s[r].experts;
        CHECK(tiles(v, n, c->vocab_size), "%s, %d GPUs: vocabulary rows do not tile %d", file, n, c->vocab_size);
        if (c->moe) CHECK(tiles(e, n, c->n_experts), "%s, %d GPUs: experts do not tile %d", file, n, c->n_experts);
        for (int i = 0; i < c->n_layers; i++) {
            const g4_layer_config *l = &c->layers[i];
            const int group = c->n_heads / l->n_kv_heads;
            int kv_seen[64] = {0};
            for (int r = 0; r < n; r++) {
                const g4_tp_layer *t = &s[r].layers[i];
                q[r] = t->q_heads;
                m[r] = t->mlp;
                CHECK(t->mlp.begin % unit == 0 && (t->mlp.end % unit == 0 || t->mlp.end == l->mlp_width),
                      "%s layer %d rank %d: MLP columns [%d, %d) cut a %d-column unit", file, i, r, t->mlp.begin,
                      t->mlp.end, unit);
                /* the KV heads are exactly those the query heads read */
                CHECK(t->kv_heads.begin == t->q_heads.begin / group &&
                          t->kv_heads.end == (t->q_heads.end - 1) / group + 1,
                      "%s layer %d rank %d: KV heads [%d, %d) for query heads [%d, %d), groups of %d", file, i, r,
                      t->kv_heads.begin, t->kv_heads.end, t->q_heads.begin, t->q_heads.end, group);
                CHECK(t->kv_shared == (l->n_kv_heads < n), "%s layer %d rank %d: shared %d with %d KV heads on %d GPUs",
                      file, i, r, t->kv_shared, l->n_kv_heads, n);
                for (int h = t->kv_heads.begin; h < t->kv_heads.end && h < 64; h++) kv_seen[h]++;
            }
            CHECK(tiles(q, n, c->n_heads), "%s layer %d, %d GPUs: query heads do not tile %d", file, i, n, c->n_heads);
            CHECK(tiles(m, n, l->mlp_width), "%s layer %d, %d GPUs: MLP columns do not tile %d", file, i, n,
                  l->mlp_width);
            /* every KV head on at least one rank; on more than one only when shared */
            for (int h = 0; h < l->n_kv_heads && h < 64; h++)
                CHECK(kv_seen[h] == (l->n_kv_heads < n ? n / l->n_kv_heads : 1),
                      "%s layer %d, %d GPUs: KV head %d on %d ranks", file, i, n, h, kv_seen[h]);
        }
        for (int r = 0; r < n; r++) g4_tp_shard_free(&s[r]);
    }
    g4_config_free(&cfg);
}

/* values worked out from the configs */
static void check_examples(void) {
    g4_config cfg;
    g4_tp_shard s;
    /* 31B, 2 GPUs: 32 heads -> 16 each; sliding layers 16 KV heads -> 8 each; global layers 4 -> 2 each; MLP 21504
     * columns in groups of 64: 336 groups -> 168 each = 10752; rank 1's vocabulary rows from 131072 */
    if (g4_config_load(data_path("hub/gemma-4-31B-it.config.json"), &cfg) == G4_OK) {
        CHECK(g4_tp_plan(&cfg.text, 2, 1, 64, &s) == G4_OK, "31B on 2: %s", g4_error_message());
        CHECK(s.layers[0].q_heads.begin == 16 && s.layers[0].kv_heads.begin == 8 && s.layers[0].kv_heads.end == 16,
              "31B rank 1 of 2, sliding layer 0: q from %d, KV [%d, %d)", s.layers[0].q_heads.begin,
              s.layers[0].kv_heads.begin, s.layers[0].kv_heads.end);
        CHECK(s.layers[5].kv_heads.begin == 2 && s.layers[5].kv_heads.end == 4 && !s.layers[5].kv_shared,
              "31B rank 1 of 2, global layer 5: KV [%d, %d)", s.layers[5].kv_heads.begin, s.layers[5].kv_heads.end);
        CHECK(s.layers[0].mlp.begin == 10752 && s.layers[0].mlp.end == 21504 && s.vocab.begin == 131072,
              "31B rank 1 of 2: MLP [%d, %d), vocabulary from %d", s.layers[0].mlp.begin, s.layers[0].mlp.end,
              s.vocab.begin);
        g4_tp_shard_free(&s);
        /* 8 GPUs: global layers' 4 KV heads each shared by 2 ranks (4 query heads a rank, 8 a KV head) */
        CHECK(g4_tp_plan(&cfg.text, 8, 3, 64, &s) == G4_OK, "31B on 8: %s", g4_error_message());
        CHECK(s.layers[5].kv_heads.begin == 1 && s.layers[5].kv_heads.end == 2 && s.layers[5].kv_shared,
              "31B rank 3 of 8, global layer 5: KV [%d, %d) shared %d", s.layers[5].kv_heads.begin,
              s.layers[5].kv_heads.end, s.layers[5].kv_shared);
        g4_tp_shard_free(&s);
        /* refused: 3 GPUs (32 heads), a unit of 4096 columns (21504 = 5.25 units) */
        CHECK(g4_tp_plan(&cfg.text, 3, 0, 64, &s) == G4_ERR_INVALID_ARGUMENT &&
                  strstr(g4_error_message(), "32 query heads"),
              "31B on 3 GPUs: %s", g4_error_message());
        CHECK(g4_tp_plan(&cfg.text, 2, 0, 4096, &s) == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "MLP"),
              "31B, 4096-column units: %s", g4_error_message());
        g4_config_free(&cfg);
    }
    /* 26B-A4B, 2 GPUs, groups of 64: the dense MLP's 2112 columns are 33 groups -> 16 and 17 (1024 | 1088); 128
     * experts -> 64 each */
    if (g4_config_load(data_path("hub/gemma-4-26B-A4B-it.config.json"), &cfg) == G4_OK) {
        CHECK(g4_tp_plan(&cfg.text, 2, 0, 64, &s) == G4_OK, "26B on 2: %s", g4_error_message());
        CHECK(s.layers[0].mlp.end == 1024 && s.experts.begin == 0 && s.experts.end == 64,
              "26B rank 0 of 2: MLP to %d, experts [%d, %d)", s.layers[0].mlp.end, s.experts.begin, s.experts.end);
        g4_tp_shard_free(&s);
        CHECK(g4_tp_plan(&cfg.text, 2, 1, 5, &s) == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "2112 columns"),
              "26B, 5-column units: %s", g4_error_message());
        g4_config_free(&cfg);
    }
    /* E2B, 2 GPUs: 8 heads -> 4 each, its one KV head computed and stored on both */
    if (g4_config_load(data_path("hub/gemma-4-E2B-it.config.json"), &cfg) == G4_OK) {
        CHECK(g4_tp_plan(&cfg.text, 2, 1, 64, &s) == G4_OK, "E2B on 2: %s", g4_error_message());
        CHECK(s.layers[0].q_heads.begin == 4 && s.layers[0].kv_heads.begin == 0 && s.layers[0].kv_heads.end == 1 &&
                  s.layers[0].kv_shared,
              "E2B rank 1 of 2: q from %d, KV [%d, %d)", s.layers[0].q_heads.begin, s.layers[0].kv_heads.begin,
              s.layers[0].kv_heads.end);
        g4_tp_shard_free(&s);
        CHECK(g4_tp_plan(&cfg.text, 2, 2, 64, &s) == G4_ERR_INVALID_ARGUMENT, "rank 2 of 2 accepted");
        g4_config_free(&cfg);
    }
}

int main(void) {
    check_config("hub/gemma-4-E2B-it.config.json", 64);
    check_config("hub/gemma-4-26B-A4B-it.config.json", 64);
    check_config("hub/gemma-4-31B-it.config.json", 64);
    check_config("hub/gemma-4-31B-it.config.json", 1);
    check_config("hub/mlx/mlx-community_gemma-4-26b-a4b-it-4bit.config.json", 64);
    check_examples();
    return test_finish();
}
