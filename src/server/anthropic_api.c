/* POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages
 * API).
 *
 * The body is translated into a chat completions body and parsed by the
 * chat completions' own parser (api_writer.h):
 *   system (a string or text blocks)     -> a system message first
 *   user blocks: text, image (base64 or url source) -> content parts;
 *     tool_result -> a tool message (before the user's other blocks)
 *   assistant blocks: text -> content, thinking -> reasoning,
 *     tool_use -> tool_calls (input as the arguments object)
 *   tools [{name, description, input_schema}] -> chat tools
 *   tool_choice auto / none / any / {type: tool, name}, max_tokens (required), stop_sequences,
 *   temperature [0, 1], top_p, top_k
 *   thinking {type: enabled, budget_tokens} / adaptive -> the template's
 *     thinking switch (the budget is checked as Anthropic does, and
 *     max_tokens bounds the whole reply; the budget itself is not a
 *     separate limit)
 * The reply is content blocks (thinking, text, tool_use) with stop_reason
 * end_turn / max_tokens / stop_sequence / tool_use. usage.input_tokens
 * counts the prompt tokens the prefix cache did not supply;
 * cache_read_input_tokens the ones it did. Streaming sends message_start,
 * ping, content_block_start / _delta / _stop per block, message_delta,
 * message_stop; a tool_use block's input arrives whole in one
 * input_json_delta. Errors: {"type": "error", "error": {"type", "message"}}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_common.h"
#include "server/api_writer.h"
#include "server/openai_response.h"
#include "text/strbuf.h"
#include "text/utf8.h"

enum { K_TEXT = 0, K_THINKING, K_TOOL_USE };

typedef struct {
    int kind;
    g4_strbuf text; /* text, thinking, or a tool_use's input JSON */
    char id[48];
    char *name;
} content_block;

typedef struct {
    g4_server *srv;
    char id[48];
    cJSON *stop_sequences; /* the request's, for stop_sequence */
    content_block *blocks;
    int n_blocks, cap_blocks;
    int open;
    int oom;
    cJSON *final;
} messages;

/* ---- errors ------------------------------------------------------------------- */

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static cJSON *error_json(int status, const char *message) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "type", error_type(status));
    size_t len;
    char *text = g4_utf8_repair(message, strlen(message), &len);
    cJSON_AddStringToObject(e, "message", text ? text : "(error message lost: out of memory)");
    free(text);
    return root;
}

/* Anthropic's overloaded status is 529. */
static int anthropic_status(int status) { return status == 503 ? 529 : status; }

void g4_anthropic_reply_error(g4_http_reply *r, const g4_oai_error *e) {
    char message[700];
    if (e->param && !strstr(e->message, e->param))
        snprintf(message, sizeof message, "%s: %s", e->param, e->message);
    else
        snprintf(message, sizeof message, "%s", e->message);
    g4_reply_json(r, anthropic_status(e->status), error_json(e->status, message));
}

void g4_anthropic_reshape_error(g4_http_reply *r) {
    if (r->status < 400 || !r->body || r->stream.read) return;
    cJSON *root = cJSON_ParseWithLength(r->body, r->body_len);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *message = cJSON_GetObjectItemCaseSensitive(err, "message");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "type");
    if (cJSON_IsString(message) && !cJSON_IsString(type)) {
        int status = r->status;
        cJSON *shaped = error_json(status, message->valuestring);
        free(r->body);
        r->body = NULL;
        g4_reply_json(r, anthropic_status(status), shaped);
    }
    cJSON_Delete(root);
}

/* ---- request -> chat body ---------------------------------------------------- */

