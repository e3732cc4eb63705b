/* config.json / generation_config.json parsing.
 * - Every real release config (tests/data/hub: E2B, E4B, 26B-A4B, 31B, the
 *   12B derivative, the mlx-community 4-bit conversions) loads, and the layer
 *   plan matches SPEC-gemma4.md §1.3 (per-variant table), §1.6 (token ids),
 *   §1.7 (derived geometry, KV donors, double-wide MLP), §1.4/§1.5 (vision,
 *   audio) and §1.8 (12B); MLX quantization blocks give the defaults and every
 *   per-module override (§7.2: MoE MLP and router at 8 bits).
 * - The fixtures' configs (transformers 5.17 per_layer_config form) match the
 *   fixture README.
 * - Malformed configs are refused with a message naming the file and field. */
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "base/file.h"
#include "io/config.h"
#include "test_util.h"

static const char *data_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TEST_DATA");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : "tests/data", rel);
    return b;
}

static char *read_text(const char *path) {
    char *text = NULL;
    size_t len;
    if (g4_read_file(path, 1u << 20, &text, &len) != G4_OK) fprintf(stderr, "%s\n", g4_error_message());
    return text;
}

/* ---- the release configs against the spec ------------------------------- */

typedef struct {
    const char *file;
    int unified;
    int n_layers, hidden, heads, kv_sliding, kv_full, k_eq_v;
    int full_every; /* full layers at i % full_every == full_every - 1 */
    int intermediate, double_wide, ple, n_kv_shared, donor_sliding, donor_full;
    int sliding_window, max_position, bidirectional_vision;
    int moe, experts, top_k, moe_width;
    int n_eos, eos[3];
    int vision; /* 1 on-device tower, 2 large tower, 0 none (unified) */
    int audio;
} release;

/* SPEC-gemma4.md §1.3 table, §1.6 eos (IT: [1, 106]); the mlx-community
 * conversions carry [1, 106, 50] in their own config.json. */
static const release releases[] = {
    {"hub/gemma-4-E2B-it.config.json", 0, 35, 1536, 8, 1, 1, 0, 5, 6144, 1, 256, 20, 13, 14, 512, 131072, 0,
     0, 0, 0, 0, 2, {1, 106}, 1, 1},
    {"hub/gemma-4-E4B-it.config.json", 0, 42, 2560, 8, 2, 2, 0, 6, 10240, 0, 256, 18, 22, 23, 512, 131072, 0,
     0, 0, 0, 0, 2, {1, 106}, 1, 1},
    {"hub/gemma-4-26B-A4B-it.config.json", 0, 30, 2816, 16, 8, 2, 1, 6, 2112, 0, 0, 0, -1, -1, 1024, 262144, 1,
     1, 128, 8, 704, 2, {1, 106}, 2, 0},
    {"hub/gemma-4-31B-it.config.json", 0, 60, 5376, 32, 16, 4, 1, 6, 21504, 0, 0, 0, -1, -1, 1024, 262144, 1,
     0, 0, 0, 0, 2, {1, 106}, 2, 0},
    /* §1.8: 48 layers, d 3840, 16 heads, 8 KV heads (1 on full layers), K=V. */
    {"hub/gemma-4-12B-it.config.PARTIAL.json", 1, 48, 3840, 16, 8, 1, 1, 6, 15360, 0, 0, 0, -1, -1, 1024,
     262144, 1, 0, 0, 0, 0, 2, {1, 106}, 0, 0},
    {"hub/mlx/mlx-community_gemma-4-e2b-it-4bit.config.json", 0, 35, 1536, 8, 1, 1, 0, 5, 6144, 1, 256, 20, 13,
     14, 512, 131072, 0, 0, 0, 0, 0, 3, {1, 106, 50}, 1, 1},
    {"hub/mlx/mlx-community_gemma-4-e4b-it-4bit.config.json", 0, 42, 2560, 8, 2, 2, 0, 6, 10240, 0, 256, 18, 22,
     23, 512, 131072, 0, 0, 0, 0, 0, 3, {1, 106, 50}, 1, 1},
    {"hub/mlx/mlx-community_gemma-4-26b-a4b-it-4bit.config.json", 0, 30, 2816, 16, 8, 2, 1, 6, 2112, 0, 0, 0, -1,
     -1, 1024, 262144, 1, 1, 128, 8, 704, 3, {1, 106, 50}, 2, 0},
    {"hub/mlx/Layr-Labs-fixture_gemma4_26b_a4b_config.json", 0, 30, 2816, 16, 8, 2, 1, 6, 2112, 0, 0, 0, -1,
     -1, 1024, 262144, 1, 1, 128, 8, 704, 3, {1, 106, 50}, 2, 0},
};

