/* Gemma 4 12B (gemma4_unified) against transformers: the encoder-free vision
 * embedder (intermediates patch_dense, patch_ln2, pos_norm, then soft
 * tokens), the merged-image logits under the three mask rules (default:
 * gemma4's sliding-only windowed rule = image.logits_vision_mask; option:
 * transformers 5.17's plain-forward rule = image.logits; causal =
 * image.logits_causal), the pixel values from image.png, and the audio
 * embedder from audio.wav (frames, soft tokens, logits). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_ref.h"
#include "media/audio_features.h"
#include "media/audio_resample.h"
#include "media/image.h"
#include "media/image_patches.h"
#include "model/model.h"
#include "model/unified_embedders.h"
#include "runtime/session.h"
#include "test_util.h"

#define TOLERANCE 1e-4

typedef struct {
    g4_backend *be;
    fixture_ref *ref;
} stage_check;

static void check_stage(void *ctx, const char *name, const float *data, int rows, int dim) {
    stage_check *sc = ctx;
    char key[64];
    snprintf(key, sizeof key, "image.%s", name);
    size_t n = 0;
    const float *want = fixture_ref_tensor(sc->ref, key, &n);
    CHECK(want && n == (size_t)rows * dim, "%s: %zu reference values for %d x %d", key, n, rows, dim);
    if (!want || n != (size_t)rows * dim) return;
    float *got = malloc(n * sizeof *got);
    sc->be->ops->to_host(sc->be, got, data, n * sizeof *got);
    double err = test_rel_rms(got, want, n);
    printf("  %-26s rel_rms %.2e\n", key, err);
    CHECK(err < TOLERANCE, "%s rel_rms %.3e", key, err);
    free(got);
}

static double prompt_logits(g4_model *m, const int32_t *ids, int n, int32_t placeholder, const float *soft,
                            int n_soft, g4_vision_mask mask, const float *want) {
    const int V = m->config.text.vocab_size;
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] == placeholder) rows[k++] = i;
    CHECK(k == n_soft, "%d placeholders for %d soft tokens", k, n_soft);
    g4_session_options opt = {.n_ctx = n + 1, .vision_mask = mask};
    g4_session *s;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    double err = INFINITY;
    g4_soft_tokens st_in = {k, rows, soft};
    if (g4_session_create(m, &opt, &s) == G4_OK) {
        if (g4_session_eval(s, ids, n, &st_in, G4_LOGITS_ALL, logits) == G4_OK)
            err = test_rel_rms(logits, want, (size_t)n * V);
        else
            fprintf(stderr, "eval: %s\n", g4_error_message());
        g4_session_destroy(s);
    }
    free(logits);
    free(rows);
    return err;
}

int main(void) {
    const char *dir = test_fixture("unified");
    fixture_ref ref;
    if (fixture_ref_open(dir, &ref) != 0) {
        CHECK(0, "cannot open the unified fixture");
        return test_finish();
    }
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create_with(0, G4_PRECISION_EXACT, &be);
    if (st == G4_OK) st = g4_model_load_dir(dir, be, &m);
    CHECK(st == G4_OK, "load: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    const int d = m->config.text.hidden_size;
    const g4_token_ids *tk = &m->config.tokens;

    /* vision, from the processor's pixel values */
    size_t n_px = 0, n_soft_ref = 0, n_l = 0;
    const float *pixels = fixture_ref_tensor(&ref, "image.pixel_values", &n_px);
    const float *want_soft = fixture_ref_tensor(&ref, "image.soft_tokens", &n_soft_ref);
    const g4_st_tensor *pos_t = g4_st_find(ref.tensors, "image.position_ids");
    stage_check sc = {be, &ref};
    float *soft = NULL;
    int n_soft = 0;
    st = g4_unified_vision_encode(m, pixels, (const int32_t *)pos_t->data, (int)pos_t->shape[0], check_stage, &sc,
                                  &soft, &n_soft);
    CHECK(st == G4_OK && (size_t)n_soft * d == n_soft_ref, "vision encode: %s (%d tokens)", g4_error_message(), n_soft);
    if (st == G4_OK && (size_t)n_soft * d == n_soft_ref) {
        float *host = malloc(n_soft_ref * sizeof *host);
        be->ops->to_host(be, host, soft, n_soft_ref * sizeof *host);
        double err = test_rel_rms(host, want_soft, n_soft_ref);
        printf("  %-26s rel_rms %.2e\n", "image.soft_tokens", err);
        CHECK(err < TOLERANCE, "image soft tokens rel_rms %.3e", err);
        free(host);
        int n_ids;
        int32_t *ids = fixture_ref_ids(&ref, "image", "prompt_ids", &n_ids);
        const struct {
            const char *key;
            g4_vision_mask mask;
        } rules[] = {{"image.logits_vision_mask", G4_VISION_MASK_DEFAULT},
                     {"image.logits", G4_VISION_MASK_ALL_LAYERS},
                     {"image.logits_causal", G4_VISION_MASK_CAUSAL}};
        for (size_t r = 0; r < 3; r++) {
            const float *want = fixture_ref_tensor(&ref, rules[r].key, &n_l);
            double e = prompt_logits(m, ids, n_ids, tk->image_id, soft, n_soft, rules[r].mask, want);
            printf("  %-26s rel_rms %.2e\n", rules[r].key, e);
            CHECK(e < TOLERANCE, "%s rel_rms %.3e", rules[r].key, e);
        }
        free(ids);
        be->ops->release(be, soft);
    }

    /* pixel values from image.png (the unified processor exists only with torchvision) */
    char path[1024];
    snprintf(path, sizeof path, "%s/image.png", dir);
    g4_image img;
    g4_image_patches p = {0};
    st = g4_image_decode_file(path, NULL, &img);
    if (st == G4_OK) st = g4_image_preprocess_unified(&img, 70, G4_IMAGE_BACKEND_TORCHVISION, &p);
    CHECK(st == G4_OK && (size_t)p.rows * p.row_len == n_px, "unified preprocess: %s", g4_error_message());
    if (st == G4_OK) {
        double max_diff = test_max_abs_diff(p.pixel_values, pixels, n_px);
        printf("  pixel values from image.png: max abs diff %.3g\n", max_diff);
        CHECK(max_diff < 2.0 / 255, "pixel values max diff %.3g", max_diff);
        CHECK(!memcmp(p.positions, pos_t->data, (size_t)p.rows * 2 * sizeof(int32_t)), "positions equal");
        g4_image_patches_free(&p);
        g4_image_free(&img);
    }

    /* audio: 640-sample frames from audio.wav */
    snprintf(path, sizeof path, "%s/audio.wav", dir);
    g4_audio a = {0};
    float *frames = NULL;
    int n_frames = 0;
    size_t n_feat = 0, n_asoft = 0;
    const float *want_frames = fixture_ref_tensor(&ref, "audio.features", &n_feat);
    const float *want_asoft = fixture_ref_tensor(&ref, "audio.soft_tokens", &n_asoft);
    st = g4_audio_load_file(path, &a);
    if (st == G4_OK) st = g4_unified_audio_frames(a.samples, a.n_samples, &frames, &n_frames);
    CHECK(st == G4_OK && (size_t)n_frames * 640 == n_feat, "audio frames: %s (%d)", g4_error_message(), n_frames);
    if (st == G4_OK && (size_t)n_frames * 640 == n_feat) {
        double err = test_rel_rms(frames, want_frames, n_feat);
        printf("  %-26s rel_rms %.2e\n", "audio.features", err);
        CHECK(err < TOLERANCE, "audio frames rel_rms %.3e", err);
        float *asoft = NULL;
        st = g4_unified_audio_encode(m, frames, n_frames, &asoft);
        CHECK(st == G4_OK, "audio encode: %s", g4_error_message());
        if (st == G4_OK) {
            float *host = malloc(n_asoft * sizeof *host);
            be->ops->to_host(be, host, asoft, n_asoft * sizeof *host);
            err = test_rel_rms(host, want_asoft, n_asoft);
            printf("  %-26s rel_rms %.2e\n", "audio.soft_tokens", err);
            CHECK(err < TOLERANCE, "audio soft tokens rel_rms %.3e", err);
            free(host);
            int n_ids;
            int32_t *ids = fixture_ref_ids(&ref, "audio", "prompt_ids", &n_ids);
            const float *want = fixture_ref_tensor(&ref, "audio.logits", &n_l);
            double e = prompt_logits(m, ids, n_ids, tk->audio_id, asoft, n_frames, G4_VISION_MASK_DEFAULT, want);
            printf("  %-26s rel_rms %.2e\n", "audio.logits", e);
            CHECK(e < TOLERANCE, "audio logits rel_rms %.3e", e);
            free(ids);
            be->ops->release(be, asoft);
        }
    }
    free(frames);
    g4_audio_free(&a);
    g4_model_release(m);
    g4_backend_destroy(be);
    fixture_ref_close(&ref);
    return test_finish();
}
