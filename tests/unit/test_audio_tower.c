/* The audio tower against transformers, from the fixtures' reference log-mel
 * features (e2b: HF layout, bf16; e2b-mlx4: channels-last convs and a 4-bit
 * embed_audio projection): soft tokens, every tower stage, and the logits of
 * a prompt with the audio merged in; the soft-token count against
 * transformers' processor formula.
 *
 * Two references: the fixtures' own (transformers 5.17 run with
 * attn_implementation="eager", which inverts the audio attention mask, so
 * they are matched with the hf517_eager_mask switch), and transformers 5.17
 * with sdpa, whose mask is right (tests/data/audio, made by
 * tests/tools/audio_stages.py), matched by the default options.
 * Also: models without an audio tower, bad inputs, and a checkpoint with
 * audio tensors missing (all listed in one error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "fixture_model.h"
#include "model/audio_tower.h"
#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

#define TOLERANCE 1e-4

/* transformers' Gemma4Processor._compute_audio_num_tokens for 16 kHz audio:
 * mel frames of the feature extractor (frame 320 + 1 samples, hop 160,
 * 160 samples of semicausal left padding), then two k3 s2 p1 convs. */
static int hf_audio_num_tokens(int n_samples) {
    const int frame_length = 320, hop = 160, pad_left = frame_length / 2;
    int t = (n_samples + pad_left - (frame_length + 1)) / hop + 1;
    if (t <= 0) return 0;
    for (int i = 0; i < 2; i++) t = (t + 2 * 1 - 3) / 2 + 1;
    return t < 750 ? t : 750;
}

static int json_int(const fixture_ref *r, const char *section, const char *key) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(r->json, section);
    const cJSON *v = s ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    return cJSON_IsNumber(v) ? (int)v->valuedouble : -1;
}

/* Reference features and mask of a fixture; mask is malloc'd. */
static const float *load_features(const fixture_ref *ref, uint8_t **mask, int *n_frames) {
    size_t nf = 0;
    const float *feat = fixture_ref_tensor(ref, "audio.features", &nf);
    const g4_st_tensor *mt = g4_st_find(ref->tensors, "audio.features_mask");
    *mask = NULL;
    *n_frames = 0;
    if (!feat || !mt || mt->dtype != G4_DTYPE_I32 || nf != (size_t)mt->shape[0] * 128) return NULL;
    *n_frames = (int)mt->shape[0];
    *mask = malloc((size_t)*n_frames);
    for (int t = 0; t < *n_frames; t++) (*mask)[t] = ((const int32_t *)mt->data)[t] != 0;
    return feat;
}

static double compare(g4_backend *be, const float *dev, const float *want, size_t n) {
    float *got = malloc(n * sizeof *got);
    be->ops->to_host(be, got, dev, n * sizeof *got);
    double err = test_rel_rms(got, want, n);
    free(got);
    return err;
}

/* A float32 tensor of a reference set with exactly n values (NULL otherwise). */
static const float *ref_tensor(g4_st_set *set, const char *name, size_t n) {
    const g4_st_tensor *t = set ? g4_st_find(set, name) : NULL;
    if (!t || t->dtype != G4_DTYPE_F32 || t->nbytes != n * 4) return NULL;
    return (const float *)t->data;
}

typedef struct {
    g4_backend *be;
    g4_st_set *want;
    const char *fixture;
    int n_checked;
} stage_check;

static void check_stage(void *ctx, const char *name, const float *data, int rows, int dim) {
    stage_check *sc = ctx;
    char key[64];
    snprintf(key, sizeof key, "audio.%s", name);
    const float *want = ref_tensor(sc->want, key, (size_t)rows * dim);
    CHECK(want != NULL, "%s: no transformers reference %s [%d x %d]", sc->fixture, key, rows, dim);
    if (!want) return;
    double err = compare(sc->be, data, want, (size_t)rows * dim);
    printf("  %-9s %-22s [%d x %d] rel_rms %.2e\n", sc->fixture, key, rows, dim, err);
    CHECK(err < TOLERANCE, "%s %s rel_rms %.3e", sc->fixture, key, err);
    sc->n_checked++;
}

