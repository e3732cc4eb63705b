/* POST /v1/responses (OpenAI's Responses API), GET and DELETE
 * /v1/responses/ID.
 *
 * The body is translated into a chat completions body and parsed by the
 * chat completions' own parser (api_writer.h), so the prompt is the one
 * the chat template renders for the equivalent messages:
 *   instructions          -> a system message first
 *   previous_response_id  -> the stored conversation (its input and reply)
 *   input "text"          -> a user message
 *   input items: message (input_text / output_text / input_image parts),
 *     function_call (joins the assistant message before it),
 *     function_call_output -> a tool message, reasoning -> the next
 *     assistant message's reasoning
 *   tools [{type: function, name, description, parameters}] -> chat tools
 *   tool_choice auto / none / required / {type: function, name}, max_output_tokens, temperature, top_p
 *   reasoning.effort      -> the template's thinking switch ("none": off;
 *                            absent: off, as chat completions)
 *   text.format           -> response_format
 * The reply comes back as output items: a reasoning item (reasoning_text
 * content), a message (output_text), function_call items. Streaming sends
 * the documented event sequence; function arguments arrive whole in one
 * delta (a tool call is known once its block is complete). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api_common.h"
#include "server/api_writer.h"
#include "server/openai_response.h"
#include "server/responses_store.h"
#include "text/strbuf.h"

typedef enum { B_REASONING = 0, B_MESSAGE, B_CALL } block_kind;

typedef struct {
    block_kind kind;
    char id[48];
    g4_strbuf text;   /* reasoning or message text; a call's arguments */
    char call_id[48]; /* calls */
    char *name;
} block;

typedef struct {
    g4_server *srv;
    char id[48];
    long created;
    cJSON *echo;        /* request fields the response object repeats */
    char *conversation; /* chat messages before the reply (JSON), for the store */
    int store;
    block *blocks;
    int n_blocks, cap_blocks;
    int open; /* the block being streamed, -1: none */
    int seq;  /* sequence_number of the next event */
    int oom;
    cJSON *final; /* the response object once complete */
} responses;

/* ---- request -> chat body ---------------------------------------------------- */

static int is_type(const cJSON *obj, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* Message content: a string, or input_text / output_text / input_image
 * parts -> chat content parts. */
static int content_parts(cJSON *content, int i, cJSON **out, g4_oai_error *err) {
    if (cJSON_IsString(content)) {
        *out = cJSON_CreateString(content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return g4_api_fail_item(err, "input[%d].content", i, 0, "input[%d].content must be a string or a list of parts",
                                i);
    cJSON *parts = cJSON_CreateArray();
    *out = parts;
    int j = 0;
    cJSON *p;
    cJSON_ArrayForEach(p, content) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p))
            return g4_api_fail_item(err, "input[%d].content[%d]", i, j, "input[%d].content[%d] must be an object", i, j);
        if (is_type(p, "input_text") || is_type(p, "output_text") || is_type(p, "refusal")) {
            if (is_type(p, "refusal")) text = cJSON_GetObjectItemCaseSensitive(p, "refusal");
            if (!cJSON_IsString(text))
                return g4_api_fail_item(err, "input[%d].content[%d].text", i, j,
                                        "input[%d].content[%d] needs its text as a string", i, j);
            cJSON *part = cJSON_CreateObject();
            cJSON_AddStringToObject(part, "type", "text");
            cJSON_AddStringToObject(part, "text", text->valuestring);
            cJSON_AddItemToArray(parts, part);
        } else if (is_type(p, "input_image")) {
            const cJSON *url = cJSON_GetObjectItemCaseSensitive(p, "image_url");
            const cJSON *detail = cJSON_GetObjectItemCaseSensitive(p, "detail");
            if (!cJSON_IsString(url))
                return g4_api_fail_item(err, "input[%d].content[%d].image_url", i, j,
                                        "input[%d].content[%d]: input_image needs image_url (a data: URI or a local "
                                        "file; file_id is not supported)",
                                        i, j);
            cJSON *part = cJSON_CreateObject(), *iu = cJSON_CreateObject();
            cJSON_AddStringToObject(part, "type", "image_url");
            cJSON_AddStringToObject(iu, "url", url->valuestring);
            if (cJSON_IsString(detail)) cJSON_AddStringToObject(iu, "detail", detail->valuestring);
            cJSON_AddItemToObject(part, "image_url", iu);
            cJSON_AddItemToArray(parts, part);
        } else {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
            return g4_api_fail_item(err, "input[%d].content[%d].type", i, j,
                                    "input[%d].content[%d]: unsupported part type '%.40s' (input_text, output_text, "
                                    "input_image)",
                                    i, j, cJSON_IsString(t) ? t->valuestring : "?");
        }
        j++;
    }
    return 0;
}

