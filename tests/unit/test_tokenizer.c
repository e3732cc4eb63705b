/* The tokenizer against Hugging Face `tokenizers`: ids, ids with the
 * post-processor, ids with special tokens as plain text, decodes (with and
 * without special tokens), the streaming detokenizer, invalid UTF-8 input
 * and long inputs, on a corpus of both Gemma tokenizer files (expected
 * outputs from tests/tools/make_tokenizer_corpus.py); then the reference ids
 * of an independent implementation, and errors for bad files and ids. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <time.h>

#include "base/file.h"
#include "test_util.h"
#include "text/json_scan.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

static int failures_shown;

/* CPU time: the machine is shared, so wall time says little about us. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *hex_decode(const char *hex, size_t *n) {
    size_t len = strlen(hex) / 2;
    char *out = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[len] = 0;
    *n = len;
    return out;
}

static int ids_equal(const int32_t *ids, size_t n, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return 0;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, want) if ((int32_t)it->valuedouble != ids[i++]) return 0;
    return 1;
}

static void show_ids(const char *what, const char *text, const int32_t *ids, size_t n, const cJSON *want) {
    if (failures_shown++ > 20) return;
    char *w = cJSON_PrintUnformatted(want);
    fprintf(stderr, "  %s for \"%.80s\":\n    got  [", what, text);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, "%s%d", i ? "," : "", ids[i]);
    fprintf(stderr, "%s]\n    want %.400s\n", n > 40 ? ",..." : "", w);
    free(w);
}

static int encode_matches(const g4_tokenizer *t, const char *s, size_t n, int flags, const cJSON *want, const char *what) {
    int32_t *ids = NULL;
    size_t count = 0;
    g4_status st = g4_tokenizer_encode(t, s, n, flags, &ids, &count);
    int ok = !st && ids_equal(ids, count, want);
    if (!ok) show_ids(what, s, ids, count, want);
    free(ids);
    return ok;
}

static int decode_matches(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want, size_t want_len) {
    char *text = NULL;
    size_t len = 0;
    g4_status st = g4_tokenizer_decode(t, ids, n, skip, &text, &len);
    int ok = !st && len == want_len && !memcmp(text, want, len);
    if (!ok && failures_shown++ < 20)
        fprintf(stderr, "  decode (skip=%d) got \"%.200s\" want \"%.200s\" (%s)\n", skip, text ? text : "", want,
                st ? g4_error_message() : "");
    free(text);
    return ok;
}

/* Streams ids one by one: every piece must be valid UTF-8 and the pieces
 * must add up to the full decode. */
static int stream_matches(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *want, size_t want_len) {
    g4_detokenizer *d;
    if (g4_detokenizer_new(t, skip, &d)) return 0;
    size_t total = 0, cap = want_len * 2 + 64;
    char *all = malloc(cap);
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *piece;
        size_t len;
        g4_status st = i < n ? g4_detokenizer_push(d, ids[i], &piece, &len) : g4_detokenizer_flush(d, &piece, &len);
        if (st || !g4_utf8_valid(piece, len) || total + len > cap) {
            ok = 0;
            break;
        }
        memcpy(all + total, piece, len);
        total += len;
    }
    ok = ok && total == want_len && !memcmp(all, want, total);
    if (!ok && failures_shown++ < 20) fprintf(stderr, "  stream (skip=%d) got \"%.*s\" want \"%.200s\"\n", skip, (int)(total < 200 ? total : 200), all, want);
    free(all);
    g4_detokenizer_free(d);
    return ok;
}

static int32_t *json_ids(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) ids[i++] = (int32_t)it->valuedouble;
    return ids;
}

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

