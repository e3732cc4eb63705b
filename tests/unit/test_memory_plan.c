/* The memory accounting (runtime/memory_plan.h, kv_cache.h) against what
 * was allocated: for fixtures with sliding and full layers, KV-shared layers
 * and K = V, at each KV type, a session's and an engine's pool take exactly
 * the bytes g4_kv_pool_bytes, the plan's per-token figures and its ring cost
 * say (summed from the CPU pool's own calloc sizes); the working memory is
 * what g4_text_scratch_create allocated; the largest context of n sequences
 * is the last one within the budget; and a CPU context beyond the memory
 * available is refused with a clear error before anything is allocated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_attention.h"
#include "fixture_model.h"
#include "model/kv_cache.h"
#include "model/text_decoder.h"
#include "runtime/engine.h"
#include "runtime/memory_plan.h"
#include "runtime/session.h"
#include "test_util.h"

static uint64_t allocated(const g4_kv_pool *p) {
    uint64_t total = 0;
    for (int i = 0; i < p->n_layers; i++) total += cpu_kv_allocated_bytes(p->layer_kv[i]);
    return total;
}

/* per-token bytes counted from the config, layer by layer */
static uint64_t per_token(const g4_model *m, g4_kv_type t, g4_layer_kind kind) {
    uint64_t total = 0;
    for (int i = 0; i < m->config.text.n_layers; i++) {
        const g4_layer_config *lc = &m->config.text.layers[i];
        if (lc->kv_donor >= 0 || lc->kind != kind) continue;
        const uint64_t v = t == G4_KV_F32 ? 4 : t == G4_KV_BF16 ? 2 : 1;
        total += 2 * (uint64_t)lc->n_kv_heads * ((uint64_t)lc->head_dim * v + (t == G4_KV_FP8 ? 4 : 0));
    }
    return total;
}

static uint64_t p3_scratch(const g4_model *m) {
    g4_memory_plan p;
    g4_memory_plan_make(m, G4_KV_BF16, 16, 32, 3, &p);
    return p.scratch_bytes;
}