static void check_release(const release *x) {
    g4_config c;
    g4_status st = g4_config_load(data_path(x->file), &c);
    CHECK(st == G4_OK, "%s: %s", x->file, g4_error_message());
    if (st != G4_OK) return;
    const g4_text_config *t = &c.text;
    const char *f = x->file;
    CHECK(c.unified == x->unified, "%s: unified", f);
    CHECK(t->n_layers == x->n_layers && t->hidden_size == x->hidden && t->n_heads == x->heads, "%s: L/d/heads", f);
    CHECK(t->vocab_size == 262144 && t->head_dim == 256 && t->intermediate_size == x->intermediate, "%s: sizes", f);
    CHECK(t->sliding_window == x->sliding_window && t->max_position == x->max_position, "%s: window/positions", f);
    CHECK(t->rms_eps == 1e-6f && t->final_softcap == 30.0f && c.tie_embeddings == 1, "%s: eps/softcap/tie", f);
    CHECK(t->ple_dim == x->ple && (x->ple == 0 || t->ple_vocab == 262144), "%s: PLE %d", f, t->ple_dim);
    CHECK(t->n_kv_shared == x->n_kv_shared, "%s: kv shared %d", f, t->n_kv_shared);
    CHECK(t->bidirectional_vision == x->bidirectional_vision && !t->bidirectional_all, "%s: bidirectional", f);
    CHECK(t->moe == x->moe, "%s: moe %d", f, t->moe);
    if (x->moe)
        CHECK(t->n_experts == x->experts && t->top_k_experts == x->top_k && t->moe_width == x->moe_width,
              "%s: experts %d top %d width %d", f, t->n_experts, t->top_k_experts, t->moe_width);
    int first_shared = x->n_layers - x->n_kv_shared;
    int plan_ok = 1;
    for (int i = 0; i < x->n_layers; i++) {
        const g4_layer_config *l = &t->layers[i];
        int full = i % x->full_every == x->full_every - 1;
        int donor = i >= first_shared ? (full ? x->donor_full : x->donor_sliding) : -1;
        int width = x->intermediate * (x->double_wide && i >= first_shared ? 2 : 1);
        int ok = l->kind == (full ? G4_LAYER_FULL : G4_LAYER_SLIDING) && l->head_dim == (full ? 512 : 256) &&
                 l->n_kv_heads == (full ? x->kv_full : x->kv_sliding) && l->k_eq_v == (full && x->k_eq_v) &&
                 l->kv_donor == donor && l->mlp_width == width;
        /* Sliding: default RoPE θ=1e4 on all 128 pairs; full: proportional θ=1e6, 25% of 512/2 = 64 pairs. */
        ok &= full ? (l->rope_theta == 1e6f && l->rope_proportional && l->rope_pairs == 64)
                   : (l->rope_theta == 1e4f && !l->rope_proportional && l->rope_pairs == 128);
        if (!ok)
            fprintf(stderr, "%s layer %d: kind %d head %d kv %d keqv %d donor %d mlp %d rope %g/%d/%d\n", f, i,
                    l->kind, l->head_dim, l->n_kv_heads, l->k_eq_v, l->kv_donor, l->mlp_width, l->rope_theta,
                    l->rope_pairs, l->rope_proportional);
        plan_ok &= ok;
    }
    CHECK(plan_ok, "%s: per-layer plan", f);
    CHECK(t->layers[x->n_layers - 1].kind == G4_LAYER_FULL, "%s: last layer full", f);

    /* §1.6 token ids; eoa is spelled eoa_token_id and/or eoa_token_index. */
    const g4_token_ids *k = &c.tokens;
    CHECK(k->bos_id == 2 && k->pad_id == 0, "%s: bos/pad", f);
    CHECK(k->image_id == 258880 && k->boi_id == 255999 && k->eoi_id == 258882 && k->video_id == 258884 &&
              k->audio_id == 258881 && k->boa_id == 256000 && k->eoa_id == 258883,
          "%s: multimodal token ids", f);
    int eos_ok = k->n_eos == x->n_eos;
    for (int i = 0; eos_ok && i < x->n_eos; i++) eos_ok = k->eos_ids[i] == x->eos[i];
    CHECK(eos_ok, "%s: eos list (%d ids)", f, k->n_eos);

    /* §1.4 vision, §1.5 audio. */
    const g4_vision_config *v = &c.vision;
    if (x->vision == 1)
        CHECK(v->present && v->hidden_size == 768 && v->intermediate_size == 3072 && v->n_layers == 16 &&
                  v->n_heads == 12 && v->head_dim == 64 && v->clipped_linears && !v->standardize &&
                  v->patch_size == 16 && v->pooling_kernel == 3 && v->default_output_length == 280 &&
                  v->position_embedding_size == 10240 && v->rope_theta == 100.0f,
              "%s: on-device vision tower", f);
    if (x->vision == 2)
        CHECK(v->present && v->hidden_size == 1152 && v->intermediate_size == 4304 && v->n_layers == 27 &&
                  v->n_heads == 16 && v->head_dim == 72 && !v->clipped_linears && v->standardize &&
                  v->default_output_length == 280,
              "%s: large vision tower", f);
    const g4_audio_config *a = &c.audio;
    CHECK(a->present == x->audio, "%s: audio present %d", f, a->present);
    if (x->audio)
        CHECK(a->hidden_size == 1024 && a->n_layers == 12 && a->n_heads == 8 && a->conv_channels[0] == 128 &&
                  a->conv_channels[1] == 32 && a->conv_kernel == 5 && a->chunk_size == 12 &&
                  a->context_left == 13 && a->context_right == 0 && a->logit_cap == 50.0f &&
                  a->invalid_logit == -1e9f && a->residual_weight == 0.5f && a->gradient_clipping == 1e10f &&
                  a->output_proj_dims == 1536 && a->clipped_linears && a->rms_eps == 1e-6f,
              "%s: audio tower", f);
    if (x->unified)
        CHECK(!v->present && !a->present && c.unified_mm.vision_present && c.unified_mm.audio_present &&
                  c.unified_mm.patch_size == 48 && c.unified_mm.mm_embed_dim == 3840 &&
                  c.unified_mm.position_table_size == 1120 && c.unified_mm.audio_frame_samples == 640,
              "%s: unified embedders (48-px patches, 3840, 1120 positions, 640-sample frames)", f);
    g4_config_free(&c);
}