static int block_type(const cJSON *b, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* A text or image block -> a chat content part (NULL with err). */
static cJSON *user_part(const cJSON *b, int i, int j, g4_oai_error *err) {
    if (block_type(b, "text")) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsString(text)) {
            g4_api_fail_item(err, "messages[%d].content[%d].text", i, j, "messages.%d.content.%d.text: must be a string",
                             i, j);
            return NULL;
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "text");
        cJSON_AddStringToObject(p, "text", text->valuestring);
        return p;
    }
    if (block_type(b, "image")) {
        const cJSON *src = cJSON_GetObjectItemCaseSensitive(b, "source");
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(src, "data");
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(src, "media_type");
        const cJSON *url = cJSON_GetObjectItemCaseSensitive(src, "url");
        g4_strbuf u = {0};
        if (block_type(src, "base64") && cJSON_IsString(data) && cJSON_IsString(mt)) {
            if (!g4_strbuf_append(&u, "data:", 5) || !g4_strbuf_append(&u, mt->valuestring, strlen(mt->valuestring)) ||
                !g4_strbuf_append(&u, ";base64,", 8) ||
                !g4_strbuf_append(&u, data->valuestring, strlen(data->valuestring))) {
                g4_strbuf_free(&u);
                g4_oai_fail(err, 503, NULL, "out of memory");
                return NULL;
            }
        } else if (block_type(src, "url") && cJSON_IsString(url)) {
            if (!g4_strbuf_append(&u, url->valuestring, strlen(url->valuestring))) {
                g4_oai_fail(err, 503, NULL, "out of memory");
                return NULL;
            }
        } else {
            g4_api_fail_item(err, "messages[%d].content[%d].source", i, j,
                             "messages.%d.content.%d.source: an image source is {\"type\": \"base64\", \"media_type\", "
                             "\"data\"} or {\"type\": \"url\", \"url\"}",
                             i, j);
            return NULL;
        }
        cJSON *p = cJSON_CreateObject(), *iu = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "image_url");
        cJSON_AddStringToObject(iu, "url", u.data);
        cJSON_AddItemToObject(p, "image_url", iu);
        g4_strbuf_free(&u);
        return p;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
    g4_api_fail_item(err, "messages[%d].content[%d].type", i, j,
                     "messages.%d.content.%d: unsupported block type '%.40s' here (text, image, tool_use, tool_result, "
                     "thinking)",
                     i, j, cJSON_IsString(t) ? t->valuestring : "?");
    return NULL;
}

