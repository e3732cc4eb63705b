/* Stop strings over streamed text.
 *
 * The generation loop feeds decoded text chunk by chunk. The matcher holds
 * back the shortest tail that could still become a stop string (and an
 * unfinished UTF-8 sequence), hands out the rest as safe to emit, and
 * reports the first stop string to complete. "First" means the match that
 * ends earliest in the stream (ties: the one starting earliest), so the
 * result does not depend on how the text was cut into chunks. Text from the
 * start of the match on is not emitted (OpenAI semantics). */
#ifndef G4_RUNTIME_STOP_STRINGS_H
#define G4_RUNTIME_STOP_STRINGS_H

#include <stddef.h>

#include "base/status.h"

typedef struct g4_stop_matcher g4_stop_matcher;

typedef struct {
    const char *emit; /* text safe to send now (valid until the next call) */
    size_t emit_len;
    int stopped;       /* a stop string matched; emit ends right before it */
    int stop_index;    /* which one (index into the list given at creation), -1 if none */
    size_t stop_offset; /* byte offset of the match in the whole stream fed so far */
} g4_stop_result;

/* Copies the strings. Empty strings are an error. n may be 0 (then every
 * byte is emitted except unfinished UTF-8). */
g4_status g4_stop_matcher_create(const char *const *stops, size_t n, g4_stop_matcher **out);
void g4_stop_matcher_free(g4_stop_matcher *m);
void g4_stop_matcher_reset(g4_stop_matcher *m);

/* Adds a chunk. After a stop, further feeds are errors until reset. */
g4_status g4_stop_matcher_feed(g4_stop_matcher *m, const char *text, size_t len, g4_stop_result *out);

/* End of generation: releases whatever was held back (no stop can complete
 * any more). */
g4_status g4_stop_matcher_flush(g4_stop_matcher *m, g4_stop_result *out);

#endif
