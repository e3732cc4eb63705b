/* gemma4.c — public C API.
 *
 * Opaque handles, status codes and per-thread error messages. Every function
 * that can fail returns a g4_status; on failure g4_error_message() says why. */
#ifndef GEMMA4_H
#define GEMMA4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum g4_status {
    G4_OK = 0,
    G4_ERR_INVALID_ARGUMENT, /* the caller passed something unusable */
    G4_ERR_IO,               /* a file could not be opened/read/written */
    G4_ERR_FORMAT,           /* a file or request is malformed */
    G4_ERR_UNSUPPORTED,      /* well-formed but not supported */
    G4_ERR_OUT_OF_MEMORY,
    G4_ERR_NOT_FOUND,        /* a named thing (tensor, file, token) is absent */
    G4_ERR_CANCELLED,        /* stopped on request */
    G4_ERR_LIMIT,            /* a size limit (context, tokens, bytes) was hit */
    G4_ERR_INTERNAL,
} g4_status;

/* The message of the last failure on this thread ("" if none). */
const char *g4_error_message(void);
const char *g4_status_name(g4_status s);

#ifdef __cplusplus
}
#endif
#endif
