/* Compressed and less common containers through libsndfile, reading straight
 * from memory with its virtual I/O interface (uploads arrive as bytes; no
 * temporary files). libsndfile returns floats scaled to [-1, 1] like the
 * soundfile module that transformers' load_audio uses. */
#include <sndfile.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media/audio_decode.h"

typedef struct {
    const unsigned char *data;
    sf_count_t size, pos;
} memory_reader;

static sf_count_t mem_length(void *user) { return ((memory_reader *)user)->size; }

static sf_count_t mem_seek(sf_count_t offset, int whence, void *user) {
    memory_reader *m = user;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->size;
    if (offset < -base || (offset > 0 && offset > INT64_MAX - base)) return -1;
    m->pos = base + offset;
    return m->pos;
}

static sf_count_t mem_read(void *ptr, sf_count_t count, void *user) {
    memory_reader *m = user;
    if (count <= 0 || m->pos >= m->size) return 0;
    sf_count_t n = m->size - m->pos < count ? m->size - m->pos : count;
    memcpy(ptr, m->data + m->pos, (size_t)n);
    m->pos += n;
    return n;
}

static sf_count_t mem_write(const void *ptr, sf_count_t count, void *user) { return 0; }

static sf_count_t mem_tell(void *user) { return ((memory_reader *)user)->pos; }

g4_status g4_sndfile_decode(const unsigned char *data, size_t size, const char *name, double max_seconds,
                            g4_audio *out) {
    memset(out, 0, sizeof *out);
    memory_reader reader = {data, (sf_count_t)size, 0};
    SF_VIRTUAL_IO io = {mem_length, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *snd = sf_open_virtual(&io, SFM_READ, &info, &reader);
    if (!snd) return g4_fail(G4_ERR_FORMAT, "%s: cannot decode: %s", name, sf_strerror(NULL));

    /* Some streams (MP3) do not know their length up front. */
    int known = info.frames > 0 && info.frames != SF_COUNT_MAX;
    size_t keep;
    g4_status st = g4_audio_check_source(name, info.channels, info.samplerate, known ? (double)info.frames : -1.0,
                                         max_seconds, &keep);
    if (st != G4_OK) {
        sf_close(snd);
        return st;
    }
    const int channels = info.channels;
    const size_t block = 4096;
    float *frame_buf = malloc(block * (size_t)channels * sizeof *frame_buf);
    /* Grow as samples arrive rather than trusting a declared length. */
    size_t cap = keep < 65536 ? keep : 65536, n = 0;
    float *mono = malloc(cap * sizeof *mono);
    if (!frame_buf || !mono) {
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu samples", name, cap);
        goto done;
    }
    int more = 0; /* the source has samples past what we kept */
    for (;;) {
        size_t want = keep - n < block ? keep - n : block;
        if (want == 0) {
            float probe[G4_AUDIO_MAX_CHANNELS];
            more = sf_readf_float(snd, probe, 1) > 0;
            break;
        }
        sf_count_t got = sf_readf_float(snd, frame_buf, (sf_count_t)want);
        if (got <= 0) break;
        st = g4_audio_append_mono(&mono, &n, &cap, keep, frame_buf, (size_t)got, channels, name);
        if (st != G4_OK) goto done;
    }
    if (sf_error(snd) != SF_ERR_NO_ERROR) {
        st = g4_fail(G4_ERR_FORMAT, "%s: decoding failed after %zu samples: %s", name, n, sf_strerror(snd));
        goto done;
    }
    out->samples = mono;
    mono = NULL;
    out->n_samples = n;
    out->sample_rate = out->source_rate = info.samplerate;
    out->source_channels = channels;
    out->truncated = more || (known && (sf_count_t)n < info.frames && n == keep);
    out->source_seconds = known ? (double)info.frames / info.samplerate : more ? -1.0 : (double)n / info.samplerate;
done:
    free(mono);
    free(frame_buf);
    sf_close(snd);
    return st;
}