static void check_long(const g4_tokenizer *t, const cJSON *rec) {
    size_t unit_len;
    char *unit = hex_decode(cJSON_GetObjectItem(rec, "unit_hex")->valuestring, &unit_len);
    size_t count = (size_t)cJSON_GetObjectItem(rec, "count")->valuedouble, n = unit_len * count;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < count; i++) memcpy(text + i * unit_len, unit, unit_len);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    double t0 = cpu_seconds();
    g4_status st = g4_tokenizer_encode(t, text, n, 0, &ids, &n_ids);
    double dt = cpu_seconds() - t0;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n_ids; i++) {
        uint32_t v = (uint32_t)ids[i];
        unsigned char le[4] = {v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24};
        h = fnv_bytes(h, le, 4);
    }
    char got[17];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)h);
    CHECK(!st && n_ids == (size_t)cJSON_GetObjectItem(rec, "n_ids")->valuedouble &&
              !strcmp(got, cJSON_GetObjectItem(rec, "ids_fnv")->valuestring),
          "long input '%s' x %zu: %zu ids (want %d), fnv %s (want %s)", unit, count, n_ids,
          (int)cJSON_GetObjectItem(rec, "n_ids")->valuedouble, got, cJSON_GetObjectItem(rec, "ids_fnv")->valuestring);
    /* merge-rank BPE with a heap: a megabyte in one word must stay fast */
    CHECK(dt < 2.0, "encoding %zu bytes took %.2f s of CPU", n, dt);
    char *dec = NULL;
    size_t dec_len = 0;
    st = g4_tokenizer_decode(t, ids, n_ids, 0, &dec, &dec_len);
    snprintf(got, sizeof got, "%016llx", (unsigned long long)fnv_bytes(0xCBF29CE484222325ull, dec, dec_len));
    CHECK(!st && !strcmp(got, cJSON_GetObjectItem(rec, "decode_fnv")->valuestring), "long decode '%s' x %zu", unit, count);
    if (cJSON_IsTrue(cJSON_GetObjectItem(rec, "roundtrip")))
        CHECK(!st && dec_len == n && !memcmp(dec, text, n), "long round trip '%s' x %zu", unit, count);
    free(dec);
    free(ids);
    free(text);
    free(unit);
}

typedef struct {
    int n_text, ok_ids, ok_special, ok_plain, ok_dec, ok_skip, ok_stream, ok_rt, n_rt;
    int n_bytes, ok_bytes, n_decode, ok_decode, n_long;
} counts;

static void check_record(const g4_tokenizer *t, const cJSON *rec, counts *c) {
    const char *kind = cJSON_GetObjectItem(rec, "kind")->valuestring;
    if (!strcmp(kind, "text")) {
        size_t n;
        char *text = hex_decode(cJSON_GetObjectItem(rec, "hex")->valuestring, &n);
        c->n_text++;
        c->ok_ids += encode_matches(t, text, n, 0, cJSON_GetObjectItem(rec, "ids"), "ids");
        c->ok_special += encode_matches(t, text, n, G4_TOK_ADD_SPECIAL, cJSON_GetObjectItem(rec, "ids_special"), "ids with special");
        c->ok_plain += encode_matches(t, text, n, G4_TOK_PLAIN_TEXT, cJSON_GetObjectItem(rec, "ids_plain"), "ids as plain text");
        size_t k, wl, wsl;
        int32_t *ids = json_ids(cJSON_GetObjectItem(rec, "ids"), &k);
        char *want = hex_decode(cJSON_GetObjectItem(rec, "decode_hex")->valuestring, &wl);
        char *want_skip = hex_decode(cJSON_GetObjectItem(rec, "decode_skip_hex")->valuestring, &wsl);
        c->ok_dec += decode_matches(t, ids, k, 0, want, wl);
        c->ok_skip += decode_matches(t, ids, k, 1, want_skip, wsl);
        c->ok_stream += stream_matches(t, ids, k, 0, want, wl) && stream_matches(t, ids, k, 1, want_skip, wsl);
        if (cJSON_IsTrue(cJSON_GetObjectItem(rec, "roundtrip"))) {
            c->n_rt++;
            char *dec = NULL;
            size_t dl = 0;
            c->ok_rt += !g4_tokenizer_decode(t, ids, k, 0, &dec, &dl) && dl == n && !memcmp(dec, text, n);
            free(dec);
        }
        free(want);
        free(want_skip);
        free(ids);
        free(text);
    } else if (!strcmp(kind, "bytes")) {
        size_t n;
        char *bytes = hex_decode(cJSON_GetObjectItem(rec, "hex")->valuestring, &n);
        c->n_bytes++;
        c->ok_bytes += encode_matches(t, bytes, n, 0, cJSON_GetObjectItem(rec, "ids"), "ids of invalid UTF-8");
        free(bytes);
    } else if (!strcmp(kind, "decode")) {
        size_t k, wl, wsl;
        int32_t *ids = json_ids(cJSON_GetObjectItem(rec, "ids"), &k);
        char *want = hex_decode(cJSON_GetObjectItem(rec, "decode_hex")->valuestring, &wl);
        char *want_skip = hex_decode(cJSON_GetObjectItem(rec, "decode_skip_hex")->valuestring, &wsl);
        c->n_decode++;
        c->ok_decode += decode_matches(t, ids, k, 0, want, wl) && decode_matches(t, ids, k, 1, want_skip, wsl) &&
                        stream_matches(t, ids, k, 0, want, wl) && stream_matches(t, ids, k, 1, want_skip, wsl);
        free(want);
        free(want_skip);
        free(ids);
    } else if (!strcmp(kind, "long")) {
        c->n_long++;
        check_long(t, rec);
    }
}

