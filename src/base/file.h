/* Files: read-only memory maps (weights are used where they lie) and
 * whole-file reads (small JSON files). */
#ifndef G4_BASE_FILE_H
#define G4_BASE_FILE_H

#include <stddef.h>
#include "base/status.h"

typedef struct {
    const unsigned char *data; /* NULL for an empty file */
    size_t size;
    char *path;                /* owned copy, for error messages */
} g4_mapped_file;

g4_status g4_map_file(const char *path, g4_mapped_file *out);
void g4_unmap_file(g4_mapped_file *f);

/* Reads a whole file into a NUL-terminated heap buffer; refuses files larger
 * than max_bytes with G4_ERR_LIMIT. */
g4_status g4_read_file(const char *path, size_t max_bytes, char **out_data, size_t *out_len);

/* Writes bytes to path (atomically via a temporary file and rename). */
g4_status g4_write_file(const char *path, const void *data, size_t len);

int g4_file_exists(const char *path);
int g4_is_directory(const char *path);

/* Returns a heap string "dir/name" (caller frees), or NULL on allocation failure. */
char *g4_path_join(const char *dir, const char *name);

/* Monotonic wall clock in seconds. */
double g4_now_seconds(void);

/* Peak resident set size of this process in bytes (0 if unknown). */
size_t g4_peak_rss_bytes(void);
/* Restarts the peak at the current resident size (Linux /proc/self/clear_refs),
 * so a benchmark's own probe buffers do not count. 1 on success. */
int g4_reset_peak_rss(void);
/* Current resident set size in bytes (0 if unknown). */
size_t g4_current_rss_bytes(void);
/* The current resident set split into private memory (heap, stacks: what a
 * copy of the weights would add) and pages mapped from files (the weights
 * used in place); 0 and 0 if unknown. */
void g4_current_rss_split(size_t *anon_bytes, size_t *file_bytes);

#endif
