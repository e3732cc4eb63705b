/* gemma4's OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions, POST
 * /v1/responses (and GET / DELETE /v1/responses/ID), POST /v1/messages and
 * /v1/messages/count_tokens (Anthropic), GET /v1/models (and
 * /v1/models/NAME), GET /health, GET /metrics (Prometheus), POST /tokenize,
 * POST /detokenize (vLLM shapes). With an API key, every endpoint but
 * /health (and /metrics when metrics_public) needs "Authorization: Bearer
 * KEY" or "x-api-key: KEY".
 *
 * Threading: one thread per connection (libmicrohttpd's thread-per-
 * connection mode), so a connection may block while its prompt is built
 * (images through the vision tower) or while it waits for tokens, without
 * holding up any other; the batched engine runs on its own thread. A
 * connection waiting for tokens also watches its socket, so a client that
 * goes away cancels its request at once and frees its KV blocks.
 *
 * Limits: body size (413, also for chunked bodies), the request bodies held
 * at once (max(8 x body limit, 512 MiB): 503), JSON values per body, prompt
 * tokens (tokenizing stops there) and max_tokens (400), /tokenize and
 * /detokenize at most the context (400), images and audio clips per
 * request (400), a full engine queue (503, with Retry-After), connections.
 * Requests with both Content-Length and Transfer-Encoding, or a NUL byte in
 * a header, are refused and their connection closed (no smuggling).
 * A request must arrive whole within the request timeout, counted from the
 * connection's start or the end of its previous request: slow ("slowloris")
 * senders are closed, and so are keep-alive connections idle that long.
 * Any connection inactive for the idle timeout is closed. Prompts with
 * images or audio are built one at a time (the towers use all cores). */
#ifndef G4_SERVER_SERVER_H
#define G4_SERVER_SERVER_H

#include <stddef.h>

#include "runtime/context.h"
#include "runtime/engine.h"

typedef struct {
    const char *host;              /* address to bind (default 127.0.0.1) */
    int port;                      /* 0: any free port (see g4_server_port) */
    const char *api_key;           /* NULL: no authentication */
    const char *model_name;        /* the id in /v1/models and requests */
    size_t max_body;               /* request body bytes (default 32 MiB) */
    size_t body_budget;            /* bodies held at once, all connections (default max(8 x max_body, 512 MiB)) */
    int max_tokens;                /* max_tokens cap (default 4096) */
    int max_prompt_tokens;         /* prompt cap (default: the context) */
    int max_images, max_audio;     /* per request (default 8 and 4) */
    const char *allowed_media_dir; /* local image files allowed from here (NULL: none) */
    int request_timeout_s;         /* a request must arrive whole within this (default 30) */
    int idle_timeout_s;            /* a connection with no activity closes (default 60) */
    int max_connections;           /* default 1024 */
    int threads;                   /* OpenMP threads for prompt building (0: default) */
    int metrics_public;            /* /metrics answers without the API key */
    int no_special_in_content;     /* special-token text in message content stays text */
    int responses_store_entries;   /* Responses API: stored responses kept (default 1000; -1: none) */
    size_t responses_store_bytes;  /* ... and their bytes (default 64 MiB) */
} g4_server_options;

typedef struct g4_server g4_server;

/* Binds and starts serving. The context and engine (started) must outlive
 * the server. */
g4_status g4_server_start(g4_context *ctx, g4_engine *engine, const g4_server_options *opt, g4_server **out);
int g4_server_port(const g4_server *s);

/* Graceful shutdown, step 1: stop accepting connections; new requests on
 * open connections get 503. Requests in flight continue. */
void g4_server_drain(g4_server *s);
/* Requests being answered now. */
int g4_server_in_flight(g4_server *s);
/* Step 2: cancels what is still generating (streams end with an error
 * event, other requests get 503), closes every connection and frees the
 * server. */
void g4_server_stop(g4_server *s);

#endif