static void check_counts(const char *what, const counts *c) {
    printf("%s: %d texts: ids %d, with special %d, plain %d, decode %d, decode skipping special %d, stream %d, "
           "round trips %d/%d; invalid UTF-8 %d/%d; random id decodes %d/%d; %d long inputs\n",
           what, c->n_text, c->ok_ids, c->ok_special, c->ok_plain, c->ok_dec, c->ok_skip, c->ok_stream, c->ok_rt, c->n_rt,
           c->ok_bytes, c->n_bytes, c->ok_decode, c->n_decode, c->n_long);
    CHECK(c->ok_ids == c->n_text, "%s ids: %d of %d texts match", what, c->ok_ids, c->n_text);
    CHECK(c->ok_special == c->n_text, "%s ids with special tokens: %d of %d match", what, c->ok_special, c->n_text);
    CHECK(c->ok_plain == c->n_text, "%s ids as plain text: %d of %d match", what, c->ok_plain, c->n_text);
    CHECK(c->ok_dec == c->n_text && c->ok_skip == c->n_text, "%s decodes: %d and %d of %d match", what, c->ok_dec, c->ok_skip, c->n_text);
    CHECK(c->ok_stream == c->n_text, "%s streamed decodes: %d of %d match", what, c->ok_stream, c->n_text);
    CHECK(c->ok_rt == c->n_rt, "%s round trips: %d of %d", what, c->ok_rt, c->n_rt);
    CHECK(c->ok_bytes == c->n_bytes, "%s invalid UTF-8: %d of %d match", what, c->ok_bytes, c->n_bytes);
    CHECK(c->ok_decode == c->n_decode, "%s random id decodes: %d of %d match", what, c->ok_decode, c->n_decode);
}

/* Calls fn on every JSON line of a fixture file. */
static void each_record(const char *name, void (*fn)(const cJSON *rec, void *ctx), void *ctx) {
    char *data;
    size_t len;
    g4_status st = g4_read_file(test_fixture(name), (size_t)1 << 28, &data, &len);
    CHECK(!st, "read %s: %s", name, g4_error_message());
    if (st) return;
    for (char *line = data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *rec = cJSON_Parse(line);
        CHECK(rec != NULL, "%s: a line is not JSON", name);
        if (rec) fn(rec, ctx);
        cJSON_Delete(rec);
    }
    free(data);
}

typedef struct {
    g4_tokenizer *t;
    counts c;
    char name[128];
} corpus_state;

