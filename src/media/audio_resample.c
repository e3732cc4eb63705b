/* libsoxr resampling and the cap to the model's 30 s. */
#include "media/audio_resample.h"

#include <math.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "media/audio_decode.h"

/* Input past the kept output that is still resampled so the filter sees the
 * same samples as when resampling the whole source. */
static const double FILTER_MARGIN_SECONDS = 1.0;

static g4_status copy_audio(const g4_audio *in, size_t n, g4_audio *out) {
    *out = *in;
    out->samples = malloc((n ? n : 1) * sizeof *out->samples);
    if (!out->samples) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for %zu samples", n);
    memcpy(out->samples, in->samples, n * sizeof *out->samples);
    out->n_samples = n;
    out->truncated = in->truncated || n < in->n_samples;
    return G4_OK;
}

/* Resamples the first n samples of in the way librosa.load(sr=...) does,
 * which is transformers 5.17's load_audio: python-soxr's resample() (an
 * output buffer of n * ratio + 1 samples, input fed in chunks of
 * max(1000, 48000 / ratio) samples, then a flush), and then librosa's
 * fix_length to ceil(n * ratio) samples (zero-padded or cut). */
static g4_status resample_prefix(const g4_audio *in, size_t n, int rate_out, g4_audio *out) {
    memset(out, 0, sizeof *out);
    const double rate_in = in->sample_rate;
    const size_t olen = (size_t)((double)n * rate_out / rate_in + 1.0);
    const size_t fixed = (size_t)ceil((double)n * ((double)rate_out / rate_in));
    double chunk_d = 48000.0 * rate_in / rate_out;
    const size_t chunk = (size_t)(chunk_d > 1000.0 ? chunk_d : 1000.0);
    float *y = malloc((olen > fixed ? olen : fixed) * sizeof *y);
    if (!y) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for %zu resampled samples", olen);

    soxr_error_t err = NULL;
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
    soxr_t soxr = soxr_create(rate_in, rate_out, 1, &err, &io, &quality, NULL);
    if (!soxr || err) {
        free(y);
        return g4_fail(G4_ERR_INTERNAL, "cannot create a %g -> %d Hz resampler: %s", rate_in, rate_out,
                       err ? err : "unknown error");
    }
    size_t pos = 0, done = 0;
    for (size_t i = 0; i < n && !err; i += chunk) {
        size_t len = n - i < chunk ? n - i : chunk;
        err = soxr_process(soxr, in->samples + i, len, NULL, y + pos, olen - pos, &done);
        pos += done;
    }
    if (!err) {
        err = soxr_process(soxr, NULL, 0, NULL, y + pos, olen - pos, &done); /* flush the filter */
        pos += done;
    }
    soxr_delete(soxr);
    if (err) {
        free(y);
        return g4_fail(G4_ERR_INTERNAL, "resampling %g -> %d Hz failed: %s", rate_in, rate_out, err);
    }
    for (; pos < fixed; pos++) y[pos] = 0.0f;
    *out = *in;
    out->samples = y;
    out->n_samples = fixed;
    out->sample_rate = rate_out;
    return G4_OK;
}

static g4_status check_rate(int rate) {
    if (rate < G4_AUDIO_MIN_RATE || rate > G4_AUDIO_MAX_RATE)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "sample rate %d Hz is outside [%d, %d]", rate, G4_AUDIO_MIN_RATE,
                       G4_AUDIO_MAX_RATE);
    return G4_OK;
}

g4_status g4_audio_resample(const g4_audio *in, int rate_out, g4_audio *out) {
    memset(out, 0, sizeof *out);
    g4_status st = check_rate(in->sample_rate);
    if (st == G4_OK) st = check_rate(rate_out);
    if (st != G4_OK) return st;
    if (in->sample_rate == rate_out) return copy_audio(in, in->n_samples, out);
    return resample_prefix(in, in->n_samples, rate_out, out);
}

g4_status g4_audio_prepare(const g4_audio *in, size_t max_samples, g4_audio *out) {
    memset(out, 0, sizeof *out);
    if (max_samples == 0) max_samples = G4_AUDIO_MODEL_MAX_SAMPLES;
    g4_status st = check_rate(in->sample_rate);
    if (st != G4_OK) return st;
    const int rate_out = G4_AUDIO_MODEL_RATE;
    if (in->sample_rate == rate_out)
        return copy_audio(in, in->n_samples < max_samples ? in->n_samples : max_samples, out);

    double needed = ceil(((double)max_samples / rate_out + FILTER_MARGIN_SECONDS) * in->sample_rate);
    size_t n_in = (double)in->n_samples < needed ? in->n_samples : (size_t)needed;
    st = resample_prefix(in, n_in, rate_out, out);
    if (st != G4_OK) return st;
    if (out->n_samples > max_samples) {
        out->n_samples = max_samples;
        out->truncated = 1;
    }
    if (n_in < in->n_samples) out->truncated = 1;
    return G4_OK;
}

/* Decoding keeps the 30 s plus the filter margin; prepare cuts the rest. */
static double decode_seconds(void) {
    return (double)G4_AUDIO_MODEL_MAX_SAMPLES / G4_AUDIO_MODEL_RATE + FILTER_MARGIN_SECONDS;
}

g4_status g4_audio_load_memory(const void *data, size_t size, const char *name, g4_audio *out) {
    memset(out, 0, sizeof *out);
    g4_audio decoded;
    g4_status st = g4_audio_decode_memory(data, size, name, decode_seconds(), &decoded);
    if (st != G4_OK) return st;
    st = g4_audio_prepare(&decoded, 0, out);
    g4_audio_free(&decoded);
    return st;
}

g4_status g4_audio_load_file(const char *path, g4_audio *out) {
    memset(out, 0, sizeof *out);
    g4_mapped_file f;
    g4_status st = g4_map_file(path, &f);
    if (st != G4_OK) return st;
    st = g4_audio_load_memory(f.data, f.size, path, out);
    g4_unmap_file(&f);
    return st;
}
