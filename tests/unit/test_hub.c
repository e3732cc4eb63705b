/* Hub client pieces that need no network: digests against published vectors,
 * URLs and names against what huggingface_hub computes (tests/data/hub/
 * vectors.json, written by tests/tools/gen_hub_vectors.py), and model-name
 * resolution against a cache laid out by hand. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "io/digest.h"
#include "io/hub.h"
#include "test_util.h"

static char *data_path(const char *name) {
    const char *root = getenv("G4_TEST_DATA");
    char *p = NULL;
    if (asprintf(&p, "%s/hub/%s", root ? root : "tests/data", name) < 0) return NULL;
    return p;
}

/* ---- SHA-256: FIPS 180-2 examples ---- */
static void test_sha256_vectors(void) {
    struct {
        const char *msg, *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char hex[65];
        CHECK(g4_sha256_hex(v[i].msg, strlen(v[i].msg), hex) == G4_OK, "sha256 failed");
        CHECK(!strcmp(hex, v[i].hex), "sha256(\"%s\") = %s, want %s", v[i].msg, hex, v[i].hex);
    }
    /* one million 'a', fed in uneven pieces through the streaming interface */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    g4_digest *d;
    CHECK(g4_digest_begin(&d, G4_DIGEST_SHA256, 0) == G4_OK, "begin");
    size_t pos = 0, step = 1;
    while (pos < 1000000) {
        size_t n = step < 1000000 - pos ? step : 1000000 - pos;
        g4_digest_update(d, a + pos, n);
        pos += n;
        step = step * 3 + 1;
    }
    char hex[65];
    g4_digest_finish_hex(d, hex);
    g4_digest_free(d);
    free(a);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
          "sha256(1e6 x 'a') = %s", hex);
}

