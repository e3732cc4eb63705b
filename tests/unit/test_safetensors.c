/* safetensors reader and writer against Python `safetensors`:
 * - every vendored fixture opens and matches what Python reports (names,
 *   dtypes, shapes, CRC-32 of each tensor's bytes, leading/trailing values;
 *   tests/data/safetensors/NAME.json from tests/tools/make_safetensors_refs.py);
 * - a file written by Python safetensors reads back exactly;
 * - g4_st_write round-trips through our reader (and, in
 *   tests/scripts/test_safetensors_python.py, through Python's);
 * - malformed files and indexes are refused with a message naming the file
 *   and the problem. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------- */

static const char *data_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TEST_DATA");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", root ? root : "tests/data", rel);
    return b;
}

static cJSON *load_json(const char *path) {
    char *text;
    size_t len;
    if (g4_read_file(path, 64u << 20, &text, &len) != G4_OK) {
        fprintf(stderr, "cannot read %s: %s\n", path, g4_error_message());
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

static uint32_t crc32_bytes(const unsigned char *p, uint64_t n) {
    uint32_t c = 0xffffffffu;
    for (uint64_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

static int is_float_dtype(g4_dtype t) {
    return t == G4_DTYPE_F64 || t == G4_DTYPE_F32 || t == G4_DTYPE_F16 || t == G4_DTYPE_BF16;
}

/* Element i as a double (exact for every float dtype). */
static double float_element(const g4_st_tensor *t, size_t i) {
    if (t->dtype == G4_DTYPE_F64) {
        double v;
        memcpy(&v, t->data + 8 * i, 8);
        return v;
    }
    if (t->dtype == G4_DTYPE_BF16) { /* decoded here, independently of dtype.c */
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return g4_load_as_f32(t->data, t->dtype, i);
}

/* Element i of an integer tensor, printed in decimal. */
static void int_element(const g4_st_tensor *t, size_t i, char *out, size_t cap) {
    const unsigned char *p = t->data + g4_dtype_size(t->dtype) * i;
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 1;
    switch (t->dtype) {
    case G4_DTYPE_I64: memcpy(&s, p, 8); break;
    case G4_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case G4_DTYPE_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case G4_DTYPE_I8: s = (int8_t)p[0]; break;
    case G4_DTYPE_U64: memcpy(&u, p, 8); is_signed = 0; break;
    case G4_DTYPE_U32: { uint32_t v; memcpy(&v, p, 4); u = v; is_signed = 0; break; }
    case G4_DTYPE_U16: { uint16_t v; memcpy(&v, p, 2); u = v; is_signed = 0; break; }
    default: u = p[0]; is_signed = 0; break; /* U8, BOOL */
    }
    if (is_signed)
        snprintf(out, cap, "%lld", (long long)s);
    else
        snprintf(out, cap, "%llu", (unsigned long long)u);
}

/* Does element i equal the JSON value written by the Python tool? */
static int element_matches(const g4_st_tensor *t, size_t i, const cJSON *want) {
    if (is_float_dtype(t->dtype)) {
        double v = float_element(t, i);
        if (cJSON_IsString(want)) {
            if (!strcmp(want->valuestring, "nan")) return isnan(v);
            if (!strcmp(want->valuestring, "inf")) return isinf(v) && v > 0;
            if (!strcmp(want->valuestring, "-inf")) return isinf(v) && v < 0;
            return 0;
        }
        return cJSON_IsNumber(want) && v == want->valuedouble;
    }
    char got[32], expect[32];
    int_element(t, i, got, sizeof got);
    if (cJSON_IsString(want))
        snprintf(expect, sizeof expect, "%s", want->valuestring);
    else if (cJSON_IsNumber(want))
        snprintf(expect, sizeof expect, "%.0f", want->valuedouble);
    else
        return 0;
    return !strcmp(got, expect);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Compares one tensor with its reference entry; returns the failures. */
static int check_tensor(const g4_st_set *set, const cJSON *ref, const char *file, const char *where) {
    int before = test_failed;
    const char *name = cJSON_GetObjectItem(ref, "name")->valuestring;
    const g4_st_tensor *t = g4_st_find(set, name);
    CHECK(t != NULL, "%s: tensor %s missing", where, name);
    if (!t) return 1;
    CHECK(!strcmp(g4_dtype_name(t->dtype), cJSON_GetObjectItem(ref, "dtype")->valuestring), "%s: %s dtype %s",
          where, name, g4_dtype_name(t->dtype));
    const cJSON *shape = cJSON_GetObjectItem(ref, "shape");
    int shape_ok = t->ndim == cJSON_GetArraySize(shape);
    for (int d = 0; shape_ok && d < t->ndim; d++)
        shape_ok = t->shape[d] == (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble;
    CHECK(shape_ok, "%s: %s shape differs (ndim %d)", where, name, t->ndim);
    CHECK(t->nbytes == (uint64_t)cJSON_GetObjectItem(ref, "nbytes")->valuedouble, "%s: %s nbytes %llu", where,
          name, (unsigned long long)t->nbytes);
    CHECK(!strcmp(base_name(g4_st_file_path(set, t->file)), file), "%s: %s is in %s, Python says %s", where, name,
          g4_st_file_path(set, t->file), file);
    if (t->nbytes != (uint64_t)cJSON_GetObjectItem(ref, "nbytes")->valuedouble) return 1;
    CHECK(crc32_bytes(t->data, t->nbytes) == (uint32_t)cJSON_GetObjectItem(ref, "crc32")->valuedouble,
          "%s: %s bytes differ (CRC-32)", where, name);
    size_t n = (size_t)cJSON_GetObjectItem(ref, "n_elements")->valuedouble;
    const cJSON *first = cJSON_GetObjectItem(ref, "first");
    const cJSON *last = cJSON_GetObjectItem(ref, "last");
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, first) {
        CHECK(element_matches(t, (size_t)i, v), "%s: %s element %d", where, name, i);
        i++;
    }
    int n_last = cJSON_GetArraySize(last);
    i = 0;
    cJSON_ArrayForEach(v, last) {
        size_t at = n - (size_t)n_last + (size_t)i++;
        CHECK(element_matches(t, at, v), "%s: %s element %zu", where, name, at);
    }
    return test_failed - before;
}

/* ---- every fixture against Python's view of it -------------------------- */

static void check_fixture(const char *fixture) {
    char rel[256];
    snprintf(rel, sizeof rel, "safetensors/%s.json", fixture);
    cJSON *ref = load_json(data_path(rel));
    CHECK(ref != NULL, "%s: reference JSON", fixture);
    if (!ref) return;
    const char *dir = test_fixture(fixture);

    g4_st_set *model = NULL;
    g4_status st = g4_st_open(dir, &model);
    CHECK(st == G4_OK, "%s: open: %s", fixture, g4_error_message());
    if (st != G4_OK) {
        cJSON_Delete(ref);
        return;
    }
    size_t model_tensors = 0;
    int model_files = 0, failures = 0;
    uint64_t model_bytes = 0;
    const cJSON *file;
    cJSON_ArrayForEach(file, cJSON_GetObjectItem(ref, "files")) {
        const char *name = cJSON_GetObjectItem(file, "file")->valuestring;
        const cJSON *tensors = cJSON_GetObjectItem(file, "tensors");
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        /* Each file on its own, too. */
        g4_st_set *single = NULL;
        st = g4_st_open(path, &single);
        CHECK(st == G4_OK, "%s: open: %s", path, g4_error_message());
        if (st != G4_OK) continue;
        CHECK(g4_st_count(single) == (size_t)cJSON_GetArraySize(tensors), "%s: %zu tensors, Python says %d",
              path, g4_st_count(single), cJSON_GetArraySize(tensors));
        CHECK(g4_st_file_count(single) == 1, "%s: file count", path);
        const cJSON *t;
        cJSON_ArrayForEach(t, tensors) failures += check_tensor(single, t, name, path);
        g4_st_close(single);
        if (!strcmp(name, "ref.safetensors")) continue;
        /* ... and as part of the checkpoint the directory opens as. */
        model_files++;
        model_tensors += (size_t)cJSON_GetArraySize(tensors);
        cJSON_ArrayForEach(t, tensors) {
            model_bytes += (uint64_t)cJSON_GetObjectItem(t, "nbytes")->valuedouble;
            failures += check_tensor(model, t, name, dir);
        }
    }
    CHECK(g4_st_count(model) == model_tensors, "%s: %zu tensors, Python says %zu", fixture, g4_st_count(model),
          model_tensors);
    CHECK(g4_st_file_count(model) == model_files, "%s: %d files, expected %d", fixture, g4_st_file_count(model),
          model_files);
    CHECK(g4_st_total_bytes(model) == model_bytes, "%s: total bytes", fixture);
    CHECK(g4_st_find(model, "no.such.tensor") == NULL, "%s: lookup of an absent name", fixture);
    /* Sharded: every weight_map entry is in the shard it names. */
    const cJSON *map = cJSON_GetObjectItem(ref, "weight_map");
    if (map) {
        CHECK(cJSON_GetArraySize(map) == (int)model_tensors, "%s: weight_map size", fixture);
        const cJSON *e;
        cJSON_ArrayForEach(e, map) {
            const g4_st_tensor *t = g4_st_find(model, e->string);
            CHECK(t && !strcmp(base_name(g4_st_file_path(model, t->file)), e->valuestring), "%s: %s shard",
                  fixture, e->string);
        }
    }
    printf("%-10s %d file(s), %zu tensors, %llu bytes: %s\n", fixture, model_files, model_tensors,
           (unsigned long long)model_bytes, failures ? "MISMATCH" : "match Python safetensors");
    g4_st_close(model);
    cJSON_Delete(ref);
}

/* The moe shards without their index open as model-*-of-* shards. */
static void check_unindexed_shards(void) {
    const char *dir = test_tmp_path("st_unindexed");
    mkdir(dir, 0755);
    for (int i = 1; i <= 6; i++) {
        char name[64], src[1200], dst[1200];
        snprintf(name, sizeof name, "model-%05d-of-00006.safetensors", i);
        snprintf(src, sizeof src, "%s/%s", test_fixture("moe"), name);
        snprintf(dst, sizeof dst, "%s/%s", dir, name);
        unlink(dst);
        CHECK(symlink(src, dst) == 0, "symlink %s", dst);
    }
    g4_st_set *a = NULL, *b = NULL;
    CHECK(g4_st_open(dir, &a) == G4_OK, "unindexed shards: %s", g4_error_message());
    CHECK(g4_st_open(test_fixture("moe"), &b) == G4_OK, "moe: %s", g4_error_message());
    if (a && b) {
        CHECK(g4_st_count(a) == g4_st_count(b) && g4_st_count(a) == 219, "unindexed: %zu tensors",
              g4_st_count(a));
        CHECK(g4_st_file_count(a) == 6, "unindexed: %d files", g4_st_file_count(a));
        int same = 1;
        for (size_t i = 0; i < g4_st_count(b); i++) {
            const g4_st_tensor *x = g4_st_at(b, i), *y = g4_st_find(a, x->name);
            same &= y && y->nbytes == x->nbytes && !memcmp(y->data, x->data, x->nbytes) &&
                    !strcmp(base_name(g4_st_file_path(a, y->file)), base_name(g4_st_file_path(b, x->file)));
        }
        CHECK(same, "unindexed shards hold the same tensors in the same files");
    }
    g4_st_close(a);
    g4_st_close(b);

    /* A shard missing from the series (an interrupted download) is an error. */
    char gone[1200];
    snprintf(gone, sizeof gone, "%s/model-00004-of-00006.safetensors", dir);
    unlink(gone);
    a = NULL;
    CHECK(g4_st_open(dir, &a) != G4_OK && strstr(g4_error_message(), dir) &&
              strstr(g4_error_message(), "shard 4 of 6 is missing"),
          "unindexed shards with one missing: '%s'", g4_error_message());
    g4_st_close(a);
    snprintf(gone, sizeof gone, "%s/model-00006-of-00006.safetensors", dir);
    unlink(gone);
    snprintf(gone, sizeof gone, "%s/model-00004-of-00006.safetensors", dir);
    char src[1200];
    snprintf(src, sizeof src, "%s/model-00004-of-00006.safetensors", test_fixture("moe"));
    CHECK(symlink(src, gone) == 0, "symlink %s", gone);
    a = NULL;
    CHECK(g4_st_open(dir, &a) != G4_OK && strstr(g4_error_message(), "found 5 of 6 shards"),
          "unindexed shards without the last: '%s'", g4_error_message());
    g4_st_close(a);
    /* Series are ordered by number, not by name: model-10-of-10 comes after model-2-of-10. */
    const char *dir2 = test_tmp_path("st_unpadded");
    mkdir(dir2, 0755);
    float v = 1;
    for (int i = 1; i <= 10; i++) {
        char name[64], tensor[16];
        snprintf(name, sizeof name, "model-%d-of-10.safetensors", i);
        snprintf(tensor, sizeof tensor, "t%d", i);
        g4_st_write_item item = {tensor, G4_DTYPE_F32, 1, {1}, &v};
        char *p = g4_path_join(dir2, name);
        CHECK(g4_st_write(p, &item, 1) == G4_OK, "write %s", p);
        free(p);
    }
    a = NULL;
    CHECK(g4_st_open(dir2, &a) == G4_OK && g4_st_count(a) == 10 &&
              strstr(g4_st_file_path(a, 9), "model-10-of-10.safetensors"),
          "unpadded shard numbers: %s", g4_error_message());
    g4_st_close(a);
}

/* ---- a file written by Python safetensors -------------------------------- */

static void check_python_written(void) {
    cJSON *ref = load_json(data_path("safetensors/python_written.json"));
    CHECK(ref != NULL, "python_written.json");
    if (!ref) return;
    g4_st_set *set = NULL;
    g4_status st = g4_st_open(data_path("safetensors/python_written.safetensors"), &set);
    CHECK(st == G4_OK, "python_written: %s", g4_error_message());
    if (st == G4_OK) {
        const cJSON *tensors = cJSON_GetObjectItem(ref, "tensors");
        CHECK(g4_st_count(set) == (size_t)cJSON_GetArraySize(tensors), "python_written: %zu tensors",
              g4_st_count(set));
        const cJSON *r;
        cJSON_ArrayForEach(r, tensors) {
            check_tensor(set, r, "python_written.safetensors", "python_written");
            const g4_st_tensor *t = g4_st_find(set, cJSON_GetObjectItem(r, "name")->valuestring);
            int i = 0, all = 1;
            const cJSON *v;
            cJSON_ArrayForEach(v, cJSON_GetObjectItem(r, "values")) all &= t && element_matches(t, (size_t)i++, v);
            CHECK(all, "python_written: every value of %s", cJSON_GetObjectItem(r, "name")->valuestring);
        }
        const g4_st_tensor *scalar = g4_st_find(set, "scalar");
        CHECK(scalar && scalar->ndim == 0 && scalar->nbytes == 4, "0-d tensor has ndim 0 and one element");
        const g4_st_tensor *empty = g4_st_find(set, "empty");
        CHECK(empty && empty->ndim == 2 && empty->nbytes == 0, "empty tensor has 0 bytes");
    }
    g4_st_close(set);
    cJSON_Delete(ref);
}

/* ---- g4_st_write round trip ---------------------------------------------- */
/* tests/scripts/test_safetensors_python.py reads the same file with Python
 * safetensors and checks these values: keep the two in step. */

static const float roundtrip_bf16_values[6] = {1.0f, -2.5f, 3.25f, 0.0078125f, -8589934592.0f, 65280.0f};

static void check_roundtrip(void) {
    float f32[6];
    for (int i = 0; i < 6; i++) f32[i] = (float)i * 0.5f - 1.0f;
    int32_t i32[4] = {INT32_MIN, -1, 0, INT32_MAX};
    uint16_t bf16[6];
    for (int i = 0; i < 6; i++) bf16[i] = g4_f32_to_bf16(roundtrip_bf16_values[i]);
    float scalar = 42.5f;
    uint8_t u8[3] = {1, 2, 255};
    /* u8 first: an odd-sized tensor ahead of wider ones must not misalign them. */
    g4_st_write_item items[] = {
        {"u8", G4_DTYPE_U8, 1, {3}, u8},
        {"f32", G4_DTYPE_F32, 2, {2, 3}, f32},
        {"i32", G4_DTYPE_I32, 1, {4}, i32},
        {"bf16", G4_DTYPE_BF16, 2, {3, 2}, bf16},
        {"scalar", G4_DTYPE_F32, 0, {0}, &scalar},
        {"empty_f32", G4_DTYPE_F32, 2, {0, 5}, NULL},
        {"empty_i32", G4_DTYPE_I32, 2, {3, 0}, NULL},
    };
    const size_t n_items = sizeof items / sizeof items[0];
    const char *path = test_tmp_path("st_roundtrip.safetensors");
    g4_status st = g4_st_write(path, items, n_items);
    CHECK(st == G4_OK, "write: %s", g4_error_message());
    g4_st_set *set = NULL;
    st = g4_st_open(path, &set);
    CHECK(st == G4_OK, "read back: %s", g4_error_message());
    if (st != G4_OK) return;
    CHECK(g4_st_count(set) == n_items, "round trip: %zu tensors", g4_st_count(set));
    for (size_t k = 0; k < n_items; k++) {
        const g4_st_tensor *t = g4_st_find(set, items[k].name);
        CHECK(t != NULL, "round trip: %s missing", items[k].name);
        if (!t) continue;
        CHECK(t->dtype == items[k].dtype && t->ndim == items[k].ndim, "round trip: %s dtype/ndim", items[k].name);
        uint64_t elements = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == items[k].shape[d], "round trip: %s dim %d", items[k].name, d);
            elements *= (uint64_t)items[k].shape[d];
        }
        CHECK(t->nbytes == elements * g4_dtype_size(t->dtype), "round trip: %s bytes", items[k].name);
        if (t->nbytes) CHECK(!memcmp(t->data, items[k].data, t->nbytes), "round trip: %s values", items[k].name);
        /* Naturally aligned in the map, so typed loads are valid. */
        CHECK(((uintptr_t)t->data % g4_dtype_size(t->dtype)) == 0, "round trip: %s aligned", items[k].name);
    }
    const g4_st_tensor *b = g4_st_find(set, "bf16");
    int bf_ok = b != NULL;
    for (int i = 0; bf_ok && i < 6; i++) bf_ok = float_element(b, (size_t)i) == roundtrip_bf16_values[i];
    CHECK(bf_ok, "round trip: bf16 values exact");
    g4_st_close(set);

    /* An empty set writes a valid empty file. */
    const char *empty_path = test_tmp_path("st_roundtrip_empty.safetensors");
    CHECK(g4_st_write(empty_path, NULL, 0) == G4_OK, "write empty: %s", g4_error_message());
    set = NULL;
    CHECK(g4_st_open(empty_path, &set) == G4_OK && g4_st_count(set) == 0, "empty file reads back with 0 tensors");
    g4_st_close(set);
}

static void check_write_rejects(void) {
    float x[2] = {1, 2};
    const char *path = test_tmp_path("st_write_bad.safetensors");
    struct {
        const char *what;
        g4_st_write_item items[2];
        size_t n;
        const char *want;
    } cases[] = {
        {"negative dim", {{"a", G4_DTYPE_F32, 1, {-2}, x}}, 1, "shape"},
        {"too many dims", {{"a", G4_DTYPE_F32, 9, {1}, x}}, 1, "dimensions"},
        {"invalid dtype", {{"a", G4_DTYPE_INVALID, 1, {2}, x}}, 1, "dtype"},
        {"no data", {{"a", G4_DTYPE_F32, 1, {2}, NULL}}, 1, "no data"},
        {"no name", {{NULL, G4_DTYPE_F32, 1, {2}, x}}, 1, "name"},
        {"reserved name", {{"__metadata__", G4_DTYPE_F32, 1, {2}, x}}, 1, "__metadata__"},
        {"duplicate", {{"a", G4_DTYPE_F32, 1, {2}, x}, {"a", G4_DTYPE_F32, 1, {1}, x}}, 2, "twice"},
        {"overflow", {{"a", G4_DTYPE_F32, 3, {INT64_MAX, INT64_MAX, 2}, x}}, 1, "overflow"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(path);
        g4_status st = g4_st_write(path, cases[i].items, cases[i].n);
        CHECK(st != G4_OK, "write %s: accepted", cases[i].what);
        CHECK(strstr(g4_error_message(), path) && strstr(g4_error_message(), cases[i].want),
              "write %s: message '%s' lacks the path or '%s'", cases[i].what, g4_error_message(), cases[i].want);
        CHECK(!g4_file_exists(path), "write %s: left a file behind", cases[i].what);
    }
}

/* ---- malformed files ------------------------------------------------------ */

static void put_u64_le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void write_bytes(const char *path, const void *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(0, "cannot create %s", path);
        return;
    }
    if (len) fwrite(bytes, 1, len, f);
    fclose(f);
}

/* Expects `path` to be refused by g4_st_open with a message naming the path
 * and containing `want`. */
static void expect_open_fails(const char *what, const char *path, const char *want) {
    g4_st_set *set = NULL;
    g4_status st = g4_st_open(path, &set);
    CHECK(st != G4_OK, "%s: accepted", what);
    CHECK(set == NULL, "%s: set returned on failure", what);
    g4_st_close(set);
    const char *msg = g4_error_message();
    CHECK(strstr(msg, path) != NULL, "%s: message '%s' does not name %s", what, msg, path);
    CHECK(strstr(msg, want) != NULL, "%s: message '%s' lacks '%s'", what, msg, want);
}

/* A file from a header text and `data_len` data bytes (0, 1, 2, ...). */
static void expect_header_fails(const char *what, const char *header, size_t data_len, const char *want) {
    size_t hlen = strlen(header);
    unsigned char *buf = malloc(8 + hlen + data_len + 1);
    put_u64_le(buf, hlen);
    memcpy(buf + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++) buf[8 + hlen + i] = (unsigned char)i;
    char name[128];
    snprintf(name, sizeof name, "st_bad_%s.safetensors", what);
    for (char *c = name; *c; c++)
        if (*c == ' ' || *c == '/') *c = '_';
    const char *path = test_tmp_path(name);
    write_bytes(path, buf, 8 + hlen + data_len);
    expect_open_fails(what, path, want);
    /* g4_st_parse on the bytes gives the same verdict, labelled as asked. */
    g4_st_tensor *t = NULL;
    size_t n = 99;
    CHECK(g4_st_parse(buf, 8 + hlen + data_len, "LABEL", &t, &n) != G4_OK && t == NULL && n == 0,
          "%s: g4_st_parse accepted", what);
    CHECK(strstr(g4_error_message(), "LABEL") && strstr(g4_error_message(), want), "%s: parse message '%s'", what,
          g4_error_message());
    free(buf);
}

static void expect_header_ok(const char *what, const char *header, size_t data_len, size_t n_tensors) {
    size_t hlen = strlen(header);
    unsigned char *buf = calloc(1, 8 + hlen + data_len);
    put_u64_le(buf, hlen);
    memcpy(buf + 8, header, hlen);
    g4_st_tensor *t = NULL;
    size_t n = 0;
    g4_status st = g4_st_parse(buf, 8 + hlen + data_len, what, &t, &n);
    CHECK(st == G4_OK && n == n_tensors, "%s: refused (%s) or %zu tensors", what, g4_error_message(), n);
    g4_st_free_tensors(t, n);
    free(buf);
}

static void check_bad_files(void) {
    const char *path = test_tmp_path("st_bad_empty.safetensors");
    write_bytes(path, "", 0);
    expect_open_fails("empty file", path, "too short");
    path = test_tmp_path("st_bad_short.safetensors");
    write_bytes(path, "\x02\0\0\0\0", 5);
    expect_open_fails("5-byte file", path, "too short");

    unsigned char hdr[16] = {0};
    put_u64_le(hdr, 1000);
    memcpy(hdr + 8, "{}      ", 8);
    path = test_tmp_path("st_bad_header_past_eof.safetensors");
    write_bytes(path, hdr, 16);
    expect_open_fails("header length past EOF", path, "past the end");
    put_u64_le(hdr, (uint64_t)200 << 20);
    path = test_tmp_path("st_bad_header_limit.safetensors");
    write_bytes(path, hdr, 16);
    expect_open_fails("header length over the limit", path, "limit");
    put_u64_le(hdr, UINT64_MAX);
    path = test_tmp_path("st_bad_header_huge.safetensors");
    write_bytes(path, hdr, 16);
    expect_open_fails("header length 2^64-1", path, "limit");

    expect_header_fails("zero header", "", 0, "not valid JSON");
    expect_header_fails("not json", "{\"a\": {\"dtype\": ", 0, "not valid JSON");
    expect_header_fails("trailing garbage", "{} x", 0, "after the JSON header");
    expect_header_fails("not an object", "[1, 2]", 0, "not a JSON object");
    expect_header_fails("string header", "\"hello\"", 0, "not a JSON object");
    expect_header_fails("entry not object", "{\"a\": 5}", 0, "not an object");
    expect_header_fails("no dtype", "{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype");
    expect_header_fails("dtype not string", "{\"a\": {\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                        "dtype");
    expect_header_fails("no shape", "{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "shape");
    expect_header_fails("shape not array", "{\"a\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}",
                        4, "shape");
    expect_header_fails("no offsets", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "data_offsets");
    expect_header_fails("unknown dtype", "{\"a\": {\"dtype\": \"Q4_K\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                        "unknown dtype 'Q4_K'");
    expect_header_fails("negative shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
                        4, "shape entry 0");
    expect_header_fails("float shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 1.5], \"data_offsets\": [0, 12]}}",
                        12, "shape entry 1");
    expect_header_fails("string shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [\"4\"], \"data_offsets\": [0, 16]}}",
                        16, "shape entry 0");
    expect_header_fails("huge shape", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1e30], \"data_offsets\": [0, 4]}}", 4,
                        "shape entry 0");
    expect_header_fails("shape overflow",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 16], \"data_offsets\": [0, 4]}}",
                        4, "overflows");
    expect_header_fails("byte size overflow",
                        "{\"a\": {\"dtype\": \"F64\", \"shape\": [4294967296, 1073741824], \"data_offsets\": [0, 4]}}",
                        4, "overflows");
    expect_header_fails("nine dims",
                        "{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1,
                        "dimensions");
    expect_header_fails("begin after end", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}",
                        8, "begin 8 > end 4");
    expect_header_fails("negative offset", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}",
                        4, "data_offsets");
    expect_header_fails("three offsets",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8, "data_offsets");
    expect_header_fails("float offset", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4.5]}}", 8,
                        "data_offsets");
    expect_header_fails("offsets past EOF", "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
                        12, "past the end");
    expect_header_fails("length mismatch", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 8,
                        "need 8 bytes but data_offsets give 4");
    expect_header_fails("overlap",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                        12, "overlap");
    expect_header_fails("same range",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                        8, "overlap");
    /* An empty tensor sorted between two overlapping ones must not hide the overlap. */
    expect_header_fails("overlap around empty",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                        " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
                        " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [12, 16]}}",
                        16, "overlap");
    expect_header_fails("contained",
                        "{\"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
                        " \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                        " \"c\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [8, 10]}}",
                        16, "overlap");
    expect_header_fails("duplicate name",
                        "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                        " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                        8, "'a' appears twice");
    expect_header_fails("metadata not object", "{\"__metadata__\": 5}", 0, "__metadata__");
    expect_header_fails("metadata value not string", "{\"__metadata__\": {\"format\": 5}}", 0, "__metadata__");
    expect_header_fails("metadata twice", "{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "__metadata__");

    /* Valid corner cases stay valid. */
    expect_header_ok("empty header object", "{}", 0, 0);
    expect_header_ok("padded header", "{\"__metadata__\": {\"format\": \"pt\"}}   \n\t ", 0, 0);
    expect_header_ok("empty tensors anywhere",
                     "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                     " \"z\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [8, 8]},"
                     " \"y\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]},"
                     " \"b\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [8, 12]}}",
                     12, 4);

    /* A real fixture file cut short. */
    g4_mapped_file real;
    char src[1200];
    snprintf(src, sizeof src, "%s/model.safetensors", test_fixture("dense"));
    CHECK(g4_map_file(src, &real) == G4_OK, "map %s", src);
    if (real.data) {
        path = test_tmp_path("st_bad_truncated.safetensors");
        write_bytes(path, real.data, real.size - 1000);
        expect_open_fails("truncated fixture", path, "truncated");
        write_bytes(path, real.data, 4000); /* cut inside the header */
        expect_open_fails("fixture cut inside its header", path, "past the end");
        g4_unmap_file(&real);
    }
    expect_open_fails("missing file", test_tmp_path("st_no_such_file.safetensors"), "cannot open");
}

/* ---- indexes -------------------------------------------------------------- */

static float shard_values[4] = {1, 2, 3, 4};

static void write_shard(const char *dir, const char *file, const char *tensor_a, const char *tensor_b) {
    g4_st_write_item items[2] = {
        {tensor_a, G4_DTYPE_F32, 1, {2}, shard_values},
        {tensor_b, G4_DTYPE_F32, 1, {2}, shard_values + 2},
    };
    char *path = g4_path_join(dir, file);
    CHECK(g4_st_write(path, items, tensor_b ? 2 : 1) == G4_OK, "write shard %s: %s", path, g4_error_message());
    free(path);
}

/* A fresh folder with shards s1 (a, b) and s2 (c, d) and the given index text. */
static const char *index_case(const char *name, const char *index_json) {
    static char dir[1200];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(name));
    mkdir(dir, 0755);
    const char *stale[] = {"s1.safetensors", "s2.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        char *p = g4_path_join(dir, stale[i]);
        unlink(p);
        free(p);
    }
    write_shard(dir, "s1.safetensors", "a", "b");
    write_shard(dir, "s2.safetensors", "c", "d");
    char *p = g4_path_join(dir, "model.safetensors.index.json");
    write_bytes(p, index_json, strlen(index_json));
    free(p);
    return dir;
}

