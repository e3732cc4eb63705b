#define _GNU_SOURCE
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

g4_status g4_map_file(const char *path, g4_mapped_file *out) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g4_fail(G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return g4_fail(G4_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return g4_fail(G4_ERR_IO, "%s: not a regular file", path);
    }
    out->size = (size_t)st.st_size;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return g4_fail(G4_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        out->data = p;
    }
    close(fd);
    out->path = strdup(path);
    if (!out->path) {
        g4_unmap_file(out);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    return G4_OK;
}

void g4_unmap_file(g4_mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

g4_status g4_read_file(const char *path, size_t max_bytes, char **out_data, size_t *out_len) {
    *out_data = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return g4_fail(G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    for (;;) {
        if (len == cap) {
            if (cap >= max_bytes) {
                free(buf);
                fclose(f);
                return g4_fail(G4_ERR_LIMIT, "%s: larger than the %zu-byte limit", path, max_bytes);
            }
            cap *= 2;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                free(buf);
                fclose(f);
                return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
            buf = grown;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return g4_fail(G4_ERR_IO, "%s: read error", path);
    }
    if (len > max_bytes) {
        free(buf);
        return g4_fail(G4_ERR_LIMIT, "%s: larger than the %zu-byte limit", path, max_bytes);
    }
    buf[len] = '\0';
    *out_data = buf;
    if (out_len) *out_len = len;
    return G4_OK;
}

g4_status g4_write_file(const char *path, const void *data, size_t len) {
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, n, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        g4_status s = g4_fail(G4_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int closed = fclose(f);
    if (w != len || closed != 0 || rename(tmp, path) != 0) {
        g4_status s = g4_fail(G4_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return s;
    }
    free(tmp);
    return G4_OK;
}

int g4_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int g4_is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *g4_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

double g4_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t g4_peak_rss_bytes(void) {
    /* VmHWM rather than getrusage: g4_reset_peak_rss can lower it */
    FILE *f = fopen("/proc/self/status", "r");
    size_t kib = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %zu kB", &kib) == 1) break;
        fclose(f);
    }
    if (kib) return kib * 1024;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

int g4_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

size_t g4_current_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long pages_total = 0, pages_resident = 0;
    int ok = fscanf(f, "%lu %lu", &pages_total, &pages_resident) == 2;
    fclose(f);
    return ok ? (size_t)pages_resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

void g4_current_rss_split(size_t *anon_bytes, size_t *file_bytes) {
    *anon_bytes = *file_bytes = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    size_t kib;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %zu kB", &kib) == 1) *anon_bytes = kib * 1024;
        if (sscanf(line, "RssFile: %zu kB", &kib) == 1) *file_bytes = kib * 1024;
    }
    fclose(f);
}