/* ---- git blob ids: git's own values and a hub file's published ids ---- */
static void test_git_blob_sha1(void) {
    char hex[41];
    g4_git_blob_sha1_hex("", 0, hex);
    CHECK(!strcmp(hex, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"), "empty blob: %s", hex);
    g4_git_blob_sha1_hex("hello world\n", 12, hex);
    CHECK(!strcmp(hex, "3b18e512dba79e4c8300dd08aeb37f8e728b8dad"), "hello world blob: %s", hex);

    /* google/gemma-4-E4B-it config.json: blob d68960fd... in a hub cache listing,
     * sha256 33b10c02... pinned by third parties (see /work/shared/hub/SOURCES.md) */
    char *path = data_path("gemma-4-E4B-it.config.json");
    char *text = NULL;
    size_t len = 0;
    CHECK(g4_read_file(path, 1 << 20, &text, &len) == G4_OK, "%s: %s", path, g4_error_message());
    if (text) {
        g4_git_blob_sha1_hex(text, len, hex);
        CHECK(!strcmp(hex, "d68960fdcce766f2bfe41436325a8a483a74d125"), "E4B config.json blob id %s", hex);
        char h256[65];
        g4_sha256_hex(text, len, h256);
        CHECK(!strcmp(h256, "33b10c02df3c2e8536cf323d29d53262aaa2f4d11dbe19bc729373fbe90295d4"),
              "E4B config.json sha256 %s", h256);
        /* the same through the file interface, in two parts as a resumed download is */
        g4_digest *d;
        g4_digest_begin(&d, G4_DIGEST_GIT_SHA1, len);
        CHECK(g4_digest_update_from_file(d, path, 1000) == G4_OK, "prefix: %s", g4_error_message());
        g4_digest_update(d, text + 1000, len - 1000);
        char full[65];
        g4_digest_finish_hex(d, full);
        g4_digest_free(d);
        CHECK(!strcmp(full, "d68960fdcce766f2bfe41436325a8a483a74d125"), "resumed blob id %s", full);
        g4_digest_begin(&d, G4_DIGEST_SHA256, 0);
        CHECK(g4_digest_update_from_file(d, path, len + 1) != G4_OK, "reading past the end must fail");
        g4_digest_free(d);
    }
    free(text);
    free(path);
}

static void test_digest_kind(void) {
    CHECK(g4_digest_kind_of("33b10c02df3c2e8536cf323d29d53262aaa2f4d11dbe19bc729373fbe90295d4") == G4_DIGEST_SHA256,
          "sha256 etag");
    CHECK(g4_digest_kind_of("d68960fdcce766f2bfe41436325a8a483a74d125") == G4_DIGEST_GIT_SHA1, "git etag");
    CHECK(g4_digest_kind_of("D68960FDCCE766F2BFE41436325A8A483A74D125") == G4_DIGEST_NONE, "uppercase");
    CHECK(g4_digest_kind_of("d68960fdcce766f2bfe41436325a8a483a74d12") == G4_DIGEST_NONE, "39 digits");
    CHECK(g4_digest_kind_of("0123456789abcdef0123456789abcdef-3") == G4_DIGEST_NONE, "multipart S3 etag");
    CHECK(g4_digest_kind_of(NULL) == G4_DIGEST_NONE, "NULL");
}

/* ---- names and URLs against huggingface_hub ---- */
static void test_vectors(void) {
    char *path = data_path("vectors.json");
    char *text = NULL;
    size_t len = 0;
    CHECK(g4_read_file(path, 1 << 22, &text, &len) == G4_OK, "%s: %s", path, g4_error_message());
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    CHECK(root != NULL, "vectors.json does not parse");
    free(text);
    free(path);
    if (!root) return;
    int n = 0;
    const cJSON *row;
#define S(i) cJSON_GetArrayItem(row, i)->valuestring
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "resolve")) {
        char *url = g4_hub_resolve_url(S(0), S(1), S(2), S(3));
        CHECK(url && !strcmp(url, S(4)), "resolve url %s, want %s", url, S(4));
        free(url);
        n++;
    }
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "api")) {
        char *url = g4_hub_api_url(S(0), S(1), S(2));
        CHECK(url && !strcmp(url, S(3)), "api url %s, want %s", url, S(3));
        free(url);
        n++;
    }
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "quote")) {
        char *q0 = g4_hub_url_escape(S(0), 0), *q1 = g4_hub_url_escape(S(0), 1);
        CHECK(!strcmp(q0, S(1)), "quote('%s', safe='') = %s, want %s", S(0), q0, S(1));
        CHECK(!strcmp(q1, S(2)), "quote('%s') = %s, want %s", S(0), q1, S(2));
        free(q0);
        free(q1);
        n++;
    }
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "folder")) {
        char *f = g4_hub_repo_folder(S(0));
        CHECK(!strcmp(f, S(1)), "folder %s, want %s", f, S(1));
        free(f);
        n++;
    }
    cJSON_ArrayForEach(row, cJSON_GetObjectItem(root, "repo_id_valid")) {
        int want = cJSON_IsTrue(cJSON_GetArrayItem(row, 1));
        CHECK(g4_hub_valid_repo_id(S(0)) == want, "valid_repo_id('%s') should be %d", S(0), want);
        n++;
    }
#undef S
    CHECK(n > 300, "only %d vectors", n);
    cJSON_Delete(root);
}

