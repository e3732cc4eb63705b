/* Log-mel features, soft-token counts and unified-model frames against
 * transformers 5.17 (Gemma4AudioFeatureExtractor, Gemma4Processor,
 * Gemma4UnifiedAudioFeatureExtractor): the e2b/unified fixtures and the
 * references of tests/tools/make_audio_refs.py. */
#include <string.h>

#include "audio_test_util.h"
#include "base/file.h"
#include "media/audio_decode.h"
#include "media/audio_features.h"
#include "media/audio_fft.h"
#include "media/audio_resample.h"

static void test_window_and_filters(const g4_st_set *refs) {
    float window[320];
    g4_audio_hann_window(window);
    const g4_st_tensor *w = audio_ref(refs, "window", G4_DTYPE_F32);
    if (w) CHECK(memcmp(window, w->data, sizeof window) == 0, "the Hann window differs from numpy's");

    static double bank[G4_AUDIO_FFT_BINS * G4_AUDIO_MEL_BINS];
    g4_audio_mel_filter_bank(bank);
    const g4_st_tensor *sums = audio_ref(refs, "mel_filter_sums", G4_DTYPE_F64);
    const g4_st_tensor *ranges = audio_ref(refs, "mel_filter_ranges", G4_DTYPE_I32);
    if (!sums || !ranges) return;
    const double *ref_sum = (const double *)sums->data;
    const int32_t *ref_range = (const int32_t *)ranges->data;
    double worst = 0;
    int range_errors = 0;
    for (int m = 0; m < G4_AUDIO_MEL_BINS; m++) {
        double s = 0;
        int lo = -1, hi = -1;
        for (int k = 0; k < G4_AUDIO_FFT_BINS; k++) {
            double v = bank[k * G4_AUDIO_MEL_BINS + m];
            s += v;
            if (v != 0 && lo < 0) lo = k;
            if (v != 0) hi = k + 1;
        }
        double e = fabs(s - ref_sum[m]) / (fabs(ref_sum[m]) + 1e-300);
        if (e > worst) worst = e;
        /* transformers' bank has an all-zero top filter (it warns about it). */
        if (ref_sum[m] == 0) range_errors += s != 0;
        else range_errors += lo != ref_range[2 * m] || hi != ref_range[2 * m + 1];
    }
    CHECK(worst < 1e-12, "mel filter sums differ by %.3g (relative)", worst);
    CHECK(range_errors == 0, "%d mel filters cover other bins than transformers'", range_errors);
}

static void test_fft(void) {
    for (int n = 4; n <= 512; n *= 2) {
        g4_rfft_plan plan;
        CHECK(g4_rfft_plan_init(&plan, n) == G4_OK, "plan %d", n);
        double x[512], re[257], im[257];
        uint32_t s = 12345;
        for (int j = 0; j < n; j++) {
            s = s * 1664525u + 1013904223u;
            x[j] = (double)(s >> 8) / (1 << 24) - 0.5;
        }
        g4_rfft(&plan, x, re, im);
        double worst = 0;
        for (int k = 0; k <= n / 2; k++) {
            double dr = 0, di = 0;
            for (int j = 0; j < n; j++) {
                dr += x[j] * cos(2 * M_PI * j * k / n);
                di -= x[j] * sin(2 * M_PI * j * k / n);
            }
            worst = fmax(worst, fmax(fabs(dr - re[k]), fabs(di - im[k])));
        }
        CHECK(worst < 1e-12, "%d-point FFT differs from the DFT by %.3g", n, worst);
        g4_rfft_plan_free(&plan);
    }
    g4_rfft_plan bad;
    CHECK(g4_rfft_plan_init(&bad, 96) == G4_ERR_INVALID_ARGUMENT, "non power of two FFT length accepted");
}

