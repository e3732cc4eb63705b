/* Internals of the hub client shared by hub_*.c: the HTTP layer (libcurl),
 * retries, cache paths and the download of one file. Not for other modules:
 * they use io/hub.h. */
#ifndef G4_IO_HUB_INTERNAL_H
#define G4_IO_HUB_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "io/hub.h"

/* asprintf that returns the string (NULL when out of memory). */
char *hub_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- HTTP (hub_http.c) ---- */

typedef struct hub_http hub_http;

/* What one response said; strings are heap copies or NULL. */
typedef struct {
    long status;             /* 0 when no response arrived */
    char *url;               /* the URL that answered (after followed redirects) */
    char *location;          /* Location, resolved against `url` */
    char *etag;              /* ETag without W/ and quotes */
    char *linked_etag;       /* X-Linked-Etag, likewise */
    char *repo_commit;       /* X-Repo-Commit */
    char *error_code;        /* X-Error-Code */
    char *error_message;     /* X-Error-Message */
    int64_t content_length;  /* -1: absent */
    int64_t linked_size;     /* X-Linked-Size, -1: absent */
    int64_t range_start;     /* Content-Range "bytes START-END/TOTAL", -1: absent */
    int64_t retry_after;     /* Retry-After in seconds, -1: absent */
    char *body;              /* GET into memory, or the start of an error body */
    size_t body_len;
    int transient;           /* the failure is worth retrying (network, 429, 5xx) */
} hub_response;

/* Receives the body of a 2xx download response. begin() runs once, after the
 * headers and before any bytes; a non-OK status from either aborts the
 * transfer and is returned by hub_http_download. */
typedef struct {
    g4_status (*begin)(void *user, const hub_response *r);
    g4_status (*write)(void *user, const void *data, size_t n);
    void *user;
} hub_sink;

/* `endpoint` fixes the one origin (scheme, host, port) that gets the token. */
g4_status hub_http_open(hub_http **out, const char *endpoint, const char *token);
void hub_http_close(hub_http *h);

/* Each returns G4_OK when a final response arrived, whatever its status (the
 * caller judges it with hub_response_error), and G4_ERR_IO with r->transient
 * set for network failures. */
/* GET into r->body (at most max_body bytes), following redirects. */
g4_status hub_http_get(hub_http *h, const char *url, size_t max_body, hub_response *r);
/* HEAD, following redirects only while they stay on the hub's origin: a
 * redirect elsewhere (a CDN) is the answer, its headers carry the metadata. */
g4_status hub_http_head(hub_http *h, const char *url, hub_response *r);
/* GET with "Range: bytes=offset-" when offset > 0, following redirects; a 2xx
 * body goes to the sink. */
g4_status hub_http_download(hub_http *h, const char *url, uint64_t offset, hub_sink *sink, hub_response *r);
void hub_response_clear(hub_response *r);

/* What a request was about, for error messages. */
typedef struct {
    const char *endpoint, *repo_id, *revision;
    int have_token;
} hub_context;

/* Turns a non-2xx response into a clear error (gated repo, unknown repo,
 * revision or file, bad token, rate limit, server error) and sets
 * r->transient for the ones worth retrying. `file` is NULL for the API call. */
g4_status hub_response_error(hub_response *r, const hub_context *ctx, const char *file);

/* ---- retries with exponential backoff ---- */

typedef struct {
    int failures;   /* consecutive failures without progress */
    int max_retries;
    int backoff_ms;
    const g4_hub_options *opt;
} hub_retry;

void hub_retry_init(hub_retry *r, const g4_hub_options *opt);
/* After a transient failure: 0 when out of retries, else reports the retry,
 * sleeps (honouring Retry-After) and returns 1. */
int hub_retry_wait(hub_retry *r, const char *file, const char *why, int64_t retry_after_s);

/* ---- cache (hub_cache.c) ---- */

/* $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. */
char *hub_hf_home(void);
/* mkdir -p */
g4_status hub_make_dirs(const char *path);
/* snapshots/{commit}/{file} → ../../blobs/{etag} (replacing what was there). */
g4_status hub_link_snapshot(const char *repo_dir, const char *commit, const char *file, const char *etag);
/* The commit a ref names (refs/{revision}), into commit[41]; G4_ERR_NOT_FOUND if none. */
g4_status hub_read_ref(const char *repo_dir, const char *revision, char commit[41]);
g4_status hub_write_ref(const char *repo_dir, const char *revision, const char *commit);
/* An exclusive flock on {cache}/.locks/{folder}/{etag}.lock; returns the fd
 * (close it to unlock), reporting G4_HUB_WAIT_LOCK if it has to wait. */
g4_status hub_lock_blob(const char *cache_dir, const char *folder, const char *etag, const g4_hub_options *opt,
                        const char *file, int *fd);
int hub_is_commit(const char *s);
/* Free bytes for unprivileged users on the filesystem of path (-1: unknown). */
int64_t hub_free_bytes(const char *path);

/* ---- one file (hub_download.c) ---- */

typedef struct {
    const hub_context *ctx;
    const char *file;                      /* repo-relative name */
    const char *url;                       /* the resolve URL, pinned to the commit */
    const char *blob_path;                 /* where the verified file goes */
    const char *etag;                      /* expected checksum (see g4_digest_kind_of) */
    int64_t size;                          /* expected size, -1 unknown */
    int index, count;
} hub_fetch;

/* Downloads into blob_path + ".incomplete" (resuming what is there), checks
 * size and checksum, renames into place. A corrupt result is deleted; a
 * partial one is kept for the next run. */
g4_status hub_fetch_blob(hub_http *h, const g4_hub_options *opt, const hub_fetch *f);
/* Checks a complete file's size and checksum against the expected ones. */
g4_status hub_verify_file(const char *path, const char *file, const char *etag, int64_t size);

/* "2.46 GB", "1.2 MB", "512 B" into buf. */
const char *hub_format_bytes(int64_t n, char buf[32]);

void hub_emit(const g4_hub_options *opt, g4_hub_event_kind kind, const char *file, int index, int count,
              uint64_t done, uint64_t total);

#endif