static void corpus_record(const cJSON *rec, void *ctx) {
    corpus_state *s = ctx;
    const char *kind = cJSON_GetObjectItem(rec, "kind")->valuestring;
    if (!strcmp(kind, "header") || !strcmp(kind, "variant")) {
        if (!strcmp(kind, "variant")) { /* expected_variants.jsonl: each variant names its file */
            char path[256];
            snprintf(path, sizeof path, "tokenizer/%s", cJSON_GetObjectItem(rec, "file")->valuestring);
            snprintf(s->name, sizeof s->name, "%s", cJSON_GetObjectItem(rec, "name")->valuestring);
            g4_tokenizer_free(s->t);
            s->t = NULL;
            g4_status st = g4_tokenizer_load(test_fixture(path), &s->t);
            CHECK(!st, "load variant %s: %s", s->name, g4_error_message());
        }
        if (s->t)
            CHECK((int)cJSON_GetObjectItem(rec, "vocab_size")->valuedouble == g4_tokenizer_vocab_size(s->t),
                  "%s: vocab size %d, tokenizers says %d", s->name, g4_tokenizer_vocab_size(s->t),
                  (int)cJSON_GetObjectItem(rec, "vocab_size")->valuedouble);
        return;
    }
    if (!s->t) return;
    counts before = s->c;
    check_record(s->t, rec, &s->c);
    int ok = s->c.ok_ids - before.ok_ids == s->c.n_text - before.n_text && s->c.ok_dec - before.ok_dec == s->c.n_text - before.n_text;
    if (!ok && failures_shown < 20) fprintf(stderr, "  (in %s)\n", s->name);
}

static void check_corpus(const char *tok_name, const char *expected_name) {
    corpus_state s = {0};
    snprintf(s.name, sizeof s.name, "%s", tok_name);
    double t0 = cpu_seconds();
    g4_status st = g4_tokenizer_load(test_fixture(tok_name), &s.t);
    double load_s = cpu_seconds() - t0;
    CHECK(!st, "load %s: %s", tok_name, g4_error_message());
    if (st) return;
    printf("%s: loaded in %.3f s of CPU, %d ids\n", tok_name, load_s, g4_tokenizer_vocab_size(s.t));
    CHECK(load_s < 1.0, "loading took %.2f s of CPU", load_s);
    each_record(expected_name, corpus_record, &s);
    check_counts(tok_name, &s.c);
    CHECK(s.c.n_text > 500 && s.c.n_decode > 100 && s.c.n_bytes > 20 && s.c.n_long > 10, "corpus is incomplete");
    g4_tokenizer_free(s.t);
}

/* Small tokenizers for the parts the Gemma files do not use: every Split
 * behaviour, Strip/Prepend normalizers, Strip decoders, added-token flags,
 * unknown tokens, legacy merges, subword affixes, other post-processors. */
static void check_variants(void) {
    corpus_state s = {0};
    each_record("tokenizer/expected_variants.jsonl", corpus_record, &s);
    check_counts("variants", &s.c);
    CHECK(s.c.n_text > 500, "variant corpus is incomplete");
    g4_tokenizer_free(s.t);
}

/* Added tokens made of whitespace with lstrip/rstrip: `tokenizers` rescans
 * the run for every match (quadratic); ours must stay linear. The shapes of
 * the results are those HF gives at 5,000 repeats (the "long" records of
 * the whitespace_tokens variant): one token for a run of "\n" (lstrip +
 * rstrip), one per "\t" (rstrip only). */
static void check_whitespace_token_scaling(void) {
    g4_tokenizer *t = NULL;
    g4_status st = g4_tokenizer_load(test_fixture("tokenizer/variants/whitespace_tokens.json"), &t);
    CHECK(!st, "load whitespace_tokens: %s", g4_error_message());
    if (st) return;
    int32_t nl = g4_tokenizer_token_id(t, "\n"), tab = g4_tokenizer_token_id(t, "\t");
    size_t n = 1000000;
    char *text = malloc(n);
    for (int pass = 0; pass < 2; pass++) {
        memset(text, pass ? '\t' : '\n', n);
        int32_t *ids = NULL;
        size_t count = 0;
        double t0 = cpu_seconds();
        st = g4_tokenizer_encode(t, text, n, 0, &ids, &count);
        double dt = cpu_seconds() - t0;
        int ok = !st && (pass ? count == n : count == 1);
        for (size_t i = 0; ok && i < count; i++) ok = ids[i] == (pass ? tab : nl);
        CHECK(ok && dt < 1.0, "a million %s: %zu ids in %.2f s of CPU", pass ? "tabs" : "newlines", count, dt);
        free(ids);
    }
    free(text);
    g4_tokenizer_free(t);
}