/* The assistant message that function_call items and reasoning join:
 * the last message when it is an assistant's without tool results after
 * it, else a new one. */
static cJSON *assistant_message(cJSON *messages) {
    int n = cJSON_GetArraySize(messages);
    cJSON *last = n ? cJSON_GetArrayItem(messages, n - 1) : NULL;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (last && cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddNullToObject(m, "content");
    cJSON_AddItemToArray(messages, m);
    return m;
}

/* Reasoning of a reasoning item: its reasoning_text content, else its summary. */
static int reasoning_text(const cJSON *item, g4_strbuf *out) {
    const cJSON *lists[2] = {cJSON_GetObjectItemCaseSensitive(item, "content"),
                             cJSON_GetObjectItemCaseSensitive(item, "summary")};
    for (int k = 0; k < 2; k++) {
        const cJSON *p, *list = cJSON_IsArray(lists[k]) ? lists[k] : NULL;
        cJSON_ArrayForEach(p, list) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (!cJSON_IsString(t)) continue;
            if (out->len && !g4_strbuf_push(out, '\n')) return -1;
            if (!g4_strbuf_append(out, t->valuestring, strlen(t->valuestring))) return -1;
        }
        if (out->len) break;
    }
    return 0;
}

static int input_items(cJSON *input, cJSON *messages, g4_oai_error *err) {
    int i = 0;
    cJSON *item;
    g4_strbuf reasoning = {0};
    cJSON_ArrayForEach(item, input) {
        if (!cJSON_IsObject(item)) {
            g4_strbuf_free(&reasoning);
            return g4_api_fail_item(err, "input[%d]", i, 0, "input[%d] must be an object", i);
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
        int rc = 0;
        if ((!type && role) || is_type(item, "message")) {
            static const char *const roles[] = {"user", "assistant", "system", "developer"};
            int known = 0;
            for (int k = 0; k < 4; k++) known |= cJSON_IsString(role) && !strcmp(role->valuestring, roles[k]);
            if (!known) {
                rc = g4_api_fail_item(err, "input[%d].role", i, 0,
                                      "input[%d].role must be 'user', 'assistant', 'system' or 'developer'", i);
            } else {
                cJSON *content = NULL;
                rc = content_parts(cJSON_GetObjectItemCaseSensitive(item, "content"), i, &content, err);
                if (!rc) {
                    cJSON *m = cJSON_CreateObject();
                    cJSON_AddStringToObject(m, "role", role->valuestring);
                    cJSON_AddItemToObject(m, "content", content);
                    content = NULL;
                    if (reasoning.len && !strcmp(role->valuestring, "assistant")) {
                        cJSON_AddStringToObject(m, "reasoning_content", reasoning.data);
                        g4_strbuf_clear(&reasoning);
                    }
                    cJSON_AddItemToArray(messages, m);
                }
                cJSON_Delete(content);
            }
        } else if (is_type(item, "function_call")) {
            const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(item, "arguments");
            if (!cJSON_IsString(call_id) || !cJSON_IsString(name) || !cJSON_IsString(args)) {
                rc = g4_api_fail_item(err, "input[%d]", i, 0,
                                      "input[%d]: a function_call needs call_id, name and arguments as strings", i);
            } else {
                cJSON *m = assistant_message(messages);
                if (reasoning.len) {
                    cJSON_DeleteItemFromObjectCaseSensitive(m, "reasoning_content");
                    cJSON_AddStringToObject(m, "reasoning_content", reasoning.data);
                    g4_strbuf_clear(&reasoning);
                }
                cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
                if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
                cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", call_id->valuestring);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(fn, "name", name->valuestring);
                cJSON_AddStringToObject(fn, "arguments", args->valuestring);
                cJSON_AddItemToObject(c, "function", fn);
                cJSON_AddItemToArray(calls, c);
            }
        } else if (is_type(item, "function_call_output")) {
            const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
            cJSON *output = cJSON_GetObjectItemCaseSensitive(item, "output");
            cJSON *content = NULL;
            if (!cJSON_IsString(call_id))
                rc = g4_api_fail_item(err, "input[%d].call_id", i, 0, "input[%d]: function_call_output needs call_id", i);
            else if (!output)
                rc = g4_api_fail_item(err, "input[%d].output", i, 0, "input[%d]: function_call_output needs output", i);
            else
                rc = content_parts(output, i, &content, err);
            if (!rc) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "tool");
                cJSON_AddStringToObject(m, "tool_call_id", call_id->valuestring);
                cJSON_AddItemToObject(m, "content", content);
                cJSON_AddItemToArray(messages, m);
            } else {
                cJSON_Delete(content);
            }
        } else if (is_type(item, "reasoning")) {
            if (reasoning_text(item, &reasoning)) rc = g4_oai_fail(err, 503, "input", "out of memory");
        } else {
            rc = g4_api_fail_item(err, "input[%d].type", i, 0,
                                  "input[%d]: unsupported item type '%.40s' (message, function_call, "
                                  "function_call_output, reasoning)",
                                  i, cJSON_IsString(type) ? type->valuestring : "?");
        }
        if (rc) {
            g4_strbuf_free(&reasoning);
            return -1;
        }
        i++;
    }
    g4_strbuf_free(&reasoning);
    return 0;
}