static void test_fixture_e2b(void) {
    const char *dir = test_fixture("e2b");
    char *wav = g4_path_join(dir, "audio.wav"), *ref_path = g4_path_join(dir, "ref.safetensors");
    g4_st_set *ref = NULL;
    g4_audio a;
    CHECK(g4_st_open(ref_path, &ref) == G4_OK, "%s: %s", ref_path, g4_error_message());
    CHECK(g4_audio_decode_file(wav, 0, &a) == G4_OK, "%s: %s", wav, g4_error_message());
    if (!ref || !a.samples) goto done;
    const g4_st_tensor *wave = audio_ref(ref, "audio.waveform", G4_DTYPE_F32);
    const g4_st_tensor *feat = audio_ref(ref, "audio.features", G4_DTYPE_F32);
    const g4_st_tensor *mask = audio_ref(ref, "audio.features_mask", G4_DTYPE_I32);
    const g4_st_tensor *soft = audio_ref(ref, "audio.soft_tokens", G4_DTYPE_F32);
    if (!wave || !feat || !mask || !soft) goto done;
    CHECK(a.n_samples == (size_t)wave->shape[0] && a.sample_rate == 16000 && a.source_channels == 1,
          "e2b audio.wav: %zu samples at %d Hz", a.n_samples, a.sample_rate);
    CHECK(a.n_samples == (size_t)wave->shape[0] &&
              memcmp(a.samples, wave->data, a.n_samples * sizeof(float)) == 0,
          "e2b audio.wav decodes differently from audio.waveform");

    float *f;
    uint8_t *m;
    int frames;
    CHECK(g4_audio_log_mel(a.samples, a.n_samples, &f, &m, &frames) == G4_OK, "%s", g4_error_message());
    CHECK(frames == feat->shape[0] && feat->shape[1] == G4_AUDIO_MEL_BINS, "e2b: %d frames, reference %lld", frames,
          (long long)feat->shape[0]);
    if (frames == feat->shape[0]) {
        double e = test_rel_rms(f, (const float *)feat->data, (size_t)frames * G4_AUDIO_MEL_BINS);
        double worst = test_max_abs_diff(f, (const float *)feat->data, (size_t)frames * G4_AUDIO_MEL_BINS);
        note_error(e);
        CHECK(e < 1e-4, "e2b features: relative RMS %.3g", e);
        printf("  e2b fixture   %5d frames: relative RMS %.2e, max |diff| %.2e\n", frames, e, worst);
        int mask_errors = 0;
        for (int i = 0; i < frames; i++) mask_errors += m[i] != (((const int32_t *)mask->data)[i] != 0);
        CHECK(mask_errors == 0, "e2b: %d mask entries differ", mask_errors);
    }
    CHECK(g4_audio_soft_token_count(a.n_samples) == soft->shape[0], "e2b: %d soft tokens, tower made %lld",
          g4_audio_soft_token_count(a.n_samples), (long long)soft->shape[0]);
    free(f);
    free(m);
done:
    g4_audio_free(&a);
    g4_st_close(ref);
    free(wav);
    free(ref_path);
}

static void test_fixture_unified(void) {
    char *ref_path = g4_path_join(test_fixture("unified"), "ref.safetensors");
    g4_st_set *ref = NULL;
    CHECK(g4_st_open(ref_path, &ref) == G4_OK, "%s: %s", ref_path, g4_error_message());
    free(ref_path);
    if (!ref) return;
    const g4_st_tensor *wave = audio_ref(ref, "audio.waveform", G4_DTYPE_F32);
    const g4_st_tensor *feat = audio_ref(ref, "audio.features", G4_DTYPE_F32);
    const g4_st_tensor *mask = g4_st_find(ref, "audio.features_mask");
    const g4_st_tensor *soft = audio_ref(ref, "audio.soft_tokens", G4_DTYPE_F32);
    if (wave && feat && mask && soft) {
        float *frames;
        int n;
        size_t samples = (size_t)wave->shape[0];
        CHECK(g4_unified_audio_frames((const float *)wave->data, samples, &frames, &n) == G4_OK, "%s",
              g4_error_message());
        CHECK(n == feat->shape[0] && feat->shape[1] == G4_UNIFIED_AUDIO_FRAME, "unified: %d frames, reference %lld",
              n, (long long)feat->shape[0]);
        if (n == feat->shape[0])
            CHECK(memcmp(frames, feat->data, (size_t)n * G4_UNIFIED_AUDIO_FRAME * sizeof(float)) == 0,
                  "unified frames differ from audio.features");
        CHECK(g4_unified_audio_token_count(samples) == soft->shape[0] && (int64_t)mask->shape[0] == soft->shape[0],
              "unified: %d tokens, reference %lld", g4_unified_audio_token_count(samples), (long long)soft->shape[0]);
        free(frames);
    }
    g4_st_close(ref);
}