/* ids from an independent implementation (transformers.js), shipped with the tokenizer files */
static void check_reference_ids(void) {
    g4_tokenizer *t = NULL;
    if (g4_tokenizer_load(test_fixture("tokenizer/tokenizer.json"), &t)) return;
    char *data;
    size_t len;
    g4_status st = g4_read_file(test_fixture("tokenizer/reference_ids.jsonl"), 1 << 20, &data, &len);
    CHECK(!st, "read reference_ids.jsonl: %s", g4_error_message());
    int n = 0, ok = 0;
    for (char *line = st ? NULL : data, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *rec = cJSON_Parse(line);
        if (!rec) continue;
        /* cJSON strings stop at NUL, and one text holds "\u0000": read it with the scanner */
        const char *at = strstr(line, "\"text\":");
        g4_json_scan scan;
        g4_strbuf buf = {0};
        const char *text = NULL;
        size_t tl = 0;
        n++;
        if (at) {
            g4_json_scan_init(&scan, at + 7, strlen(at + 7), "reference_ids.jsonl");
            if (g4_json_string(&scan, &buf, &text, &tl)) text = NULL;
        }
        if (text) ok += encode_matches(t, text, tl, 0, cJSON_GetObjectItem(rec, "ids"), "reference ids");
        g4_strbuf_free(&buf);
        cJSON_Delete(rec);
    }
    printf("reference_ids.jsonl: %d of %d match\n", ok, n);
    CHECK(n == 14 && ok == n, "reference ids: %d of %d match", ok, n);
    if (!st) free(data);
    g4_tokenizer_free(t);
}

static g4_status load_text(const char *json, g4_tokenizer **t) { return g4_tokenizer_load_from_memory(json, strlen(json), "test.json", t); }