/* tools [{type: function, name, description, parameters}] -> chat tools. */
static int translate_tools(const cJSON *tools, cJSON *chat, g4_oai_error *err) {
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return g4_oai_fail(err, 400, "tools", "'tools' must be a list");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsObject(t) || !is_type(t, "function"))
            return g4_api_fail_item(err, "tools[%d].type", i, 0, "tools[%d]: only tools of type 'function' are supported",
                                    i);
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return g4_api_fail_item(err, "tools[%d].name", i, 0, "tools[%d] needs a name", i);
        const cJSON *params = g4_api_field(t, "parameters");
        if (params && !cJSON_IsObject(params))
            return g4_api_fail_item(err, "tools[%d].parameters", i, 0, "tools[%d].parameters must be a JSON schema object",
                                    i);
        cJSON *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        if (params) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(params, 1));
        cJSON *tool = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        cJSON_AddItemToObject(tool, "function", fn);
        cJSON_AddItemToArray(out, tool);
        i++;
    }
    return 0;
}

/* text.format -> response_format */
static int translate_format(const cJSON *text, cJSON *chat, g4_oai_error *err) {
    if (!text) return 0;
    if (!cJSON_IsObject(text)) return g4_oai_fail(err, 400, "text", "'text' must be an object");
    const cJSON *fmt = g4_api_field(text, "format");
    if (!fmt) return 0;
    if (!cJSON_IsObject(fmt)) return g4_oai_fail(err, 400, "text.format", "'text.format' must be an object");
    cJSON *rf = cJSON_CreateObject();
    cJSON_AddItemToObject(chat, "response_format", rf);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(fmt, "type");
    if (!cJSON_IsString(type)) return g4_oai_fail(err, 400, "text.format.type", "'text.format.type' must be a string");
    cJSON_AddStringToObject(rf, "type", type->valuestring);
    if (!strcmp(type->valuestring, "json_schema")) {
        cJSON *js = cJSON_CreateObject();
        static const char *const keys[] = {"name", "schema", "strict", "description"};
        for (int k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(fmt, keys[k]);
            if (v) cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToObject(rf, "json_schema", js);
    }
    return 0;
}

/* Fields the response object repeats (defaults where absent). */
static cJSON *echo_fields(const cJSON *root) {
    cJSON *e = cJSON_CreateObject();
    static const char *const keys[] = {"instructions", "max_output_tokens", "previous_response_id", "tools",
                                       "tool_choice", "metadata", "parallel_tool_calls", "reasoning",
                                       "text", "truncation", "user", "temperature", "top_p"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        cJSON_AddItemToObject(e, keys[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    }
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "tools"))) cJSON_ReplaceItemInObject(e, "tools", cJSON_CreateArray());
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "tool_choice")))
        cJSON_ReplaceItemInObject(e, "tool_choice", cJSON_CreateString("auto"));
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "metadata"))) cJSON_ReplaceItemInObject(e, "metadata", cJSON_CreateObject());
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "parallel_tool_calls")))
        cJSON_ReplaceItemInObject(e, "parallel_tool_calls", cJSON_CreateTrue());
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "truncation")))
        cJSON_ReplaceItemInObject(e, "truncation", cJSON_CreateString("disabled"));
    if (cJSON_IsNull(cJSON_GetObjectItem(e, "text"))) {
        cJSON *t = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(t, "format");
        cJSON_AddStringToObject(f, "type", "text");
        cJSON_ReplaceItemInObject(e, "text", t);
    }
    return e;
}

