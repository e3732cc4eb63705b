/* g4_hub_pull: list a repo at a revision, pick the files an inference run
 * needs, fetch each one into the cache and link it into the snapshot. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/log.h"
#include "io/digest.h"
#include "io/hub_internal.h"

/* Config, tokenizer and processor files fetched when the repo has them. */
static const char *const METADATA_FILES[] = {
    "config.json",           "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json",    "processor_config.json",  "preprocessor_config.json",
};
enum { API_MAX_BYTES = 64 << 20, INDEX_MAX_BYTES = 64 << 20 };

/* A file of the repo as the API lists it. */
typedef struct {
    char *name;
    int64_t size;    /* -1: not listed */
    char *etag_hint; /* lfs.sha256 or the git blob id, if listed */
} repo_file;

typedef struct {
    char commit[41];
    repo_file *files;
    int count;
} repo_listing;

/* Everything one pull works with. */
typedef struct {
    const g4_hub_options *opt;
    hub_context ctx;
    hub_http *http;
    char *cache_dir, *folder, *repo_dir;
    repo_listing listing;
    repo_file **plan; /* pointers into listing.files */
    int planned;
} pull;

char *g4_hub_default_endpoint(void) {
    const char *v = getenv("HF_ENDPOINT");
    return strdup(v && *v ? v : "https://huggingface.co");
}

/* A token without surrounding whitespace (as huggingface_hub cleans it);
 * NULL for an empty one. Takes ownership of t. */
static char *clean_token(char *t) {
    if (!t) return NULL;
    size_t start = strspn(t, " \t\r\n"), len = strlen(t);
    while (len > start && strchr(" \t\r\n", t[len - 1])) len--;
    memmove(t, t + start, len - start);
    t[len - start] = '\0';
    if (!*t) {
        free(t);
        return NULL;
    }
    return t;
}

/* $HF_TOKEN, $HUGGING_FACE_HUB_TOKEN, then the token file `hf auth login`
 * writes ($HF_TOKEN_PATH, default $HF_HOME/token): huggingface_hub's order. */
static char *find_token(void) {
    const char *names[] = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        char *t = v ? clean_token(strdup(v)) : NULL;
        if (t) return t;
    }
    const char *p = getenv("HF_TOKEN_PATH");
    char *home = NULL, *path = p && *p ? strdup(p) : ((home = hub_hf_home()) ? hub_printf("%s/token", home) : NULL);
    free(home);
    char *text = NULL;
    if (path && g4_file_exists(path) && g4_read_file(path, 4096, &text, NULL) != G4_OK) text = NULL;
    g4_error_clear();
    free(path);
    return clean_token(text);
}

/* ---- requests with retries ---- */

typedef enum { REQUEST_GET, REQUEST_HEAD } request_kind;

/* A GET (into memory) or HEAD that must answer 2xx (or, for HEAD, redirect to
 * the CDN); transient failures are retried with backoff. */
static g4_status request(pull *p, request_kind kind, const char *url, const char *file, hub_response *r) {
    hub_retry retry;
    hub_retry_init(&retry, p->opt);
    for (;;) {
        g4_status s = kind == REQUEST_GET ? hub_http_get(p->http, url, API_MAX_BYTES, r) : hub_http_head(p->http, url, r);
        int ok = r->status >= 200 && r->status < 300;
        if (kind == REQUEST_HEAD && r->status >= 300 && r->status < 400 && r->location) ok = 1;
        if (s == G4_OK && ok) return G4_OK;
        if (s == G4_OK) s = hub_response_error(r, &p->ctx, file);
        int transient = r->transient;
        int64_t retry_after = r->retry_after;
        hub_response_clear(r);
        if (!transient || !hub_retry_wait(&retry, file, g4_error_message(), retry_after)) return s;
    }
}

/* ---- the listing ---- */

static void free_listing(repo_listing *l) {
    for (int i = 0; i < l->count; i++) {
        free(l->files[i].name);
        free(l->files[i].etag_hint);
    }
    free(l->files);
    memset(l, 0, sizeof *l);
}

static int64_t json_size(const cJSON *item) {
    return cJSON_IsNumber(item) && item->valuedouble >= 0 ? (int64_t)item->valuedouble : -1;
}