/* tool_result content: a string or text / image blocks. */
static int tool_result_content(const cJSON *content, int i, int j, cJSON **out, g4_oai_error *err) {
    if (!content || cJSON_IsNull(content)) {
        *out = cJSON_CreateString("");
        return 0;
    }
    if (cJSON_IsString(content)) {
        *out = cJSON_CreateString(content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return g4_api_fail_item(err, "messages[%d].content[%d].content", i, j,
                                "messages.%d.content.%d.content: a tool_result's content is a string or a list of blocks",
                                i, j);
    cJSON *parts = cJSON_CreateArray();
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        cJSON *p = cJSON_IsObject(b) ? user_part(b, i, j, err) : NULL;
        if (!p) {
            if (!cJSON_IsObject(b))
                g4_api_fail_item(err, "messages[%d].content[%d].content", i, j,
                                 "messages.%d.content.%d.content: blocks must be objects", i, j);
            cJSON_Delete(parts);
            return -1;
        }
        cJSON_AddItemToArray(parts, p);
    }
    *out = parts;
    return 0;
}

static int user_message(const cJSON *content, int i, cJSON *out, g4_oai_error *err) {
    cJSON *parts = cJSON_CreateArray();
    int j = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        if (!cJSON_IsObject(b)) {
            cJSON_Delete(parts);
            return g4_api_fail_item(err, "messages[%d].content[%d]", i, j, "messages.%d.content.%d: must be an object",
                                    i, j);
        }
        if (block_type(b, "tool_result")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
            cJSON *body = NULL;
            if (!cJSON_IsString(id)) {
                cJSON_Delete(parts);
                return g4_api_fail_item(err, "messages[%d].content[%d].tool_use_id", i, j,
                                        "messages.%d.content.%d.tool_use_id: Field required", i, j);
            }
            if (tool_result_content(cJSON_GetObjectItemCaseSensitive(b, "content"), i, j, &body, err)) {
                cJSON_Delete(parts);
                return -1;
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddItemToObject(m, "content", body);
            cJSON_AddItemToArray(out, m);
        } else {
            cJSON *p = user_part(b, i, j, err);
            if (!p) {
                cJSON_Delete(parts);
                return -1;
            }
            cJSON_AddItemToArray(parts, p);
        }
        j++;
    }
    if (cJSON_GetArraySize(parts) == 0) {
        cJSON_Delete(parts);
        return 0;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddItemToObject(m, "content", parts);
    cJSON_AddItemToArray(out, m);
    return 0;
}

static int assistant_message(const cJSON *content, int i, cJSON *out, g4_oai_error *err) {
    g4_strbuf text = {0}, thinking = {0};
    cJSON *calls = NULL;
    int j = 0, rc = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        const cJSON *t = NULL;
        if (!cJSON_IsObject(b)) {
            rc = g4_api_fail_item(err, "messages[%d].content[%d]", i, j, "messages.%d.content.%d: must be an object", i,
                                  j);
        } else if (block_type(b, "text") || block_type(b, "thinking")) {
            int is_text = block_type(b, "text");
            t = cJSON_GetObjectItemCaseSensitive(b, is_text ? "text" : "thinking");
            if (!cJSON_IsString(t))
                rc = g4_api_fail_item(err, "messages[%d].content[%d]", i, j,
                                      "messages.%d.content.%d: the block's text must be a string", i, j);
            else if (!g4_strbuf_append(is_text ? &text : &thinking, t->valuestring, strlen(t->valuestring)))
                rc = g4_oai_fail(err, 503, NULL, "out of memory");
        } else if (block_type(b, "redacted_thinking")) {
            /* nothing the template can show */
        } else if (block_type(b, "tool_use")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                rc = g4_api_fail_item(err, "messages[%d].content[%d]", i, j,
                                      "messages.%d.content.%d: a tool_use block needs id and name (strings) and input "
                                      "(an object)",
                                      i, j);
            } else {
                if (!calls) calls = cJSON_CreateArray();
                cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", id->valuestring);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(fn, "name", name->valuestring);
                cJSON_AddItemToObject(fn, "arguments", cJSON_Duplicate(input, 1));
                cJSON_AddItemToObject(c, "function", fn);
                cJSON_AddItemToArray(calls, c);
            }
        } else {
            t = cJSON_GetObjectItemCaseSensitive(b, "type");
            rc = g4_api_fail_item(err, "messages[%d].content[%d].type", i, j,
                                  "messages.%d.content.%d: unsupported block type '%.40s' in an assistant message", i, j,
                                  cJSON_IsString(t) ? t->valuestring : "?");
        }
        if (rc) break;
        j++;
    }
    if (!rc) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        if (text.len || !calls) cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
        else cJSON_AddNullToObject(m, "content");
        if (thinking.len) cJSON_AddStringToObject(m, "reasoning_content", thinking.data);
        if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
        calls = NULL;
        cJSON_AddItemToArray(out, m);
    }
    cJSON_Delete(calls);
    g4_strbuf_free(&text);
    g4_strbuf_free(&thinking);
    return rc;
}

static int translate_messages(const cJSON *list, cJSON *out, g4_oai_error *err) {
    if (!list) return g4_oai_fail(err, 400, "messages", "messages: Field required");
    if (!cJSON_IsArray(list)) return g4_oai_fail(err, 400, "messages", "messages: Input should be a valid list");
    if (cJSON_GetArraySize(list) == 0) return g4_oai_fail(err, 400, "messages", "messages: at least one message is required");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, list) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m)) return g4_api_fail_item(err, "messages[%d]", i, 0, "messages.%d: must be an object", i);
        int user = cJSON_IsString(role) && !strcmp(role->valuestring, "user");
        int assistant = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
        if (!user && !assistant)
            return g4_api_fail_item(err, "messages[%d].role", i, 0,
                                    "messages.%d.role: Input should be 'user' or 'assistant'", i);
        if (cJSON_IsString(content)) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "role", role->valuestring);
            cJSON_AddStringToObject(c, "content", content->valuestring);
            cJSON_AddItemToArray(out, c);
        } else if (cJSON_IsArray(content)) {
            if ((user ? user_message : assistant_message)(content, i, out, err)) return -1;
        } else {
            return g4_api_fail_item(err, "messages[%d].content", i, 0,
                                    "messages.%d.content: must be a string or a list of content blocks", i);
        }
        i++;
    }
    return 0;
}

