/* The on-disk cache, laid out as huggingface_hub lays it out (see hub.h), and
 * model-name resolution against it. Nothing here touches the network. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "io/hub_internal.h"

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

char *hub_hf_home(void) {
    const char *v;
    if ((v = env_nonempty("HF_HOME"))) return strdup(v);
    if ((v = env_nonempty("XDG_CACHE_HOME"))) return hub_printf("%s/huggingface", v);
    if ((v = env_nonempty("HOME"))) return hub_printf("%s/.cache/huggingface", v);
    return strdup(".cache/huggingface");
}

char *g4_hub_default_cache_dir(void) {
    const char *v;
    if ((v = env_nonempty("HF_HUB_CACHE")) || (v = env_nonempty("HUGGINGFACE_HUB_CACHE"))) return strdup(v);
    char *home = hub_hf_home();
    char *dir = home ? hub_printf("%s/hub", home) : NULL;
    free(home);
    return dir;
}

int hub_is_commit(const char *s) {
    if (!s || strlen(s) != 40) return 0;
    for (int i = 0; i < 40; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

g4_status hub_make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            g4_status s = g4_fail(G4_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
            free(p);
            return s;
        }
        *c = saved;
        if (!saved) break;
    }
    free(p);
    if (!g4_is_directory(path)) return g4_fail(G4_ERR_IO, "%s: exists and is not a directory", path);
    return G4_OK;
}

/* The directory part of path (heap). */
static char *parent_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
}

g4_status hub_link_snapshot(const char *repo_dir, const char *commit, const char *file, const char *etag) {
    /* the link lives depth+2 levels below repo_dir: one "../" per level */
    int depth = 0;
    for (const char *c = file; *c; c++) depth += *c == '/';
    size_t up_len = 3 * (size_t)(depth + 2);
    char *up = malloc(up_len + 1);
    char *link_path = hub_printf("%s/snapshots/%s/%s", repo_dir, commit, file);
    char *dir = link_path ? parent_of(link_path) : NULL;
    char *tmp = link_path ? hub_printf("%s.tmp%d", link_path, (int)getpid()) : NULL;
    g4_status s = G4_OK;
    if (!up || !link_path || !dir || !tmp) {
        s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int i = 0; i < depth + 2; i++) memcpy(up + 3 * i, "../", 3);
    up[up_len] = '\0';
    char *target = hub_printf("%sblobs/%s", up, etag);
    if (!target) {
        s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    s = hub_make_dirs(dir);
    if (s == G4_OK) {
        unlink(tmp);
        /* a new link renamed over the old one: the name is never missing */
        if (symlink(target, tmp) != 0 || rename(tmp, link_path) != 0) {
            s = g4_fail(G4_ERR_IO, "%s: cannot create the link to %s: %s", link_path, target, strerror(errno));
            unlink(tmp);
        }
    }
    free(target);
done:
    free(up);
    free(link_path);
    free(dir);
    free(tmp);
    return s;
}

g4_status hub_read_ref(const char *repo_dir, const char *revision, char commit[41]) {
    commit[0] = '\0';
    char *path = hub_printf("%s/refs/%s", repo_dir, revision);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    char *text = NULL;
    size_t len = 0;
    g4_status s = g4_file_exists(path) ? g4_read_file(path, 4096, &text, &len) : G4_ERR_NOT_FOUND;
    if (s == G4_ERR_NOT_FOUND) {
        s = g4_fail(G4_ERR_NOT_FOUND, "%s: no such ref", path);
    } else if (s == G4_OK) {
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = '\0';
        if (hub_is_commit(text)) memcpy(commit, text, 41);
        else s = g4_fail(G4_ERR_FORMAT, "%s: not a commit hash", path);
    }
    free(text);
    free(path);
    return s;
}

g4_status hub_write_ref(const char *repo_dir, const char *revision, const char *commit) {
    char *path = hub_printf("%s/refs/%s", repo_dir, revision);
    char *dir = path ? parent_of(path) : NULL;
    g4_status s = path && dir ? hub_make_dirs(dir) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK) s = g4_write_file(path, commit, strlen(commit)); /* no newline, as huggingface_hub writes it */
    free(path);
    free(dir);
    return s;
}