/* The Responses body -> a chat completions body (root is consumed). */
static cJSON *translate(g4_server *srv, cJSON *root, responses *st, g4_oai_error *err) {
    cJSON *chat = cJSON_CreateObject();
    cJSON *messages = cJSON_AddArrayToObject(chat, "messages");
    int rc = 0;
    const cJSON *v;
    if ((v = g4_api_field(root, "background")) && cJSON_IsTrue(v))
        rc = g4_oai_fail(err, 400, "background", "background responses are not supported");
    if (!rc && g4_api_field(root, "conversation"))
        rc = g4_oai_fail(err, 400, "conversation", "'conversation' is not supported: use previous_response_id");
    if (!rc && g4_api_field(root, "prompt"))
        rc = g4_oai_fail(err, 400, "prompt", "prompt templates are not supported");
    st->store = 1;
    if (!rc) rc = g4_oai_get_bool(root, "store", &st->store, err);
    const cJSON *instructions = g4_api_field(root, "instructions");
    if (!rc && instructions && !cJSON_IsString(instructions))
        rc = g4_oai_fail(err, 400, "instructions", "'instructions' must be a string");
    if (!rc && instructions) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", instructions->valuestring);
        cJSON_AddItemToArray(messages, m);
    }
    /* the conversation kept for the store: everything but the instructions */
    cJSON *conversation = cJSON_CreateArray();
    const cJSON *prev = g4_api_field(root, "previous_response_id");
    if (!rc && prev) {
        char *stored = NULL;
        if (!cJSON_IsString(prev)) {
            rc = g4_oai_fail(err, 400, "previous_response_id", "'previous_response_id' must be a string");
        } else if (!g4_response_store_get(srv->responses, prev->valuestring, NULL, &stored)) {
            rc = g4_oai_fail(err, 400, "previous_response_id", "Previous response with id '%.100s' not found.",
                             prev->valuestring);
            err->code = "previous_response_not_found";
        } else {
            cJSON *old = cJSON_Parse(stored);
            cJSON *m;
            while (old && (m = cJSON_DetachItemFromArray(old, 0))) cJSON_AddItemToArray(conversation, m);
            cJSON_Delete(old);
        }
        free(stored);
    }
    cJSON *input = g4_api_field(root, "input");
    if (!rc && !input) rc = g4_oai_fail(err, 400, "input", "'input' is required");
    if (!rc && cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(conversation, m);
    } else if (!rc && cJSON_IsArray(input)) {
        rc = input_items(input, conversation, err);
    } else if (!rc) {
        rc = g4_oai_fail(err, 400, "input", "'input' must be a string or a list of items");
    }
    if (!rc && cJSON_GetArraySize(conversation) == 0)
        rc = g4_oai_fail(err, 400, "input", "'input' must not be empty");
    if (!rc) {
        st->conversation = cJSON_PrintUnformatted(conversation);
        if (!st->conversation) rc = g4_oai_fail(err, 503, NULL, "out of memory");
    }
    cJSON *m;
    while ((m = cJSON_DetachItemFromArray(conversation, 0))) cJSON_AddItemToArray(messages, m);
    cJSON_Delete(conversation);
    if (!rc) rc = translate_tools(g4_api_field(root, "tools"), chat, err);
    const cJSON *choice = g4_api_field(root, "tool_choice");
    if (!rc && choice) {
        /* "required" and {"type": "function", "name"} force calls (constrained decoding, openai_constraint.c) */
        const cJSON *fname = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "name") : NULL;
        if (cJSON_IsString(choice) && (!strcmp(choice->valuestring, "auto") || !strcmp(choice->valuestring, "none") ||
                                       !strcmp(choice->valuestring, "required")))
            cJSON_AddStringToObject(chat, "tool_choice", choice->valuestring);
        else if (cJSON_IsObject(choice) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(choice, "type")) &&
                 !strcmp(cJSON_GetObjectItemCaseSensitive(choice, "type")->valuestring, "function") &&
                 cJSON_IsString(fname)) {
            cJSON *tc = cJSON_AddObjectToObject(chat, "tool_choice");
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(tc, "function"), "name", fname->valuestring);
        } else
            rc = g4_oai_fail(err, 400, "tool_choice",
                             "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                             "\"name\": ...}");
    }
    const cJSON *reasoning = g4_api_field(root, "reasoning");
    if (!rc && reasoning) {
        const cJSON *effort = g4_api_field(reasoning, "effort");
        static const char *const efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        int known = !effort;
        for (int k = 0; k < 6 && effort; k++) known |= cJSON_IsString(effort) && !strcmp(effort->valuestring, efforts[k]);
        if (!cJSON_IsObject(reasoning) || !known) {
            rc = g4_oai_fail(err, 400, "reasoning.effort",
                             "'reasoning' must be an object whose effort is one of none, minimal, low, medium, high, "
                             "xhigh");
        } else {
            cJSON *kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
            cJSON_AddBoolToObject(kw, "enable_thinking", !effort || strcmp(effort->valuestring, "none") != 0);
        }
    }
    if (!rc) rc = translate_format(g4_api_field(root, "text"), chat, err);
    int64_t max_out = 0;
    if (!rc) rc = g4_oai_get_int(root, "max_output_tokens", 1, 1e12, &max_out, err);
    if (!rc && max_out) cJSON_AddNumberToObject(chat, "max_completion_tokens", (double)max_out);
    if (!rc) {
        int parallel = 1;
        rc = g4_oai_get_bool(root, "parallel_tool_calls", &parallel, err);
    }
    if (rc) {
        cJSON_Delete(chat);
        return NULL;
    }
    st->echo = echo_fields(root);
    /* sampling and the extensions the chat parser knows keep their names */
    static const char *const same[] = {"model", "stream", "temperature", "top_p", "top_k", "min_p", "seed",
                                       "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
                                       "ignore_eos", "return_token_ids", "speculative"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) g4_api_move(chat, same[k], root, same[k]);
    return chat;
}