static int translate_system(const cJSON *system, cJSON *out, g4_oai_error *err) {
    if (!system) return 0;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddItemToArray(out, m);
    if (cJSON_IsString(system)) {
        cJSON_AddStringToObject(m, "content", system->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(system)) return g4_oai_fail(err, 400, "system", "system: must be a string or a list of text blocks");
    cJSON *parts = cJSON_AddArrayToObject(m, "content");
    int j = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, system) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!block_type(b, "text") || !cJSON_IsString(text))
            return g4_api_fail_item(err, "system[%d]", j, 0, "system.%d: system blocks must be text blocks", j);
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "text");
        cJSON_AddStringToObject(p, "text", text->valuestring);
        cJSON_AddItemToArray(parts, p);
        j++;
    }
    return 0;
}

static int translate_tools(const cJSON *tools, cJSON *chat, g4_oai_error *err) {
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return g4_oai_fail(err, 400, "tools", "tools: Input should be a valid list");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        const cJSON *type = g4_api_field(t, "type");
        if (!cJSON_IsObject(t) || (type && !block_type(t, "custom")))
            return g4_api_fail_item(err, "tools[%d]", i, 0,
                                    "tools.%d: only client tools ({name, description, input_schema}) are supported", i);
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return g4_api_fail_item(err, "tools[%d].name", i, 0, "tools.%d.name: Field required", i);
        if (!cJSON_IsObject(schema))
            return g4_api_fail_item(err, "tools[%d].input_schema", i, 0,
                                    "tools.%d.input_schema: a JSON schema object is required", i);
        cJSON *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        cJSON *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        cJSON_AddItemToObject(tool, "function", fn);
        cJSON_AddItemToArray(out, tool);
        i++;
    }
    return 0;
}

static int number_in(const cJSON *root, const char *name, double lo, double hi, g4_oai_error *err) {
    const cJSON *v = g4_api_field(root, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return g4_oai_fail(err, 400, name, "%s: must be a number in [%g, %g]", name, lo, hi);
    return 0;
}

/* The Messages body -> a chat completions body (root is consumed).
 * count_only: /count_tokens (no max_tokens, no generation fields). */
static cJSON *translate(cJSON *root, int count_only, messages *st, g4_oai_error *err) {
    cJSON *chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    int64_t max_tokens = 0;
    int rc = 0;
    if (!count_only) {
        if (!g4_api_field(root, "max_tokens")) rc = g4_oai_fail(err, 400, "max_tokens", "max_tokens: Field required");
        if (!rc) rc = g4_oai_get_int(root, "max_tokens", 1, 1e12, &max_tokens, err);
        if (!rc) cJSON_AddNumberToObject(chat, "max_tokens", (double)max_tokens);
    }
    if (!rc) rc = translate_system(g4_api_field(root, "system"), msgs, err);
    if (!rc) rc = translate_messages(g4_api_field(root, "messages"), msgs, err);
    if (!rc) rc = translate_tools(g4_api_field(root, "tools"), chat, err);
    const cJSON *choice = g4_api_field(root, "tool_choice");
    if (!rc && choice) {
        /* {"type": "any"} and {"type": "tool", "name"} force calls (constrained decoding, openai_constraint.c) */
        const cJSON *tname = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "name") : NULL;
        if (block_type(choice, "auto") || block_type(choice, "none"))
            cJSON_AddStringToObject(chat, "tool_choice", block_type(choice, "auto") ? "auto" : "none");
        else if (block_type(choice, "any"))
            cJSON_AddStringToObject(chat, "tool_choice", "required");
        else if (block_type(choice, "tool") && cJSON_IsString(tname)) {
            cJSON *tc = cJSON_AddObjectToObject(chat, "tool_choice");
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(tc, "function"), "name", tname->valuestring);
        } else if (!cJSON_IsObject(choice))
            rc = g4_oai_fail(err, 400, "tool_choice", "tool_choice: must be an object such as {\"type\": \"auto\"}");
        else
            rc = g4_oai_fail(err, 400, "tool_choice",
                             "tool_choice: {\"type\": \"auto\"}, {\"type\": \"none\"}, {\"type\": \"any\"} or "
                             "{\"type\": \"tool\", \"name\": ...}");
    }
    const cJSON *thinking = g4_api_field(root, "thinking");
    if (!rc && thinking) {
        int on = block_type(thinking, "enabled") || block_type(thinking, "adaptive");
        if (!on && !block_type(thinking, "disabled")) {
            rc = g4_oai_fail(err, 400, "thinking", "thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'");
        } else if (block_type(thinking, "enabled")) {
            int64_t budget = 0;
            if (!g4_api_field(thinking, "budget_tokens"))
                rc = g4_oai_fail(err, 400, "thinking.budget_tokens", "thinking.budget_tokens: Field required");
            if (!rc) rc = g4_oai_get_int(thinking, "budget_tokens", 1024, 1e12, &budget, err);
            if (!rc && !count_only && budget >= max_tokens)
                rc = g4_oai_fail(err, 400, "thinking.budget_tokens",
                                 "`max_tokens` must be greater than `thinking.budget_tokens`");
        }
        if (!rc) cJSON_AddBoolToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"), "enable_thinking", on);
    }
    if (!count_only) {
        const cJSON *stops = g4_api_field(root, "stop_sequences");
        if (!rc && stops) {
            const cJSON *e;
            int ok = cJSON_IsArray(stops);
            const cJSON *list = ok ? stops : NULL;
            cJSON_ArrayForEach(e, list) ok &= cJSON_IsString(e) && e->valuestring[0];
            if (!ok) rc = g4_oai_fail(err, 400, "stop_sequences", "stop_sequences: must be a list of non-empty strings");
            else if (cJSON_GetArraySize(stops) > G4_OAI_MAX_STOP)
                rc = g4_oai_fail(err, 400, "stop_sequences", "stop_sequences: at most %d strings", G4_OAI_MAX_STOP);
            if (!rc) {
                st->stop_sequences = cJSON_Duplicate(stops, 1);
                g4_api_move(chat, "stop", root, "stop_sequences");
            }
        }
        if (!rc) rc = number_in(root, "temperature", 0, 1, err);
        if (!rc) rc = number_in(root, "top_p", 0, 1, err);
        int64_t top_k = 0;
        if (!rc) rc = g4_oai_get_int(root, "top_k", 0, 1e9, &top_k, err);
        static const char *const same[] = {"stream", "temperature", "top_p", "top_k", "min_p", "seed",
                                           "repetition_penalty", "ignore_eos", "return_token_ids", "speculative"};
        for (size_t k = 0; !rc && k < sizeof same / sizeof same[0]; k++) g4_api_move(chat, same[k], root, same[k]);
    }
    if (!rc) g4_api_move(chat, "model", root, "model");
    if (rc) {
        cJSON_Delete(chat);
        return NULL;
    }
    return chat;
}