/* ---- MLX quantization blocks ---------------------------------------------- */

static int quant_is(g4_quant_params q, g4_quant_mode mode, int bits, int group) {
    return q.mode == mode && q.bits == bits && q.group_size == group;
}

/* Every override the file lists (read here with cJSON) is what quant_for gives. */
static int overrides_match_file(const g4_config *c, const char *path) {
    char *text = read_text(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *q = cJSON_GetObjectItem(root, "quantization");
    int n = 0, ok = q != NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, q) {
        if (!cJSON_IsObject(e)) continue;
        n++;
        const cJSON *bits = cJSON_GetObjectItem(e, "bits"), *group = cJSON_GetObjectItem(e, "group_size");
        const cJSON *mode = cJSON_GetObjectItem(e, "mode");
        g4_quant_mode m = mode && !strcmp(mode->valuestring, "mxfp4") ? G4_QUANT_MXFP4 : G4_QUANT_AFFINE;
        ok &= quant_is(g4_config_quant_for(c, e->string), m, bits->valueint, group->valueint);
    }
    cJSON_Delete(root);
    return ok && n == c->quant.n_overrides;
}

static void check_mlx_quant(void) {
    g4_config c;
    const char *small[] = {"hub/mlx/mlx-community_gemma-4-e2b-it-4bit.config.json",
                           "hub/mlx/mlx-community_gemma-4-e4b-it-4bit.config.json"};
    for (int i = 0; i < 2; i++) {
        CHECK(g4_config_load(data_path(small[i]), &c) == G4_OK, "%s: %s", small[i], g4_error_message());
        CHECK(c.quant.present && quant_is(c.quant.defaults, G4_QUANT_AFFINE, 4, 64) && c.quant.n_overrides == 0,
              "%s: affine 4-bit group 64, no overrides", small[i]);
        CHECK(quant_is(g4_config_quant_for(&c, "language_model.model.layers.3.self_attn.q_proj"), G4_QUANT_AFFINE,
                       4, 64),
              "%s: q_proj uses the defaults", small[i]);
        g4_config_free(&c);
    }
    const char *big[] = {"hub/mlx/mlx-community_gemma-4-26b-a4b-it-4bit.config.json",
                         "hub/mlx/Layr-Labs-fixture_gemma4_26b_a4b_config.json"};
    for (int i = 0; i < 2; i++) {
        CHECK(g4_config_load(data_path(big[i]), &c) == G4_OK, "%s: %s", big[i], g4_error_message());
        CHECK(c.quant.present && quant_is(c.quant.defaults, G4_QUANT_AFFINE, 4, 64), "%s: defaults", big[i]);
        CHECK(c.quant.n_overrides == 120, "%s: %d overrides (30 layers x gate/up/down/router)", big[i],
              c.quant.n_overrides);
        int ok = 1;
        const char *eight[] = {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "router.proj"};
        char module[128];
        for (int layer = 0; layer < 30; layer++) {
            for (int m = 0; m < 4; m++) {
                snprintf(module, sizeof module, "language_model.model.layers.%d.%s", layer, eight[m]);
                ok &= quant_is(g4_config_quant_for(&c, module), G4_QUANT_AFFINE, 8, 64);
            }
            snprintf(module, sizeof module, "language_model.model.layers.%d.self_attn.o_proj", layer);
            ok &= quant_is(g4_config_quant_for(&c, module), G4_QUANT_AFFINE, 4, 64);
        }
        CHECK(ok, "%s: dense MLP and router at 8 bits, attention at the 4-bit default", big[i]);
        CHECK(overrides_match_file(&c, data_path(big[i])), "%s: overrides match the file", big[i]);
        g4_config_free(&c);
    }
}

