/* What a g4_handle holds: shared by the public API's files (the engine's
 * requests in gemma4_api.c, the synchronous calls in gemma4_sync.c) and
 * the gemma4 commands that still need the model's internals. */
#ifndef G4_API_HANDLE_H
#define G4_API_HANDLE_H

#include "gemma4.h"
#include "model/assistant.h"
#include "model/kv_cache.h"
#include "runtime/context.h"
#include "runtime/engine.h"

struct g4_handle {
    g4_context *ctx;
    g4_engine *engine;  /* NULL when opened sequences_only */
    g4_kv_type kv_type; /* resolved: the engine's and every g4_sequence's KV type */
    g4_assistant *drafter; /* NULL: no speculative decoding (g4_open_options.draft) */
};

/* The handle's context (backend, model, tokenizer): for the commands whose
 * work the public API does not cover yet (gemma4 info's memory plan). */
static inline g4_context *g4_handle_context(const g4_handle *h) { return h->ctx; }

#endif