/* Logits of the prompt with `soft` placed at its audio placeholders. */
static void check_logits(g4_model *m, const int32_t *prompt, int n_prompt, const float *soft, int n_soft,
                         const float *want, const char *what) {
    const int V = m->config.text.vocab_size;
    int32_t *rows = malloc((size_t)n_prompt * sizeof *rows);
    int n_rows = 0;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] == m->config.tokens.audio_id) rows[n_rows++] = i;
    CHECK(n_rows == n_soft, "%s: %d placeholders for %d soft tokens", what, n_rows, n_soft);
    float *logits = malloc((size_t)n_prompt * V * sizeof *logits);
    g4_soft_tokens st_soft = {.n = n_soft, .rows = rows, .embeds = soft};
    g4_session_options opt = {.n_ctx = n_prompt + 1};
    g4_session *s = NULL;
    g4_status st = n_rows == n_soft ? g4_session_create(m, &opt, &s) : G4_ERR_INVALID_ARGUMENT;
    if (st == G4_OK) st = g4_session_eval(s, prompt, n_prompt, &st_soft, G4_LOGITS_ALL, logits);
    CHECK(st == G4_OK, "%s: audio prompt: %s", what, g4_error_message());
    if (st == G4_OK) {
        double err = test_rel_rms(logits, want, (size_t)n_prompt * V);
        printf("  %-40s [%d x %d] rel_rms %.2e\n", what, n_prompt, V, err);
        CHECK(err < TOLERANCE, "%s rel_rms %.3e", what, err);
    }
    g4_session_destroy(s);
    free(logits);
    free(rows);
}

/* The fixture's own references (transformers 5.17, eager: inverted audio
 * mask), reproduced with hf517_eager_mask. Everything but the mask rule is
 * checked here, in both layouts and with the quantised projection. */
static void check_against_fixture(g4_model *m, const fixture_ref *ref, const char *name, const float *features,
                                  const uint8_t *mask, int n_frames, const int32_t *prompt, int n_prompt) {
    g4_backend *be = m->backend;
    const int d = m->config.text.hidden_size, V = m->config.text.vocab_size;
    size_t n_want = 0, n_logits = 0;
    const float *want = fixture_ref_tensor(ref, "audio.soft_tokens", &n_want);
    const float *want_logits = fixture_ref_tensor(ref, "audio.logits", &n_logits);
    CHECK(want && want_logits && n_logits == (size_t)n_prompt * V, "%s: fixture audio references missing", name);
    if (!want || !want_logits || n_logits != (size_t)n_prompt * V) return;
    g4_audio_options opt = {.hf517_eager_mask = 1};
    float *soft = NULL;
    int n = 0;
    g4_status st = g4_audio_encode_with(m, features, mask, n_frames, &opt, &soft, &n);
    CHECK(st == G4_OK && (size_t)n * d == n_want, "%s: 5.17-eager encode: %s (%d tokens)", name, g4_error_message(), n);
    if (st == G4_OK && (size_t)n * d == n_want) {
        double err = compare(be, soft, want, n_want);
        printf("  %-9s soft tokens vs fixture (5.17 eager mask) [%d x %d] rel_rms %.2e\n", name, n, d, err);
        CHECK(err < TOLERANCE, "%s fixture soft tokens rel_rms %.3e", name, err);
        char what[96];
        snprintf(what, sizeof what, "%s logits vs fixture (5.17 eager mask)", name);
        check_logits(m, prompt, n_prompt, soft, n, want_logits, what);
    }
    if (soft) be->ops->release(be, soft);
}

