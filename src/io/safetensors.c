#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Header parsing                                                            */

static uint64_t read_u64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A JSON number that is a non-negative integer exactly representable. */
static int json_to_u64(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return 0;
    double d = item->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static int mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 1;
    *out = a * b;
    return 0;
}

void g4_st_free_tensors(g4_st_tensor *t, size_t n) {
    if (!t) return;
    for (size_t i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int compare_by_offset(const void *a, const void *b) {
    const g4_st_tensor *x = a, *y = b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : (x->nbytes > y->nbytes);
}

static int compare_by_name(const void *a, const void *b) {
    const g4_st_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static g4_status parse_entry(const cJSON *entry, const char *label, const unsigned char *data_start,
                             uint64_t data_len, g4_st_tensor *t) {
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", label, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsString(dtype))
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': missing or non-string dtype", label, name);
    t->dtype = g4_dtype_from_name(dtype->valuestring);
    if (t->dtype == G4_DTYPE_INVALID)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", label, name,
                       dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': missing shape array", label, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > G4_ST_MAX_DIMS)
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions (at most %d supported)",
                       label, name, ndim, G4_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t elements = 1;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (!json_to_u64(dim, &v) || v > (uint64_t)INT64_MAX)
            return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': shape entry %d is not a non-negative integer",
                           label, name, d);
        t->shape[d++] = (int64_t)v;
        if (mul_overflows(elements, v, &elements))
            return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': shape overflows", label, name);
    }
    uint64_t expected;
    if (mul_overflows(elements, g4_dtype_size(t->dtype), &expected))
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': byte size overflows", label, name);
    uint64_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !json_to_u64(cJSON_GetArrayItem(offsets, 0), &begin) ||
        !json_to_u64(cJSON_GetArrayItem(offsets, 1), &end))
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers",
                       label, name);
    if (begin > end)
        return g4_fail(G4_ERR_FORMAT, "%s: tensor '%s': data_offsets begin %llu > end %llu", label, name,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: tensor '%s': data range [%llu, %llu) runs past the end of the file "
                       "(%llu data bytes; truncated file?)",
                       label, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_len);
    if (end - begin != expected)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: tensor '%s': shape and dtype %s need %llu bytes but data_offsets give %llu",
                       label, name, g4_dtype_name(t->dtype), (unsigned long long)expected,
                       (unsigned long long)(end - begin));
    t->data = data_start + begin;
    t->nbytes = expected;
    t->name = strdup(name);
    if (!t->name) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    return G4_OK;
}