static void test_parse_ref(void) {
    char *repo, *rev;
    CHECK(g4_hub_parse_ref("google/gemma-4-E2B-it", &repo, &rev) == G4_OK, "plain");
    CHECK(repo && !strcmp(repo, "google/gemma-4-E2B-it") && rev == NULL, "plain parts");
    free(repo);
    free(rev);
    CHECK(g4_hub_parse_ref("google/gemma-4-E2B-it@refs/pr/3", &repo, &rev) == G4_OK, "with rev");
    CHECK(repo && rev && !strcmp(repo, "google/gemma-4-E2B-it") && !strcmp(rev, "refs/pr/3"), "rev parts");
    free(repo);
    free(rev);
    const char *bad[] = {"", "gemma", "a/b/c", "a/b@", "a/b@../x", "a/b@/abs", "a/b@x//y", "./b", "a--b/c"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(g4_hub_parse_ref(bad[i], &repo, &rev) == G4_ERR_INVALID_ARGUMENT, "'%s' should be rejected", bad[i]);
        CHECK(repo == NULL && rev == NULL, "outputs cleared");
    }
    const char *ok_paths[] = {"a", "a/b", "model-00001-of-00002.safetensors", "sub dir/x y.json", "...x"};
    const char *bad_paths[] = {"", "/a", "a//b", "a/", "..", "../a", "a/../b", "./a", "a/.", "a\\b", "a\nb"};
    for (size_t i = 0; i < sizeof ok_paths / sizeof *ok_paths; i++)
        CHECK(g4_hub_valid_relpath(ok_paths[i]), "'%s' is a valid relative path", ok_paths[i]);
    for (size_t i = 0; i < sizeof bad_paths / sizeof *bad_paths; i++)
        CHECK(!g4_hub_valid_relpath(bad_paths[i]), "'%s' must be refused", bad_paths[i]);
}

/* ---- resolution against a cache laid out by hand ---- */
static void put(const char *dir, const char *name, const char *text) {
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) < 0) return;
    CHECK(g4_write_file(p, text, strlen(text)) == G4_OK, "write %s: %s", p, g4_error_message());
    free(p);
}

static void test_resolve(void) {
    const char *cache = test_tmp_path("hub_unit_cache");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    CHECK(system(cmd) == 0, "clean");
    const char *commit = "0123456789abcdef0123456789abcdef01234567";
    char repo[1024], snap[1100], refs[1100], dir2[1200];
    snprintf(repo, sizeof repo, "%s/models--org--name", cache);
    snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, commit);
    snprintf(refs, sizeof refs, "%s/refs", repo);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s'", snap, refs);
    CHECK(system(cmd) == 0, "mkdir");
    put(refs, "main", commit); /* huggingface_hub writes no newline */
    put(refs, "v1", "0123456789abcdef0123456789abcdef01234567\n");
    put(snap, "config.json", "{}");

    char *dir = NULL;
    g4_status s = g4_hub_cache_lookup(cache, "org/name", NULL, &dir);
    CHECK(s == G4_ERR_NOT_FOUND && dir == NULL, "no weights yet: %s", g4_status_name(s));
    CHECK(strstr(g4_error_message(), "incomplete") != NULL, "message: %s", g4_error_message());

    put(snap, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"m-1.safetensors\", \"b\": \"m-2.safetensors\"}}");
    put(snap, "m-1.safetensors", "x");
    s = g4_hub_cache_lookup(cache, "org/name", NULL, &dir);
    CHECK(s == G4_ERR_NOT_FOUND && strstr(g4_error_message(), "m-2.safetensors"), "missing shard: %s",
          g4_error_message());
    put(snap, "m-2.safetensors", "y");

    const char *revs[] = {NULL, "main", "v1", commit};
    for (int i = 0; i < 4; i++) {
        s = g4_hub_cache_lookup(cache, "org/name", revs[i], &dir);
        CHECK(s == G4_OK && dir && !strcmp(dir, snap), "lookup @%s: %s (%s)", revs[i] ? revs[i] : "(none)",
              dir ? dir : "NULL", g4_error_message());
        free(dir);
    }
    s = g4_hub_cache_lookup(cache, "org/name", "v2", &dir);
    CHECK(s == G4_ERR_NOT_FOUND && strstr(g4_error_message(), "gemma4 pull org/name@v2"), "unknown ref: %s",
          g4_error_message());
    s = g4_hub_cache_lookup(cache, "org/other", NULL, &dir);
    CHECK(s == G4_ERR_NOT_FOUND, "unknown repo");
    s = g4_hub_cache_lookup(cache, "org/name", "fedcba9876543210fedcba9876543210fedcba98", &dir);
    CHECK(s == G4_ERR_NOT_FOUND, "commit without snapshot");

    /* g4_resolve_model_path: paths first, then the default cache ($HF_HUB_CACHE) */
    setenv("HF_HUB_CACHE", cache, 1);
    CHECK(g4_resolve_model_path("org/name", &dir) == G4_OK && !strcmp(dir, snap), "org/name -> %s (%s)",
          dir ? dir : "NULL", g4_error_message());
    free(dir);
    CHECK(g4_resolve_model_path("org/name@v1", &dir) == G4_OK && !strcmp(dir, snap), "org/name@v1");
    free(dir);
    CHECK(g4_resolve_model_path(snap, &dir) == G4_OK && !strcmp(dir, snap), "a directory as is");
    free(dir);
    snprintf(dir2, sizeof dir2, "%s/config.json", snap);
    CHECK(g4_resolve_model_path(dir2, &dir) == G4_OK && !strcmp(dir, snap), "a file's directory");
    free(dir);
    CHECK(g4_resolve_model_path("org/missing", &dir) == G4_ERR_NOT_FOUND && dir == NULL, "not cached");
    CHECK(strstr(g4_error_message(), "gemma4 pull org/missing"), "hint: %s", g4_error_message());
    CHECK(g4_resolve_model_path("no-such-dir", &dir) == G4_ERR_NOT_FOUND, "neither path nor name");
    CHECK(g4_resolve_model_path("", &dir) == G4_ERR_INVALID_ARGUMENT, "empty");

    /* a path that exists wins over a hub name that looks the same */
    char local[1100];
    snprintf(local, sizeof local, "%s/org/name", cache);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", local);
    CHECK(system(cmd) == 0, "mkdir");
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    CHECK(chdir(cache) == 0, "chdir");
    CHECK(g4_resolve_model_path("org/name", &dir) == G4_OK && !strcmp(dir, "org/name"), "local path first: %s",
          dir ? dir : "NULL");
    free(dir);
    CHECK(chdir(cwd) == 0, "chdir back");
    unsetenv("HF_HUB_CACHE");
}