static void check_fixture(const char *name, g4_st_set *sdpa) {
    fixture_ref ref;
    g4_backend *be;
    g4_model *m = NULL;
    g4_status st = g4_backend_cpu_create_with(0, G4_PRECISION_EXACT, &be);
    CHECK(st == G4_OK, "cpu backend: %s", g4_error_message());
    if (st != G4_OK) return;
    if (!fixture_model_open(name, be, &ref, &m)) {
        g4_backend_destroy(be);
        return;
    }
    CHECK(m->audio != NULL, "%s: no audio tower loaded", name);
    uint8_t *mask;
    int n_frames, n_prompt;
    const float *features = load_features(&ref, &mask, &n_frames);
    int32_t *prompt = fixture_ref_ids(&ref, "audio", "prompt_ids", &n_prompt);
    CHECK(features != NULL && prompt != NULL, "%s: no audio.features / features_mask / prompt_ids", name);
    if (!features || !prompt) goto done;
    const int d = m->config.text.hidden_size, V = m->config.text.vocab_size;

    check_against_fixture(m, &ref, name, features, mask, n_frames, prompt, n_prompt);

    /* The correct model (default options) against transformers 5.17 with
     * sdpa (tests/data/audio, tests/tools/audio_stages.py), on e2b's
     * weights. The audio tower of e2b-mlx4 holds the same bf16 weights, so
     * every tower stage must match too; its soft tokens differ by the
     * 4-bit projection, checked above. */
    stage_check sc = {.be = be, .want = sdpa, .fixture = name};
    g4_audio_options opt = {.window = G4_AUDIO_WINDOW_HF, .hook = check_stage, .hook_ctx = &sc};
    float *soft = NULL;
    int n_tokens = 0;
    st = g4_audio_encode_with(m, features, mask, n_frames, &opt, &soft, &n_tokens);
    CHECK(st == G4_OK, "%s: encode: %s", name, g4_error_message());
    CHECK(sc.n_checked == 2 + m->config.audio.n_layers, "%s: %d intermediates compared", name, sc.n_checked);
    if (st == G4_OK && !strcmp(name, "e2b")) {
        const float *want = ref_tensor(sdpa, "audio.soft_tokens", (size_t)n_tokens * d);
        const float *want_logits = ref_tensor(sdpa, "audio.logits", (size_t)n_prompt * V);
        CHECK(want && want_logits, "e2b: %d soft tokens; transformers reference shapes differ", n_tokens);
        if (want && want_logits) {
            double err = compare(be, soft, want, (size_t)n_tokens * d);
            printf("  %-9s soft tokens vs transformers sdpa [%d x %d] rel_rms %.2e\n", name, n_tokens, d, err);
            CHECK(err < TOLERANCE, "%s soft tokens rel_rms %.3e", name, err);
            check_logits(m, prompt, n_prompt, soft, n_tokens, want_logits, "e2b logits vs transformers sdpa");
        }
    }

    /* the count: transformers' processor formula from the clip's length, the
     * placeholders transformers put in the prompt, and our subsampling */
    int n_samples = json_int(&ref, "audio", "num_samples");
    int n_placeholders = 0;
    for (int i = 0; i < n_prompt; i++) n_placeholders += prompt[i] == m->config.tokens.audio_id;
    printf("  %-9s %d samples -> %d feature frames -> %d soft tokens (processor formula %d, prompt %d)\n", name,
           n_samples, n_frames, n_tokens, hf_audio_num_tokens(n_samples), n_placeholders);
    CHECK(n_tokens == hf_audio_num_tokens(n_samples), "%s: %d soft tokens but the processor formula gives %d", name,
          n_tokens, hf_audio_num_tokens(n_samples));
    CHECK(n_tokens == n_placeholders, "%s: %d soft tokens for %d placeholders", name, n_tokens, n_placeholders);
    CHECK(n_tokens == json_int(&ref, "audio", "num_soft_tokens"), "%s: ref.json num_soft_tokens differs", name);
    CHECK(g4_audio_subsampled_frames(n_frames) == n_tokens, "%s: %d frames subsample to %d, not %d", name, n_frames,
          g4_audio_subsampled_frames(n_frames), n_tokens);

    /* Google's window (self + 12 past frames) is a different model output:
     * the switch must reach the attention */
    if (soft) {
        g4_audio_options jax = {.window = G4_AUDIO_WINDOW_JAX};
        float *soft_jax = NULL;
        int n_jax = 0;
        st = g4_audio_encode_with(m, features, mask, n_frames, &jax, &soft_jax, &n_jax);
        CHECK(st == G4_OK && n_jax == n_tokens, "%s: JAX window encode: %s", name, g4_error_message());
        if (st == G4_OK && n_jax == n_tokens) {
            float *hf = malloc((size_t)n_tokens * d * sizeof *hf);
            be->ops->to_host(be, hf, soft, (size_t)n_tokens * d * sizeof *hf);
            double diff = compare(be, soft_jax, hf, (size_t)n_tokens * d);
            printf("  %-9s JAX window (dist <= 12) vs transformers' (dist <= 11): rel diff %.2e\n", name, diff);
            CHECK(diff > 1e-3, "%s: the JAX window changed nothing (%.2e)", name, diff);
            free(hf);
        }
        if (soft_jax) be->ops->release(be, soft_jax);
    }

    /* bad inputs */
    float *none = NULL;
    int n_none = -1;
    CHECK(g4_audio_encode(m, features, mask, 0, &none, &n_none) == G4_ERR_INVALID_ARGUMENT && !none,
          "%s: zero frames accepted", name);
    CHECK(g4_audio_encode(m, NULL, mask, n_frames, &none, &n_none) == G4_ERR_INVALID_ARGUMENT,
          "%s: NULL features accepted", name);
    uint8_t *zeros = calloc((size_t)n_frames + 1, 1);
    st = g4_audio_encode(m, features, zeros, n_frames, &none, &n_none);
    CHECK(st == G4_OK && n_none == 0 && none == NULL, "%s: all-padding clip gave %d tokens", name, n_none);
    free(zeros);
    if (soft) be->ops->release(be, soft);
done:
    free(prompt);
    free(mask);
    g4_model_release(m);
    g4_backend_destroy(be);
    fixture_ref_close(&ref);
}