/* ---- output ------------------------------------------------------------------- */

static void event(responses *st, g4_sse *out, const char *type, cJSON *obj) {
    cJSON_AddStringToObject(obj, "type", type);
    cJSON_AddNumberToObject(obj, "sequence_number", st->seq++);
    g4_sse_event(out, type, obj);
}

static cJSON *usage(const g4_gen_summary *s) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", s->n_prompt);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", s->n_cached);
    cJSON_AddNumberToObject(u, "output_tokens", s->n_completion);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", s->n_reasoning);
    cJSON_AddNumberToObject(u, "total_tokens", s->n_prompt + s->n_completion);
    g4_oai_usage_speculative(u, s->n_drafted, s->n_accepted, s->n_rounds);
    return u;
}

static const char *text_of(const block *b) { return b->text.data ? b->text.data : ""; }

/* A content part of a block: output_text or reasoning_text. */
static cJSON *part(const block *b, int with_text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", b->kind == B_MESSAGE ? "output_text" : "reasoning_text");
    cJSON_AddStringToObject(p, "text", with_text ? text_of(b) : "");
    if (b->kind == B_MESSAGE) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    }
    return p;
}

static cJSON *item(const block *b, const char *status, int whole) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", b->id);
    if (b->kind == B_CALL) {
        cJSON_AddStringToObject(it, "type", "function_call");
        cJSON_AddStringToObject(it, "status", status);
        cJSON_AddStringToObject(it, "call_id", b->call_id);
        cJSON_AddStringToObject(it, "name", b->name ? b->name : "");
        cJSON_AddStringToObject(it, "arguments", whole ? text_of(b) : "");
        return it;
    }
    cJSON_AddStringToObject(it, "type", b->kind == B_MESSAGE ? "message" : "reasoning");
    cJSON_AddStringToObject(it, "status", status);
    if (b->kind == B_MESSAGE) cJSON_AddStringToObject(it, "role", "assistant");
    else cJSON_AddArrayToObject(it, "summary");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (whole) cJSON_AddItemToArray(content, part(b, 1));
    return it;
}