/* ---- fixtures (per_layer_config form) ------------------------------------- */

static void check_fixture_configs(void) {
    const char *names[] = {"dense", "moe", "e2b", "realdims", "dense-mlx8", "moe-mlx4", "moe-mxfp4", "e2b-mlx4",
                           "unified"};
    for (int n = 0; n < 9; n++) {
        const char *name = names[n];
        g4_config c;
        g4_status st = g4_config_load(test_fixture(name), &c);
        CHECK(st == G4_OK, "fixture %s: %s", name, g4_error_message());
        if (st != G4_OK) continue;
        const g4_text_config *t = &c.text;
        int realdims = !strcmp(name, "realdims"), e2b = !strncmp(name, "e2b", 3), moe = !strncmp(name, "moe", 3);
        int L = realdims ? 4 : 6;
        CHECK(t->n_layers == L && t->vocab_size == (realdims ? 2048 : 1024), "fixture %s: layers/vocab", name);
        int ok = 1;
        for (int i = 0; i < L; i++) {
            const g4_layer_config *l = &t->layers[i];
            int full = realdims ? i == 3 : (i == 2 || i == 5);
            int head_s = realdims ? 256 : 32, head_f = realdims ? 512 : 64;
            int kv_s = realdims ? 1 : 2, kv_f = (realdims || !e2b) ? 1 : 2; /* per_layer_config */
            int donor = e2b && i >= 4 ? (full ? 2 : 3) : -1;
            ok &= l->kind == (full ? G4_LAYER_FULL : G4_LAYER_SLIDING);
            ok &= l->head_dim == (full ? head_f : head_s) && l->n_kv_heads == (full ? kv_f : kv_s);
            ok &= l->k_eq_v == (full && !e2b);
            ok &= l->kv_donor == donor && l->mlp_width == t->intermediate_size * (donor >= 0 ? 2 : 1);
            ok &= l->rope_pairs == (full ? head_f / 8 : head_s / 2) && l->rope_proportional == full;
        }
        CHECK(ok, "fixture %s: layer plan", name);
        CHECK(t->moe == moe && (!moe || (t->n_experts == 8 && t->top_k_experts == 2 && t->moe_width == 64)),
              "fixture %s: moe", name);
        CHECK(t->ple_dim == (e2b ? 64 : 0), "fixture %s: PLE %d", name, t->ple_dim);
        CHECK(c.unified == !strcmp(name, "unified"), "fixture %s: unified", name);
        /* README: image 1000, boi 1001, eoi 1002, audio 1003, boa 1004, eoa 1005, video 1006; pad 0, eos 1, bos 2. */
        const g4_token_ids *k = &c.tokens;
        CHECK(k->image_id == 1000 && k->boi_id == 1001 && k->eoi_id == 1002 && k->audio_id == 1003 &&
                  k->boa_id == 1004 && k->eoa_id == 1005 && k->video_id == 1006 && k->pad_id == 0 &&
                  k->bos_id == 2 && k->n_eos == 1 && k->eos_ids[0] == 1,
              "fixture %s: token ids", name);
        g4_quant_params router = g4_config_quant_for(&c, "language_model.model.layers.0.router.proj");
        g4_quant_params down1 = g4_config_quant_for(&c, "language_model.model.layers.1.mlp.down_proj");
        g4_quant_params q0 = g4_config_quant_for(&c, "language_model.model.layers.0.self_attn.q_proj");
        if (!strcmp(name, "dense-mlx8"))
            CHECK(quant_is(q0, G4_QUANT_AFFINE, 8, 64) && c.quant.n_overrides == 0, "dense-mlx8: 8-bit group 64");
        else if (!strcmp(name, "moe-mlx4"))
            CHECK(quant_is(q0, G4_QUANT_AFFINE, 4, 64) && quant_is(router, G4_QUANT_AFFINE, 8, 64) &&
                      c.quant.n_overrides == 6,
                  "moe-mlx4: 4-bit, router 8-bit");
        else if (!strcmp(name, "moe-mxfp4"))
            CHECK(quant_is(q0, G4_QUANT_MXFP4, 4, 32) && quant_is(router, G4_QUANT_AFFINE, 8, 64) &&
                      c.quant.n_overrides == 6,
                  "moe-mxfp4: mxfp4 group 32, router affine 8-bit");
        else if (!strcmp(name, "e2b-mlx4"))
            CHECK(quant_is(q0, G4_QUANT_AFFINE, 4, 64) && quant_is(down1, G4_QUANT_AFFINE, 8, 64) &&
                      c.quant.n_overrides == 1,
                  "e2b-mlx4: 4-bit, layers.1.mlp.down_proj 8-bit");
        else
            CHECK(!c.quant.present && q0.mode == G4_QUANT_NONE, "fixture %s: not quantized", name);
        if (e2b) CHECK(c.audio.present && c.audio.conv_channels[1] == 8, "fixture %s: audio tower", name);
        if (c.unified)
            CHECK(c.unified_mm.patch_size == 48 && c.unified_mm.mm_embed_dim == 64 &&
                      c.unified_mm.position_table_size == 64 && c.unified_mm.audio_frame_samples == 640,
                  "fixture unified: embedders");
        g4_config_free(&c);
    }
}

