/* Gemma 4 audio model inputs: log-mel features (E2B/E4B) and raw frames
 * (12B unified). See audio_features.h for the recipe and its source. */
#include "media/audio_features.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "media/audio_fft.h"

enum {
    FRAME_LENGTH = 320, /* 20 ms */
    HOP = 160,          /* 10 ms */
    FFT_LENGTH = 512,
    PAD_MULTIPLE = 128,
    LEFT_PAD = FRAME_LENGTH / 2, /* semicausal */
    UNFOLD = FRAME_LENGTH + 1,   /* frames are cut at 321 and lose their last sample */
};
static const double MEL_FLOOR = 1e-3;
static const double MEL_MAX_HZ = 8000.0;

static double hz_to_mel(double hz) { return 2595.0 * log10(1.0 + hz / 700.0); }
static double mel_to_hz(double mel) { return 700.0 * (pow(10.0, mel / 2595.0) - 1.0); }

void g4_audio_mel_filter_bank(double *filters) {
    /* Centres: 130 points evenly spaced in mel (numpy.linspace arithmetic:
     * start + i * step, last point exactly the end). */
    enum { POINTS = G4_AUDIO_MEL_BINS + 2 };
    double hz[POINTS], diff[POINTS - 1];
    const double mel_lo = hz_to_mel(0.0), mel_hi = hz_to_mel(MEL_MAX_HZ);
    const double step = (mel_hi - mel_lo) / (POINTS - 1);
    for (int i = 0; i < POINTS; i++) hz[i] = mel_to_hz(i == POINTS - 1 ? mel_hi : i * step + mel_lo);
    for (int i = 0; i < POINTS - 1; i++) diff[i] = hz[i + 1] - hz[i];
    /* FFT bin frequencies: linspace(0, 8000, 257). */
    const double bin_step = MEL_MAX_HZ / (G4_AUDIO_FFT_BINS - 1);
    for (int k = 0; k < G4_AUDIO_FFT_BINS; k++) {
        double f = k == G4_AUDIO_FFT_BINS - 1 ? MEL_MAX_HZ : k * bin_step;
        for (int m = 0; m < G4_AUDIO_MEL_BINS; m++) {
            double down = -(hz[m] - f) / diff[m], up = (hz[m + 2] - f) / diff[m + 1];
            double w = down < up ? down : up;
            filters[k * G4_AUDIO_MEL_BINS + m] = w > 0.0 ? w : 0.0;
        }
    }
}

void g4_audio_hann_window(float *window) {
    /* numpy.hanning(321)[:320]: 0.5 + 0.5 cos(pi n / 320), n = -320, -318, ... */
    for (int j = 0; j < FRAME_LENGTH; j++) {
        double n = (double)(1 - (FRAME_LENGTH + 1) + 2 * j);
        window[j] = (float)(0.5 + 0.5 * cos(M_PI * n / FRAME_LENGTH));
    }
}

int g4_audio_feature_frames(size_t n_samples) {
    size_t padded = (n_samples + PAD_MULTIPLE - 1) / PAD_MULTIPLE * PAD_MULTIPLE + LEFT_PAD;
    return padded < UNFOLD ? 0 : (int)((padded - UNFOLD) / HOP + 1);
}

/* Frame i is valid iff original sample HOP*i + HOP exists. */
static int frame_is_valid(int i, size_t n) { return (size_t)i * HOP + (UNFOLD - 1 - LEFT_PAD) < n; }

/* Each mel filter is a triangle: keep only its nonzero bin range. */
typedef struct {
    int lo, hi;                         /* nonzero bins lo..hi-1 */
    double w[G4_AUDIO_FFT_BINS];        /* weights by bin */
} mel_filter;

static int build_mel_filters(mel_filter *filters) {
    double *dense = malloc(sizeof(double) * G4_AUDIO_FFT_BINS * G4_AUDIO_MEL_BINS);
    if (!dense) return 0;
    g4_audio_mel_filter_bank(dense);
    for (int m = 0; m < G4_AUDIO_MEL_BINS; m++) {
        mel_filter *f = &filters[m];
        f->lo = G4_AUDIO_FFT_BINS;
        f->hi = 0;
        for (int k = 0; k < G4_AUDIO_FFT_BINS; k++) {
            f->w[k] = dense[k * G4_AUDIO_MEL_BINS + m];
            if (f->w[k] != 0.0) {
                if (k < f->lo) f->lo = k;
                f->hi = k + 1;
            }
        }
    }
    free(dense);
    return 1;
}