/* ---- output ------------------------------------------------------------------- */

static void event(g4_sse *out, const char *type, cJSON *obj) {
    cJSON_AddStringToObject(obj, "type", type);
    g4_sse_event(out, type, obj);
}

static cJSON *usage(const g4_gen_summary *s, int with_output) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", s->n_prompt - s->n_cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", s->n_cached);
    cJSON_AddNumberToObject(u, "output_tokens", with_output ? s->n_completion : 0);
    return u;
}

static const char *text_of(const content_block *b) { return b->text.data ? b->text.data : ""; }

static cJSON *block_json(const content_block *b, int whole) {
    cJSON *j = cJSON_CreateObject();
    if (b->kind == K_TEXT) {
        cJSON_AddStringToObject(j, "type", "text");
        cJSON_AddStringToObject(j, "text", whole ? text_of(b) : "");
    } else if (b->kind == K_THINKING) {
        cJSON_AddStringToObject(j, "type", "thinking");
        cJSON_AddStringToObject(j, "thinking", whole ? text_of(b) : "");
        cJSON_AddStringToObject(j, "signature", "");
    } else {
        cJSON_AddStringToObject(j, "type", "tool_use");
        cJSON_AddStringToObject(j, "id", b->id);
        cJSON_AddStringToObject(j, "name", b->name ? b->name : "");
        cJSON *input = whole ? cJSON_Parse(text_of(b)) : NULL;
        cJSON_AddItemToObject(j, "input", cJSON_IsObject(input) ? input : (cJSON_Delete(input), cJSON_CreateObject()));
    }
    return j;
}