/* ---- generation_config.json ----------------------------------------------- */

static const char *generation_dir(const char *name, const char *text) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(name));
    mkdir(dir, 0755);
    char *path = g4_path_join(dir, "generation_config.json");
    if (text)
        CHECK(g4_write_file(path, text, strlen(text)) == G4_OK, "write %s", path);
    else
        remove(path);
    free(path);
    return dir;
}

static void check_generation_configs(void) {
    const char *models[] = {"E2B", "E4B", "26B-A4B", "31B", "12B"};
    for (int i = 0; i < 5; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "hub/gemma-4-%s-it.generation_config.json", models[i]);
        char *text = read_text(data_path(rel));
        const char *dir = generation_dir("gen_hub", text);
        free(text);
        g4_generation_config g;
        CHECK(g4_generation_config_load(dir, &g) == G4_OK, "%s: %s", rel, g4_error_message());
        /* The hub files: sample with temperature 1, top_k 64, top_p 0.95; stop on 1, 106, 50. */
        CHECK(g.present && g.do_sample && g.temperature == 1.0f && g.top_k == 64 && g.top_p == 0.95f &&
                  g.min_p == 0.0f && g.repetition_penalty == 1.0f && g.bos_id == 2 && g.pad_id == 0,
              "%s: sampling settings", rel);
        CHECK(g.n_eos == 3 && g.eos_ids[0] == 1 && g.eos_ids[1] == 106 && g.eos_ids[2] == 50, "%s: eos", rel);
    }
    g4_generation_config g;
    CHECK(g4_generation_config_load(test_fixture("dense"), &g) == G4_OK && g.present && !g.do_sample &&
              g.n_eos == 1 && g.eos_ids[0] == 1,
          "dense fixture generation_config: greedy, eos [1]");
    const char *dir = generation_dir("gen_missing", NULL);
    CHECK(g4_generation_config_load(dir, &g) == G4_OK && !g.present && !g.do_sample && g.temperature == 1.0f &&
              g.n_eos == 0,
          "missing generation_config.json: defaults");
    struct {
        const char *text, *want;
    } bad[] = {
        {"{\"top_p\": 2}", "top_p"},
        {"{\"temperature\": -1}", "temperature"},
        {"{\"top_k\": 1.5}", "generation_config.top_k must be an integer"},
        {"{\"eos_token_id\": [1, \"x\"]}", "eos_token_id"},
        {"{\"eos_token_id\": 1e30}", "eos_token_id"},
        {"{\"do_sample\": \"yes\"}", "do_sample must be true or false"},
        {"[1]", "not a valid JSON object"},
        {"{", "not a valid JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dir = generation_dir("gen_bad", bad[i].text);
        CHECK(g4_generation_config_load(dir, &g) != G4_OK, "generation_config %s: accepted", bad[i].text);
        CHECK(strstr(g4_error_message(), "gen_bad/generation_config.json") &&
                  strstr(g4_error_message(), bad[i].want),
              "generation_config %s: message '%s'", bad[i].text, g4_error_message());
    }
}

/* ---- malformed configs ------------------------------------------------------ */

/* base with the item at `path` ("a/b/3", '/'-separated since module names
 * hold dots) replaced by `value` (JSON text), or removed when value is NULL. */
