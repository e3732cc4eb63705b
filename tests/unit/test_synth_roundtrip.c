/* `gemma4 synth` checkpoints: a synthetic model written to disk and loaded
 * back with the normal loader is the in-memory synthetic model bit for bit.
 *
 * For small configs (the vendored fixtures' shapes: dense, E2B-like with
 * per-layer embeddings and KV sharing, MoE, unified; and a dense one whose
 * MLP width is no multiple of the group size, which MLX leaves unquantised)
 * in bf16, mlx4, mlx8 and mxfp4: the written folder loads with no problem
 * and no unused tensor, in the layout of the format (bf16: Hugging Face
 * names, stacked gate_up experts; quantised: MLX names), with the same
 * parameters and weight bytes, and gives logits equal in every bit to the
 * synthetic model's on a few ids, for every position. The quantization block
 * written for the mlx-community presets equals theirs. Also: random weights
 * made in pieces equal the same made whole (the writer makes big tensors in
 * 64 MiB pieces), and the streaming safetensors writer refuses to finish a
 * file with bytes missing and leaves none behind. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/synth_checkpoint.h"
#include "model/synth_weights.h"
#include "runtime/session.h"
#include "test_util.h"

static const int32_t ids[] = {2, 17, 400, 5, 999, 63, 1, 250};
#define N_IDS ((int)(sizeof ids / sizeof ids[0]))

/* Logits of every position of `ids` (malloc'd), NULL on failure. */
static float *all_logits(const g4_model *m) {
    const int V = m->config.text.vocab_size;
    g4_session_options opt = {.n_ctx = 32};
    g4_session *s;
    float *logits = malloc((size_t)N_IDS * V * sizeof *logits);
    if (!logits || g4_session_create(m, &opt, &s) != G4_OK) {
        free(logits);
        return NULL;
    }
    g4_status st = g4_session_eval(s, ids, N_IDS, NULL, G4_LOGITS_ALL, logits);
    g4_session_destroy(s);
    if (st != G4_OK) {
        free(logits);
        return NULL;
    }
    return logits;
}

static void roundtrip(g4_backend *be, const char *label, const char *json, size_t len, const char *format) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("synth_roundtrip"));
    size_t k = strlen(dir);
    snprintf(dir + k, sizeof dir - k, "_%s_%s", label, format);
    g4_model *mem = NULL, *disk = NULL;
    g4_status st = g4_model_synthesize_json(json, len, label, format, be, NULL, &mem);
    CHECK(st == G4_OK, "%s %s: synthesize: %s", label, format, g4_error_message());
    g4_synth_checkpoint_info info;
    if (st == G4_OK) {
        st = g4_synth_checkpoint_write(json, len, label, format, dir, NULL, &info);
        CHECK(st == G4_OK, "%s %s: write: %s", label, format, g4_error_message());
    }
    if (st == G4_OK) {
        st = g4_model_load_dir(dir, be, &disk);
        CHECK(st == G4_OK, "%s %s: loading the written checkpoint: %s", label, format, g4_error_message());
    }
    if (st == G4_OK) {
        int quantised = strcmp(format, "bf16") != 0;
        CHECK(disk->layout == (quantised ? G4_LAYOUT_MLX : G4_LAYOUT_HF), "%s %s: detected as the wrong layout",
              label, format);
        CHECK(!strcmp(disk->text_prefix, quantised ? "language_model.model." : "model.language_model."),
              "%s %s: text tensors under %s", label, format, disk->text_prefix);
        CHECK(disk->n_unused_tensors == 0, "%s %s: %zu tensors written but not used", label, format,
              disk->n_unused_tensors);
        CHECK(g4_st_count(disk->tensors) == info.n_tensors && g4_st_total_bytes(disk->tensors) == info.tensor_bytes,
              "%s %s: file holds %zu tensors, %llu bytes; writer said %zu, %llu", label, format,
              g4_st_count(disk->tensors), (unsigned long long)g4_st_total_bytes(disk->tensors), info.n_tensors,
              (unsigned long long)info.tensor_bytes);
        CHECK(disk->n_params == mem->n_params, "%s %s: %llu parameters loaded, %llu synthesized", label, format,
              (unsigned long long)disk->n_params, (unsigned long long)mem->n_params);
        CHECK(!memcmp(disk->weight_bytes_by_format, mem->weight_bytes_by_format, sizeof mem->weight_bytes_by_format),
              "%s %s: weight bytes by format differ", label, format);
        uint64_t quant_bytes = disk->weight_bytes_by_format[G4_WEIGHT_AFFINE] + disk->weight_bytes_by_format[G4_WEIGHT_MXFP4];
        CHECK(quantised ? quant_bytes > 0 : quant_bytes == 0, "%s %s: %llu bytes of quantised weights", label, format,
              (unsigned long long)quant_bytes);
        /* MLX leaves a matrix whose columns are no multiple of the group
         * size in bf16: here only down_proj of an MLP width like 160 */
        uint64_t odd_bytes = 0;
        for (int l = 0; l < mem->config.text.n_layers; l++) {
            int64_t width = mem->config.text.layers[l].mlp_width;
            if (width % 64) odd_bytes += (uint64_t)width * (uint64_t)mem->config.text.hidden_size * 2;
        }
        if (quantised)
            CHECK(disk->weight_bytes_by_format[G4_WEIGHT_BF16] == odd_bytes,
                  "%s %s: %llu bytes of bf16 matrices; expected %llu (down_proj of odd MLP widths)", label, format,
                  (unsigned long long)disk->weight_bytes_by_format[G4_WEIGHT_BF16], (unsigned long long)odd_bytes);
        const int V = mem->config.text.vocab_size;
        float *a = all_logits(mem), *b = all_logits(disk);
        CHECK(a && b, "%s %s: logits failed: %s", label, format, g4_error_message());
        if (a && b) {
            size_t differ = 0, n = (size_t)N_IDS * V;
            for (size_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof *a) != 0;
            CHECK(differ == 0, "%s %s: %zu of %zu logits differ (max |diff| %g)", label, format, differ, n,
                  test_max_abs_diff(a, b, n));
            double spread = 0;
            for (int i = 1; i < V; i++) spread += a[i] != a[0];
            CHECK(spread > 0, "%s %s: logits are all equal: the check proves nothing", label, format);
        }
        free(a);
        free(b);
    }
    g4_model_release(disk);
    g4_model_release(mem);
}

