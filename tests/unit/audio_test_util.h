/* Shared by the audio tests: the deterministic test signal (the same integer
 * arithmetic as synth_int() in tests/tools/make_audio_refs.py, so both sides
 * see identical samples) and access to tests/data/audio/refs.safetensors. */
#ifndef G4_TEST_AUDIO_UTIL_H
#define G4_TEST_AUDIO_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "media/audio_features.h"
#include "test_util.h"

static inline int64_t audio_floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* A triangle wave sweeping 200 Hz..3 kHz every 5 s, a stepped envelope and
 * hashed noise, as int16 values; sample k of the stream starting at seed. */
static inline void audio_synth_int(int16_t *out, size_t n, int rate, uint64_t seed) {
    uint64_t phase = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = seed + i;
        uint64_t f = 200 + (k * 2800 / ((uint64_t)rate * 5)) % 2800;
        phase = (phase + (f << 32) / (uint64_t)rate) & 0xFFFFFFFFu;
        int64_t p = (int64_t)(phase >> 16);
        int64_t tri = p < 32768 ? p : 65535 - p;
        int64_t env = 1 + (int64_t)((k / (uint64_t)(rate / 8)) % 4);
        uint64_t h = (k * 0x9E3779B1u) & 0xFFFFFFFFu;
        h ^= h >> 15;
        h = (h * 0x85EBCA77u) & 0xFFFFFFFFu;
        h ^= h >> 13;
        int64_t s = audio_floor_div((tri - 16384) * env, 4) + (int64_t)(h >> 20) - 2048;
        out[i] = (int16_t)(s < -32768 ? -32768 : s > 32767 ? 32767 : s);
    }
}

/* The same signal as floats, v / 32768 (how a 16-bit WAV decodes). */
static inline float *audio_synth(size_t n, int rate) {
    int16_t *ints = malloc((n ? n : 1) * sizeof *ints);
    float *out = malloc((n ? n : 1) * sizeof *out);
    if (!ints || !out) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    audio_synth_int(ints, n, rate, 0);
    for (size_t i = 0; i < n; i++) out[i] = (float)ints[i] / 32768.0f;
    free(ints);
    return out;
}

static inline const char *audio_data_path(const char *name) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TEST_DATA");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/audio/%s", root ? root : "tests/data", name);
    return b;
}

static inline g4_st_set *audio_open_refs(void) {
    g4_st_set *refs = NULL;
    if (g4_st_open(audio_data_path("refs.safetensors"), &refs) != G4_OK) {
        fprintf(stderr, "cannot open the audio references: %s\n", g4_error_message());
        exit(1);
    }
    return refs;
}

/* A reference tensor of the given dtype, or NULL (and a failed check). */
static inline const g4_st_tensor *audio_ref(const g4_st_set *refs, const char *name, g4_dtype dtype) {
    const g4_st_tensor *t = g4_st_find(refs, name);
    CHECK(t != NULL, "reference %s is missing", name);
    if (!t) return NULL;
    CHECK(t->dtype == dtype, "reference %s has dtype %s", name, g4_dtype_name(t->dtype));
    return t->dtype == dtype ? t : NULL;
}

static inline size_t audio_ref_count(const g4_st_tensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* The largest feature relative RMS error seen, for the summary line. */
static inline double *audio_worst_error(void) {
    static double worst;
    return &worst;
}

static inline void note_error(double e) {
    if (e > *audio_worst_error()) *audio_worst_error() = e;
}

/* Compares features/mask with the stored reference under `prefix`. */
static inline void compare_features(const g4_st_set *refs, const char *prefix, const float *feat, const uint8_t *mask,
                             int frames) {
    char name[128];
    snprintf(name, sizeof name, "%s.mask", prefix);
    const g4_st_tensor *m = audio_ref(refs, name, G4_DTYPE_U8);
    if (!m) return;
    CHECK(frames == (int)m->shape[0], "%s: %d frames, transformers has %lld", prefix, frames, (long long)m->shape[0]);
    if (frames != (int)m->shape[0]) return;
    CHECK(frames == 0 || memcmp(mask, m->data, (size_t)frames) == 0, "%s: the frame mask differs", prefix);

    snprintf(name, sizeof name, "%s.row_sums", prefix);
    const g4_st_tensor *rs = audio_ref(refs, name, G4_DTYPE_F64);
    snprintf(name, sizeof name, "%s.col_sums", prefix);
    const g4_st_tensor *cs = audio_ref(refs, name, G4_DTYPE_F64);
    if (rs && cs && frames > 0) {
        double num = 0, den = 0, col[G4_AUDIO_MEL_BINS] = {0};
        for (int i = 0; i < frames; i++) {
            double r = 0;
            for (int b = 0; b < G4_AUDIO_MEL_BINS; b++) {
                r += feat[(size_t)i * G4_AUDIO_MEL_BINS + b];
                col[b] += feat[(size_t)i * G4_AUDIO_MEL_BINS + b];
            }
            double ref = ((const double *)rs->data)[i];
            num += (r - ref) * (r - ref);
            den += ref * ref;
        }
        CHECK(sqrt(num / (den + 1e-300)) < 1e-5, "%s: frame sums differ (relative RMS %.3g)", prefix,
              sqrt(num / (den + 1e-300)));
        num = den = 0;
        for (int b = 0; b < G4_AUDIO_MEL_BINS; b++) {
            double ref = ((const double *)cs->data)[b];
            num += (col[b] - ref) * (col[b] - ref);
            den += ref * ref;
        }
        CHECK(sqrt(num / (den + 1e-300)) < 1e-5, "%s: bin sums differ (relative RMS %.3g)", prefix,
              sqrt(num / (den + 1e-300)));
    }

    snprintf(name, sizeof name, "%s.features", prefix);
    const g4_st_tensor *f = audio_ref(refs, name, G4_DTYPE_F32);
    if (!f) return;
    snprintf(name, sizeof name, "%s.rows", prefix);
    const g4_st_tensor *rows = g4_st_find(refs, name);
    int n_rows = (int)f->shape[0];
    float *picked = malloc((size_t)n_rows * G4_AUDIO_MEL_BINS * sizeof *picked);
    for (int r = 0; r < n_rows; r++) {
        int i = rows ? ((const int32_t *)rows->data)[r] : r;
        memcpy(picked + (size_t)r * G4_AUDIO_MEL_BINS, feat + (size_t)i * G4_AUDIO_MEL_BINS,
               G4_AUDIO_MEL_BINS * sizeof *picked);
    }
    double e = test_rel_rms(picked, (const float *)f->data, (size_t)n_rows * G4_AUDIO_MEL_BINS);
    note_error(e);
    CHECK(e < 1e-4, "%s: features differ from transformers' (relative RMS %.3g)", prefix, e);
    printf("  %-12s %5d frames: relative RMS %.2e over %d%s frames\n", prefix, frames, e, n_rows,
           rows ? " sampled" : "");
    free(picked);
}

#endif
