/* Decoding: every WAV variant and compressed format against soundfile's
 * decode of the same file (tests/tools/make_audio_refs.py), lossy codecs
 * against the original signal, format detection, and malformed input. */
#include <string.h>

#include "audio_test_util.h"
#include "base/file.h"
#include "media/audio_decode.h"

typedef struct {
    const char *name;
    g4_audio_format format;
    double tolerance; /* max |ours - soundfile's|: 0 = bit-identical */
    double min_snr_db; /* vs the original signal, for lossy codecs (0: exact codec) */
} media_case;

/* Lossy decoders may differ slightly between libsndfile builds (Debian's
 * system libvorbis/opus/mpg123 vs the soundfile wheel's). */
static const media_case CASES[] = {
    {"u8_mono_8k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"s16_stereo_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"s24_3ch_22k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"s32_mono_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"f32_stereo_44k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"f64_mono_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"ext_s16_4ch_48k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"ext_f32_6ch_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"rifx_s16_stereo_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"rifx_f32_mono_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"ulaw_mono_8k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"imaadpcm_mono_16k.wav", G4_AUDIO_FORMAT_WAV, 0, 0},
    {"rf64_s16_stereo_16k.wav", G4_AUDIO_FORMAT_RF64, 0, 0},
    {"aiff_s16_mono_16k.aiff", G4_AUDIO_FORMAT_AIFF, 0, 0},
    {"flac_mono_16k.flac", G4_AUDIO_FORMAT_FLAC, 0, 0},
    {"vorbis_stereo_16k.ogg", G4_AUDIO_FORMAT_OGG, 1e-5, 10},
    {"opus_mono_16k.opus", G4_AUDIO_FORMAT_OGG, 1e-5, 10},
    {"mp3_mono_16k.mp3", G4_AUDIO_FORMAT_MP3, 1e-5, 10},
};

static double snr_db(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return 10 * log10(den / (num + 1e-30));
}

/* The original of a lossy file: channel c is synth seeded at 1000 c. */
static float *original_mono(size_t n, int rate, int channels) {
    int16_t *ch = malloc(n * sizeof *ch);
    float *out = calloc(n, sizeof *out);
    for (int c = 0; c < channels; c++) {
        audio_synth_int(ch, n, rate, 1000 * (uint64_t)c);
        for (size_t i = 0; i < n; i++) out[i] += (float)ch[i] / 32768.0f;
    }
    for (size_t i = 0; i < n; i++) out[i] /= (float)channels;
    free(ch);
    return out;
}

static void test_media_files(const g4_st_set *refs) {
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        const media_case *mc = &CASES[c];
        const char *path = audio_data_path(mc->name);
        char key[128];
        snprintf(key, sizeof key, "file.%s.mono", mc->name);
        const g4_st_tensor *mono = audio_ref(refs, key, G4_DTYPE_F32);
        snprintf(key, sizeof key, "file.%s.info", mc->name);
        const g4_st_tensor *info = audio_ref(refs, key, G4_DTYPE_I64);
        if (!mono || !info) continue;
        const int64_t *ri = (const int64_t *)info->data;

        g4_audio a, b;
        g4_status st = g4_audio_decode_file(path, 0, &a);
        CHECK(st == G4_OK, "%s: %s", mc->name, g4_error_message());
        if (st != G4_OK) continue;
        size_t n = (size_t)mono->shape[0];
        CHECK(a.n_samples == n && a.sample_rate == ri[0] && a.source_channels == ri[1] && !a.truncated,
              "%s: %zu samples at %d Hz, %d channels; soundfile: %zu at %lld Hz, %lld channels", mc->name,
              a.n_samples, a.sample_rate, a.source_channels, n, (long long)ri[0], (long long)ri[1]);
        if (a.n_samples == n) {
            double diff = test_max_abs_diff(a.samples, (const float *)mono->data, n);
            if (mc->tolerance == 0)
                CHECK(memcmp(a.samples, mono->data, n * sizeof(float)) == 0,
                      "%s: not bit-identical to soundfile + mean (max |diff| %.3g)", mc->name, diff);
            else
                CHECK(diff <= mc->tolerance, "%s: max |diff| %.3g from soundfile", mc->name, diff);
            if (mc->min_snr_db > 0) {
                float *orig = original_mono(n, a.sample_rate, a.source_channels);
                double snr = snr_db(a.samples, orig, n);
                CHECK(snr >= mc->min_snr_db, "%s: SNR %.1f dB vs the original", mc->name, snr);
                printf("  %-24s max |diff| vs soundfile %.2e, SNR vs original %.1f dB\n", mc->name, diff, snr);
                free(orig);
            }
        }
        /* From memory (what the server does with an upload) = from the path. */
        char *bytes;
        size_t len;
        CHECK(g4_read_file(path, 1 << 24, &bytes, &len) == G4_OK, "%s", g4_error_message());
        CHECK(g4_audio_detect_format(bytes, len) == mc->format, "%s detected as %s", mc->name,
              g4_audio_format_name(g4_audio_detect_format(bytes, len)));
        CHECK(g4_audio_decode_memory(bytes, len, mc->name, 0, &b) == G4_OK && b.n_samples == a.n_samples &&
                  memcmp(a.samples, b.samples, a.n_samples * sizeof(float)) == 0,
              "%s: decoding from memory differs from the file", mc->name);
        /* Keeping only the start says so. */
        g4_audio_free(&b);
        double seconds = (double)a.n_samples / a.sample_rate;
        CHECK(g4_audio_decode_memory(bytes, len, mc->name, seconds / 2, &b) == G4_OK && b.truncated &&
                  b.n_samples == (size_t)ceil(seconds / 2 * a.sample_rate) &&
                  memcmp(a.samples, b.samples, b.n_samples * sizeof(float)) == 0,
              "%s: keeping the first half gave %zu samples, truncated %d", mc->name, b.n_samples, b.truncated);
        CHECK(fabs(b.source_seconds - seconds) < 1e-9, "%s: source length %.6f s, expected %.6f s", mc->name,
              b.source_seconds, seconds);
        g4_audio_free(&b);
        g4_audio_free(&a);
        free(bytes);
    }
}