/* ---- checkpoint errors ------------------------------------------------------- */

/* Writes e2b with some audio tensors dropped or reshaped into tmp/name. */
static const char *broken_checkpoint(const char *name) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(name));
    mkdir(dir, 0755);
    const char *src = test_fixture("e2b");
    g4_st_set *set;
    if (g4_st_open(src, &set) != G4_OK) return NULL;
    size_t n = g4_st_count(set), k = 0;
    g4_st_write_item *items = calloc(n, sizeof *items);
    for (size_t i = 0; i < n; i++) {
        const g4_st_tensor *t = g4_st_at(set, i);
        if (strstr(t->name, "audio_tower.subsample_conv_projection.layer1.conv.weight") ||
            strstr(t->name, "audio_tower.layers.1.self_attn.k_proj.output_max") ||
            strstr(t->name, "embed_audio.embedding_projection.weight"))
            continue;
        g4_st_write_item it = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(it.shape, t->shape, sizeof it.shape);
        if (strstr(t->name, "audio_tower.layers.0.lconv1d.depthwise_conv1d.weight")) {
            it.ndim = 2; /* [C, 1, K] -> [C, K]: same bytes, wrong rank */
            it.shape[1] = t->shape[2];
        }
        items[k++] = it;
    }
    char *path = g4_path_join(dir, "model.safetensors");
    g4_status st = g4_st_write(path, items, k);
    free(path);
    free(items);
    g4_st_close(set);
    if (st != G4_OK) return NULL;
    char *cfg_src = g4_path_join(src, "config.json"), *cfg_dst = g4_path_join(dir, "config.json");
    char *text;
    size_t len;
    if (g4_read_file(cfg_src, 1 << 20, &text, &len) == G4_OK) {
        g4_write_file(cfg_dst, text, len);
        free(text);
    }
    free(cfg_src);
    free(cfg_dst);
    return dir;
}

static void check_errors(void) {
    g4_backend *be;
    g4_backend_cpu_create_with(0, G4_PRECISION_EXACT, &be);
    /* a model without an audio tower */
    g4_model *m = NULL;
    g4_status st = g4_model_load_dir(test_fixture("dense"), be, &m);
    CHECK(st == G4_OK && m->audio == NULL, "dense: %s", g4_error_message());
    if (st == G4_OK) {
        float feat[128 * 4] = {0}, *soft = NULL;
        int n = 0;
        CHECK(g4_audio_encode(m, feat, NULL, 4, &soft, &n) == G4_ERR_UNSUPPORTED, "dense: audio accepted");
        printf("  no tower: %s\n", g4_error_message());
        g4_model_release(m);
    }
    /* missing and malformed audio tensors, all in one message */
    const char *dir = broken_checkpoint("audio_broken");
    CHECK(dir != NULL, "cannot write the broken checkpoint");
    if (dir) {
        m = NULL;
        st = g4_model_load_dir(dir, be, &m);
        const char *msg = g4_error_message();
        printf("  broken audio tensors: %s\n", msg);
        CHECK(st == G4_ERR_FORMAT && !m, "broken audio checkpoint loaded (%d)", st);
        CHECK(strstr(msg, "4 problems") != NULL, "not all four problems listed");
        CHECK(strstr(msg, "subsample_conv_projection.layer1.conv.weight") != NULL, "missing conv not named");
        CHECK(strstr(msg, "layers.1.self_attn.k_proj.output_max") != NULL, "missing clip bound not named");
        CHECK(strstr(msg, "embed_audio.embedding_projection.weight") != NULL, "missing projection not named");
        CHECK(strstr(msg, "depthwise_conv1d.weight") != NULL, "malformed depthwise weight not named");
        g4_model_release(m);
    }
    g4_backend_destroy(be);
}

int main(int argc, char **argv) {
    const char *data = getenv("G4_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/audio/e2b_audio_sdpa.safetensors", data ? data : "tests/data");
    g4_st_set *sdpa = NULL;
    CHECK(g4_st_open(path, &sdpa) == G4_OK, "cannot open %s: %s", path, g4_error_message());
    if (argc > 1) {
        for (int i = 1; i < argc; i++) check_fixture(argv[i], sdpa);
    } else {
        check_fixture("e2b", sdpa);
        check_fixture("e2b-mlx4", sdpa);
        check_errors();
    }
    g4_st_close(sdpa);
    return test_finish();
}
