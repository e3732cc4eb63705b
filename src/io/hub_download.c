/* Downloading one file into the blob store: resume from a partial file,
 * hash while writing, retry transient failures, verify, rename into place. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/digest.h"
#include "io/hub_internal.h"

/* The state of one partial file while bytes arrive. */
typedef struct {
    const hub_fetch *f;
    const g4_hub_options *opt;
    const char *path; /* the .incomplete file */
    int fd;
    g4_digest *digest;
    g4_digest_kind kind;
    uint64_t have;         /* bytes in the file, all of them hashed */
    int corrupt;           /* more bytes than expected: the file cannot be kept */
} partial;

static g4_status restart_partial(partial *p) {
    if (ftruncate(p->fd, 0) != 0 || lseek(p->fd, 0, SEEK_SET) != 0)
        return g4_fail(G4_ERR_IO, "%s: cannot truncate: %s", p->path, strerror(errno));
    g4_digest_free(p->digest);
    p->digest = NULL;
    p->have = 0;
    return g4_digest_begin(&p->digest, p->kind, p->f->size > 0 ? (uint64_t)p->f->size : 0);
}

static g4_status sink_begin(void *user, const hub_response *r) {
    partial *p = user;
    if (p->have > 0 && r->status == 200) {
        /* the server ignored "Range:": what follows is the whole file */
        hub_emit(p->opt, G4_HUB_RESTART, p->f->file, p->f->index, p->f->count, p->have,
                 p->f->size > 0 ? (uint64_t)p->f->size : 0);
        return restart_partial(p);
    }
    if (r->status == 206 && r->range_start != (int64_t)p->have)
        return g4_fail(G4_ERR_FORMAT, "%s: asked for bytes from %" PRIu64 ", the server sent them from %" PRId64,
                       p->f->file, p->have, r->range_start);
    if (r->status != 200 && r->status != 206)
        return g4_fail(G4_ERR_FORMAT, "%s: unexpected HTTP status %ld for a download", p->f->file, r->status);
    return G4_OK;
}

static g4_status sink_write(void *user, const void *data, size_t n) {
    partial *p = user;
    if (p->f->size >= 0 && p->have + n > (uint64_t)p->f->size) {
        p->corrupt = 1;
        return g4_fail(G4_ERR_FORMAT, "%s: the server sent more than the expected %" PRId64 " bytes", p->f->file,
                       p->f->size);
    }
    const char *c = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(p->fd, c, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            if (e == ENOSPC || e == EDQUOT || e == EFBIG)
                return g4_fail(G4_ERR_LIMIT,
                               "%s: %s after %" PRIu64 " bytes; free some space and run again to resume", p->path,
                               e == EFBIG ? "file size limit reached" : "disk full", p->have);
            return g4_fail(G4_ERR_IO, "%s: write error: %s", p->path, strerror(e));
        }
        c += w;
        left -= (size_t)w;
    }
    g4_status s = g4_digest_update(p->digest, data, n);
    p->have += n;
    hub_emit(p->opt, G4_HUB_FILE_BYTES, p->f->file, p->f->index, p->f->count, p->have,
             p->f->size > 0 ? (uint64_t)p->f->size : 0);
    return s;
}

static g4_status check_result(const hub_fetch *f, uint64_t have, const char *hex) {
    if (f->size >= 0 && have != (uint64_t)f->size)
        return g4_fail(G4_ERR_FORMAT, "%s: size mismatch: expected %" PRId64 " bytes, got %" PRIu64, f->file, f->size,
                       have);
    g4_digest_kind kind = g4_digest_kind_of(f->etag);
    if (kind != G4_DIGEST_NONE && strcmp(hex, f->etag) != 0)
        return g4_fail(G4_ERR_FORMAT, "%s: checksum mismatch: expected %s %s, got %s", f->file,
                       kind == G4_DIGEST_SHA256 ? "sha256" : "git sha1", f->etag, hex);
    return G4_OK;
}

g4_status hub_verify_file(const char *path, const char *file, const char *etag, int64_t size) {
    struct stat st;
    if (stat(path, &st) != 0) return g4_fail(G4_ERR_IO, "%s: %s", path, strerror(errno));
    hub_fetch f = {.file = file, .etag = etag, .size = size};
    g4_digest_kind kind = g4_digest_kind_of(etag);
    g4_digest *d;
    g4_status s = g4_digest_begin(&d, kind, (uint64_t)st.st_size);
    if (s != G4_OK) return s;
    char hex[65];
    if (kind != G4_DIGEST_NONE) s = g4_digest_update_from_file(d, path, (uint64_t)st.st_size);
    if (s == G4_OK) s = g4_digest_finish_hex(d, hex);
    g4_digest_free(d);
    if (s == G4_OK) s = check_result(&f, (uint64_t)st.st_size, hex);
    return s;
}

