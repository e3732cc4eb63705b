#include "base/status.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One growable message per thread; messages listing every missing tensor of a
 * checkpoint can be long, so the buffer is not fixed-size. */
static _Thread_local char *error_text;
static _Thread_local size_t error_cap;

/* Threads come and go (a server's connection threads): the key's destructor
 * frees a thread's buffer when it exits. */
static pthread_key_t error_key;
static pthread_once_t error_key_once = PTHREAD_ONCE_INIT;

static void make_error_key(void) { pthread_key_create(&error_key, free); }

static void store_message(const char *msg) {
    size_t n = strlen(msg) + 1;
    if (n > error_cap) {
        char *grown = realloc(error_text, n);
        if (!grown) return; /* keep the old message rather than none */
        error_text = grown;
        error_cap = n;
        pthread_once(&error_key_once, make_error_key);
        pthread_setspecific(error_key, error_text);
    }
    memcpy(error_text, msg, n);
}

static char *vformat(const char *fmt, va_list ap) {
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

g4_status g4_fail(g4_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    store_message(s ? s : "out of memory while formatting an error message");
    free(s);
    return code;
}

g4_status g4_fail_context(g4_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *prefix = vformat(fmt, ap);
    va_end(ap);
    const char *old = error_text ? error_text : "";
    size_t n = (prefix ? strlen(prefix) : 0) + strlen(old) + 3;
    char *s = malloc(n);
    if (s && prefix) {
        snprintf(s, n, "%s: %s", prefix, old);
        store_message(s);
    }
    free(s);
    free(prefix);
    return code;
}

const char *g4_error_message(void) { return error_text ? error_text : ""; }

void g4_error_clear(void) {
    if (error_text) error_text[0] = '\0';
}

const char *g4_status_name(g4_status s) {
    switch (s) {
    case G4_OK: return "ok";
    case G4_ERR_INVALID_ARGUMENT: return "invalid argument";
    case G4_ERR_IO: return "i/o error";
    case G4_ERR_FORMAT: return "bad format";
    case G4_ERR_UNSUPPORTED: return "unsupported";
    case G4_ERR_OUT_OF_MEMORY: return "out of memory";
    case G4_ERR_NOT_FOUND: return "not found";
    case G4_ERR_CANCELLED: return "cancelled";
    case G4_ERR_LIMIT: return "limit exceeded";
    case G4_ERR_INTERNAL: return "internal error";
    case G4_ERR_PERMISSION: return "permission denied";
    }
    return "unknown status";
}
