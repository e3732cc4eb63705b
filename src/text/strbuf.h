/* A growable byte buffer, always NUL-terminated when non-empty. */
#ifndef G4_TEXT_STRBUF_H
#define G4_TEXT_STRBUF_H

#include <stddef.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
} g4_strbuf;

/* Makes room for `extra` more bytes (plus a NUL); 0 on allocation failure. */
int g4_strbuf_reserve(g4_strbuf *b, size_t extra);

static inline int g4_strbuf_append(g4_strbuf *b, const void *p, size_t n) {
    if (b->len + n + 1 > b->cap && !g4_strbuf_reserve(b, n)) return 0;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 1;
}

static inline int g4_strbuf_push(g4_strbuf *b, char c) { return g4_strbuf_append(b, &c, 1); }

static inline void g4_strbuf_clear(g4_strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void g4_strbuf_free(g4_strbuf *b);

/* A NUL-terminated copy of s[0..n) (s need not be terminated); NULL when
 * out of memory. */
char *g4_dup_bytes(const char *s, size_t n);

#endif
