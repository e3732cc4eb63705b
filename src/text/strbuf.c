#include "text/strbuf.h"

#include <stdlib.h>

int g4_strbuf_reserve(g4_strbuf *b, size_t extra) {
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

void g4_strbuf_free(g4_strbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *g4_dup_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}
