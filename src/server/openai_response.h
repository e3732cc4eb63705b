/* JSON pieces of OpenAI responses: ids, usage, log-probabilities, chunks. */
#ifndef G4_SERVER_OPENAI_RESPONSE_H
#define G4_SERVER_OPENAI_RESPONSE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "runtime/context.h"
#include "runtime/sampler.h"
#include "server/openai_request.h"
#include "text/chat.h"

/* "PREFIX" + 24 random hex digits (e.g. "chatcmpl-", "cmpl-", "call_"). */
void g4_oai_new_id(const char *prefix, char *out, size_t cap);

/* With prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache supplied. */
cJSON *g4_oai_usage(long prompt_tokens, long completion_tokens, long cached_tokens);
/* usage.speculative (an extension, only where the request drafted): draft
 * tokens proposed and accepted, verification rounds and the mean accepted
 * length (tokens a round emitted: (accepted + rounds) / rounds). */
void g4_oai_usage_speculative(cJSON *usage, int drafted, int accepted, int rounds);

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [...]} for one token. */
cJSON *g4_oai_chat_logprob(const g4_context *ctx, const g4_sample *s, int top);

/* A token's own bytes (malloc'd, NUL-terminated, *len without the NUL):
 * the byte of a byte-fallback token, the decoded text of any other, nothing
 * for a special token when skip_special. NULL on failure. */
char *g4_token_bytes(const g4_context *ctx, int32_t id, int skip_special, size_t *len);

/* Characters of the text so far, fed token by token, for completions'
 * text_offset: the offset of a token is the index of the character its
 * first byte belongs to (a token that continues a character split across
 * byte-fallback tokens starts inside it). UTF-8 structure only: an invalid
 * run counts a character per lead or stray byte. */
typedef struct {
    size_t chars;    /* characters begun so far */
    int continuation; /* continuation bytes the last character still expects */
} g4_text_counter;
size_t g4_text_counter_add(g4_text_counter *c, const char *bytes, size_t n);

/* Completions: {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}. */
cJSON *g4_oai_completion_logprobs_new(void);
void g4_oai_completion_logprobs_add(cJSON *lp, const g4_context *ctx, const g4_sample *s, int top, size_t offset);

/* [{"id", "type": "function", "function": {"name", "arguments"}}], with
 * "index" on each when for_stream. */
cJSON *g4_oai_tool_calls(const g4_tool_call *calls, size_t n, int for_stream);

/* A chunk skeleton: {"id", "object", "created", "model", "choices": [{"index": 0, ...}]};
 * *choice is the choice object to fill. */
cJSON *g4_oai_chunk(g4_oai_kind kind, const char *id, long created, const char *model, cJSON **choice);

#endif
