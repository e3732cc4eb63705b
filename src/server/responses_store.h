/* The Responses API's stored responses (`store`, `previous_response_id`,
 * GET / DELETE /v1/responses/ID): in memory, bounded by entries and bytes,
 * the least recently used dropped first. Each entry keeps the response
 * object as answered and the conversation that led to it, in the chat
 * messages shape (the reply included as an assistant message), so a
 * request that continues it renders through the chat template like any
 * other. Thread-safe. */
#ifndef G4_SERVER_RESPONSES_STORE_H
#define G4_SERVER_RESPONSES_STORE_H

#include <stddef.h>

typedef struct g4_response_store g4_response_store;

/* max_entries, max_bytes 0: nothing is stored. */
g4_response_store *g4_response_store_create(int max_entries, size_t max_bytes);
void g4_response_store_free(g4_response_store *st);

/* Copies the texts; an entry larger than the whole budget is not kept.
 * Returns 1 if stored. Replaces an entry with the same id. */
int g4_response_store_put(g4_response_store *st, const char *id, const char *response_json,
                          const char *messages_json);
/* malloc'd copies (either out may be NULL); 0 if there is no such entry.
 * A hit counts as a use. */
int g4_response_store_get(g4_response_store *st, const char *id, char **response_json, char **messages_json);
int g4_response_store_delete(g4_response_store *st, const char *id);

typedef struct {
    int entries;
    size_t bytes;
    unsigned long evictions;
} g4_response_store_stats;
void g4_response_store_get_stats(g4_response_store *st, g4_response_store_stats *out);

#endif