static char *fixture_config(const char *fixture, size_t *len) {
    char path[1024], *json = NULL;
    snprintf(path, sizeof path, "%s/config.json", test_fixture(fixture));
    g4_status st = g4_read_file(path, 1 << 20, &json, len);
    CHECK(st == G4_OK, "%s: %s", path, g4_error_message());
    return json;
}

/* The dense fixture with an MLP width of 160: down_proj's 160 columns are no
 * multiple of 64, so MLX keeps it in bf16 inside a 4-bit checkpoint. */
static char *odd_width_config(size_t *len) {
    char *json = fixture_config("dense", len);
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    if (!root) return NULL;
    cJSON *text = cJSON_GetObjectItem(root, "text_config");
    cJSON_ReplaceItemInObject(text, "intermediate_size", cJSON_CreateNumber(160));
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    *len = out ? strlen(out) : 0;
    return out;
}

/* Entries of two quantization blocks match: numbers and strings equal,
 * per-module objects with the same group_size, bits and mode. */
static int same_entry(const cJSON *a, const cJSON *b) {
    if (!a || !b) return 0;
    if (cJSON_IsNumber(a)) return cJSON_IsNumber(b) && a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a)) return cJSON_IsString(b) && !strcmp(a->valuestring, b->valuestring);
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) return 0;
    const char *keys[] = {"group_size", "bits", "mode"};
    for (int k = 0; k < 3; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, keys[k]), *y = cJSON_GetObjectItemCaseSensitive(b, keys[k]);
        if (!x != !y || (x && !same_entry(x, y))) return 0;
    }
    return 1;
}

/* The compiled-in mlx-community configs (e2b, e4b, 26b-a4b 4-bit: the real
 * release files) carry MLX's recipe in "quantization"; the block written for
 * a synthetic checkpoint comes from what the loader quantised how, and must
 * equal it entry for entry (26b-a4b: 8-bit dense MLPs and routers). */
