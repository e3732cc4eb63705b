/* libFuzzer target for audio input: arbitrary bytes through the whole upload
 * path (format detection, the WAV parser, libsndfile and libmpg123 decoding,
 * downmix, resampling with the cap, log-mel features, unified frames).
 * Build: cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DGEMMA4_FUZZ=ON
 * Run:   build-fuzz/tests/fuzz/fuzz_audio -dict=tests/fuzz/audio.dict CORPUS tests/data/audio */
#include <stdint.h>
#include <stdlib.h>

#include "media/audio_decode.h"
#include "media/audio_features.h"
#include "media/audio_resample.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_audio decoded, prepared;
    /* Keep 2 s: a few bytes of FLAC or MP3 can expand to hours of samples. */
    if (g4_audio_decode_memory(data, size, "fuzz", 2.0, &decoded) != G4_OK) return 0;
    if (g4_audio_prepare(&decoded, 32000, &prepared) == G4_OK) {
        float *features = NULL, *frames = NULL;
        uint8_t *mask = NULL;
        int n = 0;
        if (g4_audio_log_mel(prepared.samples, prepared.n_samples, &features, &mask, &n) == G4_OK &&
            n != g4_audio_feature_frames(prepared.n_samples))
            abort();
        free(features);
        free(mask);
        if (g4_unified_audio_frames(prepared.samples, prepared.n_samples, &frames, &n) == G4_OK &&
            n != g4_unified_audio_token_count(prepared.n_samples))
            abort();
        free(frames);
        g4_audio_free(&prepared);
    }
    g4_audio_free(&decoded);
    return 0;
}
