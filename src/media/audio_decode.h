/* Decoding audio files to mono float samples at their own sample rate.
 *
 * The container is recognised from the bytes, never from a file name: WAV
 * (RIFF/RIFX: integer PCM 8/16/24/32-bit, IEEE float 32/64, also inside
 * WAVE_FORMAT_EXTENSIBLE) is parsed in-tree (audio_wav.c); MP3 goes to
 * libmpg123 (audio_mp3.c); FLAC, Ogg (Vorbis, Opus), AIFF, RF64 and the
 * telephony WAV codecs (mu-law, A-law, ADPCM, GSM) go through libsndfile
 * (audio_sndfile.c). Anything else is refused, so libsndfile's rarer parsers
 * are never exposed to uploads.
 *
 * Channels are averaged into mono: sum in float in channel order, then divide
 * by the channel count. That is what transformers' load_audio (soundfile
 * read as float32, then waveform.mean(axis=0)) and librosa.load(mono=True)
 * compute; Gemma 4's processor itself only takes mono float arrays. Integer
 * samples are scaled as libsndfile does (16-bit: v / 32768, 8-bit unsigned:
 * (v - 128) / 128, ...), so a WAV decodes bit-identically to soundfile. */
#ifndef G4_MEDIA_AUDIO_DECODE_H
#define G4_MEDIA_AUDIO_DECODE_H

#include <stddef.h>

#include "media/audio.h"

typedef enum {
    G4_AUDIO_FORMAT_UNKNOWN = 0,
    G4_AUDIO_FORMAT_WAV,  /* RIFF/RIFX WAVE */
    G4_AUDIO_FORMAT_RF64, /* RF64 / BW64 (64-bit WAV) */
    G4_AUDIO_FORMAT_FLAC,
    G4_AUDIO_FORMAT_OGG,  /* Ogg Vorbis or Opus */
    G4_AUDIO_FORMAT_MP3,
    G4_AUDIO_FORMAT_AIFF,
} g4_audio_format;

g4_audio_format g4_audio_detect_format(const void *data, size_t size);
const char *g4_audio_format_name(g4_audio_format f);

/* Decodes a whole file held in memory (e.g. a base64-decoded upload) into
 * mono. Keeps at most max_seconds of audio (<= 0: no cap beyond
 * G4_AUDIO_MAX_SOURCE_SECONDS) and sets out->truncated when the source was
 * longer. Sources declaring more than G4_AUDIO_MAX_SOURCE_SECONDS, rates
 * outside [G4_AUDIO_MIN_RATE, G4_AUDIO_MAX_RATE], zero or too many channels,
 * no samples and non-finite samples are errors. `name` labels messages. */
g4_status g4_audio_decode_memory(const void *data, size_t size, const char *name,
                                 double max_seconds, g4_audio *out);
g4_status g4_audio_decode_file(const char *path, double max_seconds, g4_audio *out);

/* ---- internal: the two decoders behind g4_audio_decode_memory ---- */

/* Frames to keep from a source of `frames` frames (may be < 0: unknown) at
 * `rate`, and the limit checks shared by both decoders. */
g4_status g4_audio_check_source(const char *name, int channels, int rate, double frames,
                                double max_seconds, size_t *keep_frames);

/* Parses and decodes an in-tree WAV. Returns G4_ERR_UNSUPPORTED with
 * *needs_sndfile = 1 for WAV codecs that libsndfile decodes instead. */
g4_status g4_wav_decode(const unsigned char *data, size_t size, const char *name,
                        double max_seconds, g4_audio *out, int *needs_sndfile);

/* MP3 through libmpg123 (audio_mp3.c). */
g4_status g4_mp3_decode(const unsigned char *data, size_t size, const char *name,
                        double max_seconds, g4_audio *out);

/* Decodes through libsndfile's virtual I/O (no temporary file). */
g4_status g4_sndfile_decode(const unsigned char *data, size_t size, const char *name,
                            double max_seconds, g4_audio *out);

/* Averages `channels` interleaved float channels of `frames` frames into
 * mono (in may equal out). */
void g4_audio_downmix(const float *in, size_t frames, int channels, float *out);

/* Appends `frames` interleaved frames to the mono samples mono[0..*n),
 * growing the buffer (capacity *cap) by doubling up to `keep` samples
 * (frames must fit in keep - *n). */
g4_status g4_audio_append_mono(float **mono, size_t *n, size_t *cap, size_t keep, const float *in, size_t frames,
                               int channels, const char *name);

#endif
