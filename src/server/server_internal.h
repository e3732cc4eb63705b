/* Shared by the server's files: the server state, the reply shape the
 * endpoint handlers fill, and the handlers. Only http_server.c sees
 * libmicrohttpd. */
#ifndef G4_SERVER_INTERNAL_H
#define G4_SERVER_INTERNAL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>

#include "server/gen_job.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/responses_store.h"
#include "server/server.h"

typedef struct conn_entry conn_entry;

struct g4_server {
    g4_context *ctx;
    g4_engine *engine;
    g4_server_options opt;
    char *model_name;
    long created;
    int n_ctx;
    g4_metrics *metrics;
    void *daemon; /* struct MHD_Daemon */
    int port;
    atomic_int draining, stopping, in_flight;
    atomic_size_t body_bytes; /* request bodies held now, all connections together */
    size_t body_budget;
    size_t max_json_values; /* per request body: bounds its cJSON tree */
    size_t max_token_bytes; /* the tokenizer's longest token */
    pthread_mutex_t media_lock; /* one prompt with media at a time: the towers are heavy */
    g4_response_store *responses; /* the Responses API's stored responses */
    /* generations in progress, cancelled at shutdown */
    pthread_mutex_t jobs_lock;
    g4_job **jobs;
    int n_jobs, cap_jobs;
    /* connections, for closing the ones that send a request too slowly */
    pthread_mutex_t conn_lock;
    pthread_cond_t reaper_wake;
    conn_entry *conns;
    pthread_t reaper;
    int reaper_started, reaper_stop;
};

/* A response body produced piece by piece (server-sent events). read
 * returns the bytes written (> 0), 0 at the end, -1 to drop the connection. */
typedef struct {
    long (*read)(void *cls, char *buf, size_t max);
    void (*free)(void *cls);
    void *cls;
} g4_body_source;

typedef struct {
    int status;               /* 0: close the connection without answering */
    const char *content_type; /* default application/json */
    char *body;               /* malloc'd, owned by the reply */
    size_t body_len;
    g4_body_source stream;    /* a streamed body instead (when read is set) */
    const char *allow;        /* Allow header (405) */
    int close;                /* close the connection after this answer */
} g4_http_reply;

typedef struct {
    g4_server *srv;
    const char *body;
    size_t body_len;
    int fd;           /* the client socket, watched for hang-ups */
    double t_arrival; /* when the request's headers were complete */
} g4_http_request;

/* Replies (take ownership of obj). */
void g4_reply_json(g4_http_reply *r, int status, cJSON *obj);
void g4_reply_error(g4_http_reply *r, const g4_oai_error *e);
void g4_reply_errorf(g4_http_reply *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The OpenAI error object {"error": {...}}. */
cJSON *g4_error_json(const g4_oai_error *e);

/* Endpoints. */
void g4_serve_models(const g4_http_request *q, const char *name, g4_http_reply *r);
void g4_serve_health(const g4_http_request *q, g4_http_reply *r);
void g4_serve_metrics(const g4_http_request *q, g4_http_reply *r);
void g4_serve_tokenize(const g4_http_request *q, g4_http_reply *r);
void g4_serve_detokenize(const g4_http_request *q, g4_http_reply *r);
void g4_serve_generate(const g4_http_request *q, g4_oai_kind kind, g4_http_reply *r);
/* The Responses API (responses_api.c): POST /v1/responses, and GET or
 * (remove) DELETE /v1/responses/ID. */
void g4_serve_responses(const g4_http_request *q, g4_http_reply *r);
void g4_serve_response_stored(const g4_http_request *q, const char *id, int remove, g4_http_reply *r);
/* The Anthropic Messages API (anthropic_api.c): POST /v1/messages and
 * /v1/messages/count_tokens; its error shape for replies made elsewhere
 * (authentication, limits) on those paths. */
void g4_serve_messages(const g4_http_request *q, g4_http_reply *r);
void g4_serve_count_tokens(const g4_http_request *q, g4_http_reply *r);
void g4_anthropic_reply_error(g4_http_reply *r, const g4_oai_error *e);
void g4_anthropic_reshape_error(g4_http_reply *r);
/* The prompt a chat request renders to, counted (/v1/messages/count_tokens):
 * takes req. Returns 0 with *n_tokens, or -1 with err. */
int g4_count_chat_prompt(const g4_http_request *q, g4_oai_request *req, int *n_tokens, g4_oai_error *err);

/* Generations in progress (cancelled by g4_server_stop). */
void g4_server_track(g4_server *s, g4_job *j);
void g4_server_untrack(g4_server *s, g4_job *j);

/* Prompt text before tokenizing: bytes of the conversation's text (media
 * payloads left out); whether that many bytes could still be max_tokens
 * tokens (0: certainly more, refuse without tokenizing); special-token text
 * in every message's content wrapped in escaped spans (-1 with err). */
size_t g4_oai_messages_text_bytes(const cJSON *messages);
int g4_oai_text_may_fit(const g4_server *s, size_t bytes, int max_tokens);
int g4_oai_escape_content(const g4_tokenizer *t, cJSON *messages, g4_oai_error *err);

/* A token's text for logprobs ("token_id:N" without a tokenizer). */
char *g4_token_text(const g4_context *ctx, int32_t id);

#endif