static g4_status parse_listing(const char *text, size_t len, repo_listing *out, const char *repo_id) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return g4_fail(G4_ERR_FORMAT, "%s: the hub's file list is not JSON", repo_id);
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(root, "sha");
    const cJSON *siblings = cJSON_GetObjectItemCaseSensitive(root, "siblings");
    g4_status s = G4_OK;
    if (!cJSON_IsString(sha) || !hub_is_commit(sha->valuestring) || !cJSON_IsArray(siblings)) {
        s = g4_fail(G4_ERR_FORMAT, "%s: the hub's answer has no commit \"sha\" or \"siblings\" list", repo_id);
        goto done;
    }
    memcpy(out->commit, sha->valuestring, 41);
    int n = cJSON_GetArraySize(siblings);
    out->files = calloc(n > 0 ? (size_t)n : 1, sizeof *out->files);
    if (!out->files) {
        s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, siblings) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "rfilename");
        if (!cJSON_IsString(name)) continue;
        repo_file *f = &out->files[out->count];
        f->name = strdup(name->valuestring);
        if (!f->name) {
            s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        out->count++;
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(item, "lfs");
        const cJSON *sha256 = cJSON_GetObjectItemCaseSensitive(lfs, "sha256");
        const cJSON *blob = cJSON_GetObjectItemCaseSensitive(item, "blobId");
        f->size = json_size(cJSON_GetObjectItemCaseSensitive(lfs ? lfs : item, "size"));
        if (f->size < 0) f->size = json_size(cJSON_GetObjectItemCaseSensitive(item, "size"));
        const char *hint = cJSON_IsString(sha256) ? sha256->valuestring : cJSON_IsString(blob) ? blob->valuestring : NULL;
        if (hint && g4_digest_kind_of(hint) != G4_DIGEST_NONE) f->etag_hint = strdup(hint);
    }
done:
    cJSON_Delete(root);
    return s;
}

static g4_status fetch_listing(pull *p) {
    char *url = g4_hub_api_url(p->ctx.endpoint, p->ctx.repo_id, p->ctx.revision);
    if (!url) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    hub_response r;
    g4_status s = request(p, REQUEST_GET, url, NULL, &r);
    if (s == G4_OK) s = parse_listing(r.body ? r.body : "", r.body_len, &p->listing, p->ctx.repo_id);
    hub_response_clear(&r);
    free(url);
    return s;
}

static repo_file *listed(pull *p, const char *name) {
    for (int i = 0; i < p->listing.count; i++)
        if (!strcmp(p->listing.files[i].name, name)) return &p->listing.files[i];
    return NULL;
}

/* ---- the plan: which files ---- */

static g4_status plan_add(pull *p, repo_file *f) {
    for (int i = 0; i < p->planned; i++)
        if (p->plan[i] == f) return G4_OK;
    repo_file **grown = realloc(p->plan, (size_t)(p->planned + 1) * sizeof *grown);
    if (!grown) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    p->plan = grown;
    p->plan[p->planned++] = f;
    return G4_OK;
}

static char *snapshot_path(const pull *p, const char *file) {
    return hub_printf("%s/snapshots/%s/%s", p->repo_dir, p->listing.commit, file);
}

/* The index's text: from the snapshot if an earlier pull fetched it, else
 * from the hub (it is small; it is fetched again into the cache later). */
static g4_status read_index(pull *p, const char *name, char **text, size_t *len) {
    char *local = snapshot_path(p, name);
    if (!local) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status s;
    if (g4_file_exists(local)) {
        s = g4_read_file(local, INDEX_MAX_BYTES, text, len);
    } else {
        char *url = g4_hub_resolve_url(p->ctx.endpoint, p->ctx.repo_id, p->listing.commit, name);
        hub_response r;
        s = url ? request(p, REQUEST_GET, url, name, &r) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        if (s == G4_OK) {
            *text = r.body ? r.body : strdup("");
            *len = r.body_len;
            r.body = NULL;
            if (!*text) s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        if (url) hub_response_clear(&r);
        free(url);
    }
    free(local);
    return s;
}

/* Adds every shard the index's weight_map names. */
static g4_status plan_shards(pull *p, const char *index_name) {
    char *text = NULL;
    size_t len = 0;
    g4_status s = read_index(p, index_name, &text, &len);
    if (s != G4_OK) return s;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map) || !map->child) {
        cJSON_Delete(root);
        return g4_fail(G4_ERR_FORMAT, "%s: no weight_map in %s", p->ctx.repo_id, index_name);
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, map) {
        const char *shard = cJSON_IsString(entry) ? entry->valuestring : NULL;
        repo_file *f = shard && g4_hub_valid_relpath(shard) ? listed(p, shard) : NULL;
        if (!f) {
            s = g4_fail(G4_ERR_FORMAT, "%s: %s names a shard '%s' that the repo does not have", p->ctx.repo_id,
                        index_name, shard ? shard : "(not a string)");
            break;
        }
        if ((s = plan_add(p, f)) != G4_OK) break;
    }
    cJSON_Delete(root);
    return s;
}