static cJSON *response_object(responses *st, const char *status, const g4_gen_summary *s) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", st->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)st->created);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddNullToObject(r, "error");
    if (s && s->end == G4_GEN_END_LENGTH) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(r, "incomplete_details");
    }
    cJSON_AddStringToObject(r, "model", st->srv->model_name);
    cJSON *output = cJSON_AddArrayToObject(r, "output");
    const char *item_status = s && s->end == G4_GEN_END_LENGTH ? "incomplete" : "completed";
    for (int i = 0; s && i < st->n_blocks; i++) cJSON_AddItemToArray(output, item(&st->blocks[i], item_status, 1));
    cJSON *e;
    cJSON_ArrayForEach(e, st->echo) cJSON_AddItemToObject(r, e->string, cJSON_Duplicate(e, 1));
    cJSON_AddBoolToObject(r, "store", st->store);
    if (s) cJSON_AddItemToObject(r, "usage", usage(s));
    else cJSON_AddNullToObject(r, "usage");
    return r;
}

static block *new_block(responses *st, block_kind kind) {
    if (st->n_blocks == st->cap_blocks) {
        int cap = st->cap_blocks ? st->cap_blocks * 2 : 4;
        block *grown = realloc(st->blocks, (size_t)cap * sizeof *grown);
        if (!grown) return NULL;
        st->blocks = grown;
        st->cap_blocks = cap;
    }
    block *b = &st->blocks[st->n_blocks++];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    g4_oai_new_id(kind == B_MESSAGE ? "msg_" : kind == B_REASONING ? "rs_" : "fc_", b->id, sizeof b->id);
    return b;
}

static cJSON *item_event(const block *b, int index) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "item_id", b->id);
    cJSON_AddNumberToObject(ev, "output_index", index);
    return ev;
}

static void open_block(responses *st, g4_sse *out, int index) {
    block *b = &st->blocks[index];
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "output_index", index);
    cJSON_AddItemToObject(ev, "item", item(b, "in_progress", 0));
    event(st, out, "response.output_item.added", ev);
    if (b->kind == B_CALL) return;
    ev = item_event(b, index);
    cJSON_AddNumberToObject(ev, "content_index", 0);
    cJSON_AddItemToObject(ev, "part", part(b, 0));
    event(st, out, "response.content_part.added", ev);
}

static void close_block(responses *st, g4_sse *out, int index) {
    block *b = &st->blocks[index];
    cJSON *ev = item_event(b, index);
    if (b->kind == B_CALL) {
        cJSON_AddStringToObject(ev, "name", b->name ? b->name : "");
        cJSON_AddStringToObject(ev, "arguments", text_of(b));
        event(st, out, "response.function_call_arguments.done", ev);
    } else {
        int msg = b->kind == B_MESSAGE;
        cJSON_AddNumberToObject(ev, "content_index", 0);
        cJSON_AddStringToObject(ev, "text", text_of(b));
        if (msg) cJSON_AddArrayToObject(ev, "logprobs");
        event(st, out, msg ? "response.output_text.done" : "response.reasoning_text.done", ev);
        ev = item_event(b, index);
        cJSON_AddNumberToObject(ev, "content_index", 0);
        cJSON_AddItemToObject(ev, "part", part(b, 1));
        event(st, out, "response.content_part.done", ev);
    }
    ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "output_index", index);
    cJSON_AddItemToObject(ev, "item", item(b, "completed", 1));
    event(st, out, "response.output_item.done", ev);
}

static void delta(responses *st, g4_sse *out, int index, const char *text, size_t n) {
    block *b = &st->blocks[index];
    if (!g4_strbuf_append(&b->text, text, n)) st->oom = 1;
    if (!out) return;
    cJSON *ev = item_event(b, index);
    if (b->kind != B_CALL) cJSON_AddNumberToObject(ev, "content_index", 0);
    char *piece = g4_dup_bytes(text, n);
    cJSON_AddStringToObject(ev, "delta", piece ? piece : "");
    free(piece);
    if (b->kind == B_MESSAGE) cJSON_AddArrayToObject(ev, "logprobs");
    event(st, out, b->kind == B_MESSAGE ? "response.output_text.delta"
                   : b->kind == B_REASONING ? "response.reasoning_text.delta"
                                            : "response.function_call_arguments.delta",
          ev);
}

/* Text of one kind: continues the open block of that kind, or closes the
 * open one and starts another. */
