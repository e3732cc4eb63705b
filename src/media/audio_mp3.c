/* MP3 through libmpg123 directly. libsndfile decodes MP3 with the same
 * library and the same settings (float output, gapless, no automatic
 * resampling, no "Frankenstein" stream joining), but it cannot pass
 * MPG123_QUIET, so every odd upload would print mpg123's warnings to
 * stderr; a library must not. Samples equal libsndfile's (and so soundfile's
 * and librosa's) for the same mpg123 version. */
#include <mpg123.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "media/audio_decode.h"

typedef struct {
    const unsigned char *data;
    off_t size, pos;
} mp3_reader;

static mpg123_ssize_t mp3_read(void *user, void *buf, size_t count) {
    mp3_reader *r = user;
    if (r->pos >= r->size) return 0;
    size_t n = (size_t)(r->size - r->pos) < count ? (size_t)(r->size - r->pos) : count;
    memcpy(buf, r->data + r->pos, n);
    r->pos += (off_t)n;
    return (mpg123_ssize_t)n;
}

static off_t mp3_seek(void *user, off_t offset, int whence) {
    mp3_reader *r = user;
    off_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? r->pos : r->size;
    if (offset < -base || (offset > 0 && offset > INT64_MAX - base)) return -1;
    r->pos = base + offset;
    return r->pos;
}

g4_status g4_mp3_decode(const unsigned char *data, size_t size, const char *name, double max_seconds,
                        g4_audio *out) {
    memset(out, 0, sizeof *out);
    int err = mpg123_init(); /* a no-op since mpg123 1.27 */
    mpg123_handle *mh = err == MPG123_OK ? mpg123_new(NULL, &err) : NULL;
    if (!mh) return g4_fail(G4_ERR_INTERNAL, "%s: cannot start the MP3 decoder: %s", name, mpg123_plain_strerror(err));
    mp3_reader reader = {data, (off_t)size, 0};
    float *frame_buf = NULL, *mono = NULL;
    g4_status st = G4_OK;
    long rate = 0;
    int channels = 0, encoding = 0;
    mpg123_param(mh, MPG123_ADD_FLAGS, MPG123_QUIET | MPG123_FORCE_FLOAT | MPG123_NO_FRANKENSTEIN, 0.0);
    mpg123_param(mh, MPG123_REMOVE_FLAGS, MPG123_AUTO_RESAMPLE, 0.0);
    if (mpg123_replace_reader_handle(mh, mp3_read, mp3_seek, NULL) != MPG123_OK ||
        mpg123_open_handle(mh, &reader) != MPG123_OK ||
        mpg123_getformat(mh, &rate, &channels, &encoding) != MPG123_OK) {
        st = g4_fail(G4_ERR_FORMAT, "%s: not a decodable MP3 stream: %s", name, mpg123_strerror(mh));
        goto done;
    }
    if (encoding != MPG123_ENC_FLOAT_32) {
        st = g4_fail(G4_ERR_INTERNAL, "%s: the MP3 decoder does not produce float samples", name);
        goto done;
    }
    /* Keep the first format: a stream that changes it midway is refused. */
    mpg123_format_none(mh);
    mpg123_format(mh, rate, channels, MPG123_ENC_FLOAT_32);
    off_t length = mpg123_length(mh); /* frames; < 0 when unknown */
    size_t keep;
    st = g4_audio_check_source(name, channels, (int)rate, length > 0 ? (double)length : -1.0, max_seconds, &keep);
    if (st != G4_OK) goto done;

    const size_t block = 4608; /* four MPEG-1 layer III frames */
    size_t cap = keep < 65536 ? keep : 65536, n = 0;
    frame_buf = malloc(block * (size_t)channels * sizeof *frame_buf);
    mono = malloc(cap * sizeof *mono);
    if (!frame_buf || !mono) {
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu samples", name, cap);
        goto done;
    }
    int more = 0;
    for (;;) {
        size_t want = keep - n < block ? keep - n : block, got_bytes = 0;
        int rc = mpg123_read(mh, frame_buf, (want ? want : 1) * (size_t)channels * sizeof(float), &got_bytes);
        size_t got = got_bytes / ((size_t)channels * sizeof(float));
        if (want == 0) {
            more = got > 0;
            break;
        }
        if (rc == MPG123_NEW_FORMAT) {
            st = g4_fail(G4_ERR_UNSUPPORTED, "%s: the MP3 stream changes its sample format midway", name);
            goto done;
        }
        if (rc != MPG123_OK && rc != MPG123_DONE) {
            st = g4_fail(G4_ERR_FORMAT, "%s: MP3 decoding failed after %zu samples: %s", name, n,
                         mpg123_strerror(mh));
            goto done;
        }
        st = g4_audio_append_mono(&mono, &n, &cap, keep, frame_buf, got, channels, name);
        if (st != G4_OK) goto done;
        if (rc == MPG123_DONE) break;
    }
    out->samples = mono;
    mono = NULL;
    out->n_samples = n;
    out->sample_rate = out->source_rate = (int)rate;
    out->source_channels = channels;
    out->truncated = more;
    out->source_seconds = length > 0 ? (double)length / rate : more ? -1.0 : (double)n / rate;
done:
    free(mono);
    free(frame_buf);
    mpg123_close(mh);
    mpg123_delete(mh);
    return st;
}
