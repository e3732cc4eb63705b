/* Repo ids, revisions, file names and the URLs built from them. Names that
 * come from the network (shard names in an index file) become local paths,
 * so they are validated before use. */
#define _GNU_SOURCE /* vasprintf */
#include "io/hub.h"
#include "io/hub_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
}

/* One of ORG or NAME: 1..96 name characters, not starting or ending with '-'
 * or '.' (huggingface_hub's word-boundary rule). */
static int valid_repo_part(const char *s, size_t n) {
    if (n == 0 || n > 96) return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_name_char(s[i])) return 0;
    if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
    return 1;
}

int g4_hub_valid_repo_id(const char *repo_id) {
    if (!repo_id) return 0;
    const char *slash = strchr(repo_id, '/');
    if (!slash || strchr(slash + 1, '/')) return 0;
    if (strstr(repo_id, "--") || strstr(repo_id, "..")) return 0;
    return valid_repo_part(repo_id, (size_t)(slash - repo_id)) && valid_repo_part(slash + 1, strlen(slash + 1));
}

int g4_hub_valid_relpath(const char *path) {
    if (!path || !*path || path[0] == '/') return 0;
    const char *part = path;
    for (;;) {
        const char *end = strchr(part, '/');
        size_t n = end ? (size_t)(end - part) : strlen(part);
        if (n == 0 || (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.')) return 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)part[i];
            if (c < 0x20 || c == 0x7f || c == '\\') return 0;
        }
        if (!end) return 1;
        part = end + 1;
    }
}

g4_status g4_hub_parse_ref(const char *arg, char **repo_id, char **revision) {
    *repo_id = NULL;
    *revision = NULL;
    if (!arg) return g4_fail(G4_ERR_INVALID_ARGUMENT, "no model name");
    const char *at = strchr(arg, '@');
    size_t n = at ? (size_t)(at - arg) : strlen(arg);
    char *repo = strndup(arg, n);
    if (!repo) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (!g4_hub_valid_repo_id(repo)) {
        free(repo);
        return g4_fail(G4_ERR_INVALID_ARGUMENT,
                       "'%s' is not a hub model name (ORG/NAME or ORG/NAME@REVISION, letters, digits, '-', '_', '.')",
                       arg);
    }
    if (at) {
        if (!g4_hub_valid_relpath(at + 1)) {
            free(repo);
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "'%s': bad revision '%s'", arg, at + 1);
        }
        *revision = strdup(at + 1);
        if (!*revision) {
            free(repo);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    *repo_id = repo;
    return G4_OK;
}

char *g4_hub_url_escape(const char *s, int keep_slash) {
    static const char digits[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-' || c == '~' || (keep_slash && c == '/');
        if (plain) {
            *o++ = (char)c;
        } else {
            *o++ = '%';
            *o++ = digits[c >> 4];
            *o++ = digits[c & 15];
        }
    }
    *o = '\0';
    return out;
}

char *hub_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

/* The endpoint without trailing slashes, as huggingface_hub strips them. */
static char *trimmed_endpoint(const char *endpoint) {
    size_t n = strlen(endpoint);
    while (n > 0 && endpoint[n - 1] == '/') n--;
    return strndup(endpoint, n);
}

char *g4_hub_resolve_url(const char *endpoint, const char *repo_id, const char *revision, const char *file) {
    char *base = trimmed_endpoint(endpoint);
    char *rev = g4_hub_url_escape(revision ? revision : "main", 0);
    char *name = g4_hub_url_escape(file, 1);
    char *url = base && rev && name ? hub_printf("%s/%s/resolve/%s/%s", base, repo_id, rev, name) : NULL;
    free(base);
    free(rev);
    free(name);
    return url;
}

char *g4_hub_api_url(const char *endpoint, const char *repo_id, const char *revision) {
    char *base = trimmed_endpoint(endpoint);
    char *rev = g4_hub_url_escape(revision ? revision : "main", 0);
    char *url = base && rev ? hub_printf("%s/api/models/%s/revision/%s?blobs=true", base, repo_id, rev) : NULL;
    free(base);
    free(rev);
    return url;
}

char *g4_hub_repo_folder(const char *repo_id) {
    const char *slash = strchr(repo_id, '/');
    if (!slash) return hub_printf("models--%s", repo_id);
    return hub_printf("models--%.*s--%s", (int)(slash - repo_id), repo_id, slash + 1);
}