/* __metadata__ is a string-to-string map, present at most once. */
static g4_status check_metadata(const cJSON *md, const char *label, int occurrence) {
    if (occurrence > 1) return g4_fail(G4_ERR_FORMAT, "%s: __metadata__ appears twice in the header", label);
    if (!cJSON_IsObject(md)) return g4_fail(G4_ERR_FORMAT, "%s: __metadata__ is not an object", label);
    const cJSON *e;
    cJSON_ArrayForEach(e, md) {
        if (!cJSON_IsString(e))
            return g4_fail(G4_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", label, e->string);
    }
    return G4_OK;
}

/* Ranges sorted by start overlap iff one starts before the furthest end seen
 * so far; empty tensors occupy nothing and are skipped (comparing only
 * neighbours would let an empty one hide an overlap). */
static g4_status check_overlaps(const g4_st_tensor *by_offset, size_t n, const char *label) {
    const g4_st_tensor *reach_owner = NULL;
    const unsigned char *reach = NULL;
    for (size_t i = 0; i < n; i++) {
        const g4_st_tensor *t = &by_offset[i];
        if (t->nbytes == 0) continue;
        if (reach_owner && t->data < reach)
            return g4_fail(G4_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the file", label,
                           reach_owner->name, t->name);
        if (!reach_owner || t->data + t->nbytes > reach) {
            reach = t->data + t->nbytes;
            reach_owner = t;
        }
    }
    return G4_OK;
}

g4_status g4_st_parse(const unsigned char *buf, size_t len, const char *label, g4_st_tensor **out,
                      size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (len < 8)
        return g4_fail(G4_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file", label, len);
    uint64_t header_len = read_u64_le(buf);
    if (header_len > G4_ST_MAX_HEADER_BYTES)
        return g4_fail(G4_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit", label,
                       (unsigned long long)header_len, (unsigned long long)G4_ST_MAX_HEADER_BYTES);
    if (header_len > len - 8)
        return g4_fail(G4_ERR_FORMAT,
                       "%s: header length %llu points past the end of the %zu-byte file (truncated?)",
                       label, (unsigned long long)header_len, len);
    const unsigned char *data_start = buf + 8 + header_len;
    uint64_t data_len = len - 8 - header_len;

    const char *header = (const char *)buf + 8;
    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(header, (size_t)header_len, &parse_end, 0);
    if (!root) return g4_fail(G4_ERR_FORMAT, "%s: header is not valid JSON", label);
    /* The format allows only whitespace padding after the object; anything
     * else means a corrupt header (Python safetensors refuses it too). */
    for (const char *p = parse_end; p < header + header_len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return g4_fail(G4_ERR_FORMAT, "%s: unexpected bytes after the JSON header at byte %zu", label,
                           (size_t)(p - header) + 8);
        }
    }
    if (!cJSON_IsObject(root) || header[0] != '{') {
        cJSON_Delete(root);
        return g4_fail(G4_ERR_FORMAT, "%s: header is not a JSON object starting with '{'", label);
    }
    size_t count = 0;
    const cJSON *entry;
    cJSON_ArrayForEach(entry, root) {
        if (strcmp(entry->string, "__metadata__") != 0) count++;
    }
    g4_st_tensor *tensors = calloc(count ? count : 1, sizeof *tensors);
    if (!tensors) {
        cJSON_Delete(root);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    size_t n = 0;
    int n_metadata = 0;
    g4_status st = G4_OK;
    cJSON_ArrayForEach(entry, root) {
        if (!strcmp(entry->string, "__metadata__")) {
            st = check_metadata(entry, label, ++n_metadata);
            if (st != G4_OK) break;
            continue;
        }
        st = parse_entry(entry, label, data_start, data_len, &tensors[n]);
        if (st != G4_OK) break;
        n++;
    }
    cJSON_Delete(root);
    if (st == G4_OK && n > 1) {
        qsort(tensors, n, sizeof *tensors, compare_by_name);
        for (size_t i = 1; i < n; i++) {
            if (!strcmp(tensors[i].name, tensors[i - 1].name)) {
                st = g4_fail(G4_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", label,
                             tensors[i].name);
                break;
            }
        }
    }
    if (st == G4_OK && n > 1) {
        /* Overlap check on a copy sorted by offset; keep name order for lookup. */
        g4_st_tensor *by_offset = malloc(n * sizeof *by_offset);
        if (!by_offset) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            memcpy(by_offset, tensors, n * sizeof *by_offset);
            qsort(by_offset, n, sizeof *by_offset, compare_by_offset);
            st = check_overlaps(by_offset, n, label);
            free(by_offset);
        }
    }
    if (st != G4_OK) {
        g4_st_free_tensors(tensors, n);
        return st;
    }
    *out = tensors;
    *n_out = n;
    return G4_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensor sets (one or more mapped files) with a name hash table             */

struct g4_st_set {
    g4_mapped_file *files;
    int n_files;
    g4_st_tensor *tensors; /* all files' tensors */
    size_t n_tensors, cap_tensors;
    size_t *slots;         /* open addressing: index+1, 0 = empty */
    size_t n_slots;
    uint64_t total_bytes;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const g4_st_tensor *lookup(const g4_st_set *set, const char *name) {
    if (!set->n_slots) return NULL;
    size_t mask = set->n_slots - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        size_t s = set->slots[i];
        if (!s) return NULL;
        if (!strcmp(set->tensors[s - 1].name, name)) return &set->tensors[s - 1];
    }
}

static g4_status build_index(g4_st_set *set) {
    size_t n_slots = 16;
    while (n_slots < set->n_tensors * 2) n_slots *= 2;
    set->slots = calloc(n_slots, sizeof *set->slots);
    if (!set->slots) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    set->n_slots = n_slots;
    for (size_t t = 0; t < set->n_tensors; t++) {
        const char *name = set->tensors[t].name;
        size_t i = hash_name(name) & (n_slots - 1);
        while (set->slots[i]) {
            const g4_st_tensor *other = &set->tensors[set->slots[i] - 1];
            if (!strcmp(other->name, name))
                return g4_fail(G4_ERR_FORMAT, "tensor '%s' appears in both %s and %s", name,
                               set->files[other->file].path, set->files[set->tensors[t].file].path);
            i = (i + 1) & (n_slots - 1);
        }
        set->slots[i] = t + 1;
    }
    return G4_OK;
}

static g4_status add_file(g4_st_set *set, const char *path) {
    g4_mapped_file *grown = realloc(set->files, (size_t)(set->n_files + 1) * sizeof *grown);
    if (!grown) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    set->files = grown;
    g4_mapped_file *f = &set->files[set->n_files];
    g4_status st = g4_map_file(path, f);
    if (st != G4_OK) return st;
    set->n_files++;
    g4_st_tensor *t;
    size_t n;
    st = g4_st_parse(f->data, f->size, path, &t, &n);
    if (st != G4_OK) return st;
    if (set->n_tensors + n > set->cap_tensors) {
        size_t cap = set->cap_tensors ? set->cap_tensors : 64;
        while (cap < set->n_tensors + n) cap *= 2;
        g4_st_tensor *more = realloc(set->tensors, cap * sizeof *more);
        if (!more) {
            g4_st_free_tensors(t, n);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        set->tensors = more;
        set->cap_tensors = cap;
    }
    for (size_t i = 0; i < n; i++) {
        t[i].file = set->n_files - 1;
        set->total_bytes += t[i].nbytes;
        set->tensors[set->n_tensors++] = t[i];
    }
    free(t); /* names moved into the set */
    return G4_OK;
}

/* Index parsing ------------------------------------------------------------ */

g4_status g4_st_parse_index(const char *text, size_t len, const char *label, g4_st_index_entry_fn fn,
                            void *ctx) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return g4_fail(G4_ERR_FORMAT, "%s: not valid JSON", label);
    g4_status st = G4_OK;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        st = g4_fail(G4_ERR_FORMAT, "%s: missing \"weight_map\" object", label);
    } else if (!map->child) {
        /* An index that names nothing would open as an empty model. */
        st = g4_fail(G4_ERR_FORMAT, "%s: weight_map lists no tensors", label);
    } else {
        const cJSON *e;
        cJSON_ArrayForEach(e, map) {
            if (!cJSON_IsString(e)) {
                st = g4_fail(G4_ERR_FORMAT, "%s: weight_map entry '%s' is not a string", label, e->string);
                break;
            }
            const char *shard = e->valuestring;
            if (!shard[0] || strchr(shard, '/') || strstr(shard, "..")) {
                st = g4_fail(G4_ERR_FORMAT, "%s: weight_map entry '%s' names an unsafe shard path '%s'",
                             label, e->string, shard);
                break;
            }
            st = fn(ctx, e->string, shard);
            if (st != G4_OK) break;
        }
    }
    cJSON_Delete(root);
    return st;
}

typedef struct {
    char **names; /* distinct shard names */
    int n, cap;
    char **tensor_names; /* tensor -> shard index pairs to verify later */
    int *tensor_shard;
    size_t n_t, cap_t;
} index_contents;

static g4_status collect_index_entry(void *ctx, const char *tensor, const char *shard) {
    index_contents *ic = ctx;
    int s = -1;
    for (int i = 0; i < ic->n; i++)
        if (!strcmp(ic->names[i], shard)) s = i;
    if (s < 0) {
        if (ic->n == ic->cap) {
            int cap = ic->cap ? ic->cap * 2 : 8;
            char **more = realloc(ic->names, (size_t)cap * sizeof *more);
            if (!more) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            ic->names = more;
            ic->cap = cap;
        }
        ic->names[ic->n] = strdup(shard);
        if (!ic->names[ic->n]) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        s = ic->n++;
    }
    if (ic->n_t == ic->cap_t) {
        size_t cap = ic->cap_t ? ic->cap_t * 2 : 256;
        char **more = realloc(ic->tensor_names, cap * sizeof *more);
        int *more_s = realloc(ic->tensor_shard, cap * sizeof *more_s);
        if (more) ic->tensor_names = more;
        if (more_s) ic->tensor_shard = more_s;
        if (!more || !more_s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        ic->cap_t = cap;
    }
    ic->tensor_names[ic->n_t] = strdup(tensor);
    if (!ic->tensor_names[ic->n_t]) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    ic->tensor_shard[ic->n_t++] = s;
    return G4_OK;
}

static void free_index_contents(index_contents *ic) {
    for (int i = 0; i < ic->n; i++) free(ic->names[i]);
    for (size_t i = 0; i < ic->n_t; i++) free(ic->tensor_names[i]);
    free(ic->names);
    free(ic->tensor_names);
    free(ic->tensor_shard);
}

static g4_status open_indexed(g4_st_set *set, const char *dir, const char *index_path) {
    char *text;
    size_t len;
    g4_status st = g4_read_file(index_path, 256u << 20, &text, &len);
    if (st != G4_OK) return st;
    index_contents ic = {0};
    st = g4_st_parse_index(text, len, index_path, collect_index_entry, &ic);
    free(text);
    for (int i = 0; st == G4_OK && i < ic.n; i++) {
        char *path = g4_path_join(dir, ic.names[i]);
        if (!path) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        st = add_file(set, path);
        free(path);
    }
    if (st == G4_OK) st = build_index(set);
    /* Every tensor the index promises must be in the shard it names. */
    for (size_t i = 0; st == G4_OK && i < ic.n_t; i++) {
        const g4_st_tensor *t = lookup(set, ic.tensor_names[i]);
        if (!t)
            st = g4_fail(G4_ERR_FORMAT, "%s lists tensor '%s' in %s, but no shard contains it", index_path,
                         ic.tensor_names[i], ic.names[ic.tensor_shard[i]]);
        else if (t->file != ic.tensor_shard[i])
            st = g4_fail(G4_ERR_FORMAT, "%s lists tensor '%s' in %s, but it is in %s", index_path,
                         ic.tensor_names[i], ic.names[ic.tensor_shard[i]], set->files[t->file].path);
    }
    free_index_contents(&ic);
    return st;
}

/* model-00001-of-00003.safetensors style shards, when there is no index. */
static int parse_shard_name(const char *name, unsigned *index, unsigned *count) {
    char tail[32];
    return sscanf(name, "model-%5u-of-%5u.%31s", index, count, tail) == 3 && !strcmp(tail, "safetensors");
}

static int is_shard_name(const char *name) {
    unsigned a, b;
    return parse_shard_name(name, &a, &b);
}

static int compare_shard_names(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    unsigned xi, xn, yi, yn;
    parse_shard_name(x, &xi, &xn);
    parse_shard_name(y, &yi, &yn);
    if (xi != yi) return xi < yi ? -1 : 1;
    return strcmp(x, y);
}

/* Sorted shard names must be exactly 1..N of one N: a missing shard (an
 * interrupted download) would otherwise open as a model without its tensors. */
static g4_status check_shard_series(const char *dir, char **names, size_t n) {
    unsigned index, count, first_count = 0;
    for (size_t i = 0; i < n; i++) {
        parse_shard_name(names[i], &index, &count);
        if (i == 0) first_count = count;
        if (count != first_count)
            return g4_fail(G4_ERR_FORMAT, "%s: shards of different series (%s and %s)", dir, names[0], names[i]);
        if (index != i + 1)
            return g4_fail(G4_ERR_NOT_FOUND, "%s: shard %zu of %u is missing (found %s)", dir, i + 1, count,
                           names[i]);
    }
    if (n != first_count)
        return g4_fail(G4_ERR_NOT_FOUND, "%s: found %zu of %u shards (model-%05u-of-%05u.safetensors missing)",
                       dir, n, first_count, (unsigned)n + 1, first_count);
    return G4_OK;
}

static g4_status open_unindexed_shards(g4_st_set *set, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return g4_fail(G4_ERR_IO, "%s: cannot list directory", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    g4_status st = G4_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_shard_name(e->d_name)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **more = realloc(names, cap * sizeof *more);
            if (!more) {
                st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
                break;
            }
            names = more;
        }
        names[n] = strdup(e->d_name);
        if (!names[n]) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (st == G4_OK && n == 0)
        st = g4_fail(G4_ERR_NOT_FOUND,
                     "%s: no model.safetensors, model.safetensors.index.json or model-*-of-*.safetensors "
                     "files",
                     dir);
    if (st == G4_OK) qsort(names, n, sizeof *names, compare_shard_names);
    if (st == G4_OK) st = check_shard_series(dir, names, n);
    for (size_t i = 0; st == G4_OK && i < n; i++) {
        char *path = g4_path_join(dir, names[i]);
        st = path ? add_file(set, path) : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        free(path);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st == G4_OK) st = build_index(set);
    return st;
}

g4_status g4_st_open(const char *path, g4_st_set **out) {
    *out = NULL;
    g4_st_set *set = calloc(1, sizeof *set);
    if (!set) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status st;
    if (g4_is_directory(path)) {
        char *index = g4_path_join(path, "model.safetensors.index.json");
        char *single = g4_path_join(path, "model.safetensors");
        if (!index || !single)
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        else if (g4_file_exists(index))
            st = open_indexed(set, path, index);
        else if (g4_file_exists(single)) {
            st = add_file(set, single);
            if (st == G4_OK) st = build_index(set);
        } else
            st = open_unindexed_shards(set, path);
        free(index);
        free(single);
    } else {
        st = add_file(set, path);
        if (st == G4_OK) st = build_index(set);
    }
    if (st != G4_OK) {
        g4_st_close(set);
        return st;
    }
    *out = set;
    return G4_OK;
}

void g4_st_close(g4_st_set *set) {
    if (!set) return;
    g4_st_free_tensors(set->tensors, set->n_tensors);
    for (int i = 0; i < set->n_files; i++) g4_unmap_file(&set->files[i]);
    free(set->files);
    free(set->slots);
    free(set);
}

size_t g4_st_count(const g4_st_set *set) { return set->n_tensors; }
const g4_st_tensor *g4_st_at(const g4_st_set *set, size_t i) { return &set->tensors[i]; }
const g4_st_tensor *g4_st_find(const g4_st_set *set, const char *name) { return lookup(set, name); }
const char *g4_st_file_path(const g4_st_set *set, int i) { return set->files[i].path; }
int g4_st_file_count(const g4_st_set *set) { return set->n_files; }
uint64_t g4_st_total_bytes(const g4_st_set *set) { return set->total_bytes; }