static char *mutate(const char *base_file, const char *path, const char *value) {
    char *text = read_text(data_path(base_file));
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!root) return NULL;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *parent = root;
    char *seg = buf, *slash;
    while ((slash = strchr(seg, '/')) != NULL) {
        *slash = '\0';
        parent = cJSON_IsArray(parent) ? cJSON_GetArrayItem(parent, atoi(seg))
                                       : cJSON_GetObjectItemCaseSensitive(parent, seg);
        seg = slash + 1;
    }
    if (!value) {
        if (cJSON_IsArray(parent))
            cJSON_DeleteItemFromArray(parent, atoi(seg));
        else
            cJSON_DeleteItemFromObjectCaseSensitive(parent, seg);
    } else {
        cJSON *v = cJSON_Parse(value);
        if (cJSON_IsArray(parent))
            cJSON_ReplaceItemInArray(parent, atoi(seg), v);
        else if (cJSON_GetObjectItemCaseSensitive(parent, seg))
            cJSON_ReplaceItemInObjectCaseSensitive(parent, seg, v);
        else
            cJSON_AddItemToObject(parent, seg, v);
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static void expect_parse_fails(const char *what, const char *text, const char *want) {
    g4_config c;
    memset(&c, 0x5a, sizeof c); /* parse must clear it */
    g4_status st = text ? g4_config_parse(text, strlen(text), "LABEL", &c) : G4_ERR_INTERNAL;
    CHECK(st != G4_OK, "%s: accepted", what);
    CHECK(c.text.layers == NULL && c.quant.overrides == NULL, "%s: output not cleared", what);
    const char *msg = g4_error_message();
    CHECK(strstr(msg, "LABEL") && strstr(msg, want), "%s: message '%s' lacks 'LABEL' or '%s'", what, msg, want);
}

static void expect_mutation_fails(const char *base, const char *path, const char *value, const char *want) {
    char *text = mutate(base, path, value);
    char what[512];
    snprintf(what, sizeof what, "%s: %s = %s", base, path, value ? value : "(removed)");
    expect_parse_fails(what, text, want);
    free(text);
}

static void expect_mutation_ok(const char *base, const char *path, const char *value, g4_config *c) {
    memset(c, 0, sizeof *c); /* safe to free even if the base file is missing */
    char *text = mutate(base, path, value);
    g4_status st = text ? g4_config_parse(text, strlen(text), "LABEL", c) : G4_ERR_INTERNAL;
    CHECK(st == G4_OK, "%s: %s = %s refused: %s", base, path, value ? value : "(removed)", g4_error_message());
    free(text);
}

static void check_bad_configs(void) {
    const char *e2b = "hub/gemma-4-E2B-it.config.json", *moe = "hub/gemma-4-26B-A4B-it.config.json";
    const char *b31 = "hub/gemma-4-31B-it.config.json", *mlx = "hub/mlx/mlx-community_gemma-4-26b-a4b-it-4bit.config.json";
    const char *router = "quantization/language_model.model.layers.0.router.proj";
    char path[256];

    expect_parse_fails("not JSON", "{\"model_type\": \"gemma4\",", "not valid JSON");
    expect_parse_fails("empty", "", "not valid JSON");
    expect_parse_fails("array", "[1, 2]", "not a JSON object");
    expect_mutation_fails(e2b, "model_type", NULL, "missing model_type");
    expect_mutation_fails(e2b, "model_type", "5", "model_type must be a string");
    expect_mutation_fails(e2b, "model_type", "\"gemma3\"", "'gemma3' is not a Gemma 4 model");
    expect_mutation_fails(e2b, "text_config", NULL, "needs a text_config object");
    expect_mutation_fails(e2b, "text_config", "[]", "needs a text_config object");
    expect_mutation_fails(e2b, "text_config/layer_types/34", NULL, "layer_types must list 35 entries");
    expect_mutation_fails(e2b, "text_config/layer_types", "\"sliding_attention\"", "layer_types must list");
    expect_mutation_fails(e2b, "text_config/layer_types/3", "\"chunked_attention\"",
                          "layer_types[3] = 'chunked_attention' is not supported");
    expect_mutation_fails(e2b, "text_config/layer_types/3", "7", "layer_types[3] is not a string");
    const char *sizes[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                           "head_dim", "intermediate_size", "vocab_size"};
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "text_config/%s", sizes[i]);
        expect_mutation_fails(e2b, path, "0", "needs positive");
        expect_mutation_fails(e2b, path, "-8", "needs positive");
        char want[128];
        snprintf(want, sizeof want, "text_config.%s must be an integer", sizes[i]);
        expect_mutation_fails(e2b, path, "\"35\"", want);
        expect_mutation_fails(e2b, path, "35.5", want);
        expect_mutation_fails(e2b, path, "1e10", want);
        expect_mutation_fails(e2b, path, "true", want);
    }
    expect_mutation_fails(e2b, "text_config/intermediate_size", "2147483647", "implausibly large");
    expect_mutation_fails(e2b, "text_config/num_hidden_layers", "100000", "needs positive");
    expect_mutation_fails(e2b, "text_config/num_kv_shared_layers", "35", "num_kv_shared_layers=35 must be in [0, 35)");
    expect_mutation_fails(e2b, "text_config/num_kv_shared_layers", "-1", "must be in [0, 35)");
    expect_mutation_fails(e2b, "text_config/sliding_window", "0", "sliding_window must be positive");
    expect_mutation_fails(e2b, "text_config/max_position_embeddings", "-5", "max_position_embeddings");
    expect_mutation_fails(e2b, "text_config/rms_norm_eps", "0", "rms_norm_eps");
    expect_mutation_fails(e2b, "text_config/rms_norm_eps", "\"1e-6\"", "rms_norm_eps must be a finite number");
    expect_mutation_fails(e2b, "text_config/rms_norm_eps", "1e300", "rms_norm_eps must be a finite number");
    expect_mutation_fails(e2b, "text_config/final_logit_softcapping", "-30", "final_logit_softcapping");
    expect_mutation_fails(e2b, "text_config/hidden_size_per_layer_input", "-256", "hidden_size_per_layer_input");
    expect_mutation_fails(e2b, "text_config/use_double_wide_mlp", "\"yes\"", "use_double_wide_mlp must be true or false");
    expect_mutation_fails(e2b, "text_config/use_bidirectional_attention", "\"all\"", "not supported");
    expect_mutation_fails(e2b, "text_config/num_key_value_heads", "3", "multiple of its 3 KV heads");
    expect_mutation_fails(b31, "text_config/num_global_key_value_heads", "5", "multiple of its 5 KV heads");
    expect_mutation_fails(b31, "text_config/global_head_dim", "511", "head_dim 511 must be even");
    expect_mutation_fails(b31, "text_config/global_head_dim", "1000000", "head_dim 1000000");
    /* MoE */
    expect_mutation_fails(moe, "text_config/num_experts", NULL, "enable_moe_block needs");
    expect_mutation_fails(moe, "text_config/top_k_experts", NULL, "enable_moe_block needs");
    expect_mutation_fails(moe, "text_config/moe_intermediate_size", NULL, "enable_moe_block needs");
    expect_mutation_fails(moe, "text_config/top_k_experts", "129", "enable_moe_block needs");
    expect_mutation_fails(moe, "text_config/enable_moe_block", "\"true\"", "enable_moe_block must be true or false");
    /* RoPE */
    expect_mutation_fails(e2b, "text_config/rope_parameters/full_attention/rope_type", "\"yarn\"",
                          "rope_type 'yarn' for full_attention layers is not supported");
    expect_mutation_fails(e2b, "text_config/rope_parameters/sliding_attention/rope_type", "\"llama3\"",
                          "rope_type 'llama3'");
    expect_mutation_fails(e2b, "text_config/rope_parameters/full_attention/factor", "8", "scaling factor");
    expect_mutation_fails(e2b, "text_config/rope_parameters/full_attention/partial_rotary_factor", "1e30",
                          "partial_rotary_factor");
    expect_mutation_fails(e2b, "text_config/rope_parameters/full_attention/partial_rotary_factor", "-0.25",
                          "partial_rotary_factor");
    expect_mutation_fails(e2b, "text_config/rope_parameters/sliding_attention/partial_rotary_factor", "0.5",
                          "partial rotary factor on default RoPE");
    expect_mutation_fails(e2b, "text_config/rope_parameters/sliding_attention/rope_theta", "-1", "rope_theta > 0");
    expect_mutation_fails(e2b, "text_config/rope_parameters/sliding_attention/rope_type", "1",
                          "sliding_attention.rope_type must be a string");
    /* Token ids */
    expect_mutation_fails(e2b, "eos_token_id", "1e30", "eos_token_id");
    expect_mutation_fails(e2b, "eos_token_id", "[1, \"106\"]", "eos_token_id");
    expect_mutation_fails(e2b, "eos_token_id", "[1,2,3,4,5,6,7,8,9]", "at most 8");
    expect_mutation_fails(e2b, "image_token_id", "\"258880\"", "image_token_id must be an integer");
    /* Vision / audio */
    expect_mutation_fails(e2b, "vision_config/hidden_size", "0", "vision_config sizes must be positive");
    expect_mutation_fails(e2b, "vision_config/num_key_value_heads", "5", "vision_config");
    expect_mutation_fails(e2b, "vision_config", "7", "vision_config is not an object");
    expect_mutation_fails(e2b, "audio_config/subsampling_conv_channels", "[1e30, 32]", "subsampling_conv_channels");
    expect_mutation_fails(e2b, "audio_config/subsampling_conv_channels", "[128]", "subsampling_conv_channels");
    expect_mutation_fails(e2b, "audio_config/num_attention_heads", "0", "audio_config sizes must be positive");
    expect_mutation_fails(e2b, "audio_config/conv_kernel_size", "-5", "audio_config");
    /* Quantization */
    expect_mutation_fails(mlx, "quantization/bits", "9", "affine quantization with 9 bits");
    expect_mutation_fails(mlx, "quantization/bits", "1", "affine quantization with 1 bits");
    expect_mutation_fails(mlx, "quantization/group_size", "0", "group_size 0");
    expect_mutation_fails(mlx, "quantization/group_size", "-64", "group_size -64");
    expect_mutation_fails(mlx, "quantization/mode", "\"nvfp4\"", "quantization mode 'nvfp4'");
    expect_mutation_fails(mlx, "quantization/mode", "\"mxfp4\"", "mxfp4 with 4 bits and group_size 64");
    expect_mutation_fails(mlx, "quantization/bits", "\"4\"", "quantization.bits must be an integer");
    expect_mutation_fails(mlx, "quantization", "4", "\"quantization\" is not an object");
    snprintf(path, sizeof path, "%s/bits", router);
    expect_mutation_fails(mlx, path, "9", "(language_model.model.layers.0.router.proj)");
    snprintf(path, sizeof path, "%s", router);
    expect_mutation_fails(mlx, path, "{\"mode\": \"mxfp4\", \"bits\": 8, \"group_size\": 32}", "mxfp4 with 8 bits");
    /* Valid variations stay valid. */
    g4_config c;
    expect_mutation_ok(e2b, "eoa_token_index", NULL, &c);
    CHECK(c.tokens.eoa_id == 258883, "eoa_token_id alone");
    g4_config_free(&c);
    expect_mutation_ok(e2b, "eoa_token_id", NULL, &c);
    CHECK(c.tokens.eoa_id == 258883, "eoa_token_index alone");
    g4_config_free(&c);
    expect_mutation_ok(e2b, "eos_token_id", "106", &c);
    CHECK(c.tokens.n_eos == 1 && c.tokens.eos_ids[0] == 106, "eos as one number");
    g4_config_free(&c);
    expect_mutation_ok(e2b, "eos_token_id", NULL, &c);
    CHECK(c.tokens.n_eos == 1 && c.tokens.eos_ids[0] == 1, "eos from text_config when the top level has none");
    g4_config_free(&c);
    expect_mutation_ok(e2b, "text_config/layer_types", NULL, &c);
    int ok = c.text.n_layers == 35;
    for (int i = 0; ok && i < 35; i++)
        ok = c.text.layers[i].kind == ((i % 6 == 5 || i == 34) ? G4_LAYER_FULL : G4_LAYER_SLIDING);
    CHECK(ok, "no layer_types: every 6th layer full and the last full (transformers' default)");
    g4_config_free(&c);
}