static void check_preset_quant_blocks(void) {
    const char *presets[] = {"e2b", "e4b", "26b-a4b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const char *json;
        size_t len;
        char *written = NULL;
        g4_status st = g4_model_preset_config(presets[i], "mlx4", &json, &len);
        if (st == G4_OK) st = g4_synth_checkpoint_config(json, len, presets[i], "mlx4", &written);
        CHECK(st == G4_OK, "%s: %s", presets[i], g4_error_message());
        if (st != G4_OK) continue;
        cJSON *ref = cJSON_ParseWithLength(json, len), *got = cJSON_Parse(written);
        const cJSON *rq = cJSON_GetObjectItemCaseSensitive(ref, "quantization");
        const cJSON *gq = cJSON_GetObjectItemCaseSensitive(got, "quantization");
        CHECK(rq && gq, "%s: quantization block missing", presets[i]);
        if (rq && gq) {
            int n_ref = cJSON_GetArraySize(rq), n_got = cJSON_GetArraySize(gq), differ = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, rq) {
                if (!same_entry(e, cJSON_GetObjectItemCaseSensitive(gq, e->string))) {
                    if (differ++ < 3) fprintf(stderr, "  %s: entry %s differs\n", presets[i], e->string);
                }
            }
            CHECK(n_ref == n_got && differ == 0, "%s: %d entries written, %d in the mlx-community config, %d differ",
                  presets[i], n_got, n_ref, differ);
            CHECK(cJSON_Compare(gq, cJSON_GetObjectItemCaseSensitive(got, "quantization_config"), 1),
                  "%s: quantization_config is not a copy of quantization", presets[i]);
        }
        CHECK(!cJSON_GetObjectItemCaseSensitive(got, "vision_config") &&
                  !cJSON_GetObjectItemCaseSensitive(got, "audio_config"),
              "%s: tower configs kept though no tower is written", presets[i]);
        cJSON_Delete(ref);
        cJSON_Delete(got);
        free(written);
    }
}

/* Fields the Gemma 4 config classes type as float are written as JSON
 * floats (30.0, not 30): transformers' strict config classes refuse an
 * integer there ("expected float, got int (value: 30)"), and cJSON prints
 * 30.0 as 30 unless told otherwise. */
static int float_text(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == ':') p++;
    const size_t n = strspn(p, "-+0123456789.eE");
    return memchr(p, '.', n) || memchr(p, 'e', n) || memchr(p, 'E', n);
}

/* occurrences of "key" in text, and how many of them hold a float */
static int count_values(const char *text, const char *key, int *floats) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    int n = 0;
    *floats = 0;
    for (const char *p = strstr(text, quoted); p; p = strstr(p + 1, quoted), n++)
        *floats += float_text(p + strlen(quoted));
    return n;
}

static void check_float_fields(void) {
    const char *presets[] = {"e2b", "e4b", "26b-a4b", "31b", "12b"};
    const char *keys[] = {"final_logit_softcapping", "rope_theta", "rms_norm_eps", "partial_rotary_factor",
                          "initializer_range"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const char *json;
        size_t len;
        char *written = NULL;
        g4_status st = g4_model_preset_config(presets[i], "bf16", &json, &len);
        if (st == G4_OK) st = g4_synth_checkpoint_config(json, len, presets[i], "bf16", &written);
        CHECK(st == G4_OK, "%s: %s", presets[i], g4_error_message());
        if (st != G4_OK) continue;
        int total = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            int floats;
            const int n = count_values(written, keys[k], &floats);
            total += n;
            CHECK(floats == n, "%s: %d of the %d values of %s written as floats", presets[i], floats, n, keys[k]);
        }
        CHECK(total >= 4, "%s: the written config has the float fields (%d found)", presets[i], total);
        free(written);
    }
}

static void check_fill_pieces(void) {
    const size_t n = 3 * G4_SYNTH_BLOCK_BYTES + 4098;
    unsigned char *whole = malloc(n), *pieces = malloc(n);
    if (!whole || !pieces) abort();
    for (int fill = G4_SYNTH_WEIGHTS; fill <= G4_SYNTH_ONES; fill++) {
        g4_synth_fill_bytes((g4_synth_fill)fill, 1234, 0, whole, n);
        for (size_t at = 0; at < n; at += G4_SYNTH_BLOCK_BYTES) {
            size_t piece = n - at < G4_SYNTH_BLOCK_BYTES ? n - at : G4_SYNTH_BLOCK_BYTES;
            g4_synth_fill_bytes((g4_synth_fill)fill, 1234, at, pieces + at, piece);
        }
        CHECK(!memcmp(whole, pieces, n), "fill %d: made in pieces differs from made whole", fill);
        size_t zeros = 0;
        for (size_t i = 0; i < n; i++) zeros += whole[i] == 0;
        CHECK(zeros < n / 8, "fill %d: %zu of %zu bytes are zero", fill, zeros, n);
    }
    free(whole);
    free(pieces);
}

