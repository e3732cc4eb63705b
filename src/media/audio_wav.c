/* The in-tree WAV reader: RIFF (little-endian) and RIFX (big-endian) WAVE
 * files holding integer PCM (8-bit unsigned, 16/24/32-bit signed) or IEEE
 * float (32/64-bit), plain or as WAVE_FORMAT_EXTENSIBLE, any channel count.
 *
 * Real files are often slightly wrong, so the reader is lenient where the
 * intent is clear and strict where it is not: the RIFF size, byte rate and
 * block align are ignored (they are redundant and often stale); a data chunk
 * claiming more bytes than the file holds is cut to what is there (streamed
 * or truncated recordings); a missing pad byte after an odd-sized chunk is
 * tolerated. A missing or short fmt chunk, a missing data chunk, zero
 * channels, absurd rates and unknown codecs are errors. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "media/audio_decode.h"

enum {
    WAVE_FORMAT_PCM = 0x0001,
    WAVE_FORMAT_IEEE_FLOAT = 0x0003,
    WAVE_FORMAT_EXTENSIBLE = 0xFFFE,
};

typedef struct {
    int big_endian;
    unsigned codec; /* WAVE_FORMAT_* code, resolved through EXTENSIBLE */
    unsigned channels;
    uint32_t rate;
    unsigned bits;  /* container bits per sample */
    const unsigned char *data;
    size_t data_bytes;
    int have_fmt, have_data;
} wav_layout;

static uint32_t read_u16(const unsigned char *p, int big_endian) {
    return big_endian ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0];
}

static uint32_t read_u32(const unsigned char *p, int big_endian) {
    return big_endian ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
                      : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* Chunk ids are four printable ASCII characters. */
static int looks_like_chunk_id(const unsigned char *p) {
    for (int i = 0; i < 4; i++)
        if (p[i] < 0x20 || p[i] > 0x7E) return 0;
    return 1;
}

/* Codecs libsndfile decodes that we leave to it: MS ADPCM, A-law, mu-law,
 * IMA ADPCM, GSM 6.10 (common in telephony recordings). */
static int is_sndfile_codec(unsigned codec) {
    return codec == 0x0002 || codec == 0x0006 || codec == 0x0007 || codec == 0x0011 || codec == 0x0031;
}

static g4_status parse_fmt(const unsigned char *p, uint32_t size, const char *name, wav_layout *w) {
    const int be = w->big_endian;
    if (size < 16) return g4_fail(G4_ERR_FORMAT, "%s: the WAV fmt chunk is %u bytes (at least 16 needed)", name, size);
    w->codec = read_u16(p, be);
    w->channels = read_u16(p + 2, be);
    w->rate = read_u32(p + 4, be);
    w->bits = read_u16(p + 14, be);
    if (w->codec == WAVE_FORMAT_EXTENSIBLE) {
        /* The sub-format GUID is {code}-0000-0010-8000-00AA00389B71. */
        static const unsigned char guid_tail[8] = {0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};
        if (size < 40)
            return g4_fail(G4_ERR_FORMAT, "%s: the WAVE_FORMAT_EXTENSIBLE fmt chunk is %u bytes (40 needed)", name,
                           size);
        uint32_t code = read_u32(p + 24, be);
        if (code > 0xFFFF || read_u16(p + 28, be) != 0 || read_u16(p + 30, be) != 0x0010 ||
            memcmp(p + 32, guid_tail, 8) != 0)
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: WAVE_FORMAT_EXTENSIBLE with a non-standard sub-format GUID",
                           name);
        w->codec = code;
    }
    w->have_fmt = 1;
    return G4_OK;
}

/* Walks the chunk list for the first fmt and data chunks, in either order. */
static g4_status parse_chunks(const unsigned char *d, size_t size, const char *name, wav_layout *w) {
    memset(w, 0, sizeof *w);
    if (size < 12) return g4_fail(G4_ERR_FORMAT, "%s: %zu bytes is too short for a WAV header", name, size);
    w->big_endian = memcmp(d, "RIFX", 4) == 0;
    size_t pos = 12;
    while (pos + 8 <= size && !(w->have_fmt && w->have_data)) {
        const unsigned char *id = d + pos;
        uint32_t chunk = read_u32(d + pos + 4, w->big_endian);
        size_t body = pos + 8, avail = size - body;
        if (!memcmp(id, "fmt ", 4) && !w->have_fmt) {
            if (chunk > avail)
                return g4_fail(G4_ERR_FORMAT, "%s: the WAV fmt chunk (%u bytes) runs past the end of the file",
                               name, chunk);
            g4_status st = parse_fmt(d + body, chunk, name, w);
            if (st != G4_OK) return st;
        } else if (!memcmp(id, "data", 4) && !w->have_data) {
            w->data = d + body;
            w->data_bytes = chunk < avail ? chunk : avail;
            w->have_data = 1;
        }
        if (chunk >= avail) break; /* this chunk reaches the end of the file */
        size_t next = body + chunk;
        /* Odd chunks are followed by a pad byte, which some writers forget. */
        if ((chunk & 1) && !(next + 5 <= size && looks_like_chunk_id(d + next + 1)) && next + 4 <= size &&
            looks_like_chunk_id(d + next))
            pos = next;
        else
            pos = next + (chunk & 1);
    }
    if (!w->have_fmt) return g4_fail(G4_ERR_FORMAT, "%s: the WAV file has no fmt chunk", name);
    if (!w->have_data) return g4_fail(G4_ERR_FORMAT, "%s: the WAV file has no data chunk", name);
    return G4_OK;
}