static void check_errors(void) {
    g4_tokenizer *t = NULL;
    char *data;
    size_t len;
    g4_status st = g4_read_file(test_fixture("tokenizer/tokenizer.json"), (size_t)1 << 28, &data, &len);
    CHECK(!st, "read tokenizer.json");
    if (st) return;
    const size_t cuts[] = {0, 1, 100, 5000, len / 3, len / 2, len - 1000, len - 2};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        st = g4_tokenizer_load_from_memory(data, cuts[i], "truncated.json", &t);
        CHECK(st == G4_ERR_FORMAT && !t && strstr(g4_error_message(), "truncated.json"),
              "truncated at %zu bytes: status %d, message '%s'", cuts[i], st, g4_error_message());
    }
    free(data);
    /* every truncation of a small file fails cleanly; corrupted bytes never crash */
    st = g4_read_file(test_fixture("tokenizer/variants/llama_style.json"), 1 << 24, &data, &len);
    CHECK(!st, "read llama_style.json");
    if (!st) {
        int clean = 1;
        for (size_t cut = 0; cut < len; cut += 3) {
            if (g4_tokenizer_load_from_memory(data, cut, "cut.json", &t) != G4_ERR_FORMAT || t) clean = 0;
            g4_tokenizer_free(t);
            t = NULL;
        }
        CHECK(clean, "some truncation of llama_style.json did not fail with a format error");
        unsigned seed = 12345;
        for (int trial = 0; trial < 300; trial++) {
            char *copy = malloc(len);
            memcpy(copy, data, len);
            for (int k = 0; k < 4; k++) {
                seed = seed * 1103515245u + 12345u;
                size_t at = (seed >> 8) % len;
                seed = seed * 1103515245u + 12345u;
                copy[at] = "\"{}[]:,\\0a \x80"[(seed >> 8) % 12];
            }
            if (!g4_tokenizer_load_from_memory(copy, len, "corrupt.json", &t)) {
                int32_t *ids;
                size_t n;
                if (!g4_tokenizer_encode(t, "hello world", 11, 0, &ids, &n)) free(ids);
                g4_tokenizer_free(t);
                t = NULL;
            }
            free(copy);
        }
        free(data);
    }
    st = load_text("{\"added_tokens\": [], \"normalizer\": null}", &t);
    CHECK(st == G4_ERR_FORMAT && strstr(g4_error_message(), "model"), "missing model: %d %s", st, g4_error_message());
    st = load_text("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", &t);
    CHECK(st == G4_ERR_UNSUPPORTED && strstr(g4_error_message(), "Unigram"), "unknown model type: %d %s", st, g4_error_message());
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"c\"]]}}", &t);
    CHECK(st == G4_ERR_FORMAT && strstr(g4_error_message(), "'c'"), "merge with a missing token: %d %s", st, g4_error_message());
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", &t);
    CHECK(st == G4_ERR_FORMAT && strstr(g4_error_message(), "ab"), "merged token missing: %d %s", st, g4_error_message());
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}", &t);
    CHECK(st == G4_ERR_UNSUPPORTED && strstr(g4_error_message(), "NFKC"), "unsupported normalizer: %d %s", st, g4_error_message());
    st = load_text("[1, 2]", &t);
    CHECK(st == G4_ERR_FORMAT, "top level not an object: %d", st);
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}, \"merges\": []}}", &t);
    CHECK(st == G4_ERR_FORMAT, "trailing comma: %d %s", st, g4_error_message());
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}} x", &t);
    CHECK(st == G4_ERR_FORMAT, "text after the object: %d", st);
    st = g4_tokenizer_load("/nonexistent/tokenizer.json", &t);
    CHECK(st == G4_ERR_IO || st == G4_ERR_NOT_FOUND, "missing file: %d", st);

    /* a minimal valid tokenizer, for id errors */
    st = load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}", &t);
    CHECK(!st, "minimal tokenizer: %s", g4_error_message());
    if (st) return;
    int32_t *ids;
    size_t n;
    st = g4_tokenizer_encode(t, "abab", 4, 0, &ids, &n);
    CHECK(!st && n == 2 && ids[0] == 2 && ids[1] == 2, "minimal encode");
    if (!st) free(ids);
    char *text;
    const int32_t bad[][1] = {{-1}, {3}, {1 << 30}};
    for (int i = 0; i < 3; i++) {
        st = g4_tokenizer_decode(t, bad[i], 1, 0, &text, &len);
        CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "not in the vocabulary"), "decode of id %d: %d", bad[i][0], st);
    }
    g4_detokenizer *d;
    const char *piece;
    CHECK(!g4_detokenizer_new(t, 0, &d), "detokenizer");
    CHECK(g4_detokenizer_push(d, 7, &piece, &len) == G4_ERR_INVALID_ARGUMENT, "detokenizer bad id");
    g4_detokenizer_free(d);
    CHECK(g4_tokenizer_token_id(t, "ab") == 2 && g4_tokenizer_token_id(t, "zz") == -1, "token_id");
    CHECK(g4_tokenizer_token_text(t, 2) && !strcmp(g4_tokenizer_token_text(t, 2), "ab") && !g4_tokenizer_token_text(t, 3), "token_text");
    g4_tokenizer_free(t);
}

