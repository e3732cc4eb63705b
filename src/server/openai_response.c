#include "server/openai_response.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_internal.h"

/* splitmix64 over a clock-seeded counter: unique, not secret */
void g4_oai_new_id(const char *prefix, char *out, size_t cap) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (++counter * 0x9E3779B97F4A7C15ull);
    uint64_t words[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        words[i] = z ^ (z >> 31);
    }
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)words[0],
             (unsigned long long)(words[1] & 0xffffffffu));
}

cJSON *g4_oai_usage(long prompt_tokens, long completion_tokens, long cached_tokens) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
    cJSON *details = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", (double)cached_tokens);
    return u;
}

void g4_oai_usage_speculative(cJSON *usage, int drafted, int accepted, int rounds) {
    if (!usage || rounds <= 0) return;
    cJSON *sp = cJSON_AddObjectToObject(usage, "speculative");
    cJSON_AddNumberToObject(sp, "draft_tokens", drafted);
    cJSON_AddNumberToObject(sp, "accepted_tokens", accepted);
    cJSON_AddNumberToObject(sp, "rounds", rounds);
    cJSON_AddNumberToObject(sp, "mean_accepted_length", (double)(accepted + rounds) / rounds);
}

char *g4_token_text(const g4_context *ctx, int32_t id) {
    char *text = NULL;
    size_t len;
    if (ctx->tokenizer && g4_tokenizer_decode(ctx->tokenizer, &id, 1, 0, &text, &len) == G4_OK) return text;
    g4_error_clear();
    text = malloc(24);
    if (text) snprintf(text, 24, "token_id:%d", (int)id);
    return text;
}

char *g4_token_bytes(const g4_context *ctx, int32_t id, int skip_special, size_t *len) {
    *len = 0;
    int byte = ctx->tokenizer ? g4_tokenizer_token_byte(ctx->tokenizer, id) : -1;
    if (byte >= 0) {
        char *b = malloc(2);
        if (b) b[0] = (char)byte, b[1] = 0, *len = 1;
        return b;
    }
    if (!ctx->tokenizer) {
        char *t = g4_token_text(ctx, id); /* "token_id:N" */
        *len = t ? strlen(t) : 0;
        return t;
    }
    char *text = NULL;
    if (g4_tokenizer_decode(ctx->tokenizer, &id, 1, skip_special, &text, len) == G4_OK) return text;
    g4_error_clear();
    return NULL;
}

size_t g4_text_counter_add(g4_text_counter *c, const char *bytes, size_t n) {
    const unsigned char *b = (const unsigned char *)bytes;
    int inside = n > 0 && c->continuation > 0 && (b[0] & 0xC0) == 0x80;
    size_t offset = inside ? c->chars - 1 : c->chars;
    for (size_t i = 0; i < n; i++) {
        if (c->continuation > 0 && (b[i] & 0xC0) == 0x80) {
            c->continuation--;
            continue;
        }
        c->chars++;
        c->continuation = b[i] >= 0xF0 && b[i] < 0xF5 ? 3 : b[i] >= 0xE0 && b[i] < 0xF0 ? 2 : b[i] >= 0xC2 && b[i] < 0xE0 ? 1 : 0;
    }
    return offset;
}

/* -inf (a filtered token) as vLLM reports it */
static double finite_logprob(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

static cJSON *token_entry(const g4_context *ctx, int32_t id, float logprob) {
    cJSON *e = cJSON_CreateObject();
    char *text = g4_token_text(ctx, id);
    cJSON_AddStringToObject(e, "token", text ? text : "");
    cJSON_AddNumberToObject(e, "logprob", finite_logprob(logprob));
    /* the token's own bytes: a byte-fallback token is one byte, not its U+FFFD text */
    size_t n = 0;
    char *raw = g4_token_bytes(ctx, id, 0, &n);
    cJSON *bytes = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)raw[i]));
    free(raw);
    free(text);
    return e;
}

cJSON *g4_oai_chat_logprob(const g4_context *ctx, const g4_sample *s, int top) {
    cJSON *e = token_entry(ctx, s->token, s->logprob);
    cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < s->n_top && i < top; i++)
        cJSON_AddItemToArray(tops, token_entry(ctx, s->top[i].id, s->top[i].logprob));
    return e;
}

cJSON *g4_oai_completion_logprobs_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

void g4_oai_completion_logprobs_add(cJSON *lp, const g4_context *ctx, const g4_sample *s, int top, size_t offset) {
    char *text = g4_token_text(ctx, s->token);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), cJSON_CreateString(text ? text : ""));
    free(text);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(finite_logprob(s->logprob)));
    cJSON *alts = cJSON_CreateObject();
    for (int i = 0; i < s->n_top && i < top; i++) {
        char *t = g4_token_text(ctx, s->top[i].id);
        if (t && !cJSON_GetObjectItemCaseSensitive(alts, t))
            cJSON_AddNumberToObject(alts, t, finite_logprob(s->top[i].logprob));
        free(t);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), alts);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

cJSON *g4_oai_tool_calls(const g4_tool_call *calls, size_t n, int for_stream) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        char id[40];
        g4_oai_new_id("call_", id, sizeof id);
        if (for_stream) cJSON_AddNumberToObject(c, "index", (double)i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", calls[i].arguments);
        cJSON_AddItemToArray(arr, c);
    }
    return arr;
}

cJSON *g4_oai_chunk(g4_oai_kind kind, const char *id, long created, const char *model, cJSON **choice) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "object", kind == G4_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)created);
    cJSON_AddStringToObject(c, "model", model);
    cJSON *choices = cJSON_AddArrayToObject(c, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON_AddItemToArray(choices, ch);
    *choice = ch;
    return c;
}
