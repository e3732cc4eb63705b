/* Content digests used to check downloaded files: SHA-256 (the hub's ETag of
 * LFS files) and git's blob SHA-1 (the ETag of regular git files, the SHA-1
 * of "blob <size>\0" followed by the bytes). Both stream, so a multi-GB file is
 * hashed while it arrives. Backed by OpenSSL's libcrypto, which uses the CPU's
 * SHA instructions (about 2 GB/s) — re-hashing a 60 GB checkpoint on resume
 * must not take minutes. */
#ifndef G4_IO_DIGEST_H
#define G4_IO_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    G4_DIGEST_NONE = 0, /* no checksum known: only the size can be checked */
    G4_DIGEST_SHA256,   /* 64 hex digits */
    G4_DIGEST_GIT_SHA1, /* 40 hex digits: git blob object id */
} g4_digest_kind;

typedef struct g4_digest g4_digest;

/* Starts a digest. For G4_DIGEST_GIT_SHA1 the blob size must be known up front
 * (it is part of the hashed header). G4_DIGEST_NONE gives a digest that
 * ignores its input. */
g4_status g4_digest_begin(g4_digest **out, g4_digest_kind kind, uint64_t git_blob_size);
g4_status g4_digest_update(g4_digest *d, const void *data, size_t n);
/* Writes the lowercase hex digest and a NUL into hex (65 bytes suffice);
 * "" for G4_DIGEST_NONE. The digest cannot be updated afterwards. */
g4_status g4_digest_finish_hex(g4_digest *d, char hex[65]);
void g4_digest_free(g4_digest *d);

/* Feeds the first `nbytes` bytes of a file into d (used when resuming). */
g4_status g4_digest_update_from_file(g4_digest *d, const char *path, uint64_t nbytes);

/* One-shot helpers. */
g4_status g4_sha256_hex(const void *data, size_t n, char hex[65]);
g4_status g4_git_blob_sha1_hex(const void *data, size_t n, char hex[41]);

/* What kind of checksum an ETag value is: 64 lowercase hex digits → SHA-256,
 * 40 → git SHA-1, anything else → none. */
g4_digest_kind g4_digest_kind_of(const char *etag);

#endif
