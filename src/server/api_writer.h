/* How the Responses and Messages APIs answer a generation that the chat
 * completions path runs for them.
 *
 * One request model and one rendering path serve the three chat APIs: the
 * Responses and Messages handlers translate their bodies into a chat
 * completions body (g4_oai_parse_root), so validation, the chat template,
 * media, the engine and the reply splitter (reasoning / content / tool
 * calls) are the chat completions' own. Only the answer differs: an API
 * writer turns the reply's pieces into its own objects and events.
 *
 * The generation calls the writer on the connection's thread, in order:
 * open (streaming only, once the request is accepted), text (for every
 * piece of reasoning or content text, streaming or not), then close (the
 * reply is complete: tool calls and the end known) or fail (streaming,
 * after open; a failure before open is answered with reply_error), and
 * answer (not streaming: the whole body). free releases the writer's
 * state when the generation ends, however it ends. */
#ifndef G4_SERVER_API_WRITER_H
#define G4_SERVER_API_WRITER_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "server/server_internal.h"
#include "text/chat.h"

/* How the reply ended (tool calls are told apart by n_calls). */
typedef enum {
    G4_GEN_END_TURN = 0,    /* an end-of-turn marker or stop token */
    G4_GEN_END_LENGTH,      /* max tokens or the context */
    G4_GEN_END_STOP_STRING, /* a stop string: stop_index says which */
} g4_gen_end;

typedef struct {
    int n_prompt, n_cached, n_completion;
    int n_reasoning; /* generated tokens inside the thought channel (markers included) */
    g4_gen_end end;
    int stop_index; /* the request's stop string that matched (G4_GEN_END_STOP_STRING), else -1 */
    const g4_tool_call *calls;
    size_t n_calls;
    int has_reasoning;
    const int32_t *prompt_ids; /* for return_token_ids */
    const int32_t *out_ids;
    int n_out;
    int n_drafted, n_accepted, n_rounds; /* speculative decoding (all 0: not drafted) */
} g4_gen_summary;

/* The stream being written: events go to it as "event: NAME\ndata: JSON\n\n". */
typedef struct g4_sse g4_sse;
/* Writes one event and takes obj (NULL event: a data-only line). */
void g4_sse_event(g4_sse *out, const char *event, cJSON *obj);

typedef struct {
    void (*open)(void *api, g4_sse *out, const g4_gen_summary *s); /* s: the prompt's counts */
    /* out is NULL when the answer is not streamed */
    void (*text)(void *api, g4_sse *out, const char *content, size_t content_len, const char *reasoning,
                 size_t reasoning_len);
    void (*close)(void *api, g4_sse *out, const g4_gen_summary *s);
    void (*fail)(void *api, g4_sse *out, const g4_oai_error *e);
    /* the whole answer (status 200), from the summary and what text gathered */
    void (*answer)(void *api, const g4_gen_summary *s, g4_http_reply *r);
    /* an error before generation began, in this API's shape */
    void (*reply_error)(g4_http_reply *r, const g4_oai_error *e);
    void (*free)(void *api);
} g4_api_writer;

/* Runs `req` (parsed from the API's translated body) and answers with w.
 * Takes req and api (w->free(api) when done), also on failure. */
void g4_serve_chat_with(const g4_http_request *q, g4_oai_request *req, const g4_api_writer *w, void *api,
                        g4_http_reply *r);

#endif
