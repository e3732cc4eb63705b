#include "server/responses_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *id, *response, *messages;
    size_t bytes;
    struct entry *prev, *next; /* most recently used first */
} entry;

struct g4_response_store {
    pthread_mutex_t lock;
    int max_entries;
    size_t max_bytes;
    entry *head, *tail;
    int n;
    size_t bytes;
    unsigned long evictions;
};

g4_response_store *g4_response_store_create(int max_entries, size_t max_bytes) {
    g4_response_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    pthread_mutex_init(&st->lock, NULL);
    st->max_entries = max_entries > 0 ? max_entries : 0;
    st->max_bytes = max_bytes;
    return st;
}

static void unlink_entry(g4_response_store *st, entry *e) {
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(g4_response_store *st, entry *e) {
    e->prev = NULL;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

static void free_entry(entry *e) {
    free(e->id);
    free(e->response);
    free(e->messages);
    free(e);
}

static void drop(g4_response_store *st, entry *e) {
    unlink_entry(st, e);
    st->n--;
    st->bytes -= e->bytes;
    free_entry(e);
}

void g4_response_store_free(g4_response_store *st) {
    if (!st) return;
    while (st->head) drop(st, st->head);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* Linear: the store holds at most max_entries (a thousand or so), and a
 * lookup is tiny next to the generation it comes with. */
static entry *find(g4_response_store *st, const char *id) {
    for (entry *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

int g4_response_store_put(g4_response_store *st, const char *id, const char *response_json,
                          const char *messages_json) {
    if (!st || !id) return 0;
    size_t bytes = strlen(id) + strlen(response_json) + strlen(messages_json) + sizeof(entry);
    if (st->max_entries == 0 || bytes > st->max_bytes) return 0;
    entry *e = calloc(1, sizeof *e);
    if (!e) return 0;
    e->id = strdup(id);
    e->response = strdup(response_json);
    e->messages = strdup(messages_json);
    e->bytes = bytes;
    if (!e->id || !e->response || !e->messages) {
        free_entry(e);
        return 0;
    }
    pthread_mutex_lock(&st->lock);
    entry *old = find(st, id);
    if (old) drop(st, old);
    while (st->tail && (st->n + 1 > st->max_entries || st->bytes + bytes > st->max_bytes)) {
        drop(st, st->tail);
        st->evictions++;
    }
    push_front(st, e);
    st->n++;
    st->bytes += bytes;
    pthread_mutex_unlock(&st->lock);
    return 1;
}

int g4_response_store_get(g4_response_store *st, const char *id, char **response_json, char **messages_json) {
    if (response_json) *response_json = NULL;
    if (messages_json) *messages_json = NULL;
    if (!st || !id) return 0;
    pthread_mutex_lock(&st->lock);
    entry *e = find(st, id);
    int ok = e != NULL;
    if (e) {
        unlink_entry(st, e);
        push_front(st, e);
        if (response_json) ok &= (*response_json = strdup(e->response)) != NULL;
        if (messages_json) ok &= (*messages_json = strdup(e->messages)) != NULL;
    }
    pthread_mutex_unlock(&st->lock);
    if (!ok && e) {
        if (response_json) free(*response_json), *response_json = NULL;
        if (messages_json) free(*messages_json), *messages_json = NULL;
    }
    return ok;
}

int g4_response_store_delete(g4_response_store *st, const char *id) {
    if (!st || !id) return 0;
    pthread_mutex_lock(&st->lock);
    entry *e = find(st, id);
    if (e) drop(st, e);
    pthread_mutex_unlock(&st->lock);
    return e != NULL;
}

void g4_response_store_get_stats(g4_response_store *st, g4_response_store_stats *out) {
    memset(out, 0, sizeof *out);
    if (!st) return;
    pthread_mutex_lock(&st->lock);
    out->entries = st->n;
    out->bytes = st->bytes;
    out->evictions = st->evictions;
    pthread_mutex_unlock(&st->lock);
}
