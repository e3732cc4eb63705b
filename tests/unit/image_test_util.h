/* Helpers shared by the test_image_*.c programs: test-data paths, whole-file
 * reads and the CRC-32 that tests/tools/make_image_refs.py writes (zlib's). */
#ifndef G4_IMAGE_TEST_UTIL_H
#define G4_IMAGE_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline const char *image_data_path(const char *name) {
    static char buf[4][1024];
    static int k;
    const char *root = getenv("G4_TEST_DATA");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/image/%s", root ? root : "tests/data", name);
    return b;
}

/* Whole file into a malloc'd buffer (NULL on failure; *size 0 for empty). */
static inline uint8_t *image_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    *size = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) *size = (size_t)n;
    return buf;
}

static inline uint32_t image_crc32(const void *data, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

#endif