/* Chat markers are found by name in the file that is loaded. */
static void check_lookup(void) {
    g4_tokenizer *t = NULL;
    if (g4_tokenizer_load(test_fixture("tokenizer/tokenizer-gemma4-style.json"), &t)) return;
    const struct {
        const char *name;
        int32_t id;
        int special;
    } want[] = {{"<|turn>", 105, 1}, {"<turn|>", 106, 1}, {"<|image|>", 258880, 1}, {"<bos>", 2, 1},
                {"<unused5>", 11, 0}, {"\n", 107, 0}, {"<image_soft_token>", 262144, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int32_t id = g4_tokenizer_token_id(t, want[i].name);
        CHECK(id == want[i].id && g4_tokenizer_is_special(t, id) == want[i].special, "token %s: id %d special %d", want[i].name,
              id, g4_tokenizer_is_special(t, id));
    }
    CHECK(!strcmp(g4_tokenizer_token_text(t, 105), "<|turn>"), "token text 105");
    g4_tokenizer_free(t);
}

/* Bounded encoding, escaped spans and byte tokens (the server's limits and
 * --no-special-in-content), on the Gemma 4 style tokenizer. */
static void check_server_helpers(void) {
    g4_tokenizer *t = NULL;
    if (g4_tokenizer_load(test_fixture("tokenizer/tokenizer-gemma4-style.json"), &t)) return;
    const char *text = "one two three four five six seven eight nine ten";
    int32_t *all = NULL, *ids = NULL;
    size_t n_all = 0, n = 0;
    CHECK(g4_tokenizer_encode(t, text, strlen(text), 0, &all, &n_all) == G4_OK && n_all > 4, "encode");
    CHECK(g4_tokenizer_encode_max(t, text, strlen(text), 0, n_all, &ids, &n) == G4_OK && n == n_all &&
              !memcmp(ids, all, n * sizeof *ids),
          "encode_max at the exact count = encode");
    free(ids);
    ids = NULL;
    CHECK(g4_tokenizer_encode_max(t, text, strlen(text), 0, n_all - 1, &ids, &n) == G4_ERR_LIMIT && !ids,
          "encode_max one short: G4_ERR_LIMIT");
    /* escaped: typed special-token text is plain text, the rest unchanged */
    const char *typed = "a<|turn>b<bos>";
    char *esc = NULL;
    size_t esc_len = 0;
    CHECK(g4_tokenizer_escape_special(t, typed, strlen(typed), &esc, &esc_len) == G4_OK &&
              !strcmp(esc, "a\xEF\xB7\x90<|turn>\xEF\xB7\x91" "b\xEF\xB7\x90<bos>\xEF\xB7\x91"),
          "escape: [%s]", esc ? esc : "");
    int32_t *plain = NULL, *got = NULL;
    size_t n_plain = 0, n_got = 0;
    g4_tokenizer_encode(t, "a", 1, 0, &plain, &n_plain);
    CHECK(g4_tokenizer_encode(t, esc, esc_len, G4_TOK_ESCAPED_SPANS, &got, &n_got) == G4_OK, "encode escaped");
    int specials = 0;
    for (size_t i = 0; i < n_got; i++) specials += g4_tokenizer_is_special(t, got[i]);
    int32_t *raw = NULL;
    size_t n_raw = 0;
    g4_tokenizer_encode(t, typed, strlen(typed), 0, &raw, &n_raw);
    int raw_specials = 0;
    for (size_t i = 0; i < n_raw; i++) raw_specials += g4_tokenizer_is_special(t, raw[i]);
    CHECK(specials == 0 && raw_specials == 2, "escaped: %d special tokens (unescaped: %d)", specials, raw_specials);
    char *back = NULL;
    CHECK(g4_tokenizer_decode(t, got, n_got, 0, &back, NULL) == G4_OK && back && !strcmp(back, typed),
          "escaped text decodes to what was typed: [%s]", back ? back : "");
    free(back);
    /* marks typed by the client are no marks */
    char *esc2 = NULL;
    size_t esc2_len = 0;
    const char *marks = "x\xEF\xB7\x90<|turn>\xEF\xB7\x91";
    CHECK(g4_tokenizer_escape_special(t, marks, strlen(marks), &esc2, &esc2_len) == G4_OK &&
              !strcmp(esc2, "x\xEF\xBF\xBD\xEF\xB7\x90<|turn>\xEF\xB7\x91\xEF\xBF\xBD"),
          "typed marks become U+FFFD: [%s]", esc2 ? esc2 : "");
    int32_t c3 = g4_tokenizer_token_id(t, "<0xC3>");
    CHECK(c3 < 0 || g4_tokenizer_token_byte(t, c3) == 0xC3, "byte of <0xC3>");
    CHECK(g4_tokenizer_token_byte(t, g4_tokenizer_token_id(t, "<|turn>")) == -1, "no byte for <|turn>");
    CHECK(g4_tokenizer_max_token_bytes(t) >= 7, "longest token");
    free(esc);
    free(esc2);
    free(all);
    free(plain);
    free(got);
    free(raw);
    g4_tokenizer_free(t);
}

int main(void) {
    check_server_helpers();
    check_corpus("tokenizer/tokenizer.json", "tokenizer/expected_gemma3.jsonl");
    check_corpus("tokenizer/tokenizer-gemma4-style.json", "tokenizer/expected_gemma4style.jsonl");
    check_variants();
    check_whitespace_token_scaling();
    check_reference_ids();
    check_errors();
    check_lookup();
    return test_finish();
}
