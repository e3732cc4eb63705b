/* Format detection, the shared source checks, the downmix, and the dispatch
 * to the in-tree WAV reader or libsndfile. */
#include "media/audio_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

void g4_audio_free(g4_audio *a) {
    if (!a) return;
    free(a->samples);
    memset(a, 0, sizeof *a);
}

static int starts_with(const unsigned char *d, size_t n, size_t at, const char *tag) {
    size_t k = strlen(tag);
    return n >= at + k && memcmp(d + at, tag, k) == 0;
}

/* An MPEG audio frame header: 11 sync bits, then version, layer, bitrate and
 * rate fields that are not the reserved values (this excludes AAC ADTS,
 * whose layer bits are 0). */
static int is_mpeg_frame_header(const unsigned char *d, size_t n) {
    if (n < 4 || d[0] != 0xFF || (d[1] & 0xE0) != 0xE0) return 0;
    int version = (d[1] >> 3) & 3, layer = (d[1] >> 1) & 3;
    int bitrate = d[2] >> 4, rate = (d[2] >> 2) & 3;
    return version != 1 && layer != 0 && bitrate != 15 && rate != 3;
}

g4_audio_format g4_audio_detect_format(const void *data, size_t size) {
    const unsigned char *d = data;
    if (!d) return G4_AUDIO_FORMAT_UNKNOWN;
    if ((starts_with(d, size, 0, "RIFF") || starts_with(d, size, 0, "RIFX")) && starts_with(d, size, 8, "WAVE"))
        return G4_AUDIO_FORMAT_WAV;
    if ((starts_with(d, size, 0, "RF64") || starts_with(d, size, 0, "BW64")) && starts_with(d, size, 8, "WAVE"))
        return G4_AUDIO_FORMAT_RF64;
    if (starts_with(d, size, 0, "fLaC")) return G4_AUDIO_FORMAT_FLAC;
    if (starts_with(d, size, 0, "OggS")) return G4_AUDIO_FORMAT_OGG;
    if (starts_with(d, size, 0, "FORM") && (starts_with(d, size, 8, "AIFF") || starts_with(d, size, 8, "AIFC")))
        return G4_AUDIO_FORMAT_AIFF;
    if (starts_with(d, size, 0, "ID3") || is_mpeg_frame_header(d, size)) return G4_AUDIO_FORMAT_MP3;
    return G4_AUDIO_FORMAT_UNKNOWN;
}

const char *g4_audio_format_name(g4_audio_format f) {
    switch (f) {
    case G4_AUDIO_FORMAT_WAV: return "WAV";
    case G4_AUDIO_FORMAT_RF64: return "RF64";
    case G4_AUDIO_FORMAT_FLAC: return "FLAC";
    case G4_AUDIO_FORMAT_OGG: return "Ogg";
    case G4_AUDIO_FORMAT_MP3: return "MP3";
    case G4_AUDIO_FORMAT_AIFF: return "AIFF";
    default: return "unknown";
    }
}

g4_status g4_audio_check_source(const char *name, int channels, int rate, double frames,
                                double max_seconds, size_t *keep_frames) {
    if (channels <= 0) return g4_fail(G4_ERR_FORMAT, "%s: the audio has %d channels", name, channels);
    if (channels > G4_AUDIO_MAX_CHANNELS)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: %d channels (at most %d are supported)", name, channels,
                       G4_AUDIO_MAX_CHANNELS);
    if (rate < G4_AUDIO_MIN_RATE || rate > G4_AUDIO_MAX_RATE)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: sample rate %d Hz is outside [%d, %d]", name, rate,
                       G4_AUDIO_MIN_RATE, G4_AUDIO_MAX_RATE);
    if (frames >= 0 && frames / rate > G4_AUDIO_MAX_SOURCE_SECONDS)
        return g4_fail(G4_ERR_LIMIT, "%s: %.0f s of audio is longer than the %.0f s accepted", name,
                       frames / rate, G4_AUDIO_MAX_SOURCE_SECONDS);
    double cap_seconds = max_seconds > 0 && max_seconds < G4_AUDIO_MAX_SOURCE_SECONDS ? max_seconds
                                                                                       : G4_AUDIO_MAX_SOURCE_SECONDS;
    double cap = ceil(cap_seconds * rate);
    *keep_frames = (size_t)(frames >= 0 && frames < cap ? frames : cap);
    return G4_OK;
}

