/* What a g4_handle holds: shared by the public API's files (the engine's
 * requests in gemma4_api.c, the synchronous calls in gemma4_sync.c) and
 * the gemma4 commands that still need the model's internals. */
#ifndef G4_API_HANDLE_H
#define G4_API_HANDLE_H

#include "gemma4.h"
#include "model/assistant.h"
#include "model/kv_cache.h"
#include "runtime/context.h"
#include <cjson/cJSON.h>

#include "constrain/token_mask.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

struct g4_handle {
    g4_context *ctx;
    g4_engine *engine;  /* NULL when opened sequences_only */
    g4_kv_type kv_type; /* resolved: the engine's and every g4_sequence's KV type */
    g4_assistant *drafter; /* NULL: no speculative decoding (g4_open_options.draft) */
    int draft_max;         /* g4_open_options.draft_max (0: 1), for g4_sequence_generate */
    char *draft_dir;       /* the drafter's folder */
};

/* One sequence of the synchronous API: g4_session, run on the caller's thread. */
struct g4_sequence {
    g4_handle *h;
    g4_session *session;
    g4_hidden_sink sink;
    void *sink_user;
};

/* g4_params' sampling as the sampler takes it (top_p, repetition_penalty <= 0: off). */
void g4_sampler_params_from_api(const g4_params *p, g4_sampler_params *out);
/* The matcher of p's constraint (NULL when it gives none); thinking: the
 * reply may open with a thought. */
g4_status g4_params_constraint(const g4_handle *h, const g4_params *p, int thinking, int starts_in_reasoning,
                               g4_token_matcher **out);

/* messages_json (and tools_json, may be NULL) read strictly (an escaped NUL
 * is refused, not cut), checked as OpenAI chat messages, tool-call
 * arguments normalized; *messages / *tools to cJSON_Delete, also on failure. */
g4_status g4_chat_json_parse(const char *messages_json, const char *tools_json, cJSON **messages, cJSON **tools);
/* The public media files as the prompt builder takes them (*out NULL for
 * none; free it). */
g4_status g4_media_inputs_from_files(const g4_media_file *media, int n_media, g4_media_input **out);

/* The handle's context (backend, model, tokenizer): for the commands whose
 * work the public API does not cover yet (gemma4 info's memory plan). */
static inline g4_context *g4_handle_context(const g4_handle *h) { return h->ctx; }

#endif