static void check_model(const char *name, g4_backend *be) {
    fixture_ref ref;
    g4_model *m;
    if (!fixture_model_open(name, be, &ref, &m)) return;
    const g4_text_config *tc = &m->config.text;
    for (int t = G4_KV_F32; t <= G4_KV_FP8; t++) {
        const g4_kv_type type = (g4_kv_type)t;
        const char *tn = g4_kv_type_name(type);
        g4_memory_plan p;
        g4_memory_plan_make(m, type, 16, 32, 1, &p);
        CHECK(p.full_bytes_per_token == per_token(m, type, G4_LAYER_FULL) &&
                  p.sliding_bytes_per_token == per_token(m, type, G4_LAYER_SLIDING),
              "%s %s: per-token bytes %llu/%llu", name, tn, (unsigned long long)p.full_bytes_per_token,
              (unsigned long long)p.sliding_bytes_per_token);
        /* sessions shorter and longer than window + chunk (the ring is capped by the context) */
        const int ctxs[] = {20, 100, 333};
        for (int c = 0; c < 3; c++) {
            g4_session_options so = {.n_ctx = ctxs[c], .chunk = 32, .kv_type = type};
            g4_session *s;
            g4_status st = g4_session_create(m, &so, &s);
            CHECK(st == G4_OK, "%s %s: session: %s", name, tn, g4_error_message());
            if (st != G4_OK) continue;
            const uint64_t got = allocated(s->kv);
            CHECK(got == g4_kv_pool_bytes(s->kv, m), "%s %s ctx %d: allocated %llu, pool bytes %llu", name, tn,
                  ctxs[c], (unsigned long long)got, (unsigned long long)g4_kv_pool_bytes(s->kv, m));
            CHECK(got == g4_memory_plan_seq_bytes(&p, ctxs[c]), "%s %s ctx %d: allocated %llu, plan %llu", name, tn,
                  ctxs[c], (unsigned long long)got, (unsigned long long)g4_memory_plan_seq_bytes(&p, ctxs[c]));
            g4_session_destroy(s);
        }
        /* an engine: the pool of kv_blocks plus max_seqs rings, the scratch as planned */
        g4_engine_options eo = {.max_seqs = 3, .n_ctx = 200, .kv_blocks = 30, .max_batch_tokens = 32, .kv_type = type,
                                .no_prefix_cache = 1}; /* (its snapshots: test_prefix_cache) */
        g4_engine *e;
        g4_status st = g4_engine_create(m, &eo, &e);
        CHECK(st == G4_OK, "%s %s: engine: %s", name, tn, g4_error_message());
        if (st == G4_OK) {
            g4_memory_plan pe;
            g4_memory_plan_make(m, type, 16, 32, 3, &pe);
            g4_engine_stats es;
            g4_engine_get_stats(e, &es);
            const uint64_t want = 30ull * 16 * pe.full_bytes_per_token + 3 * pe.ring_bytes;
            CHECK(es.kv_bytes == want, "%s %s: engine pool %llu bytes, planned %llu", name, tn,
                  (unsigned long long)es.kv_bytes, (unsigned long long)want);
            CHECK(g4_memory_plan_full_blocks(&pe, pe.weight_bytes + pe.scratch_bytes + pe.reserve_bytes + want, 3) == 30,
                  "%s %s: the budget of exactly this pool gives %lld blocks", name, tn,
                  (long long)g4_memory_plan_full_blocks(&pe, pe.weight_bytes + pe.scratch_bytes + want, 3));
            g4_engine_destroy(e);
        }
        /* the scratch */
        g4_text_scratch *sc;
        if (g4_text_scratch_create(m, 32, 3, &sc) == G4_OK) {
            CHECK(g4_text_scratch_bytes(sc) == g4_text_scratch_bytes_for(m, 32, 3) &&
                      g4_text_scratch_bytes_for(m, 32, 3) == (size_t)p3_scratch(m),
                  "%s: scratch %zu allocated, %zu planned", name, g4_text_scratch_bytes(sc),
                  g4_text_scratch_bytes_for(m, 32, 3));
            g4_text_scratch_free(sc);
        }
        /* the largest context within a budget: fits, and one more block does not */
        const uint64_t fixed = p.weight_bytes + p.scratch_bytes + p.reserve_bytes;
        for (int n = 1; n <= 16; n *= 4) {
            const uint64_t budget = fixed + (uint64_t)n * g4_memory_plan_seq_bytes(&p, 1000) + 5;
            const int c = g4_memory_plan_max_ctx(&p, budget, n, tc->max_position);
            CHECK(c >= 1000 && fixed + n * g4_memory_plan_seq_bytes(&p, c) <= budget &&
                      fixed + n * g4_memory_plan_seq_bytes(&p, c + 16) > budget,
                  "%s %s: %d sequences: max context %d for a budget of 1000 positions each", name, tn, n, c);
        }
        CHECK(g4_memory_plan_max_ctx(&p, fixed, 1, tc->max_position) == 0, "%s %s: no room, no context", name, tn);
    }
    /* beyond the memory: a clear error, nothing allocated */
    const uint64_t avail = g4_memory_available();
    if (avail) {
        const uint64_t per = per_token(m, G4_KV_F32, G4_LAYER_FULL);
        const int64_t blocks = (int64_t)(avail / (16 * per)) + 16;
        g4_status st = g4_memory_check_kv(m, G4_KV_F32, 16, blocks, 0, (int)(blocks * 16 > 2000000000 ? 2000000000 : blocks * 16));
        CHECK(st == G4_ERR_LIMIT && strstr(g4_error_message(), "GiB of memory is available"),
              "%s: a pool past the available memory: %s", name, g4_error_message());
        CHECK(g4_memory_check_kv(m, G4_KV_F32, 16, 4, 4, 64) == G4_OK, "%s: a small pool passes", name);
    }
    g4_model_release(m);
    fixture_ref_close(&ref);
}

int main(void) {
    g4_backend *be;
    CHECK(g4_backend_cpu_create(1, &be) == G4_OK, "cpu backend");
    check_model("e2b", be);
    check_model("dense", be);
    g4_backend_destroy(be);
    return test_finish();
}
