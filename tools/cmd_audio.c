/* gemma4 audio: decode an audio file the way the server treats an upload
 * (16 kHz mono, at most 30 s) and report what the model would see; optionally
 * write the 16 kHz waveform, the log-mel features and their mask (or the
 * unified model's raw frames) to a safetensors file for comparison with
 * transformers.
 *
 * Internal headers remain (media/audio_decode.h, audio_features.h, audio_resample.h, io/safetensors.h): a diagnostic of the audio decoder and
 * feature extractor themselves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "media/audio_decode.h"
#include "media/audio_features.h"
#include "media/audio_resample.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 audio FILE [-o OUT.safetensors] [--unified]\n"
            "  Decodes FILE (WAV, FLAC, Ogg Vorbis/Opus, MP3, AIFF), downmixes to mono,\n"
            "  resamples to 16 kHz, keeps the first 30 s and prints what the model sees.\n"
            "  -o OUT       write audio.waveform, audio.features [frames, 128] and\n"
            "               audio.features_mask (with --unified: audio.features [n, 640])\n"
            "  --unified    the 12B model's raw 640-sample frames instead of log-mel\n");
}

int cmd_audio(int argc, char **argv) {
    const char *path = NULL, *out_path = NULL;
    int unified = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out_path = argv[++i];
        } else if (!strcmp(argv[i], "--unified")) {
            unified = 1;
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    char *bytes;
    size_t size;
    g4_audio a;
    if (g4_read_file(path, (size_t)1 << 31, &bytes, &size) != G4_OK ||
        g4_audio_load_memory(bytes, size, path, &a) != G4_OK) {
        fprintf(stderr, "gemma4 audio: %s\n", g4_error_message());
        return 1;
    }
    printf("%s: %s, %d Hz, %d channel%s, %.3f s\n", path, g4_audio_format_name(g4_audio_detect_format(bytes, size)),
           a.source_rate, a.source_channels, a.source_channels == 1 ? "" : "s", a.source_seconds);
    free(bytes);
    printf("model input: %zu samples at 16 kHz (%.3f s)%s\n", a.n_samples, a.n_samples / 16000.0,
           a.truncated ? "; the audio was cut to its first 30 s" : "");

    float *features = NULL;
    uint8_t *mask = NULL;
    int frames = 0, rc = 0;
    g4_status st = unified ? g4_unified_audio_frames(a.samples, a.n_samples, &features, &frames)
                           : g4_audio_log_mel(a.samples, a.n_samples, &features, &mask, &frames);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4 audio: %s\n", g4_error_message());
        g4_audio_free(&a);
        return 1;
    }
    int width = unified ? G4_UNIFIED_AUDIO_FRAME : G4_AUDIO_MEL_BINS;
    int tokens = unified ? g4_unified_audio_token_count(a.n_samples) : g4_audio_soft_token_count(a.n_samples);
    printf("%s: %d frames of %d; %d audio soft tokens\n", unified ? "unified frames" : "log-mel features", frames,
           width, tokens);
    if (out_path) {
        if (unified) {
            mask = malloc(frames ? (size_t)frames : 1);
            if (mask) memset(mask, 1, (size_t)frames);
        }
        g4_st_write_item items[3] = {
            {"audio.waveform", G4_DTYPE_F32, 1, {(int64_t)a.n_samples}, a.samples},
            {"audio.features", G4_DTYPE_F32, 2, {frames, width}, features},
            {"audio.features_mask", G4_DTYPE_U8, 1, {frames}, mask},
        };
        if (!mask || g4_st_write(out_path, items, 3) != G4_OK) {
            fprintf(stderr, "gemma4 audio: %s\n", mask ? g4_error_message() : "out of memory");
            rc = 1;
        } else {
            printf("wrote %s\n", out_path);
        }
    }
    free(features);
    free(mask);
    g4_audio_free(&a);
    return rc;
}