static void add_text(responses *st, g4_sse *out, block_kind kind, const char *text, size_t n) {
    if (st->open < 0 || st->blocks[st->open].kind != kind) {
        if (st->open >= 0 && out) close_block(st, out, st->open);
        if (!new_block(st, kind)) {
            st->oom = 1;
            return;
        }
        st->open = st->n_blocks - 1;
        if (out) open_block(st, out, st->open);
    }
    delta(st, out, st->open, text, n);
}

static void on_open(void *api, g4_sse *out, const g4_gen_summary *s) {
    responses *st = api;
    (void)s;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", response_object(st, "in_progress", NULL));
    event(st, out, "response.created", ev);
    ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", response_object(st, "in_progress", NULL));
    event(st, out, "response.in_progress", ev);
}

static void on_text(void *api, g4_sse *out, const char *content, size_t content_len, const char *reasoning,
                    size_t reasoning_len) {
    responses *st = api;
    if (reasoning_len) add_text(st, out, B_REASONING, reasoning, reasoning_len);
    if (content_len) add_text(st, out, B_MESSAGE, content, content_len);
}

/* The conversation with this reply as its last assistant message. */
static char *conversation_after(const responses *st) {
    cJSON *msgs = cJSON_Parse(st->conversation);
    if (!msgs) return NULL;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    g4_strbuf text = {0}, reasoning = {0};
    cJSON *calls = NULL;
    for (int i = 0; i < st->n_blocks; i++) {
        const block *b = &st->blocks[i];
        if (b->kind == B_MESSAGE) g4_strbuf_append(&text, text_of(b), b->text.len);
        if (b->kind == B_REASONING) g4_strbuf_append(&reasoning, text_of(b), b->text.len);
        if (b->kind != B_CALL) continue;
        if (!calls) calls = cJSON_CreateArray();
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", b->call_id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(fn, "name", b->name ? b->name : "");
        cJSON_AddStringToObject(fn, "arguments", text_of(b));
        cJSON_AddItemToObject(c, "function", fn);
        cJSON_AddItemToArray(calls, c);
    }
    if (text.len || !calls) cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
    else cJSON_AddNullToObject(m, "content");
    if (reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", reasoning.data);
    if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
    cJSON_AddItemToArray(msgs, m);
    g4_strbuf_free(&text);
    g4_strbuf_free(&reasoning);
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    return json;
}

static void on_close(void *api, g4_sse *out, const g4_gen_summary *s) {
    responses *st = api;
    if (st->open >= 0 && out) close_block(st, out, st->open);
    st->open = -1;
    int has_message = 0;
    for (int i = 0; i < st->n_blocks; i++) has_message |= st->blocks[i].kind == B_MESSAGE;
    if (!has_message && !s->n_calls) {
        /* an empty reply is still a message */
        if (new_block(st, B_MESSAGE) && out) {
            open_block(st, out, st->n_blocks - 1);
            close_block(st, out, st->n_blocks - 1);
        }
    }
    for (size_t i = 0; i < s->n_calls; i++) {
        block *b = new_block(st, B_CALL);
        if (!b) {
            st->oom = 1;
            break;
        }
        g4_oai_new_id("call_", b->call_id, sizeof b->call_id);
        b->name = strdup(s->calls[i].name);
        int index = st->n_blocks - 1;
        if (out) open_block(st, out, index);
        delta(st, out, index, s->calls[i].arguments, strlen(s->calls[i].arguments));
        if (out) close_block(st, out, index);
    }
    int incomplete = s->end == G4_GEN_END_LENGTH;
    st->final = response_object(st, incomplete ? "incomplete" : "completed", s);
    if (s->prompt_ids) {
        /* return_token_ids (vLLM's extension) */
        cJSON_AddItemToObject(st->final, "prompt_token_ids", cJSON_CreateIntArray(s->prompt_ids, s->n_prompt));
        cJSON_AddItemToObject(st->final, "token_ids",
                              cJSON_CreateIntArray(s->out_ids ? s->out_ids : (int32_t[]){0}, s->out_ids ? s->n_out : 0));
    }
    if (st->store && !st->oom) {
        char *resp = cJSON_PrintUnformatted(st->final), *conv = conversation_after(st);
        if (resp && conv) g4_response_store_put(st->srv->responses, st->id, resp, conv);
        free(resp);
        free(conv);
    }
    if (out) {
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddItemToObject(ev, "response", cJSON_Duplicate(st->final, 1));
        event(st, out, incomplete ? "response.incomplete" : "response.completed", ev);
    }
}

static void on_fail(void *api, g4_sse *out, const g4_oai_error *e) {
    responses *st = api;
    cJSON *r = response_object(st, "failed", NULL);
    cJSON *err = cJSON_CreateObject();
    cJSON_AddStringToObject(err, "code", e->status >= 500 ? "server_error" : "invalid_request");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_ReplaceItemInObject(r, "error", err);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", r);
    event(st, out, "response.failed", ev);
}

static void on_answer(void *api, const g4_gen_summary *s, g4_http_reply *r) {
    responses *st = api;
    (void)s;
    if (st->oom || !st->final) {
        g4_reply_errorf(r, 503, NULL, "out of memory");
        return;
    }
    g4_reply_json(r, 200, st->final);
    st->final = NULL;
}

static void free_state(void *api) {
    responses *st = api;
    if (!st) return;
    for (int i = 0; i < st->n_blocks; i++) {
        g4_strbuf_free(&st->blocks[i].text);
        free(st->blocks[i].name);
    }
    free(st->blocks);
    cJSON_Delete(st->echo);
    cJSON_Delete(st->final);
    free(st->conversation);
    free(st);
}

static const g4_api_writer responses_writer = {
    .open = on_open,
    .text = on_text,
    .close = on_close,
    .fail = on_fail,
    .answer = on_answer,
    .reply_error = g4_reply_error,
    .free = free_state,
};

static double float_value(float f) {
    char text[32];
    snprintf(text, sizeof text, "%.7g", (double)f);
    return strtod(text, NULL);
}

void g4_serve_responses(const g4_http_request *q, g4_http_reply *r) {
    g4_server *s = q->srv;
    g4_oai_error err;
    cJSON *root = g4_oai_parse_json(q->body, q->body_len, s->max_json_values, &err);
    if (!root) {
        g4_reply_error(r, &err);
        return;
    }
    responses *st = calloc(1, sizeof *st);
    if (!st) {
        cJSON_Delete(root);
        g4_reply_errorf(r, 503, NULL, "out of memory");
        return;
    }
    st->srv = s;
    st->open = -1;
    st->created = (long)time(NULL);
    g4_oai_new_id("resp_", st->id, sizeof st->id);
    cJSON *chat = translate(s, root, st, &err);
    cJSON_Delete(root);
    g4_oai_request req;
    g4_oai_limits lim = g4_api_limits(s);
    if (!chat || g4_oai_parse_root(chat, G4_OAI_CHAT, &lim, &req, &err)) {
        if (chat) g4_oai_request_free(&req);
        free_state(st);
        g4_reply_error(r, &err);
        return;
    }
    /* the sampling values in effect, as the response object reports them
     * (a float's shortest decimal: 0.95, not 0.949999988) */
    if (cJSON_IsNull(cJSON_GetObjectItem(st->echo, "temperature")))
        cJSON_ReplaceItemInObject(st->echo, "temperature", cJSON_CreateNumber(float_value(req.sampling.temperature)));
    if (cJSON_IsNull(cJSON_GetObjectItem(st->echo, "top_p")))
        cJSON_ReplaceItemInObject(st->echo, "top_p", cJSON_CreateNumber(float_value(req.sampling.top_p)));
    g4_serve_chat_with(q, &req, &responses_writer, st, r);
}

void g4_serve_response_stored(const g4_http_request *q, const char *id, int remove, g4_http_reply *r) {
    g4_server *s = q->srv;
    if (remove) {
        if (!g4_response_store_delete(s->responses, id)) {
            g4_reply_errorf(r, 404, NULL, "Response with id '%.100s' not found.", id);
            return;
        }
        cJSON *out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "id", id);
        cJSON_AddStringToObject(out, "object", "response");
        cJSON_AddBoolToObject(out, "deleted", 1);
        g4_reply_json(r, 200, out);
        return;
    }
    char *json = NULL;
    if (!g4_response_store_get(s->responses, id, &json, NULL)) {
        g4_reply_errorf(r, 404, NULL, "Response with id '%.100s' not found.", id);
        return;
    }
    r->status = 200;
    r->content_type = "application/json";
    r->body = json;
    r->body_len = strlen(json);
}