/* per_layer_config errors, on the e2b fixture's config text. */
static void check_bad_per_layer_config(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", test_fixture("e2b"));
    char *text = read_text(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL, "e2b fixture config");
    if (!root) return;
    cJSON *tc = cJSON_GetObjectItem(root, "text_config");
    struct {
        const char *plc, *want;
    } cases[] = {
        {"{\"2\": {\"head_dim\": 63}, \"5\": {\"head_dim\": 64}}", "layer 2: head_dim 63 must be even"},
        {"{\"2\": {\"head_dim\": 64}, \"5\": {\"head_dim\": 128}}", "layer 5 shares KV with layer 2"},
        {"{\"2\": {\"head_dim\": 64, \"num_key_value_heads\": 3}}", "multiple of its 3 KV heads"},
        {"{\"9\": {\"head_dim\": 64}}", "per_layer_config key '9' is not a layer index below 6"},
        {"{\"x\": {\"head_dim\": 64}}", "per_layer_config key 'x'"},
        {"{\"02\": {\"head_dim\": 64}}", "per_layer_config key '02'"},
        {"{\"+2\": {\"head_dim\": 64}}", "per_layer_config key '+2'"},
        {"{\"2\": 64}", "per_layer_config[2] is not an object"},
        {"[64]", "per_layer_config is not an object"},
        {"{\"2\": {\"head_dim\": \"64\"}}", "per_layer_config.head_dim must be an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON_ReplaceItemInObjectCaseSensitive(tc, "per_layer_config", cJSON_Parse(cases[i].plc));
        char *s = cJSON_PrintUnformatted(root);
        char what[256];
        snprintf(what, sizeof what, "per_layer_config %s", cases[i].plc);
        expect_parse_fails(what, s, cases[i].want);
        free(s);
    }
    /* A shared layer with no earlier layer of its kind to borrow from. */
    cJSON_ReplaceItemInObjectCaseSensitive(tc, "per_layer_config", cJSON_Parse("{\"5\": {\"head_dim\": 64}}"));
    cJSON_ReplaceItemInObjectCaseSensitive(
        tc, "layer_types",
        cJSON_Parse("[\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
                    " \"sliding_attention\", \"full_attention\"]"));
    char *s = cJSON_PrintUnformatted(root);
    expect_parse_fails("shared full layer without donor", s, "KV-shared layer 5 has no earlier full layer");
    free(s);
    cJSON_Delete(root);
}

int main(void) {
    for (size_t i = 0; i < sizeof releases / sizeof releases[0]; i++) check_release(&releases[i]);
    check_mlx_quant();
    check_fixture_configs();
    check_generation_configs();
    check_bad_configs();
    check_bad_per_layer_config();

    g4_config c;
    CHECK(g4_config_load(test_tmp_path("no_such_model_dir"), &c) != G4_OK &&
              strstr(g4_error_message(), "no_such_model_dir") && c.text.layers == NULL,
          "missing config: error names the path, output cleared");
    g4_config_free(&c);
    return test_finish();
}