static content_block *new_block(messages *st, int kind) {
    if (st->n_blocks == st->cap_blocks) {
        int cap = st->cap_blocks ? st->cap_blocks * 2 : 4;
        content_block *grown = realloc(st->blocks, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        st->blocks = grown;
        st->cap_blocks = cap;
    }
    content_block *b = &st->blocks[st->n_blocks++];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    return b;
}

static void block_start(messages *st, g4_sse *out, int index) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", index);
    cJSON_AddItemToObject(ev, "content_block", block_json(&st->blocks[index], 0));
    event(out, "content_block_start", ev);
}

static void block_stop(g4_sse *out, int index) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", index);
    event(out, "content_block_stop", ev);
}

static void block_delta(messages *st, g4_sse *out, int index, const char *text, size_t n) {
    content_block *b = &st->blocks[index];
    if (!g4_strbuf_append(&b->text, text, n)) st->oom = 1;
    if (!out) return;
    cJSON *ev = cJSON_CreateObject(), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "index", index);
    char *piece = g4_dup_bytes(text, n);
    static const char *const types[] = {"text_delta", "thinking_delta", "input_json_delta"};
    static const char *const keys[] = {"text", "thinking", "partial_json"};
    cJSON_AddStringToObject(d, "type", types[b->kind]);
    cJSON_AddStringToObject(d, keys[b->kind], piece ? piece : "");
    free(piece);
    cJSON_AddItemToObject(ev, "delta", d);
    event(out, "content_block_delta", ev);
}

static void add_text(messages *st, g4_sse *out, int kind, const char *text, size_t n) {
    if (st->open < 0 || st->blocks[st->open].kind != kind) {
        if (st->open >= 0 && out) block_stop(out, st->open);
        if (!new_block(st, kind)) {
            st->oom = 1;
            return;
        }
        st->open = st->n_blocks - 1;
        if (out) block_start(st, out, st->open);
    }
    block_delta(st, out, st->open, text, n);
}

static cJSON *message_object(messages *st, const g4_gen_summary *s, int whole) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", st->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", st->srv->model_name);
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    for (int i = 0; whole && i < st->n_blocks; i++) cJSON_AddItemToArray(content, block_json(&st->blocks[i], 1));
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON_AddItemToObject(m, "usage", usage(s, whole));
    return m;
}

/* stop_reason and stop_sequence of the finished reply */
static void stop_fields(messages *st, const g4_gen_summary *s, cJSON *obj) {
    const char *reason = s->n_calls ? "tool_use"
                         : s->end == G4_GEN_END_LENGTH ? "max_tokens"
                         : s->end == G4_GEN_END_STOP_STRING ? "stop_sequence"
                                                             : "end_turn";
    cJSON_ReplaceItemInObject(obj, "stop_reason", cJSON_CreateString(reason));
    const cJSON *seq = s->end == G4_GEN_END_STOP_STRING ? cJSON_GetArrayItem(st->stop_sequences, s->stop_index) : NULL;
    cJSON_ReplaceItemInObject(obj, "stop_sequence", cJSON_IsString(seq) ? cJSON_CreateString(seq->valuestring)
                                                                         : cJSON_CreateNull());
}

static void on_open(void *api, g4_sse *out, const g4_gen_summary *s) {
    messages *st = api;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "message", message_object(st, s, 0));
    event(out, "message_start", ev);
    event(out, "ping", cJSON_CreateObject());
}

static void on_text(void *api, g4_sse *out, const char *content, size_t content_len, const char *reasoning,
                    size_t reasoning_len) {
    messages *st = api;
    if (reasoning_len) add_text(st, out, K_THINKING, reasoning, reasoning_len);
    if (content_len) add_text(st, out, K_TEXT, content, content_len);
}