void g4_audio_downmix(const float *in, size_t frames, int channels, float *out) {
    if (channels == 1) {
        if (out != in) memmove(out, in, frames * sizeof *out);
        return;
    }
    /* Sequential float sum then one division: numpy's float32 mean over the
     * channel axis rounds the same way for fewer than 8 channels. */
    const float count = (float)channels;
    for (size_t i = 0; i < frames; i++) {
        const float *frame = in + i * (size_t)channels;
        float sum = frame[0];
        for (int c = 1; c < channels; c++) sum += frame[c];
        out[i] = sum / count;
    }
}

g4_status g4_audio_append_mono(float **mono, size_t *n, size_t *cap, size_t keep, const float *in, size_t frames,
                               int channels, const char *name) {
    if (*n + frames > *cap) {
        size_t grown = *cap * 2 < keep ? *cap * 2 : keep;
        if (grown < *n + frames) grown = *n + frames;
        float *p = realloc(*mono, grown * sizeof *p);
        if (!p) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu samples", name, grown);
        *mono = p;
        *cap = grown;
    }
    g4_audio_downmix(in, frames, channels, *mono + *n);
    *n += frames;
    return G4_OK;
}

/* A NaN or infinity would poison every feature downstream. */
static g4_status check_finite(const g4_audio *a, const char *name) {
    for (size_t i = 0; i < a->n_samples; i++)
        if (!isfinite(a->samples[i]))
            return g4_fail(G4_ERR_FORMAT, "%s: sample %zu is not a finite number", name, i);
    return G4_OK;
}

g4_status g4_audio_decode_memory(const void *data, size_t size, const char *name, double max_seconds,
                                 g4_audio *out) {
    memset(out, 0, sizeof *out);
    if (!name) name = "audio";
    if (!data || size == 0) return g4_fail(G4_ERR_FORMAT, "%s: empty audio data", name);
    const unsigned char *bytes = data;
    g4_audio_format format = g4_audio_detect_format(bytes, size);
    g4_status st;
    switch (format) {
    case G4_AUDIO_FORMAT_WAV: {
        int needs_sndfile = 0;
        st = g4_wav_decode(bytes, size, name, max_seconds, out, &needs_sndfile);
        if (st == G4_ERR_UNSUPPORTED && needs_sndfile) st = g4_sndfile_decode(bytes, size, name, max_seconds, out);
        break;
    }
    case G4_AUDIO_FORMAT_MP3:
        st = g4_mp3_decode(bytes, size, name, max_seconds, out);
        break;
    case G4_AUDIO_FORMAT_UNKNOWN:
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "%s: not a recognised audio file (expected WAV, FLAC, Ogg Vorbis/Opus, MP3, AIFF or RF64)",
                       name);
    default:
        st = g4_sndfile_decode(bytes, size, name, max_seconds, out);
        break;
    }
    if (st == G4_OK && out->n_samples == 0) st = g4_fail(G4_ERR_FORMAT, "%s: the audio holds no samples", name);
    if (st == G4_OK) st = check_finite(out, name);
    if (st != G4_OK) g4_audio_free(out);
    return st;
}

g4_status g4_audio_decode_file(const char *path, double max_seconds, g4_audio *out) {
    memset(out, 0, sizeof *out);
    g4_mapped_file f;
    g4_status st = g4_map_file(path, &f);
    if (st != G4_OK) return st;
    st = g4_audio_decode_memory(f.data, f.size, path, max_seconds, out);
    g4_unmap_file(&f);
    return st;
}