static void test_default_dirs(void) {
    setenv("HF_HUB_CACHE", "/x/hub", 1);
    char *d = g4_hub_default_cache_dir();
    CHECK(d && !strcmp(d, "/x/hub"), "HF_HUB_CACHE: %s", d);
    free(d);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HUGGINGFACE_HUB_CACHE");
    setenv("HF_HOME", "/y", 1);
    d = g4_hub_default_cache_dir();
    CHECK(d && !strcmp(d, "/y/hub"), "HF_HOME: %s", d);
    free(d);
    unsetenv("HF_HOME");
    setenv("XDG_CACHE_HOME", "/z", 1);
    d = g4_hub_default_cache_dir();
    CHECK(d && !strcmp(d, "/z/huggingface/hub"), "XDG_CACHE_HOME: %s", d);
    free(d);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    d = g4_hub_default_cache_dir();
    CHECK(d && !strcmp(d, "/home/u/.cache/huggingface/hub"), "HOME: %s", d);
    free(d);
    setenv("HF_ENDPOINT", "http://mirror:1/", 1);
    d = g4_hub_default_endpoint();
    CHECK(d && !strcmp(d, "http://mirror:1/"), "HF_ENDPOINT: %s", d);
    free(d);
    unsetenv("HF_ENDPOINT");
    d = g4_hub_default_endpoint();
    CHECK(d && !strcmp(d, "https://huggingface.co"), "default endpoint: %s", d);
    free(d);
}

int main(void) {
    test_sha256_vectors();
    test_git_blob_sha1();
    test_digest_kind();
    test_vectors();
    test_parse_ref();
    test_resolve();
    test_default_dirs();
    return test_finish();
}
