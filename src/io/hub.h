/* Hugging Face hub downloads ("gemma4 pull") and model-name resolution.
 *
 * Protocol (as huggingface_hub speaks it):
 *   GET  {endpoint}/api/models/{repo}/revision/{rev}?blobs=true
 *        → JSON: "sha" (the commit) and "siblings" [{rfilename, size, blobId,
 *          lfs: {sha256, size}}]
 *   HEAD {endpoint}/{repo}/resolve/{commit}/{file}
 *        → 200 (small git files: ETag = git blob SHA-1, Content-Length) or
 *          302 to a CDN (LFS files: X-Linked-Etag = SHA-256, X-Linked-Size);
 *          X-Repo-Commit either way; errors carry X-Error-Code
 *          (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
 *   GET  the same URL, following redirects, with "Range: bytes=N-" to resume.
 * The token goes only to the endpoint's own origin, never to the CDN.
 *
 * Cache layout: the one huggingface_hub uses, so that a model fetched by
 * Python is found here and the other way round:
 *   {cache}/models--ORG--NAME/blobs/{etag}            file contents
 *   {cache}/models--ORG--NAME/blobs/{etag}.incomplete  partial download
 *   {cache}/models--ORG--NAME/snapshots/{commit}/{file} → ../../blobs/{etag}
 *   {cache}/models--ORG--NAME/refs/{revision}          the commit, as text
 *   {cache}/.locks/models--ORG--NAME/{etag}.lock       flock()ed while writing
 * {cache} is --cache, else $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
 * $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub. */
#ifndef G4_IO_HUB_H
#define G4_IO_HUB_H

#include <stdint.h>

#include "base/status.h"

typedef enum {
    G4_HUB_LISTED,      /* the file list is known: count = files to fetch, total = their bytes (0 if unknown) */
    G4_HUB_FILE_CACHED, /* already in the cache, nothing to fetch */
    G4_HUB_FILE_START,  /* starting (done > 0 when resuming a partial file) */
    G4_HUB_FILE_BYTES,  /* more bytes arrived */
    G4_HUB_FILE_DONE,   /* written, size and checksum verified */
    G4_HUB_RETRY,       /* a transient failure: message says what, wait_seconds how long until the retry */
    G4_HUB_RESTART,     /* the server ignored the Range request: starting the file over */
    G4_HUB_WAIT_LOCK,   /* another process is downloading this file; waiting for it */
} g4_hub_event_kind;

typedef struct {
    g4_hub_event_kind kind;
    const char *file;      /* repo-relative name (NULL for G4_HUB_LISTED) */
    int index, count;      /* this is file `index` (1-based) of `count` */
    uint64_t done, total;  /* bytes of this file so far / expected (0: unknown) */
    const char *message;   /* G4_HUB_RETRY: the error */
    double wait_seconds;   /* G4_HUB_RETRY */
} g4_hub_event;

typedef void (*g4_hub_progress_fn)(const g4_hub_event *event, void *user);

typedef struct {
    const char *endpoint;  /* NULL: $HF_ENDPOINT, else https://huggingface.co */
    const char *cache_dir; /* NULL: g4_hub_default_cache_dir() */
    const char *token;     /* NULL: $HF_TOKEN, $HUGGING_FACE_HUB_TOKEN, then the file $HF_TOKEN_PATH or $HF_HOME/token */
    int max_retries;       /* per request, after the first try; <= 0: 5 */
    int backoff_ms;        /* first retry delay, doubled each time (capped at 30 s); <= 0: 1000 */
    int verify_cached;     /* re-hash files already in the cache */
    g4_hub_progress_fn progress;
    void *progress_user;
} g4_hub_options;

/* Downloads a model repo at `revision` (NULL: "main") into the cache: the
 * config, tokenizer and processor files that exist and all safetensors
 * weights (model.safetensors, or the shards named by
 * model.safetensors.index.json plus the index). Every file's size is checked,
 * and its content against the ETag (SHA-256 for LFS files, git SHA-1 for
 * others). Interrupted downloads resume. On success *out_dir (caller frees) is
 * the snapshot directory. */
g4_status g4_hub_pull(const char *repo_id, const char *revision, const g4_hub_options *opt, char **out_dir);

/* A local directory for a -m argument, without network: an existing directory
 * (or the directory of an existing file) as given, or ORG/NAME[@REVISION]
 * already complete in the default cache. */
g4_status g4_resolve_model_path(const char *arg, char **dir);

/* The snapshot directory of repo_id at revision (NULL: "main"; a branch/tag
 * name is looked up in refs/, a 40-digit commit used as is) in cache_dir
 * (NULL: the default), if it holds config.json and complete weights. */
g4_status g4_hub_cache_lookup(const char *cache_dir, const char *repo_id, const char *revision, char **dir);

/* Heap strings; NULL only when out of memory. */
char *g4_hub_default_cache_dir(void);
char *g4_hub_default_endpoint(void);

/* ---- names and URLs (exposed for tests) ---- */

/* Splits "ORG/NAME" or "ORG/NAME@REV" (heap strings; *revision NULL when absent). */
g4_status g4_hub_parse_ref(const char *arg, char **repo_id, char **revision);
/* Repo ids are ORG/NAME with letters, digits, '-', '_', '.'; no "--" or "..",
 * no leading/trailing '-' or '.', at most 96 characters. */
int g4_hub_valid_repo_id(const char *repo_id);
/* Revisions and file names become paths: no empty, "." or ".." components, no
 * leading '/', no backslash or control characters. */
int g4_hub_valid_relpath(const char *path);
/* Percent-encodes everything but A-Z a-z 0-9 "_.-~" (and '/' if keep_slash),
 * as Python's urllib.parse.quote does. */
char *g4_hub_url_escape(const char *s, int keep_slash);
/* {endpoint}/{repo}/resolve/{quote(rev, safe="")}/{quote(file)} */
char *g4_hub_resolve_url(const char *endpoint, const char *repo_id, const char *revision, const char *file);
/* {endpoint}/api/models/{repo}/revision/{quote(rev, safe="")}?blobs=true */
char *g4_hub_api_url(const char *endpoint, const char *repo_id, const char *revision);
/* "models--ORG--NAME" */
char *g4_hub_repo_folder(const char *repo_id);

#endif