g4_status g4_audio_log_mel(const float *samples, size_t n, float **features, uint8_t **mask, int *n_frames) {
    *features = NULL;
    *mask = NULL;
    *n_frames = 0;
    if (n > G4_AUDIO_MODEL_MAX_SAMPLES)
        return g4_fail(G4_ERR_LIMIT, "%zu audio samples exceed the model's %d (30 s at 16 kHz); cut the audio first",
                       n, G4_AUDIO_MODEL_MAX_SAMPLES);
    if (n > 0 && !samples) return g4_fail(G4_ERR_INVALID_ARGUMENT, "log-mel: no samples given");
    const int frames = g4_audio_feature_frames(n);
    if (frames == 0) return G4_OK;

    float *out = malloc((size_t)frames * G4_AUDIO_MEL_BINS * sizeof *out);
    uint8_t *valid = malloc((size_t)frames);
    mel_filter *filters = malloc(sizeof(mel_filter) * G4_AUDIO_MEL_BINS);
    g4_rfft_plan plan;
    g4_status st = g4_rfft_plan_init(&plan, FFT_LENGTH);
    if (!out || !valid || !filters || st != G4_OK || !build_mel_filters(filters)) {
        free(out);
        free(valid);
        free(filters);
        g4_rfft_plan_free(&plan);
        return st != G4_OK ? st : g4_fail(G4_ERR_OUT_OF_MEMORY, "log-mel: out of memory for %d frames", frames);
    }
    float window[FRAME_LENGTH];
    g4_audio_hann_window(window);

    double buf[FFT_LENGTH], re[G4_AUDIO_FFT_BINS], im[G4_AUDIO_FFT_BINS], mag[G4_AUDIO_FFT_BINS];
    for (int i = 0; i < frames; i++) {
        float *row = out + (size_t)i * G4_AUDIO_MEL_BINS;
        valid[i] = (uint8_t)frame_is_valid(i, n);
        if (!valid[i]) { /* transformers computes these and multiplies by 0 */
            memset(row, 0, G4_AUDIO_MEL_BINS * sizeof *row);
            continue;
        }
        /* Frame i covers padded samples [HOP i, HOP i + 320), i.e. original
         * samples from HOP i - LEFT_PAD; zeros outside the waveform. */
        const long first = (long)i * HOP - LEFT_PAD;
        for (int j = 0; j < FRAME_LENGTH; j++) {
            long s = first + j;
            float x = s >= 0 && (size_t)s < n ? samples[s] : 0.0f;
            buf[j] = (double)(x * window[j]); /* a float32 product, as in numpy */
        }
        for (int j = FRAME_LENGTH; j < FFT_LENGTH; j++) buf[j] = 0.0;
        g4_rfft(&plan, buf, re, im);
        for (int k = 0; k < G4_AUDIO_FFT_BINS; k++) mag[k] = sqrt(re[k] * re[k] + im[k] * im[k]);
        for (int m = 0; m < G4_AUDIO_MEL_BINS; m++) {
            const mel_filter *f = &filters[m];
            double sum = 0.0;
            for (int k = f->lo; k < f->hi; k++) sum += mag[k] * f->w[k];
            row[m] = (float)log(sum + MEL_FLOOR);
        }
    }
    free(filters);
    g4_rfft_plan_free(&plan);
    *features = out;
    *mask = valid;
    *n_frames = frames;
    return G4_OK;
}

int g4_audio_soft_token_count(size_t n_samples) {
    if (n_samples < (size_t)(UNFOLD - LEFT_PAD)) return 0; /* T = (n - 161) // 160 + 1 <= 0 */
    size_t t = (n_samples + LEFT_PAD - UNFOLD) / HOP + 1;
    for (int i = 0; i < 2; i++) t = (t + 2 - 3) / 2 + 1; /* stride-2 conv, kernel 3, padding 1 */
    return t < G4_AUDIO_AUDIO_SEQ_LENGTH ? (int)t : G4_AUDIO_AUDIO_SEQ_LENGTH;
}

int g4_unified_audio_token_count(size_t n_samples) {
    return (int)((n_samples + G4_UNIFIED_AUDIO_FRAME - 1) / G4_UNIFIED_AUDIO_FRAME);
}

g4_status g4_unified_audio_frames(const float *samples, size_t n, float **frames, int *n_frames) {
    *frames = NULL;
    *n_frames = 0;
    if (n > G4_AUDIO_MODEL_MAX_SAMPLES)
        return g4_fail(G4_ERR_LIMIT, "%zu audio samples exceed the model's %d (30 s at 16 kHz); cut the audio first",
                       n, G4_AUDIO_MODEL_MAX_SAMPLES);
    if (n > 0 && !samples) return g4_fail(G4_ERR_INVALID_ARGUMENT, "unified audio frames: no samples given");
    const int count = g4_unified_audio_token_count(n);
    if (count == 0) return G4_OK;
    float *out = calloc((size_t)count * G4_UNIFIED_AUDIO_FRAME, sizeof *out);
    if (!out) return g4_fail(G4_ERR_OUT_OF_MEMORY, "unified audio frames: out of memory for %d frames", count);
    memcpy(out, samples, n * sizeof *out);
    *frames = out;
    *n_frames = count;
    return G4_OK;
}