static void test_lengths(const g4_st_set *refs) {
    const g4_st_tensor *lengths = audio_ref(refs, "lengths", G4_DTYPE_I64);
    if (!lengths) return;
    for (int64_t i = 0; i < lengths->shape[0]; i++) {
        size_t n = (size_t)((const int64_t *)lengths->data)[i];
        g4_audio a = {audio_synth(n, 16000), n, 16000, 1, 16000, (double)n / 16000, 0}, cut;
        CHECK(g4_audio_prepare(&a, 0, &cut) == G4_OK, "%s", g4_error_message());
        /* Over 30 s: transformers truncates silently, we say so. */
        CHECK(cut.truncated == (n > G4_AUDIO_MODEL_MAX_SAMPLES) &&
                  cut.n_samples == (n > G4_AUDIO_MODEL_MAX_SAMPLES ? G4_AUDIO_MODEL_MAX_SAMPLES : n),
              "%zu samples: kept %zu, truncated %d", n, cut.n_samples, cut.truncated);
        float *f;
        uint8_t *m;
        int frames;
        CHECK(g4_audio_log_mel(cut.samples, cut.n_samples, &f, &m, &frames) == G4_OK, "%s", g4_error_message());
        CHECK(frames == g4_audio_feature_frames(cut.n_samples), "frame count");
        char prefix[32];
        snprintf(prefix, sizeof prefix, "len%zu", n);
        compare_features(refs, prefix, f, m, frames);
        free(f);
        free(m);
        g4_audio_free(&a);
        g4_audio_free(&cut);
    }
    /* No audio, no frames; above 30 s the caller must cut first. */
    float *f = (float *)1;
    uint8_t *m = (uint8_t *)1;
    int frames = -1;
    CHECK(g4_audio_log_mel(NULL, 0, &f, &m, &frames) == G4_OK && frames == 0 && !f && !m, "empty input");
    float *big = calloc(G4_AUDIO_MODEL_MAX_SAMPLES + 1, sizeof *big);
    CHECK(g4_audio_log_mel(big, G4_AUDIO_MODEL_MAX_SAMPLES + 1, &f, &m, &frames) == G4_ERR_LIMIT,
          "more than 30 s accepted");
    CHECK(g4_unified_audio_frames(big, G4_AUDIO_MODEL_MAX_SAMPLES + 1, &f, &frames) == G4_ERR_LIMIT,
          "more than 30 s accepted (unified)");
    double t0 = g4_now_seconds();
    CHECK(g4_audio_log_mel(big, G4_AUDIO_MODEL_MAX_SAMPLES, &f, &m, &frames) == G4_OK, "%s", g4_error_message());
    printf("  log-mel of 30 s: %.1f ms\n", (g4_now_seconds() - t0) * 1e3);
    free(f);
    free(m);
    free(big);
}

static void test_token_counts(const g4_st_set *refs) {
    const g4_st_tensor *t = audio_ref(refs, "token_counts", G4_DTYPE_I32);
    if (t) {
        const int32_t *rows = (const int32_t *)t->data;
        int wrong = 0, wrong_prompt = 0, prompts = 0;
        for (int64_t i = 0; i < t->shape[0]; i++) {
            int got = g4_audio_soft_token_count((size_t)rows[3 * i]);
            wrong += got != rows[3 * i + 1];
            if (rows[3 * i + 2] >= 0) {
                prompts++;
                wrong_prompt += got != rows[3 * i + 2];
            }
        }
        CHECK(wrong == 0, "%d of %lld token counts differ from _compute_audio_num_tokens", wrong,
              (long long)t->shape[0]);
        CHECK(wrong_prompt == 0, "%d of %d token counts differ from the processor's prompt expansion", wrong_prompt,
              prompts);
        printf("  token counts: %lld lengths vs _compute_audio_num_tokens, %d vs the prompt expansion\n",
               (long long)t->shape[0], prompts);
    }
    const g4_st_tensor *u = audio_ref(refs, "unified_token_counts", G4_DTYPE_I32);
    if (u) {
        const int32_t *rows = (const int32_t *)u->data;
        for (int64_t i = 0; i < u->shape[0]; i++) {
            int got = g4_unified_audio_token_count((size_t)rows[3 * i]);
            CHECK(got == rows[3 * i + 1] && got == rows[3 * i + 2], "unified %d samples: %d tokens, reference %d/%d",
                  rows[3 * i], got, rows[3 * i + 1], rows[3 * i + 2]);
        }
    }
    const g4_st_tensor *uf = audio_ref(refs, "unified.n1000.frames", G4_DTYPE_F32);
    if (uf) {
        float *x = audio_synth(1000, 16000), *frames;
        int n;
        CHECK(g4_unified_audio_frames(x, 1000, &frames, &n) == G4_OK && n == uf->shape[0], "unified 1000 samples");
        if (n == uf->shape[0])
            CHECK(memcmp(frames, uf->data, (size_t)n * G4_UNIFIED_AUDIO_FRAME * sizeof(float)) == 0,
                  "unified frames of 1000 samples differ");
        free(x);
        free(frames);
    }
}

int main(void) {
    g4_st_set *refs = audio_open_refs();
    test_window_and_filters(refs);
    test_fft();
    test_fixture_e2b();
    test_fixture_unified();
    test_lengths(refs);
    test_token_counts(refs);
    printf("  worst feature relative RMS: %.2e\n", *audio_worst_error());
    g4_st_close(refs);
    return test_finish();
}
