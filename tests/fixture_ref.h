/* Reading a fixture's references: ref.json (ids and metadata) and
 * ref.safetensors (float32 reference tensors). */
#ifndef G4_TEST_FIXTURE_REF_H
#define G4_TEST_FIXTURE_REF_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/safetensors.h"

typedef struct {
    cJSON *json;
    g4_st_set *tensors;
} fixture_ref;

static inline int fixture_ref_open(const char *dir, fixture_ref *r) {
    memset(r, 0, sizeof *r);
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.json", dir);
    char *text;
    size_t len;
    if (g4_read_file(path, 64u << 20, &text, &len) != G4_OK) return -1;
    r->json = cJSON_ParseWithLength(text, len);
    free(text);
    snprintf(path, sizeof path, "%s/ref.safetensors", dir);
    if (!r->json || g4_st_open(path, &r->tensors) != G4_OK) return -1;
    return 0;
}

static inline void fixture_ref_close(fixture_ref *r) {
    cJSON_Delete(r->json);
    g4_st_close(r->tensors);
}

/* ids at a path like {"text", "all_ids"}; malloc'd, count in *n. */
static inline int32_t *fixture_ref_ids(const fixture_ref *r, const char *section, const char *key, int *n) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(r->json, section);
    const cJSON *a = s ? cJSON_GetObjectItemCaseSensitive(s, key) : NULL;
    *n = 0;
    if (!cJSON_IsArray(a)) return NULL;
    int32_t *ids = malloc(((size_t)cJSON_GetArraySize(a) + 1) * sizeof *ids);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) ids[(*n)++] = (int32_t)e->valuedouble;
    return ids;
}

/* A float32 reference tensor (NULL if absent); element count in *n. */
static inline const float *fixture_ref_tensor(const fixture_ref *r, const char *name, size_t *n) {
    const g4_st_tensor *t = g4_st_find(r->tensors, name);
    if (!t || t->dtype != G4_DTYPE_F32) return NULL;
    *n = t->nbytes / 4;
    return (const float *)t->data;
}

#endif