static void check_stream_writer(void) {
    const char *path = test_tmp_path("synth_stream.safetensors");
    uint16_t a[5] = {1, 2, 3, 4, 5};
    uint32_t b[3] = {7, 8, 9};
    g4_st_write_item items[2] = {{.name = "a", .dtype = G4_DTYPE_BF16, .ndim = 1, .shape = {5}},
                                 {.name = "b", .dtype = G4_DTYPE_U32, .ndim = 2, .shape = {1, 3}}};
    /* in pieces, in the order asked for (the 4-byte tensor first) */
    g4_st_stream *s;
    g4_status st = g4_st_stream_open(path, items, 2, &s);
    CHECK(st == G4_OK, "stream open: %s", g4_error_message());
    if (st != G4_OK) return;
    uint64_t done = 9, total = 0;
    CHECK(g4_st_stream_next(s, &done, &total) == 1 && done == 0 && total == 12, "first due: not b's 12 bytes");
    st = g4_st_stream_write(s, b, 5);
    if (st == G4_OK) st = g4_st_stream_write(s, (const unsigned char *)b + 5, 7);
    CHECK(g4_st_stream_next(s, &done, &total) == 0 && done == 0 && total == 10, "second due: not a's 10 bytes");
    if (st == G4_OK) st = g4_st_stream_write(s, a, 10);
    CHECK(g4_st_stream_next(s, NULL, NULL) == 2, "not finished after all bytes");
    g4_status closed = g4_st_stream_close(s);
    CHECK(st == G4_OK && closed == G4_OK, "stream write: %s", g4_error_message());
    g4_st_set *set;
    if (g4_st_open(path, &set) == G4_OK) {
        const g4_st_tensor *ta = g4_st_find(set, "a"), *tb = g4_st_find(set, "b");
        CHECK(ta && tb && !memcmp(ta->data, a, sizeof a) && !memcmp(tb->data, b, sizeof b),
              "streamed file does not read back");
        g4_st_close(set);
    } else {
        CHECK(0, "streamed file does not open: %s", g4_error_message());
    }
    /* too many bytes, and closing early */
    const char *path2 = test_tmp_path("synth_stream_short.safetensors");
    if (g4_st_stream_open(path2, items, 2, &s) == G4_OK) {
        CHECK(g4_st_stream_write(s, b, 13) != G4_OK, "a piece past the tensor's end accepted");
        CHECK(g4_st_stream_close(s) != G4_OK, "a stream with a failed write closed fine");
    }
    if (g4_st_stream_open(path2, items, 2, &s) == G4_OK) {
        (void)g4_st_stream_write(s, b, 12);
        st = g4_st_stream_close(s);
        CHECK(st != G4_OK && strstr(g4_error_message(), "before all tensors"), "closing early: %s",
              g4_error_message());
    }
    CHECK(!g4_file_exists(path2), "a partial file was left behind");
}

int main(void) {
    check_fill_pieces();
    check_stream_writer();
    check_preset_quant_blocks();
    check_float_fields();
    g4_backend *be;
    if (g4_backend_cpu_create(0, &be) != G4_OK) {
        fprintf(stderr, "cpu backend: %s\n", g4_error_message());
        return 1;
    }
    const struct {
        const char *fixture;
        const char *formats[4];
    } cases[] = {{"dense", {"bf16", "mlx4", "mlx8"}},
                 {"e2b", {"bf16", "mlx4"}},
                 {"moe", {"bf16", "mlx4", "mxfp4"}},
                 {"unified", {"bf16", "mlx4"}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = 0;
        char *json = fixture_config(cases[c].fixture, &len);
        for (int f = 0; json && f < 4 && cases[c].formats[f]; f++)
            roundtrip(be, cases[c].fixture, json, len, cases[c].formats[f]);
        free(json);
    }
    size_t len = 0;
    char *odd = odd_width_config(&len);
    CHECK(odd != NULL && strstr(odd, "\"intermediate_size\":160"), "odd-width config");
    if (odd) {
        roundtrip(be, "odd-width", odd, len, "bf16");
        roundtrip(be, "odd-width", odd, len, "mlx4");
    }
    free(odd);
    g4_backend_destroy(be);
    return test_finish();
}
