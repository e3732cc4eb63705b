/* The vision tower against transformers: from the processor's pixel values
 * (ref image.pixel_values / image.position_ids) the soft tokens must match
 * image.soft_tokens, and the prompt with the image merged in must give
 * image.logits (bidirectional image attention on sliding layers for the
 * 26B/31B-like fixtures, plain causal for E2B). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_model.h"
#include "model/model.h"
#include "model/vision_tower.h"
#include "runtime/session.h"
#include "test_util.h"

#define TOLERANCE 1e-4
/* End to end (our soft tokens through our decoder) the random fixtures
 * amplify the tower's rounding 50-100x into the image rows' logits: with
 * float32 sums in the tower's matmuls dense reached 1.0e-4 and moe 1.7e-4
 * (transformers' own float32 gets 1.1e-4 and 2.3e-4 against the same
 * float64 references, tests/tools/transformers_f32_floor.py). The tower
 * therefore uses matmul_precise (float64 sums): dense 3.9e-5, moe 8.2e-5,
 * e2b 2.9e-5, e2b-mlx4 5.0e-5 (AVX-512; 7.9e-5 / 9.0e-5 for moe on AVX2 /
 * scalar, whose attention sums differ). */
#define END_TO_END_TOLERANCE 1e-4

/* Prompt logits with the soft tokens spliced in at the image placeholders. */
static g4_status image_prompt_logits(g4_model *m, const int32_t *ids, int n_ids, int32_t *rows_of, int k,
                                     float *soft, float *logits) {
    g4_session_options opt = {.n_ctx = n_ids + 1};
    g4_session *s = NULL;
    g4_status st = g4_session_create(m, &opt, &s);
    g4_soft_tokens st_in = {k, rows_of, soft};
    if (st == G4_OK) st = g4_session_eval(s, ids, n_ids, &st_in, G4_LOGITS_ALL, logits);
    if (s) g4_session_destroy(s);
    return st;
}

static void check_fixture(const char *name) {
    fixture_ref ref;
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create_with(0, G4_PRECISION_EXACT, &be);
    CHECK(st == G4_OK, "cpu backend: %s", g4_error_message());
    if (st != G4_OK) return;
    if (!fixture_model_open(name, be, &ref, &m)) {
        g4_backend_destroy(be);
        return;
    }
    size_t n_px = 0, n_soft_ref = 0, n_logits = 0;
    const float *pixels = fixture_ref_tensor(&ref, "image.pixel_values", &n_px);
    const float *want_soft = fixture_ref_tensor(&ref, "image.soft_tokens", &n_soft_ref);
    const float *want_logits = fixture_ref_tensor(&ref, "image.logits", &n_logits);
    const g4_st_tensor *pos_t = g4_st_find(ref.tensors, "image.position_ids");
    CHECK(pixels && want_soft && want_logits && pos_t && pos_t->dtype == G4_DTYPE_I32, "%s: references present",
          name);
    const int d = m->config.text.hidden_size, V = m->config.text.vocab_size;
    int rows = pos_t ? (int)pos_t->shape[0] : 0;
    float *soft = NULL;
    int n_soft = 0;
    st = g4_vision_encode(m, pixels, (const int32_t *)pos_t->data, rows, &soft, &n_soft);
    CHECK(st == G4_OK, "%s: encode: %s", name, g4_error_message());
    if (st == G4_OK) {
        CHECK((size_t)n_soft * d == n_soft_ref, "%s: %d soft tokens, reference has %zu values", name, n_soft,
              n_soft_ref);
        float *host = malloc((size_t)n_soft * d * sizeof *host);
        be->ops->to_host(be, host, soft, (size_t)n_soft * d * sizeof *host);
        if ((size_t)n_soft * d == n_soft_ref) {
            double err = test_rel_rms(host, want_soft, n_soft_ref);
            printf("  %-10s image soft tokens (%d)   rel_rms %.2e\n", name, n_soft, err);
            CHECK(err < TOLERANCE, "%s soft tokens rel_rms %.3e", name, err);
        }
        free(host);

        int n_ids;
        int32_t *ids = fixture_ref_ids(&ref, "image", "prompt_ids", &n_ids);
        int32_t *rows_of = malloc((size_t)n_ids * sizeof *rows_of);
        int k = 0;
        for (int i = 0; i < n_ids; i++)
            if (ids[i] == m->config.tokens.image_id) rows_of[k++] = i;
        CHECK(k == n_soft, "%s: %d placeholders for %d soft tokens", name, k, n_soft);
        float *logits = malloc((size_t)n_ids * V * sizeof *logits);
        st = image_prompt_logits(m, ids, n_ids, rows_of, k, soft, logits);
        CHECK(st == G4_OK, "%s: image prompt: %s", name, g4_error_message());
        if (st == G4_OK && (size_t)n_ids * V == n_logits) {
            double err = test_rel_rms(logits, want_logits, n_logits);
            printf("  %-10s image logits              rel_rms %.2e\n", name, err);
            if (getenv("G4_DEBUG_ROWS"))
                for (int r = 0; r < n_ids; r++)
                    printf("    row %d id %d rel_rms %.2e\n", r, ids[r],
                           test_rel_rms(logits + (size_t)r * V, want_logits + (size_t)r * V, V));
            CHECK(err < END_TO_END_TOLERANCE, "%s image logits rel_rms %.3e", name, err);
        }
        /* the decoder alone: transformers' soft tokens in, same prompt */
        float *ref_soft = be->ops->alloc(be, n_soft_ref * sizeof(float));
        CHECK(ref_soft != NULL, "%s: allocation", name);
        if (ref_soft && k == n_soft && (size_t)n_soft * d == n_soft_ref) {
            be->ops->to_device(be, ref_soft, want_soft, n_soft_ref * sizeof(float));
            st = image_prompt_logits(m, ids, n_ids, rows_of, k, ref_soft, logits);
            CHECK(st == G4_OK, "%s: image prompt from reference soft tokens: %s", name, g4_error_message());
            if (st == G4_OK && (size_t)n_ids * V == n_logits) {
                double err = test_rel_rms(logits, want_logits, n_logits);
                printf("  %-10s image logits (ref soft)   rel_rms %.2e\n", name, err);
                CHECK(err < TOLERANCE, "%s image logits from reference soft tokens rel_rms %.3e", name, err);
            }
        }
        if (ref_soft) be->ops->release(be, ref_soft);
        free(logits);
        free(rows_of);
        free(ids);
        be->ops->release(be, soft);
    }
    g4_model_release(m);
    g4_backend_destroy(be);
    fixture_ref_close(&ref);
}

int main(int argc, char **argv) {
    const char *all[] = {"dense", "moe", "e2b", "e2b-mlx4"};
    if (argc > 1)
        for (int i = 1; i < argc; i++) check_fixture(argv[i]);
    else
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) check_fixture(all[i]);
    return test_finish();
}