g4_status hub_lock_blob(const char *cache_dir, const char *folder, const char *etag, const g4_hub_options *opt,
                        const char *file, int *fd) {
    *fd = -1;
    char *dir = hub_printf("%s/.locks/%s", cache_dir, folder);
    char *path = dir ? hub_printf("%s/%s.lock", dir, etag) : NULL;
    g4_status s = path ? hub_make_dirs(dir) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK) {
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (f < 0) {
            s = g4_fail(G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        } else {
            int r = flock(f, LOCK_EX | LOCK_NB);
            if (r != 0 && errno == EWOULDBLOCK) {
                hub_emit(opt, G4_HUB_WAIT_LOCK, file, 0, 0, 0, 0);
                while ((r = flock(f, LOCK_EX)) != 0 && errno == EINTR) {
                }
            }
            if (r != 0) {
                s = g4_fail(G4_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
                close(f);
            } else {
                *fd = f;
            }
        }
    }
    free(dir);
    free(path);
    return s;
}

int64_t hub_free_bytes(const char *path) {
    struct statvfs v;
    if (statvfs(path, &v) != 0) return -1;
    return (int64_t)v.f_bavail * (int64_t)v.f_frsize;
}

/* ---- lookup without network ---- */

/* A snapshot is usable when it has config.json and all its weights: the
 * shards its index names, or model.safetensors. Names the first missing file. */
static g4_status snapshot_complete(const char *dir) {
    char *path = hub_printf("%s/config.json", dir);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    int ok = g4_file_exists(path);
    free(path);
    if (!ok) return g4_fail(G4_ERR_NOT_FOUND, "%s: config.json is missing", dir);

    path = hub_printf("%s/model.safetensors", dir);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    ok = g4_file_exists(path);
    free(path);
    if (ok) return G4_OK;

    path = hub_printf("%s/model.safetensors.index.json", dir);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    char *text = NULL;
    size_t len = 0;
    g4_status s = g4_file_exists(path) ? g4_read_file(path, 64u << 20, &text, &len)
                                       : g4_fail(G4_ERR_NOT_FOUND, "%s: no safetensors weights", dir);
    free(path);
    if (s != G4_OK) return s;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return g4_fail(G4_ERR_FORMAT, "%s/model.safetensors.index.json: no weight_map object", dir);
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, map) {
        if (!cJSON_IsString(entry) || !g4_hub_valid_relpath(entry->valuestring)) {
            s = g4_fail(G4_ERR_FORMAT, "%s/model.safetensors.index.json: bad shard name", dir);
            break;
        }
        char *shard = hub_printf("%s/%s", dir, entry->valuestring);
        if (!shard) {
            s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        ok = g4_file_exists(shard);
        free(shard);
        if (!ok) {
            s = g4_fail(G4_ERR_NOT_FOUND, "%s: shard %s is missing", dir, entry->valuestring);
            break;
        }
    }
    cJSON_Delete(root);
    return s;
}

g4_status g4_hub_cache_lookup(const char *cache_dir, const char *repo_id, const char *revision, char **dir) {
    *dir = NULL;
    if (!g4_hub_valid_repo_id(repo_id)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "'%s' is not a hub model name", repo_id);
    const char *rev = revision ? revision : "main";
    if (!g4_hub_valid_relpath(rev)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "bad revision '%s'", rev);
    char *cache = cache_dir ? strdup(cache_dir) : g4_hub_default_cache_dir();
    char *folder = g4_hub_repo_folder(repo_id);
    char *repo_dir = cache && folder ? hub_printf("%s/%s", cache, folder) : NULL;
    g4_status s = repo_dir ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    char commit[41] = "";
    if (s == G4_OK) {
        if (hub_is_commit(rev)) memcpy(commit, rev, 41);
        else if (hub_read_ref(repo_dir, rev, commit) != G4_OK)
            s = g4_fail(G4_ERR_NOT_FOUND, "%s@%s is not in the cache %s; run `gemma4 pull %s%s%s` first", repo_id, rev,
                        cache, repo_id, revision ? "@" : "", revision ? revision : "");
    }
    char *snap = s == G4_OK ? hub_printf("%s/snapshots/%s", repo_dir, commit) : NULL;
    if (s == G4_OK && !snap) s = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == G4_OK && !g4_is_directory(snap))
        s = g4_fail(G4_ERR_NOT_FOUND, "%s@%s is not in the cache %s; run `gemma4 pull %s%s%s` first", repo_id, rev,
                    cache, repo_id, revision ? "@" : "", revision ? revision : "");
    if (s == G4_OK && (s = snapshot_complete(snap)) != G4_OK)
        s = g4_fail_context(s, "%s@%s is incomplete in the cache (run `gemma4 pull %s` again)", repo_id, rev,
                            repo_id);
    if (s == G4_OK) {
        *dir = snap;
        snap = NULL;
    }
    free(snap);
    free(cache);
    free(folder);
    free(repo_dir);
    return s;
}

g4_status g4_resolve_model_path(const char *arg, char **dir) {
    *dir = NULL;
    if (!arg || !*arg) return g4_fail(G4_ERR_INVALID_ARGUMENT, "no model given");
    struct stat st;
    if (stat(arg, &st) == 0) {
        *dir = S_ISDIR(st.st_mode) ? strdup(arg) : parent_of(arg);
        return *dir ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    char *repo_id, *revision;
    if (g4_hub_parse_ref(arg, &repo_id, &revision) != G4_OK)
        return g4_fail(G4_ERR_NOT_FOUND, "%s: no such file or directory, and not a hub model name (ORG/NAME[@REV])",
                       arg);
    g4_status s = g4_hub_cache_lookup(NULL, repo_id, revision, dir);
    free(repo_id);
    free(revision);
    return s;
}