static void on_close(void *api, g4_sse *out, const g4_gen_summary *s) {
    messages *st = api;
    if (st->open >= 0 && out) block_stop(out, st->open);
    st->open = -1;
    for (size_t i = 0; i < s->n_calls; i++) {
        content_block *b = new_block(st, K_TOOL_USE);
        if (!b) {
            st->oom = 1;
            break;
        }
        g4_oai_new_id("toolu_", b->id, sizeof b->id);
        b->name = strdup(s->calls[i].name);
        int index = st->n_blocks - 1;
        if (out) block_start(st, out, index);
        block_delta(st, out, index, s->calls[i].arguments, strlen(s->calls[i].arguments));
        if (out) block_stop(out, index);
    }
    st->final = message_object(st, s, 1);
    stop_fields(st, s, st->final);
    if (s->prompt_ids) {
        cJSON_AddItemToObject(st->final, "prompt_token_ids", cJSON_CreateIntArray(s->prompt_ids, s->n_prompt));
        cJSON_AddItemToObject(st->final, "token_ids",
                              cJSON_CreateIntArray(s->out_ids ? s->out_ids : (int32_t[]){0}, s->out_ids ? s->n_out : 0));
    }
    if (!out) return;
    cJSON *ev = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(ev, "delta");
    cJSON_AddNullToObject(d, "stop_reason");
    cJSON_AddNullToObject(d, "stop_sequence");
    stop_fields(st, s, d);
    cJSON_AddItemToObject(ev, "usage", usage(s, 1));
    event(out, "message_delta", ev);
    event(out, "message_stop", cJSON_CreateObject());
}

static void on_fail(void *api, g4_sse *out, const g4_oai_error *e) {
    (void)api;
    g4_sse_event(out, "error", error_json(e->status, e->message));
}

static void on_answer(void *api, const g4_gen_summary *s, g4_http_reply *r) {
    messages *st = api;
    (void)s;
    if (st->oom || !st->final) {
        g4_reply_json(r, 529, error_json(503, "out of memory"));
        return;
    }
    g4_reply_json(r, 200, st->final);
    st->final = NULL;
}

static void free_state(void *api) {
    messages *st = api;
    if (!st) return;
    for (int i = 0; i < st->n_blocks; i++) {
        g4_strbuf_free(&st->blocks[i].text);
        free(st->blocks[i].name);
    }
    free(st->blocks);
    cJSON_Delete(st->stop_sequences);
    cJSON_Delete(st->final);
    free(st);
}

static const g4_api_writer messages_writer = {
    .open = on_open,
    .text = on_text,
    .close = on_close,
    .fail = on_fail,
    .answer = on_answer,
    .reply_error = g4_anthropic_reply_error,
    .free = free_state,
};

/* Body -> translated and parsed chat request; 0, or -1 with err. */
static int parse(const g4_http_request *q, int count_only, messages *st, g4_oai_request *req, g4_oai_error *err) {
    g4_server *s = q->srv;
    cJSON *root = g4_oai_parse_json(q->body, q->body_len, s->max_json_values, err);
    if (!root) return -1;
    cJSON *chat = translate(root, count_only, st, err);
    cJSON_Delete(root);
    if (!chat) return -1;
    g4_oai_limits lim = g4_api_limits(s);
    if (g4_oai_parse_root(chat, G4_OAI_CHAT, &lim, req, err)) {
        g4_oai_request_free(req);
        return -1;
    }
    return 0;
}

void g4_serve_messages(const g4_http_request *q, g4_http_reply *r) {
    messages *st = calloc(1, sizeof *st);
    if (!st) {
        g4_reply_json(r, 529, error_json(503, "out of memory"));
        return;
    }
    st->srv = q->srv;
    st->open = -1;
    g4_oai_new_id("msg_", st->id, sizeof st->id);
    g4_oai_request req;
    g4_oai_error err;
    if (parse(q, 0, st, &req, &err)) {
        free_state(st);
        g4_anthropic_reply_error(r, &err);
        return;
    }
    g4_serve_chat_with(q, &req, &messages_writer, st, r);
}

void g4_serve_count_tokens(const g4_http_request *q, g4_http_reply *r) {
    messages st = {.srv = q->srv, .open = -1};
    g4_oai_request req;
    g4_oai_error err;
    int n = 0;
    int rc = parse(q, 1, &st, &req, &err);
    cJSON_Delete(st.stop_sequences);
    if (!rc) rc = g4_count_chat_prompt(q, &req, &n, &err);
    if (rc) {
        g4_anthropic_reply_error(r, &err);
        return;
    }
    cJSON *out = cJSON_CreateObject();
    cJSON_AddNumberToObject(out, "input_tokens", n);
    g4_reply_json(r, 200, out);
}
