/* The synchronous part of gemma4.h, from a program that includes nothing
 * else of the library: g4_tokenize / g4_detokenize against Hugging Face
 * tokenizers' ids and text for the vendored corpus; g4_sequence's logits
 * (one prefill, one id at a time, after g4_sequence_truncate) and hidden
 * states bit for bit equal to the internal path's (g4_session, through
 * tests/support/internal_reference.c) and within 1e-4 of transformers';
 * an image prompt through g4_sequence_append_media equal to the internal
 * path's (g4_prompt_from_ids + g4_session);
 * model facts; clear errors for bad calls. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemma4.h"
#include "support/internal_reference.h"
#include "test_util.h"

#define TOLERANCE 1e-4 /* rel. RMS against transformers' float64, as test_text_fixtures */

static int same_ids(const int32_t *a, size_t n, const int32_t *b, size_t m) {
    return n == m && (n == 0 || memcmp(a, b, n * sizeof *a) == 0);
}

static void check_tokenizer(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s", test_fixture("tokenizer/tokenizer-gemma4-style.json"));
    g4_tokenizer *t = NULL;
    g4_status st = g4_tokenizer_open(path, &t);
    CHECK(st == G4_OK, "g4_tokenizer_open %s: %s", path, g4_error_message());
    if (st != G4_OK) return;
    int n_cases = 0;
    ref_tokenizer_case *cases = ref_tokenizer_cases(test_fixture("tokenizer/expected_gemma4style.jsonl"), &n_cases);
    CHECK(cases && n_cases > 800, "the corpus has %d text records", n_cases);
    int ok_ids = 0, ok_special = 0, ok_plain = 0, ok_dec = 0, ok_skip = 0;
    for (int i = 0; i < n_cases; i++) {
        const ref_tokenizer_case *c = &cases[i];
        int32_t *ids = NULL;
        size_t n = 0;
        if (g4_tokenize(t, c->text, c->len, 0, &ids, &n) == G4_OK) ok_ids += same_ids(ids, n, c->ids, c->n_ids);
        g4_free(ids);
        if (g4_tokenize(t, c->text, c->len, G4_TOKENIZE_ADD_SPECIAL, &ids, &n) == G4_OK)
            ok_special += same_ids(ids, n, c->ids_special, c->n_special);
        g4_free(ids);
        if (g4_tokenize(t, c->text, c->len, G4_TOKENIZE_PLAIN_TEXT, &ids, &n) == G4_OK)
            ok_plain += same_ids(ids, n, c->ids_plain, c->n_plain);
        g4_free(ids);
        char *text = NULL;
        size_t len = 0;
        if (g4_detokenize(t, c->ids, c->n_ids, 0, &text, &len) == G4_OK)
            ok_dec += len == c->decoded_len && memcmp(text, c->decoded, len) == 0 && text[len] == 0;
        g4_free(text);
        if (g4_detokenize(t, c->ids, c->n_ids, 1, &text, &len) == G4_OK)
            ok_skip += len == c->decoded_skip_len && memcmp(text, c->decoded_skip, len) == 0;
        g4_free(text);
    }
    printf("tokenizer: %d texts; ids %d, with <bos> %d, plain %d, decoded %d, decoded skipping specials %d\n",
           n_cases, ok_ids, ok_special, ok_plain, ok_dec, ok_skip);
    CHECK(ok_ids == n_cases && ok_special == n_cases && ok_plain == n_cases, "encodings as tokenizers'");
    CHECK(ok_dec == n_cases && ok_skip == n_cases, "decodings as tokenizers'");
    int32_t *ids = NULL;
    size_t n = 0;
    st = g4_tokenize(t, "x", 1, 0x40, &ids, &n);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "flags"), "unknown flags refused: %s",
          g4_error_message());
    st = g4_tokenize(NULL, "x", 1, 0, &ids, &n);
    CHECK(st == G4_ERR_INVALID_ARGUMENT, "no tokenizer refused: %s", g4_error_message());
    ref_tokenizer_cases_free(cases, n_cases);
    g4_tokenizer_close(t);
    st = g4_tokenizer_open(test_fixture("dense"), &t);
    CHECK(st != G4_OK && g4_error_message()[0], "a folder without tokenizer.json: %s", g4_error_message());
}

/* g4_hidden_sink keeping "final_norm" */
typedef struct {
    float *rows;
    int got, cap, dim, calls;
} final_norm_sink;

static float *keep_final_norm(void *user, const char *name, int rows, int dim) {
    final_norm_sink *k = user;
    k->calls++;
    if (strcmp(name, "final_norm") != 0 || k->got + rows > k->cap) return NULL;
    k->dim = dim;
    float *dest = k->rows + (size_t)k->got * dim;
    k->got += rows;
    return dest;
}

static void ignore_event(void *user, const g4_event *ev) { (void)user, (void)ev; }