/* ---- hand-made WAV files ---- */

typedef struct {
    unsigned char b[4096];
    size_t n;
} bytes_buf;

static void put_bytes(bytes_buf *w, const void *p, size_t n) {
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u16(bytes_buf *w, unsigned v) {
    unsigned char b[2] = {v & 255, v >> 8};
    put_bytes(w, b, 2);
}
static void put_u32(bytes_buf *w, uint32_t v) {
    unsigned char b[4] = {v & 255, v >> 8 & 255, v >> 16 & 255, v >> 24};
    put_bytes(w, b, 4);
}

typedef struct {
    unsigned codec, channels, bits;
    uint32_t rate;
    uint32_t fmt_size;  /* 0: 16 */
    uint32_t data_size; /* the size written in the data header; UINT32_MAX-1: the real size */
    size_t samples;     /* int16 samples of data actually written */
} wav_spec;

#define REAL_SIZE 0xFFFFFFFEu

static const int16_t PCM[8] = {0, 1000, -1000, 32767, -32768, 12345, -2, 7};

static void put_fmt(bytes_buf *w, const wav_spec *s) {
    uint32_t size = s->fmt_size ? s->fmt_size : 16;
    put_bytes(w, "fmt ", 4);
    put_u32(w, size);
    put_u16(w, s->codec);
    put_u16(w, s->channels);
    put_u32(w, s->rate);
    put_u32(w, s->rate * s->channels * s->bits / 8);
    put_u16(w, s->channels * s->bits / 8);
    put_u16(w, s->bits);
    for (uint32_t i = 16; i < size && i < 64; i++) put_bytes(w, "", 1);
}

static void put_data(bytes_buf *w, const wav_spec *s) {
    put_bytes(w, "data", 4);
    put_u32(w, s->data_size == REAL_SIZE ? (uint32_t)(s->samples * 2) : s->data_size);
    for (size_t i = 0; i < s->samples; i++) put_u16(w, (uint16_t)PCM[i % 8]);
}

static void make_wav(bytes_buf *w, const wav_spec *s) {
    w->n = 0;
    put_bytes(w, "RIFF", 4);
    put_u32(w, 0); /* patched below; readers must not rely on it anyway */
    put_bytes(w, "WAVE", 4);
    put_fmt(w, s);
    put_data(w, s);
    uint32_t riff = (uint32_t)w->n - 8;
    memcpy(w->b + 4, (unsigned char[4]){riff & 255, riff >> 8 & 255, riff >> 16 & 255, riff >> 24}, 4);
}

static const wav_spec GOOD = {1, 1, 16, 16000, 0, REAL_SIZE, 8};

/* Expect an error whose message mentions `words`. */
static void expect_error(const void *data, size_t n, g4_status code, const char *words, const char *what) {
    g4_audio a;
    g4_status st = g4_audio_decode_memory(data, n, "upload", 0, &a);
    CHECK(st == code && strstr(g4_error_message(), words), "%s: got %s \"%s\", expected %s mentioning \"%s\"", what,
          g4_status_name(st), g4_error_message(), g4_status_name(code), words);
    CHECK(a.samples == NULL && a.n_samples == 0, "%s: output not cleared", what);
}

static void expect_pcm(const bytes_buf *w, size_t count, const char *what) {
    g4_audio a;
    g4_status st = g4_audio_decode_memory(w->b, w->n, "upload", 0, &a);
    CHECK(st == G4_OK, "%s: %s", what, g4_error_message());
    if (st != G4_OK) return;
    int ok = a.n_samples == count;
    for (size_t i = 0; ok && i < count; i++) ok = a.samples[i] == (float)PCM[i % 8] / 32768.0f;
    CHECK(ok, "%s: decoded %zu samples, expected %zu of the test pattern", what, a.n_samples, count);
    g4_audio_free(&a);
}

static void test_malformed_wav(void) {
    bytes_buf w;
    wav_spec s = GOOD;
    make_wav(&w, &s);
    expect_pcm(&w, 8, "a well-formed WAV");

    /* Every truncation of the header is an error, never a crash; once one
     * whole sample is there it decodes. */
    for (size_t cut = 0; cut < 46; cut++) {
        g4_audio a;
        g4_status st = g4_audio_decode_memory(w.b, cut, "upload", 0, &a);
        CHECK(st != G4_OK, "a WAV cut to %zu bytes decoded", cut);
    }
    expect_error(w.b, 11, G4_ERR_UNSUPPORTED, "not a recognised audio file", "a WAV cut inside the RIFF header");
    expect_error(w.b, 12, G4_ERR_FORMAT, "no fmt chunk", "a WAV cut after the RIFF header");
    expect_error(w.b, 24, G4_ERR_FORMAT, "fmt chunk (16 bytes) runs past", "a WAV cut inside fmt");
    expect_error(w.b, 36, G4_ERR_FORMAT, "no data chunk", "a WAV cut after fmt");
    expect_error(w.b, 45, G4_ERR_FORMAT, "no complete sample frame", "a WAV with half a sample");
    {
        bytes_buf cut = w;
        cut.n = 46;
        expect_pcm(&cut, 1, "a WAV cut after one sample");
    }

    s = GOOD;
    s.data_size = 1000; /* more than the file holds: read what is there */
    make_wav(&w, &s);
    expect_pcm(&w, 8, "a data chunk claiming 1000 bytes");
    s.data_size = 0xFFFFFFFFu; /* streamed WAVs leave the size unset */
    make_wav(&w, &s);
    expect_pcm(&w, 8, "a data chunk of size 0xFFFFFFFF");
    s.data_size = 0;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "no complete sample frame", "an empty data chunk");
    s = GOOD;
    s.samples = 0;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "no complete sample frame", "no sample data");

    s = GOOD;
    s.fmt_size = 0xFFFFFF00u; /* a lying fmt size */
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "runs past the end", "a fmt chunk claiming 4 GB");
    s.fmt_size = 14;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "fmt chunk is 14 bytes", "a 14-byte fmt chunk");

    s = GOOD;
    s.channels = 0;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "0 channels", "zero channels");
    s.channels = 300;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "300 channels", "300 channels");
    s = GOOD;
    s.rate = 0;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "sample rate 0 Hz", "rate 0");
    s.rate = 999;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "sample rate 999 Hz", "rate 999");
    s.rate = 0xFFFFFFFFu;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "sample rate 4294967295 Hz", "rate 2^32-1");
    s.rate = 1000;
    make_wav(&w, &s);
    expect_pcm(&w, 8, "rate 1000");
    s.rate = 768000;
    make_wav(&w, &s);
    expect_pcm(&w, 8, "rate 768000");

    s = GOOD;
    s.bits = 0;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "0 bits", "0-bit PCM");
    s.bits = 40;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "40 bits", "40-bit PCM");
    s.bits = 12; /* 12 valid bits in 16-bit containers, read like libsndfile */
    make_wav(&w, &s);
    expect_pcm(&w, 8, "12-bit PCM");
    s = GOOD;
    s.codec = 3;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "IEEE float with 16 bits", "16-bit float");
    s.codec = 0x55;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "codec 0x0055", "MP3-in-WAV");

    /* WAVE_FORMAT_EXTENSIBLE: the short form, a foreign GUID, a good one. */
    s = GOOD;
    s.codec = 0xFFFE;
    s.fmt_size = 18;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "EXTENSIBLE fmt chunk is 18 bytes", "a short EXTENSIBLE fmt");
    s.fmt_size = 40;
    make_wav(&w, &s);
    expect_error(w.b, w.n, G4_ERR_UNSUPPORTED, "non-standard sub-format GUID", "an all-zero GUID");
    static const unsigned char pcm_guid[16] = {1, 0, 0, 0, 0, 0, 0x10, 0, 0x80, 0, 0, 0xAA, 0, 0x38, 0x9B, 0x71};
    memcpy(w.b + 12 + 8 + 24, pcm_guid, 16);
    expect_pcm(&w, 8, "EXTENSIBLE PCM");

    /* Chunk order and padding: data before fmt; an odd LIST chunk with and
     * without its pad byte. */
    s = GOOD;
    w.n = 0;
    put_bytes(&w, "RIFF\0\0\0\0WAVE", 12);
    put_data(&w, &s);
    put_fmt(&w, &s);
    expect_pcm(&w, 8, "data before fmt");
    for (int pad = 0; pad < 2; pad++) {
        w.n = 0;
        put_bytes(&w, "RIFF\0\0\0\0WAVE", 12);
        put_fmt(&w, &s);
        put_bytes(&w, "LIST", 4);
        put_u32(&w, 3);
        put_bytes(&w, "abc", 3);
        if (pad) put_bytes(&w, "", 1);
        put_data(&w, &s);
        expect_pcm(&w, 8, pad ? "an odd chunk with its pad byte" : "an odd chunk without its pad byte");
    }
    /* A chunk size pointing past the end before any data chunk. */
    w.n = 0;
    put_bytes(&w, "RIFF\0\0\0\0WAVE", 12);
    put_fmt(&w, &s);
    put_bytes(&w, "JUNK", 4);
    put_u32(&w, 0x7FFFFFF0u);
    put_data(&w, &s);
    expect_error(w.b, w.n, G4_ERR_FORMAT, "no data chunk", "a junk chunk claiming 2 GB");

    /* A NaN sample in a float WAV. */
    s = GOOD;
    s.codec = 3;
    s.bits = 32;
    w.n = 0;
    put_bytes(&w, "RIFF\0\0\0\0WAVE", 12);
    put_fmt(&w, &s);
    put_bytes(&w, "data", 4);
    put_u32(&w, 8);
    put_u32(&w, 0x3F000000u); /* 0.5 */
    put_u32(&w, 0x7FC00000u); /* NaN */
    expect_error(w.b, w.n, G4_ERR_FORMAT, "sample 1 is not a finite number", "a NaN sample");

    /* Longer than 4 hours (1 kHz 8-bit keeps the buffer at 14 MB). */
    size_t frames = (size_t)(G4_AUDIO_MAX_SOURCE_SECONDS * 1000) + 1000;
    unsigned char *big = malloc(44 + frames);
    s = GOOD;
    s.bits = 8;
    s.rate = 1000;
    s.samples = 0;
    make_wav(&w, &s);
    memcpy(big, w.b, 40);
    memcpy(big + 40, (unsigned char[4]){frames & 255, frames >> 8 & 255, frames >> 16 & 255, frames >> 24}, 4);
    memset(big + 44, 128, frames);
    expect_error(big, 44 + frames, G4_ERR_LIMIT, "longer than the 14400 s accepted", "4 h + 1 s of audio");
    free(big);
}

