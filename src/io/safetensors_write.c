/* Writing safetensors files: the header first, then each tensor's bytes as
 * the caller makes them, so a file of any size needs no copy in memory. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"

struct g4_st_stream {
    FILE *f;
    char *path, *tmp;
    size_t n, k;           /* tensors, and the position in `order` being written */
    size_t *order;         /* indices into the caller's items, in file order */
    uint64_t *sizes;       /* bytes of each item */
    uint64_t done;         /* bytes of order[k] written so far */
    g4_status failed;      /* first failure; later calls repeat it */
};

static int mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 1;
    *out = a * b;
    return 0;
}

/* Byte size of one item, or a failure naming what is wrong with it. */
static g4_status item_bytes(const char *path, const g4_st_write_item *it, uint64_t *bytes) {
    if (!it->name) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor without a name", path);
    if (!strcmp(it->name, "__metadata__"))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: '__metadata__' is reserved, not a tensor name", path);
    if (g4_dtype_size(it->dtype) == 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has an invalid dtype", path, it->name);
    if (it->ndim < 0 || it->ndim > G4_ST_MAX_DIMS)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has %d dimensions (0 to %d allowed)", path,
                       it->name, it->ndim, G4_ST_MAX_DIMS);
    uint64_t elements = 1;
    for (int d = 0; d < it->ndim; d++) {
        if (it->shape[d] < 0)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has a negative shape entry %d", path,
                           it->name, d);
        if (mul_overflows(elements, (uint64_t)it->shape[d], &elements))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s': shape overflows", path, it->name);
    }
    if (mul_overflows(elements, g4_dtype_size(it->dtype), bytes) || *bytes > SIZE_MAX / 2)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s': byte size overflows", path, it->name);
    return G4_OK;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

/* Validates the items and returns the order to write them in: widest
 * element first (stable), as Python safetensors does, so that with the data
 * section 8-byte aligned every tensor is aligned to its element size. */
static g4_status plan_write(const char *path, const g4_st_write_item *items, size_t n, size_t *order,
                            uint64_t *sizes) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        g4_status st = item_bytes(path, &items[i], &sizes[i]);
        if (st != G4_OK) return st;
        if (sizes[i] > SIZE_MAX / 2 - total) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: total size overflows", path);
        total += sizes[i];
    }
    /* duplicate names: sort pointers to the names (checkpoints have thousands) */
    const char **names = malloc((n ? n : 1) * sizeof *names);
    const char ***refs = malloc((n ? n : 1) * sizeof *refs);
    if (!names || !refs) {
        free(names);
        free(refs);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n; i++) names[i] = items[i].name, refs[i] = &names[i];
    qsort(refs, n, sizeof *refs, compare_names);
    g4_status st = G4_OK;
    for (size_t i = 1; i < n && st == G4_OK; i++)
        if (!strcmp(*refs[i - 1], *refs[i]))
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is listed twice", path, *refs[i]);
    free(names);
    free(refs);
    if (st != G4_OK) return st;
    size_t k = 0;
    for (size_t width = 8; width >= 1; width /= 2)
        for (size_t i = 0; i < n; i++)
            if (g4_dtype_size(items[i].dtype) == width) order[k++] = i;
    return G4_OK;
}

/* The JSON header for items in `order` (NULL when out of memory). */
static char *build_header(const g4_st_write_item *items, const size_t *order, const uint64_t *sizes, size_t n) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    uint64_t offset = 0;
    for (size_t k = 0; k < n; k++) {
        const g4_st_write_item *it = &items[order[k]];
        uint64_t bytes = sizes[order[k]];
        cJSON *e = cJSON_AddObjectToObject(root, it->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!shape || !offs || !cJSON_AddStringToObject(e, "dtype", g4_dtype_name(it->dtype))) {
            cJSON_Delete(root);
            return NULL;
        }
        for (int d = 0; d < it->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)it->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        if (cJSON_GetArraySize(shape) != it->ndim || cJSON_GetArraySize(offs) != 2) {
            cJSON_Delete(root);
            return NULL;
        }
        offset += bytes;
    }
    char *header = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return header;
}

static void stream_free(g4_st_stream *s) {
    if (!s) return;
    if (s->f) fclose(s->f);
    if (s->tmp) unlink(s->tmp); /* gone already when the file was finished */
    free(s->tmp);
    free(s->path);
    free(s->order);
    free(s->sizes);
    free(s);
}

