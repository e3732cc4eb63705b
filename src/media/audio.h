/* Audio as the model sees it: mono float samples at one sample rate, plus
 * what the caller needs to know about the source (its length, whether only
 * its beginning was kept). The pipeline is decode (audio_decode.h) ->
 * downmix -> resample to 16 kHz and cap at 30 s (audio_resample.h) ->
 * log-mel features or raw frames (audio_features.h). */
#ifndef G4_MEDIA_AUDIO_H
#define G4_MEDIA_AUDIO_H

#include <stddef.h>

#include "base/status.h"

/* Sample rates outside this range are refused as nonsense. */
#define G4_AUDIO_MIN_RATE 1000
#define G4_AUDIO_MAX_RATE 768000
/* More channels than this is not a recording anyone means to transcribe. */
#define G4_AUDIO_MAX_CHANNELS 256
/* Sources longer than this (4 hours) are refused rather than cut to 30 s:
 * such an upload is almost surely a mistake, and the caller should know. */
#define G4_AUDIO_MAX_SOURCE_SECONDS 14400.0

/* What the Gemma 4 audio path consumes: 16 kHz mono, at most 30 s
 * (transformers' Gemma4AudioFeatureExtractor max_length=480000). */
#define G4_AUDIO_MODEL_RATE 16000
#define G4_AUDIO_MODEL_MAX_SAMPLES 480000

typedef struct {
    float *samples;        /* mono; integer sources are scaled to [-1, 1) */
    size_t n_samples;
    int sample_rate;       /* Hz */
    int source_channels;   /* channels before the downmix */
    int source_rate;       /* Hz, before any resampling */
    double source_seconds; /* length of the whole source; < 0 when unknown */
    int truncated;         /* 1: samples hold only the beginning of the source */
} g4_audio;

void g4_audio_free(g4_audio *a);

#endif
