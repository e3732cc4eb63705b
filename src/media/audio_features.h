/* Model inputs from a 16 kHz mono waveform.
 *
 * Gemma 4 E2B/E4B (audio tower): log-mel features exactly as transformers'
 * Gemma4AudioFeatureExtractor computes them with its defaults (one waveform,
 * padding="longest", pad_to_multiple_of=128, no dither, no preemphasis, no
 * per-bin normalisation):
 *   - zero-pad the waveform to a multiple of 128 samples, then prepend 160
 *     zeros (semicausal padding);
 *   - frames of 321 samples every 160 (the last sample dropped -> 320), times
 *     a periodic Hann window (float32, numpy's hanning(321)[:320]);
 *   - |rfft| with n_fft = 512 (257 bins); HTK mel filter bank of 128 bins over
 *     0-8 kHz without area normalisation (float64); log(mel + 1e-3);
 *   - frame i is valid iff original sample 160 i + 160 exists (the last
 *     sample of its 321-sample window is real audio); invalid frames are 0.
 * The window product is rounded to float32 like numpy's; the FFT, mel sum and
 * log run in double (numpy 2 runs the FFT in float32; the two agree to
 * ~4e-8 relative).
 *
 * Gemma 4 12B ("unified", encoder-free audio): raw 640-sample frames,
 * zero-padded at the end, every frame valid (Gemma4UnifiedAudioFeatureExtractor). */
#ifndef G4_MEDIA_AUDIO_FEATURES_H
#define G4_MEDIA_AUDIO_FEATURES_H

#include <stddef.h>
#include <stdint.h>

#include "media/audio.h"

#define G4_AUDIO_MEL_BINS 128
#define G4_AUDIO_FFT_BINS 257 /* n_fft 512 / 2 + 1 */
#define G4_AUDIO_AUDIO_SEQ_LENGTH 750 /* processor cap on soft tokens */
#define G4_UNIFIED_AUDIO_FRAME 640    /* samples per unified-model audio token */

/* Number of feature frames (valid or not) for n samples. */
int g4_audio_feature_frames(size_t n_samples);

/* Log-mel features of n 16 kHz samples: *features [*n_frames, 128] and
 * *mask [*n_frames] (1 = valid), both malloc'd (NULL when there are no
 * frames). n above G4_AUDIO_MODEL_MAX_SAMPLES is refused (G4_ERR_LIMIT):
 * cut with g4_audio_prepare, which tells the caller it did. */
g4_status g4_audio_log_mel(const float *samples, size_t n, float **features, uint8_t **mask, int *n_frames);

/* Audio soft tokens the E2B/E4B tower produces for n samples (= the
 * processor's <|audio|> placeholder count): T = (n + 160 - 321) // 160 + 1
 * valid frames (0 if T <= 0), halved twice by the stride-2 convolutions
 * (T = (T + 2 - 3) // 2 + 1), capped at 750. */
int g4_audio_soft_token_count(size_t n_samples);

/* The unified (12B) model's audio input: *frames [*n_frames, 640] holding the
 * samples zero-padded to a multiple of 640; every frame is a token. */
g4_status g4_unified_audio_frames(const float *samples, size_t n, float **frames, int *n_frames);
/* ceil(n / 640): transformers applies no cap here (audio_seq_length is not
 * enforced for the unified processor); g4_audio_prepare's 30 s cap bounds it
 * at 750. */
int g4_unified_audio_token_count(size_t n_samples);

/* The HTK mel filter bank, dense [257][128] float64 as transformers'
 * mel_filter_bank returns it (for tests). */
void g4_audio_mel_filter_bank(double *filters);
/* The float32 periodic Hann window of 320 samples (for tests). */
void g4_audio_hann_window(float *window);

#endif
