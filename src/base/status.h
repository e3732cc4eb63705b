/* Errors are values: every fallible function returns a g4_status and, on
 * failure, leaves a human-readable message in a per-thread buffer that the
 * caller reads with g4_error_message(). Nothing in the library exits. */
#ifndef G4_BASE_STATUS_H
#define G4_BASE_STATUS_H

#include "gemma4.h" /* g4_status lives in the public header */

/* Record `code` with a printf-style message and return `code`, so that a
 * failing path reads `return g4_fail(G4_ERR_FORMAT, "...", ...);`. */
g4_status g4_fail(g4_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context ("loading X: <old message>"),
 * keeping the code. Returns `code`. */
g4_status g4_fail_context(g4_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void g4_error_clear(void);

#endif