static g4_status make_plan(pull *p) {
    g4_status s = G4_OK;
    for (size_t i = 0; i < sizeof METADATA_FILES / sizeof *METADATA_FILES && s == G4_OK; i++) {
        repo_file *f = listed(p, METADATA_FILES[i]);
        if (f) s = plan_add(p, f);
    }
    if (s != G4_OK) return s;
    if (!listed(p, "config.json"))
        return g4_fail(G4_ERR_NOT_FOUND, "%s has no config.json at revision %s: not a transformers model",
                       p->ctx.repo_id, p->listing.commit);
    /* transformers' order: a single model.safetensors first, else the index */
    repo_file *single = listed(p, "model.safetensors");
    if (single) return plan_add(p, single);
    repo_file *index = listed(p, "model.safetensors.index.json");
    if (!index)
        return g4_fail(G4_ERR_NOT_FOUND,
                       "%s has no safetensors weights (model.safetensors or model.safetensors.index.json)",
                       p->ctx.repo_id);
    s = plan_add(p, index);
    return s == G4_OK ? plan_shards(p, index->name) : s;
}

/* Fails early when the files still missing cannot fit on the disk. */
static g4_status check_disk_space(pull *p, uint64_t *total) {
    int64_t need = 0;
    *total = 0;
    for (int i = 0; i < p->planned; i++) {
        repo_file *f = p->plan[i];
        if (f->size > 0) *total += (uint64_t)f->size;
        char *snap = snapshot_path(p, f->name);
        int cached = snap && g4_file_exists(snap);
        free(snap);
        if (cached || f->size <= 0) continue;
        int64_t have = 0;
        if (f->etag_hint) {
            char *blob = hub_printf("%s/blobs/%s", p->repo_dir, f->etag_hint);
            char *part = hub_printf("%s/blobs/%s.incomplete", p->repo_dir, f->etag_hint);
            struct stat st;
            if (blob && stat(blob, &st) == 0) have = f->size;
            else if (part && stat(part, &st) == 0 && st.st_size <= f->size) have = st.st_size;
            free(blob);
            free(part);
        }
        need += f->size - have;
    }
    int64_t free_bytes = hub_free_bytes(p->repo_dir);
    char a[32], b[32];
    if (free_bytes >= 0 && need > free_bytes)
        return g4_fail(G4_ERR_LIMIT, "not enough disk space in %s: the download needs %s, %s are free", p->repo_dir,
                       hub_format_bytes(need, a), hub_format_bytes(free_bytes, b));
    return G4_OK;
}

/* ---- one file ---- */

/* ETags become file names: hex digits, or at least nothing path-like. */
static int safe_etag(const char *e) {
    size_t n = strlen(e);
    if (n == 0 || n > 128 || !strcmp(e, ".") || !strcmp(e, "..")) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = e[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_' ||
              c == '.'))
            return 0;
    }
    return 1;
}

/* The blob a snapshot entry links to: its ETag, the last part of the link. */
static char *linked_etag(const char *snap) {
    char target[4096];
    ssize_t n = readlink(snap, target, sizeof target - 1);
    if (n <= 0) return NULL;
    target[n] = '\0';
    const char *slash = strrchr(target, '/');
    return strdup(slash ? slash + 1 : target);
}

/* What HEAD says about the file: checksum and size. */
static g4_status file_metadata(pull *p, const repo_file *f, const char *url, char **etag, int64_t *size) {
    hub_response r;
    g4_status s = request(p, REQUEST_HEAD, url, f->name, &r);
    if (s != G4_OK) return s;
    int redirected = r.status >= 300;
    const char *e = r.linked_etag ? r.linked_etag : r.etag;
    *etag = strdup(e ? e : f->etag_hint ? f->etag_hint : "");
    /* on a redirect, Content-Length is that of the redirect's own body */
    *size = r.linked_size >= 0 ? r.linked_size : !redirected && r.content_length >= 0 ? r.content_length : f->size;
    if (!*etag) s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    else if (r.repo_commit && strcmp(r.repo_commit, p->listing.commit) != 0)
        s = g4_fail(G4_ERR_FORMAT, "%s: the hub served commit %s, expected %s", f->name, r.repo_commit,
                    p->listing.commit);
    else if (!**etag)
        s = g4_fail(G4_ERR_FORMAT, "%s: the hub sent no ETag, so the file cannot be checked", f->name);
    else if (!safe_etag(*etag))
        s = g4_fail(G4_ERR_FORMAT, "%s: unusable ETag '%s'", f->name, *etag);
    hub_response_clear(&r);
    return s;
}