static void test_garbage(const g4_st_set *refs) {
    expect_error(NULL, 0, G4_ERR_FORMAT, "empty audio data", "NULL");
    expect_error("", 0, G4_ERR_FORMAT, "empty audio data", "zero bytes");
    unsigned char noise[2048];
    uint32_t x = 99;
    for (size_t i = 0; i < sizeof noise; i++) noise[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
    noise[0] = 'G';
    expect_error(noise, sizeof noise, G4_ERR_UNSUPPORTED, "not a recognised audio file", "random bytes");
    expect_error("<html>hello</html>", 18, G4_ERR_UNSUPPORTED, "not a recognised audio file", "HTML");

    /* Known magic numbers followed by noise: libsndfile must refuse them. */
    static const char *magic[] = {"fLaC", "OggS", "ID3\x03", "FORM\0\0\0\0AIFF", "RF64\xff\xff\xff\xffWAVE"};
    static const size_t magic_len[] = {4, 4, 4, 12, 12};
    for (int i = 0; i < 5; i++) {
        unsigned char buf[sizeof noise];
        memcpy(buf, noise, sizeof buf);
        memcpy(buf, magic[i], magic_len[i]);
        g4_audio a;
        g4_status st = g4_audio_decode_memory(buf, sizeof buf, "upload", 0, &a);
        CHECK(st != G4_OK && strlen(g4_error_message()) > 0, "%.4s + noise decoded (%zu samples)", magic[i],
              a.n_samples);
    }

    /* Truncated compressed files: an error or a shorter decode, nothing else. */
    static const char *files[] = {"flac_mono_16k.flac", "vorbis_stereo_16k.ogg", "opus_mono_16k.opus",
                                  "mp3_mono_16k.mp3", "imaadpcm_mono_16k.wav", "aiff_s16_mono_16k.aiff"};
    for (int i = 0; i < 6; i++) {
        char *bytes;
        size_t len;
        if (g4_read_file(audio_data_path(files[i]), 1 << 24, &bytes, &len) != G4_OK) continue;
        int outcomes[2] = {0, 0};
        for (size_t cut = 0; cut < len; cut += len / 37 + 1) {
            g4_audio a;
            g4_status st = g4_audio_decode_memory(bytes, cut, files[i], 0, &a);
            outcomes[st == G4_OK]++;
            CHECK(st != G4_OK || a.n_samples <= 8000 * 2, "%s cut to %zu bytes: %zu samples", files[i], cut,
                  a.n_samples);
            CHECK(st == G4_OK || strlen(g4_error_message()) > 0, "%s cut to %zu: no message", files[i], cut);
            g4_audio_free(&a);
        }
        printf("  %-24s truncated 38 ways: %d decoded (shorter), %d refused\n", files[i], outcomes[1], outcomes[0]);
        free(bytes);
    }
    (void)refs;
}

static void test_detect_and_downmix(void) {
    CHECK(g4_audio_detect_format("\xff\xfb\x90\x00", 4) == G4_AUDIO_FORMAT_MP3, "MPEG-1 layer III frame header");
    CHECK(g4_audio_detect_format("\xff\xf1\x50\x80", 4) == G4_AUDIO_FORMAT_UNKNOWN, "AAC ADTS is not MP3");
    CHECK(g4_audio_detect_format("RIFF\0\0\0\0AVI ", 12) == G4_AUDIO_FORMAT_UNKNOWN, "AVI is not WAV");
    CHECK(g4_audio_detect_format("RIFX\0\0\0\0WAVE", 12) == G4_AUDIO_FORMAT_WAV, "RIFX");
    CHECK(g4_audio_detect_format("RIF", 3) == G4_AUDIO_FORMAT_UNKNOWN, "3 bytes");
    float in[6] = {1, 2, 4, 0.1f, 0.2f, 0.4f}, out[2];
    g4_audio_downmix(in, 2, 3, out);
    CHECK(out[0] == (1.0f + 2.0f + 4.0f) / 3.0f && out[1] == (0.1f + 0.2f + 0.4f) / 3.0f, "3-channel mean");
}

int main(void) {
    g4_st_set *refs = audio_open_refs();
    test_media_files(refs);
    test_malformed_wav();
    test_garbage(refs);
    test_detect_and_downmix();
    g4_st_close(refs);
    return test_finish();
}