static void expect_index_fails(const char *name, const char *index_json, const char *want) {
    const char *dir = index_case(name, index_json);
    char index_path[1300];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    g4_st_set *set = NULL;
    g4_status st = g4_st_open(dir, &set);
    CHECK(st != G4_OK, "index %s: accepted", name);
    const char *msg = g4_error_message();
    CHECK(strstr(msg, dir) != NULL, "index %s: message '%s' names no file in %s", name, msg, dir);
    CHECK(strstr(msg, want) != NULL, "index %s: message '%s' lacks '%s'", name, msg, want);
    g4_st_close(set);
}

static g4_status count_entry(void *ctx, const char *tensor, const char *shard) {
    (void)tensor;
    (void)shard;
    ++*(int *)ctx;
    return G4_OK;
}

static void check_indexes(void) {
    const char *good = "{\"metadata\": {}, \"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\","
                       " \"c\": \"s2.safetensors\", \"d\": \"s2.safetensors\"}}";
    const char *dir = index_case("st_index_good", good);
    g4_st_set *set = NULL;
    CHECK(g4_st_open(dir, &set) == G4_OK, "good index: %s", g4_error_message());
    if (set) {
        CHECK(g4_st_count(set) == 4 && g4_st_file_count(set) == 2, "good index: 4 tensors in 2 files");
        const g4_st_tensor *c = g4_st_find(set, "c");
        CHECK(c && !strcmp(base_name(g4_st_file_path(set, c->file)), "s2.safetensors") &&
                  float_element(c, 1) == 2.0,
              "good index: c read from s2");
    }
    g4_st_close(set);

    expect_index_fails("st_index_missing_shard",
                       "{\"weight_map\": {\"a\": \"s1.safetensors\", \"x\": \"s3.safetensors\"}}",
                       "s3.safetensors: cannot open");
    expect_index_fails("st_index_absent_tensor",
                       "{\"weight_map\": {\"a\": \"s1.safetensors\", \"ghost\": \"s2.safetensors\"}}",
                       "lists tensor 'ghost' in s2.safetensors, but no shard contains it");
    expect_index_fails("st_index_wrong_shard",
                       "{\"weight_map\": {\"a\": \"s2.safetensors\", \"c\": \"s1.safetensors\"}}",
                       "lists tensor 'a' in s2.safetensors, but it is in");
    expect_index_fails("st_index_slash", "{\"weight_map\": {\"a\": \"sub/s1.safetensors\"}}", "unsafe shard path");
    expect_index_fails("st_index_dotdot", "{\"weight_map\": {\"a\": \"..s1.safetensors\"}}", "unsafe shard path");
    expect_index_fails("st_index_parent", "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}", "unsafe shard path");
    expect_index_fails("st_index_absolute", "{\"weight_map\": {\"a\": \"/etc/passwd\"}}", "unsafe shard path");
    expect_index_fails("st_index_empty_name", "{\"weight_map\": {\"a\": \"\"}}", "unsafe shard path");
    expect_index_fails("st_index_malformed", "{\"weight_map\": {\"a\": \"s1.safetensors\",", "not valid JSON");
    expect_index_fails("st_index_no_map", "{\"metadata\": {}}", "weight_map");
    expect_index_fails("st_index_map_array", "{\"weight_map\": [\"s1.safetensors\"]}", "weight_map");
    expect_index_fails("st_index_value_number", "{\"weight_map\": {\"a\": 1}}", "not a string");
    expect_index_fails("st_index_empty_map", "{\"weight_map\": {}}", "no tensors");
    expect_index_fails("st_index_not_object", "[]", "weight_map");

    /* The same tensor in two shards. */
    dir = index_case("st_index_duplicate",
                     "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"}}");
    write_shard(dir, "s2.safetensors", "a", NULL);
    char *p = g4_path_join(dir, "model.safetensors.index.json");
    const char *dup = "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}";
    write_bytes(p, dup, strlen(dup));
    free(p);
    set = NULL;
    CHECK(g4_st_open(dir, &set) != G4_OK, "duplicate across shards: accepted");
    CHECK(strstr(g4_error_message(), "'a' appears in both") && strstr(g4_error_message(), "s1.safetensors") &&
              strstr(g4_error_message(), "s2.safetensors"),
          "duplicate across shards: message '%s'", g4_error_message());
    g4_st_close(set);

    /* g4_st_parse_index sees every entry of the real moe index. */
    char index_path[1200];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", test_fixture("moe"));
    char *text;
    size_t len;
    CHECK(g4_read_file(index_path, 1u << 20, &text, &len) == G4_OK, "read moe index");
    int n = 0;
    CHECK(g4_st_parse_index(text, len, index_path, count_entry, &n) == G4_OK && n == 219,
          "moe index: %d entries (%s)", n, g4_error_message());
    free(text);
}

int main(void) {
    const char *fixtures[] = {"dense",      "moe",      "e2b",       "realdims", "dense-mlx8",
                              "moe-mlx4",   "moe-mxfp4", "e2b-mlx4", "unified"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) check_fixture(fixtures[i]);
    check_unindexed_shards();
    check_python_written();
    check_roundtrip();
    check_write_rejects();
    check_bad_files();
    check_indexes();
    return test_finish();
}