static int64_t file_size_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static g4_status pull_file(pull *p, const repo_file *f, int index) {
    const g4_hub_options *opt = p->opt;
    char *snap = snapshot_path(p, f->name);
    if (!snap) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status s = G4_OK;
    int damaged = 0; /* the cached copy failed --verify: fetch it again */
    if (g4_file_exists(snap)) {
        char *etag = linked_etag(snap);
        s = opt->verify_cached ? hub_verify_file(snap, f->name, etag ? etag : f->etag_hint, f->size) : G4_OK;
        free(etag);
        if (s == G4_OK) {
            int64_t n = file_size_of(snap);
            hub_emit(opt, G4_HUB_FILE_CACHED, f->name, index, p->planned, (uint64_t)n, (uint64_t)n);
            free(snap);
            return G4_OK;
        }
        g4_log(G4_LOG_WARN, "%s; fetching it again", g4_error_message());
        damaged = 1;
    }
    free(snap);

    char *url = g4_hub_resolve_url(p->ctx.endpoint, p->ctx.repo_id, p->listing.commit, f->name);
    char *etag = NULL, *blob = NULL;
    int64_t size = -1;
    int lock = -1;
    s = url ? file_metadata(p, f, url, &etag, &size) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK && !(blob = hub_printf("%s/blobs/%s", p->repo_dir, etag)))
        s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK) s = hub_lock_blob(p->cache_dir, p->folder, etag, opt, f->name, &lock);
    if (s == G4_OK) {
        int have = !damaged && g4_file_exists(blob);
        if (have && (size >= 0 && file_size_of(blob) != size)) have = 0;
        if (have && opt->verify_cached && hub_verify_file(blob, f->name, etag, size) != G4_OK) {
            g4_log(G4_LOG_WARN, "%s; fetching it again", g4_error_message());
            have = 0;
        }
        if (have) {
            hub_emit(opt, G4_HUB_FILE_CACHED, f->name, index, p->planned, (uint64_t)size, (uint64_t)size);
        } else {
            hub_fetch fetch = {.ctx = &p->ctx, .file = f->name, .url = url, .blob_path = blob, .etag = etag,
                               .size = size, .index = index, .count = p->planned};
            unlink(blob);
            s = hub_fetch_blob(p->http, opt, &fetch);
        }
    }
    if (s == G4_OK) s = hub_link_snapshot(p->repo_dir, p->listing.commit, f->name, etag);
    if (lock >= 0) close(lock);
    free(url);
    free(etag);
    free(blob);
    return s;
}

/* ---- the whole pull ---- */

static void pull_free(pull *p) {
    hub_http_close(p->http);
    free_listing(&p->listing);
    free(p->plan);
    free(p->cache_dir);
    free(p->folder);
    free(p->repo_dir);
}

g4_status g4_hub_pull(const char *repo_id, const char *revision, const g4_hub_options *options, char **out_dir) {
    *out_dir = NULL;
    g4_hub_options defaults = {0};
    const g4_hub_options *opt = options ? options : &defaults;
    if (!g4_hub_valid_repo_id(repo_id))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "'%s' is not a hub model name (ORG/NAME)", repo_id ? repo_id : "");
    if (!revision || !*revision) revision = "main";
    if (!g4_hub_valid_relpath(revision)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "bad revision '%s'", revision);

    char *endpoint = opt->endpoint ? strdup(opt->endpoint) : g4_hub_default_endpoint();
    char *token = opt->token ? strdup(opt->token) : find_token();
    pull p = {.opt = opt};
    p.cache_dir = opt->cache_dir ? strdup(opt->cache_dir) : g4_hub_default_cache_dir();
    p.folder = g4_hub_repo_folder(repo_id);
    p.repo_dir = p.cache_dir && p.folder ? hub_printf("%s/%s", p.cache_dir, p.folder) : NULL;
    p.ctx = (hub_context){endpoint, repo_id, revision, token && *token};
    g4_status s = endpoint && p.repo_dir ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK) s = hub_http_open(&p.http, endpoint, token);
    if (token) memset(token, 0, strlen(token));
    free(token);

    if (s == G4_OK) s = fetch_listing(&p);
    if (s == G4_OK) s = make_plan(&p);
    if (s == G4_OK) {
        char *blobs = hub_printf("%s/blobs", p.repo_dir);
        s = blobs ? hub_make_dirs(blobs) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        free(blobs);
    }
    uint64_t total = 0;
    if (s == G4_OK) s = check_disk_space(&p, &total);
    if (s == G4_OK && opt->progress) {
        g4_hub_event e = {.kind = G4_HUB_LISTED, .count = p.planned, .total = total, .message = p.listing.commit};
        opt->progress(&e, opt->progress_user);
    }
    for (int i = 0; i < p.planned && s == G4_OK; i++) s = pull_file(&p, p.plan[i], i + 1);
    if (s == G4_OK && strcmp(revision, p.listing.commit) != 0) s = hub_write_ref(p.repo_dir, revision, p.listing.commit);
    if (s == G4_OK) {
        *out_dir = hub_printf("%s/snapshots/%s", p.repo_dir, p.listing.commit);
        if (!*out_dir) s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (s != G4_OK) s = g4_fail_context(s, "pulling %s@%s", repo_id, revision);
    pull_free(&p);
    free(endpoint);
    return s;
}
