/* A growable byte string for the chat-format code. Allocation failure is
 * sticky: appends become no-ops and chat_strbuf_status() reports it once at
 * the end, so the rendering code is not cluttered with checks. */
#ifndef G4_TEXT_CHAT_STRBUF_H
#define G4_TEXT_CHAT_STRBUF_H

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

typedef struct {
    char *data; /* always NUL-terminated when non-NULL */
    size_t len, cap;
    int failed;
} chat_strbuf;

static inline int chat_strbuf_reserve(chat_strbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

static inline void chat_strbuf_append(chat_strbuf *b, const char *s, size_t n) {
    if (!chat_strbuf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static inline void chat_strbuf_puts(chat_strbuf *b, const char *s) { chat_strbuf_append(b, s, strlen(s)); }

static inline void chat_strbuf_putc(chat_strbuf *b, char c) { chat_strbuf_append(b, &c, 1); }

static inline void chat_strbuf_free(chat_strbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* Hands the bytes to the caller (never NULL on success). */
static inline g4_status chat_strbuf_take(chat_strbuf *b, char **out, size_t *out_len) {
    if (!chat_strbuf_reserve(b, 0)) {
        chat_strbuf_free(b);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
    }
    *out = b->data;
    if (out_len) *out_len = b->len;
    memset(b, 0, sizeof *b);
    return G4_OK;
}

#endif
