/* Shared by the audio tests: the deterministic test signal (the same integer
 * arithmetic as synth_int() in tests/tools/make_audio_refs.py, so both sides
 * see identical samples) and access to tests/data/audio/refs.safetensors. */
#ifndef G4_TEST_AUDIO_UTIL_H
#define G4_TEST_AUDIO_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/safetensors.h"
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

#endif