/* Opens (or creates) the partial file and hashes what it already holds. */
static g4_status open_partial(partial *p) {
    const hub_fetch *f = p->f;
    p->fd = open(p->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (p->fd < 0) return g4_fail(G4_ERR_IO, "%s: cannot create: %s", p->path, strerror(errno));
    struct stat st;
    if (fstat(p->fd, &st) != 0) return g4_fail(G4_ERR_IO, "%s: %s", p->path, strerror(errno));
    p->have = (uint64_t)st.st_size;
    p->kind = g4_digest_kind_of(f->etag);
    if (p->kind == G4_DIGEST_GIT_SHA1 && f->size < 0) p->kind = G4_DIGEST_NONE; /* git's header needs the size */
    if (f->size >= 0 && p->have > (uint64_t)f->size) return restart_partial(p);
    g4_status s = g4_digest_begin(&p->digest, p->kind, f->size > 0 ? (uint64_t)f->size : 0);
    if (s == G4_OK && p->have > 0) s = g4_digest_update_from_file(p->digest, p->path, p->have);
    if (s == G4_OK && lseek(p->fd, (off_t)p->have, SEEK_SET) < 0)
        s = g4_fail(G4_ERR_IO, "%s: %s", p->path, strerror(errno));
    return s;
}

/* Enough room for the rest of the file? */
static g4_status check_space(const partial *p) {
    if (p->f->size < 0) return G4_OK;
    int64_t need = p->f->size - (int64_t)p->have;
    int64_t free_bytes = hub_free_bytes(p->path);
    char a[32], b[32];
    if (free_bytes >= 0 && need > free_bytes)
        return g4_fail(G4_ERR_LIMIT, "not enough disk space for %s: it needs %s more, %s are free where %s is",
                       p->f->file, hub_format_bytes(need, a), hub_format_bytes(free_bytes, b), p->path);
    return G4_OK;
}

/* Repeats the GET until the file is whole, within the retry budget. */
static g4_status download_loop(hub_http *h, partial *p) {
    const hub_fetch *f = p->f;
    hub_retry retry;
    hub_retry_init(&retry, p->opt);
    hub_sink sink = {sink_begin, sink_write, p};
    uint64_t furthest = p->have; /* only getting further than ever before renews the retry budget */
    for (;;) {
        if (f->size >= 0 && p->have == (uint64_t)f->size) return G4_OK;
        hub_response r;
        g4_status s = hub_http_download(h, f->url, p->have, &sink, &r);
        if (p->have > furthest) {
            furthest = p->have;
            retry.failures = 0;
        }
        int transient = r.transient;
        if (s == G4_OK && (r.status < 200 || r.status >= 300)) {
            if (r.status == 416 && p->have > 0) { /* our range is past the end: the partial file is not this file */
                s = restart_partial(p);
                transient = 1;
                if (s == G4_OK) s = g4_fail(G4_ERR_IO, "%s: range not satisfiable, starting over", f->file);
            } else {
                s = hub_response_error(&r, f->ctx, f->file);
                transient = r.transient;
            }
        } else if (s == G4_OK && f->size >= 0 && p->have < (uint64_t)f->size) {
            s = g4_fail(G4_ERR_IO, "%s: the connection ended after %" PRIu64 " of %" PRId64 " bytes", f->file,
                        p->have, f->size);
            transient = 1;
        }
        int64_t retry_after = r.retry_after;
        hub_response_clear(&r);
        if (s == G4_OK) return G4_OK;
        if (s == G4_ERR_IO && strncmp(g4_error_message(), f->file, strlen(f->file)) != 0)
            s = g4_fail(s, "%s: %s", f->file, g4_error_message()); /* name the file, not just the CDN URL */
        if (!transient || !hub_retry_wait(&retry, f->file, g4_error_message(), retry_after)) return s;
    }
}

g4_status hub_fetch_blob(hub_http *h, const g4_hub_options *opt, const hub_fetch *f) {
    char *path = hub_printf("%s.incomplete", f->blob_path);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    partial p = {.f = f, .opt = opt, .path = path, .fd = -1};
    g4_status s = open_partial(&p);
    if (s == G4_OK) {
        hub_emit(opt, G4_HUB_FILE_START, f->file, f->index, f->count, p.have, f->size > 0 ? (uint64_t)f->size : 0);
        s = check_space(&p);
    }
    if (s == G4_OK) s = download_loop(h, &p);
    if (s == G4_OK && fsync(p.fd) != 0) s = g4_fail(G4_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    if (p.fd >= 0 && close(p.fd) != 0 && s == G4_OK) s = g4_fail(G4_ERR_IO, "%s: close: %s", path, strerror(errno));
    char hex[65] = "";
    if (s == G4_OK) s = g4_digest_finish_hex(p.digest, hex);
    if (s == G4_OK && (s = check_result(f, p.have, hex)) != G4_OK) p.corrupt = 1;
    if (s == G4_OK && rename(path, f->blob_path) != 0)
        s = g4_fail(G4_ERR_IO, "%s: cannot rename to %s: %s", path, f->blob_path, strerror(errno));
    if (s == G4_OK) hub_emit(opt, G4_HUB_FILE_DONE, f->file, f->index, f->count, p.have, p.have);
    if (p.corrupt) {
        /* resuming from bad bytes would fail forever: start clean next time */
        unlink(path);
        s = g4_fail(s, "%s; the download was deleted (run again to fetch it anew)", g4_error_message());
    }
    g4_digest_free(p.digest);
    free(path);
    return s;
}