/* A file's bytes (malloc'd), NULL if unreadable. */
static void *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = n > 0 ? malloc((size_t)n) : NULL;
    *size = data && fread(data, 1, (size_t)n, f) == (size_t)n ? (size_t)n : 0;
    fclose(f);
    if (!*size) free(data);
    return *size ? data : NULL;
}

/* The processor's image prompt with the fixture's image.png appended through
 * g4_sequence_append_media: every row as the internal path gives it (whose
 * image accuracy test_vision_tower and test_unified check). */
static void check_image(g4_handle *h, const ref_fixture *ref, const char *dir, const char *name, size_t V) {
    int n = 0;
    int32_t *ids = ref_fixture_ids(ref, "image", "prompt_ids", &n);
    char path[1024];
    snprintf(path, sizeof path, "%s/image.png", dir);
    size_t size = 0;
    void *png = read_all(path, &size);
    CHECK(ids && png, "%s: image prompt and %s", name, path);
    float *got = malloc((size_t)n * V * sizeof *got), *internal = malloc((size_t)n * V * sizeof *internal);
    g4_sequence *s = NULL;
    g4_sequence_options so = {.n_ctx = n};
    g4_status st = ids && png ? g4_sequence_open(h, &so, &s) : G4_ERR_IO;
    const g4_media_file image = {.data = png, .size = size, .label = path};
    if (st == G4_OK) st = g4_sequence_append_media(s, ids, n, &image, 1, G4_ROWS_ALL, got);
    CHECK(st == G4_OK, "%s: append with an image: %s", name, g4_error_message());
    if (st == G4_OK) {
        CHECK(ref_session_image_logits(ref, ids, n, png, size, internal) == 0, "%s: internal image prompt", name);
        CHECK(!memcmp(got, internal, (size_t)n * V * sizeof *got), "%s: image prompt logits = the internal path's",
              name);
    }
    const g4_media_file garbage = {.data = "not an image", .size = 12, .label = "garbage"};
    g4_sequence_truncate(s, 0);
    st = s ? g4_sequence_append_media(s, ids, n, &garbage, 1, G4_ROWS_LAST, got) : G4_ERR_IO;
    CHECK(st != G4_OK && strstr(g4_error_message(), "garbage"), "%s: bytes that are no image: %s", name,
          g4_error_message());
    g4_sequence_close(s);
    free(got), free(internal), free(png), free(ids);
}

