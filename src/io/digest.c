#include "io/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

struct g4_digest {
    g4_digest_kind kind;
    EVP_MD_CTX *ctx; /* NULL for G4_DIGEST_NONE */
};

g4_status g4_digest_begin(g4_digest **out, g4_digest_kind kind, uint64_t git_blob_size) {
    *out = NULL;
    g4_digest *d = calloc(1, sizeof *d);
    if (!d) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    d->kind = kind;
    if (kind != G4_DIGEST_NONE) {
        d->ctx = EVP_MD_CTX_new();
        const EVP_MD *md = kind == G4_DIGEST_SHA256 ? EVP_sha256() : EVP_sha1();
        if (!d->ctx || EVP_DigestInit_ex(d->ctx, md, NULL) != 1) {
            g4_digest_free(d);
            return g4_fail(G4_ERR_INTERNAL, "libcrypto: cannot start a digest");
        }
        if (kind == G4_DIGEST_GIT_SHA1) {
            /* git hashes objects as "<type> <decimal size>\0<bytes>" */
            char header[40];
            int n = snprintf(header, sizeof header, "blob %" PRIu64, git_blob_size);
            if (EVP_DigestUpdate(d->ctx, header, (size_t)n + 1) != 1) {
                g4_digest_free(d);
                return g4_fail(G4_ERR_INTERNAL, "libcrypto: digest update failed");
            }
        }
    }
    *out = d;
    return G4_OK;
}

g4_status g4_digest_update(g4_digest *d, const void *data, size_t n) {
    if (!d->ctx || n == 0) return G4_OK;
    if (EVP_DigestUpdate(d->ctx, data, n) != 1) return g4_fail(G4_ERR_INTERNAL, "libcrypto: digest update failed");
    return G4_OK;
}

g4_status g4_digest_finish_hex(g4_digest *d, char hex[65]) {
    hex[0] = '\0';
    if (!d->ctx) return G4_OK;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    int ok = EVP_DigestFinal_ex(d->ctx, md, &len);
    EVP_MD_CTX_free(d->ctx);
    d->ctx = NULL;
    if (ok != 1 || len > 32) return g4_fail(G4_ERR_INTERNAL, "libcrypto: digest final failed");
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < len; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[2 * len] = '\0';
    return G4_OK;
}

void g4_digest_free(g4_digest *d) {
    if (!d) return;
    EVP_MD_CTX_free(d->ctx);
    free(d);
}

g4_status g4_digest_update_from_file(g4_digest *d, const char *path, uint64_t nbytes) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g4_fail(G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4u << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    g4_status s = G4_OK;
    while (nbytes > 0 && s == G4_OK) {
        size_t want = nbytes < cap ? (size_t)nbytes : cap;
        ssize_t got = read(fd, buf, want);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) s = g4_fail(G4_ERR_IO, "%s: read error: %s", path, strerror(errno));
        else if (got == 0) s = g4_fail(G4_ERR_IO, "%s: shorter than expected", path);
        else {
            s = g4_digest_update(d, buf, (size_t)got);
            nbytes -= (uint64_t)got;
        }
    }
    free(buf);
    close(fd);
    return s;
}

static g4_status one_shot(g4_digest_kind kind, const void *data, size_t n, char *hex) {
    g4_digest *d;
    g4_status s = g4_digest_begin(&d, kind, n);
    if (s != G4_OK) return s;
    s = g4_digest_update(d, data, n);
    if (s == G4_OK) s = g4_digest_finish_hex(d, hex);
    g4_digest_free(d);
    return s;
}

g4_status g4_sha256_hex(const void *data, size_t n, char hex[65]) { return one_shot(G4_DIGEST_SHA256, data, n, hex); }

g4_status g4_git_blob_sha1_hex(const void *data, size_t n, char hex[41]) {
    char full[65];
    g4_status s = one_shot(G4_DIGEST_GIT_SHA1, data, n, full);
    if (s == G4_OK) memcpy(hex, full, 41);
    return s;
}

static int all_lower_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

g4_digest_kind g4_digest_kind_of(const char *etag) {
    if (!etag) return G4_DIGEST_NONE;
    size_t n = strlen(etag);
    if (n == 64 && all_lower_hex(etag, n)) return G4_DIGEST_SHA256;
    if (n == 40 && all_lower_hex(etag, n)) return G4_DIGEST_GIT_SHA1;
    return G4_DIGEST_NONE;
}