/* Skips past tensors that are complete (and empty ones). */
static void advance(g4_st_stream *s) {
    while (s->k < s->n && s->done == s->sizes[s->order[s->k]]) {
        s->k++;
        s->done = 0;
    }
}

g4_status g4_st_stream_open(const char *path, const g4_st_write_item *items, size_t n, g4_st_stream **out) {
    *out = NULL;
    g4_st_stream *s = calloc(1, sizeof *s);
    size_t tmp_len = strlen(path) + 24;
    if (s) {
        s->n = n;
        s->order = malloc((n ? n : 1) * sizeof *s->order);
        s->sizes = malloc((n ? n : 1) * sizeof *s->sizes);
        s->path = strdup(path);
        s->tmp = malloc(tmp_len);
    }
    if (!s || !s->order || !s->sizes || !s->path || !s->tmp) {
        stream_free(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    snprintf(s->tmp, tmp_len, "%s.tmp%d", path, (int)getpid());
    g4_status st = plan_write(path, items, n, s->order, s->sizes);
    char *header = st == G4_OK ? build_header(items, s->order, s->sizes, n) : NULL;
    if (st == G4_OK && !header) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st != G4_OK) {
        free(s->tmp);
        s->tmp = NULL; /* nothing created yet */
        stream_free(s);
        return st;
    }
    s->f = fopen(s->tmp, "wb");
    if (!s->f) {
        st = g4_fail(G4_ERR_IO, "%s: cannot create: %s", s->tmp, strerror(errno));
        free(header);
        free(s->tmp);
        s->tmp = NULL;
        stream_free(s);
        return st;
    }
    size_t hlen = strlen(header), padded = (hlen + 7) & ~(size_t)7; /* keep data 8-byte aligned */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, s->f) == 8 && fwrite(header, 1, hlen, s->f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', s->f) != EOF;
    free(header);
    if (!ok) {
        st = g4_fail(G4_ERR_IO, "%s: write failed: %s", s->tmp, strerror(errno));
        stream_free(s);
        return st;
    }
    advance(s);
    *out = s;
    return G4_OK;
}

size_t g4_st_stream_next(const g4_st_stream *s, uint64_t *done, uint64_t *total) {
    if (s->k >= s->n) return s->n;
    if (done) *done = s->done;
    if (total) *total = s->sizes[s->order[s->k]];
    return s->order[s->k];
}

g4_status g4_st_stream_write(g4_st_stream *s, const void *bytes, size_t len) {
    if (s->failed != G4_OK) return s->failed;
    if (s->k >= s->n || len > s->sizes[s->order[s->k]] - s->done) {
        s->failed = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: %zu bytes more than the tensors' sizes", s->path, len);
        return s->failed;
    }
    if (len && fwrite(bytes, 1, len, s->f) != len) {
        s->failed = g4_fail(G4_ERR_IO, "%s: write failed: %s", s->tmp, strerror(errno));
        return s->failed;
    }
    s->done += len;
    advance(s);
    return G4_OK;
}

g4_status g4_st_stream_close(g4_st_stream *s) {
    if (!s) return G4_OK;
    g4_status st = s->failed;
    if (st == G4_OK && s->k < s->n)
        st = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: closed before all tensors were written", s->path);
    if (st == G4_OK) {
        int closed = fclose(s->f);
        s->f = NULL;
        if (closed != 0 || rename(s->tmp, s->path) != 0)
            st = g4_fail(G4_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
        else {
            free(s->tmp);
            s->tmp = NULL;
        }
    }
    stream_free(s);
    return st;
}

g4_status g4_st_write(const char *path, const g4_st_write_item *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 0;
        g4_status st = item_bytes(path, &items[i], &bytes);
        if (st != G4_OK) return st;
        if (bytes && !items[i].data)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has no data", path, items[i].name);
    }
    g4_st_stream *s;
    g4_status st = g4_st_stream_open(path, items, n, &s);
    if (st != G4_OK) return st;
    uint64_t total = 0;
    for (size_t i; st == G4_OK && (i = g4_st_stream_next(s, NULL, &total)) < n;)
        st = g4_st_stream_write(s, items[i].data, (size_t)total);
    g4_status closed = g4_st_stream_close(s);
    return st != G4_OK ? st : closed;
}