static void check_fixture(const char *name) {
    const char *dir = test_fixture(name);
    ref_fixture *ref = ref_fixture_open(dir);
    CHECK(ref != NULL, "%s: the internal path opens it", name);
    if (!ref) return;
    g4_handle *h = NULL;
    g4_open_options oo = {.device = "cpu", .exact = 1, .sequences_only = 1};
    g4_status st = g4_open(dir, &oo, &h);
    CHECK(st == G4_OK, "%s: g4_open: %s", name, g4_error_message());
    if (st != G4_OK) {
        ref_fixture_close(ref);
        return;
    }
    g4_model_info info;
    g4_get_model_info(h, &info);
    CHECK(info.vocab_size == ref_fixture_vocab(ref) && info.hidden_size == ref_fixture_hidden_size(ref) &&
              info.n_layers == ref_fixture_n_layers(ref) && info.max_position == ref_fixture_max_position(ref) &&
              info.bos_id == ref_fixture_bos(ref),
          "%s: model info %d/%d/%d/%d/%d", name, info.vocab_size, info.hidden_size, info.n_layers, info.max_position,
          info.bos_id);
    char *summary = g4_model_summary(h);
    CHECK(summary && strlen(summary) > 0, "%s: a summary", name);
    g4_free(summary);
    CHECK(g4_model_tokenizer(h) == NULL, "%s: no tokenizer.json, no tokenizer", name);

    int n = 0;
    int32_t *ids = ref_fixture_ids(ref, "text", "all_ids", &n);
    size_t n_want = 0;
    const float *want = ref_fixture_tensor(ref, "text.logits", &n_want);
    const size_t V = (size_t)info.vocab_size, D = (size_t)info.hidden_size;
    CHECK(ids && n > 4 && want && n_want == (size_t)n * V, "%s: %d ids, %zu reference logits", name, n, n_want);
    if (!ids || n <= 4 || !want || n_want != (size_t)n * V) goto done;
    float *got = malloc((size_t)n * V * sizeof *got), *internal = malloc((size_t)n * V * sizeof *internal);
    float *hidden = malloc((size_t)n * D * sizeof *hidden), *internal_hidden = malloc((size_t)n * D * sizeof *hidden);

    /* one prefill with the hidden-state sink */
    g4_sequence *s = NULL;
    g4_sequence_options so = {.n_ctx = n + 1};
    st = g4_sequence_open(h, &so, &s);
    CHECK(st == G4_OK, "%s: g4_sequence_open: %s", name, g4_error_message());
    final_norm_sink sink = {.rows = hidden, .cap = n};
    g4_sequence_set_hidden_sink(s, keep_final_norm, &sink);
    st = st == G4_OK ? g4_sequence_append(s, ids, n, G4_ROWS_ALL, got) : st;
    CHECK(st == G4_OK && g4_sequence_length(s) == n, "%s: prefill: %s", name, g4_error_message());
    CHECK(ref_session_logits(ref, ids, n, 0, internal, internal_hidden) == 0, "%s: internal prefill", name);
    CHECK(!memcmp(got, internal, (size_t)n * V * sizeof *got), "%s: prefill logits = g4_session's, bit for bit", name);
    CHECK(sink.got == n && sink.dim == (int)D && sink.calls >= 4, "%s: final_norm %d rows of %d (%d captures)", name,
          sink.got, sink.dim, sink.calls);
    CHECK(!memcmp(hidden, internal_hidden, (size_t)n * D * sizeof *hidden), "%s: final_norm = g4_session's", name);
    size_t n_hid = 0;
    const float *want_hidden = ref_fixture_tensor(ref, "text.hidden.final_norm", &n_hid);
    if (want_hidden && n_hid == (size_t)n * D) {
        double e = test_rel_rms(hidden, want_hidden, n_hid);
        CHECK(e < TOLERANCE, "%s: final_norm vs transformers rel_rms %.2e", name, e);
    }
    double err = test_rel_rms(got, want, (size_t)n * V);
    printf("%-10s prefill logits vs transformers rel_rms %.2e\n", name, err);
    CHECK(err < TOLERANCE, "%s: prefill rel_rms %.3e", name, err);

    /* truncated to k and the rest appended again */
    const int k = n / 2;
    st = g4_sequence_truncate(s, n + 1);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "truncate"), "%s: past the end: %s", name,
          g4_error_message());
    g4_sequence_set_hidden_sink(s, NULL, NULL);
    st = g4_sequence_truncate(s, k);
    CHECK(st == G4_OK && g4_sequence_length(s) == k, "%s: truncate to %d: %s", name, k, g4_error_message());
    st = g4_sequence_append(s, ids + k, n - k, G4_ROWS_ALL, got);
    CHECK(st == G4_OK, "%s: append after truncate: %s", name, g4_error_message());
    CHECK(ref_session_truncated(ref, ids, n, k, internal) == 0, "%s: internal truncate", name);
    CHECK(!memcmp(got, internal, (size_t)(n - k) * V * sizeof *got), "%s: after truncate = g4_session's", name);
    err = test_rel_rms(got, want + (size_t)k * V, (size_t)(n - k) * V);
    CHECK(err < TOLERANCE, "%s: after truncate rel_rms %.3e", name, err);

    /* one id at a time, last row each */
    st = g4_sequence_truncate(s, 0);
    for (int t = 0; t < n && st == G4_OK; t++) st = g4_sequence_append(s, ids + t, 1, G4_ROWS_LAST, got + t * V);
    CHECK(st == G4_OK, "%s: decode: %s", name, g4_error_message());
    CHECK(ref_session_logits(ref, ids, n, 1, internal, NULL) == 0, "%s: internal decode", name);
    CHECK(!memcmp(got, internal, (size_t)n * V * sizeof *got), "%s: decode logits = g4_session's", name);
    err = test_rel_rms(got, want, (size_t)n * V);
    printf("%-10s decode logits vs transformers rel_rms %.2e\n", name, err);
    CHECK(err < TOLERANCE, "%s: decode rel_rms %.3e", name, err);

    /* bad calls */
    CHECK(g4_sequence_append(s, ids, 0, G4_ROWS_LAST, got) == G4_ERR_INVALID_ARGUMENT, "%s: no ids refused", name);
    CHECK(g4_sequence_append(s, ids, 1, G4_ROWS_ALL, NULL) == G4_ERR_INVALID_ARGUMENT && g4_error_message()[0],
          "%s: rows without a buffer: %s", name, g4_error_message());
    CHECK(g4_sequence_length(s) == n, "%s: refused calls leave the sequence as it was", name);
    g4_sequence *bad = NULL;
    g4_sequence_options bad_mask = {.vision_mask = "sideways"};
    st = g4_sequence_open(h, &bad_mask, &bad);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && bad == NULL && strstr(g4_error_message(), "sideways"),
          "%s: bad vision_mask: %s", name, g4_error_message());
    uint64_t id;
    st = g4_submit_text(h, "hi", NULL, ignore_event, NULL, &id);
    CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "sequences_only"),
          "%s: no requests on a sequences_only handle: %s", name, g4_error_message());
    g4_sequence_close(s);
    free(got), free(internal), free(hidden), free(internal_hidden);
    if (strcmp(name, "dense") == 0 || strcmp(name, "unified") == 0) check_image(h, ref, dir, name, V);
done:
    free(ids);
    g4_close(h);
    ref_fixture_close(ref);
}

int main(void) {
    check_tokenizer();
    const char *fixtures[] = {"dense", "moe", "e2b", "unified"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) check_fixture(fixtures[i]);
    return test_finish();
}
