/* Sample-rate conversion and the 30 s cap: what turns any decoded upload into
 * the 16 kHz mono waveform Gemma 4's audio feature extractor expects.
 *
 * The resampler is libsoxr at SOXR_HQ with float32 samples, fed the same
 * way as the python-soxr wrapper feeds it, and the output length fixed to
 * ceil(n * 16000 / rate) as librosa does. transformers 5.17's load_audio is
 * librosa.load(path, sr=16000) (soundfile decode, mean of channels,
 * soxr.resample(..., quality="soxr_hq"), fix_length), so this reproduces the
 * reference pipeline's waveform (bit-identical on the machine it was
 * measured on). libsamplerate's SRC_SINC_BEST_QUALITY, the other candidate,
 * is as good a filter but a different one (0.4-0.7% relative difference from
 * the reference, mostly near Nyquist) and ~50x slower. */
#ifndef G4_MEDIA_AUDIO_RESAMPLE_H
#define G4_MEDIA_AUDIO_RESAMPLE_H

#include "media/audio.h"

/* Resamples `in` to rate_out Hz into a new *out (metadata copied; in is
 * unchanged). Equal rates copy. */
g4_status g4_audio_resample(const g4_audio *in, int rate_out, g4_audio *out);

/* Resamples to G4_AUDIO_MODEL_RATE and keeps at most max_samples (0: the
 * model's G4_AUDIO_MODEL_MAX_SAMPLES, 30 s). Only the part of the input
 * that reaches the kept output (plus a 1 s margin for the filter) is
 * resampled, so long sources cost no more than 31 s; the kept samples equal
 * those of resampling everything. out->truncated is set when anything was
 * cut, here or earlier; the library prints nothing, the caller tells the
 * user. */
g4_status g4_audio_prepare(const g4_audio *in, size_t max_samples, g4_audio *out);

/* Decode + prepare in one call: what a server does with an upload. */
g4_status g4_audio_load_memory(const void *data, size_t size, const char *name, g4_audio *out);
g4_status g4_audio_load_file(const char *path, g4_audio *out);

#endif
