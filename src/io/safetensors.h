/* safetensors: an 8-byte little-endian header length, a JSON header naming
 * every tensor's dtype, shape and byte range, then the raw data. Files are
 * memory-mapped and tensors point straight into the map (zero copy).
 * A checkpoint is one file or several shards listed by
 * model.safetensors.index.json; both open as one tensor set. */
#ifndef G4_IO_SAFETENSORS_H
#define G4_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/file.h"
#include "base/status.h"
#include "tensor/dtype.h"

#define G4_ST_MAX_DIMS 8
/* Headers larger than this are refused (real headers are well under 10 MB). */
#define G4_ST_MAX_HEADER_BYTES ((uint64_t)100 << 20)

typedef struct {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_ST_MAX_DIMS];
    const unsigned char *data; /* inside the file's map */
    uint64_t nbytes;
    int file;                  /* index into the set's files */
} g4_st_tensor;

typedef struct g4_st_set g4_st_set;

/* Parses and validates one file's bytes. `label` names the file in errors.
 * On success *out is a malloc'd array of *n_out tensors whose data pointers
 * point into buf; free it with g4_st_free_tensors. Rejects: short files,
 * header length past the end, bad JSON, unknown dtypes, bad shapes, offsets
 * outside the data, shape x dtype != byte length, overlapping ranges and
 * duplicate names. Used by g4_st_open and by the fuzz target. */
g4_status g4_st_parse(const unsigned char *buf, size_t len, const char *label,
                      g4_st_tensor **out, size_t *n_out);
void g4_st_free_tensors(g4_st_tensor *t, size_t n);

/* Opens a single .safetensors file, or a directory holding either
 * model.safetensors.index.json (+ shards), model.safetensors, or
 * model-XXXXX-of-YYYYY.safetensors shards. */
g4_status g4_st_open(const char *path, g4_st_set **out);
void g4_st_close(g4_st_set *set);

size_t g4_st_count(const g4_st_set *set);
const g4_st_tensor *g4_st_at(const g4_st_set *set, size_t i);
/* NULL when absent. */
const g4_st_tensor *g4_st_find(const g4_st_set *set, const char *name);
/* Path of file number i (for messages). */
const char *g4_st_file_path(const g4_st_set *set, int i);
int g4_st_file_count(const g4_st_set *set);
/* Sum of all tensors' bytes. */
uint64_t g4_st_total_bytes(const g4_st_set *set);

/* Parses a model.safetensors.index.json text: calls back once per
 * (tensor name, shard file name). Validates structure (weight_map object of
 * strings, shard names without '/' or ".."). Used by g4_st_open and fuzzed. */
typedef g4_status (*g4_st_index_entry_fn)(void *ctx, const char *tensor, const char *shard);
g4_status g4_st_parse_index(const char *text, size_t len, const char *label,
                            g4_st_index_entry_fn fn, void *ctx);

/* Writing (for `gemma4 logits -o` and tests). */
typedef struct {
    const char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_ST_MAX_DIMS];
    const void *data;
} g4_st_write_item;

g4_status g4_st_write(const char *path, const g4_st_write_item *items, size_t n);

/* Streaming writer, for files larger than memory: opening writes the header
 * from the items' names, dtypes and shapes (their data is not read); then the
 * caller writes each tensor's bytes, in any pieces, in the order the writer
 * asks for; closing renames the finished file into place (it is written as
 * path.tmpPID until then and removed if anything failed). */
typedef struct g4_st_stream g4_st_stream;
g4_status g4_st_stream_open(const char *path, const g4_st_write_item *items, size_t n, g4_st_stream **out);
/* Index into items of the tensor whose bytes come next, with how many of
 * its bytes are written (*done) out of *total; n when all are written. */
size_t g4_st_stream_next(const g4_st_stream *s, uint64_t *done, uint64_t *total);
/* Appends len bytes of the current tensor (a piece may not run past it). */
g4_status g4_st_stream_write(g4_st_stream *s, const void *bytes, size_t len);
/* Fails, removing the partial file, unless every byte was written. */
g4_status g4_st_stream_close(g4_st_stream *s);

#endif