/* One sample as a float, scaled exactly as libsndfile scales it. */
static float decode_sample(const unsigned char *p, unsigned bytes, int is_float, int be) {
    if (is_float) {
        if (bytes == 4) {
            uint32_t u = read_u32(p, be);
            float f;
            memcpy(&f, &u, 4);
            return f;
        }
        uint64_t hi = read_u32(p + (be ? 0 : 4), be), lo = read_u32(p + (be ? 4 : 0), be);
        uint64_t u = hi << 32 | lo;
        double f;
        memcpy(&f, &u, 8);
        return (float)f;
    }
    switch (bytes) {
    case 1: return (float)((int)p[0] - 128) * (1.0f / 128.0f); /* 8-bit WAV is unsigned */
    case 2: return (float)(int16_t)read_u16(p, be) * (1.0f / 32768.0f);
    case 3: {
        uint32_t u = be ? (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]
                        : (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
        int32_t v = (int32_t)(u << 8) >> 8;
        return (float)v * (1.0f / 8388608.0f);
    }
    default: return (float)(int32_t)read_u32(p, be) * (1.0f / 2147483648.0f);
    }
}

g4_status g4_wav_decode(const unsigned char *data, size_t size, const char *name, double max_seconds,
                        g4_audio *out, int *needs_sndfile) {
    memset(out, 0, sizeof *out);
    *needs_sndfile = 0;
    wav_layout w;
    g4_status st = parse_chunks(data, size, name, &w);
    if (st != G4_OK) return st;

    int is_float = 0;
    if (w.codec == WAVE_FORMAT_PCM) {
        if (w.bits < 1 || w.bits > 32)
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: integer PCM with %u bits per sample", name, w.bits);
    } else if (w.codec == WAVE_FORMAT_IEEE_FLOAT) {
        if (w.bits != 32 && w.bits != 64)
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: IEEE float with %u bits per sample", name, w.bits);
        is_float = 1;
    } else {
        *needs_sndfile = is_sndfile_codec(w.codec);
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: WAV codec 0x%04x is not supported", name, w.codec);
    }
    if (w.rate > (uint32_t)G4_AUDIO_MAX_RATE)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: sample rate %u Hz is outside [%d, %d]", name, w.rate,
                       G4_AUDIO_MIN_RATE, G4_AUDIO_MAX_RATE);
    const int channels = (int)w.channels, rate = (int)w.rate;
    const unsigned bytes = (w.bits + 7) / 8;
    const size_t frame_bytes = (size_t)bytes * (w.channels ? w.channels : 1);
    const size_t frames = w.data_bytes / frame_bytes; /* a partial last frame is dropped */
    size_t keep;
    st = g4_audio_check_source(name, channels, rate, (double)frames, max_seconds, &keep);
    if (st != G4_OK) return st;
    if (frames == 0) return g4_fail(G4_ERR_FORMAT, "%s: the WAV data chunk holds no complete sample frame", name);

    /* Decode in blocks: interleaved floats, then the shared downmix. */
    const size_t block = channels == 1 ? keep : (size_t)(65536 / channels) + 1;
    float *mono = malloc(keep * sizeof *mono);
    float *frame_buf = channels == 1 ? mono : malloc(block * (size_t)channels * sizeof *frame_buf);
    if (!mono || !frame_buf) {
        free(mono);
        if (frame_buf != mono) free(frame_buf);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu samples", name, keep);
    }
    for (size_t start = 0; start < keep; start += block) {
        size_t n = keep - start < block ? keep - start : block;
        const unsigned char *p = w.data + start * frame_bytes;
        float *dst = channels == 1 ? mono + start : frame_buf;
        for (size_t i = 0; i < n * (size_t)channels; i++) dst[i] = decode_sample(p + i * bytes, bytes, is_float, w.big_endian);
        if (channels > 1) g4_audio_downmix(frame_buf, n, channels, mono + start);
    }
    if (frame_buf != mono) free(frame_buf);

    out->samples = mono;
    out->n_samples = keep;
    out->sample_rate = out->source_rate = rate;
    out->source_channels = channels;
    out->source_seconds = (double)frames / rate;
    out->truncated = keep < frames;
    return G4_OK;
}
