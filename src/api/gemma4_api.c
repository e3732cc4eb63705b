/* The public embedding API of gemma4.h: thin wrappers over the runtime
 * context, the prompt builder, the batched engine and the reply splitter. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_handle.h"
#include "base/status.h"
#include "io/hub.h"
#include "model/assistant.h"
#include "model/kv_cache.h"
#include "runtime/chat_messages.h"
#include "runtime/constraints.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"
#include "runtime/reply_stream.h"
#include "text/chat.h"
#include "text/json_strict.h"

/* The drafter g4_open_options.draft names, loaded beside the target and attached. */
static g4_status open_drafter(const char *draft, const g4_model *target, g4_assistant **out, char **dir_out) {
    char *dir = NULL;
    g4_status st = !strcmp(draft, "auto") ? g4_assistant_find(target->path, &dir) : g4_resolve_model_path(draft, &dir);
    if (st == G4_OK) st = g4_assistant_load_dir(dir, target->backend, out);
    if (st == G4_OK) st = g4_assistant_attach(*out, target);
    if (st != G4_OK) {
        g4_assistant_release(*out);
        *out = NULL;
        st = g4_fail_context(st, "drafter %s", dir ? dir : draft);
    }
    if (st == G4_OK) *dir_out = dir;
    else free(dir);
    return st;
}

/* One submitted request; freed after the engine's last event. */
typedef struct {
    g4_handle *h;
    g4_reply_stream *reply;
    g4_event_callback cb;
    void *user;
    int chat;
    int ended; /* the final event went out already (a stop string ended the text) */
} api_request;

g4_status g4_open(const char *model, const g4_open_options *opt, g4_handle **out) {
    *out = NULL;
    g4_open_options o = {0};
    if (opt) o = *opt;
    g4_handle *h = calloc(1, sizeof *h);
    if (!h) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_context_options co = {.device = o.device, .threads = o.threads, .require_tokenizer = !o.sequences_only,
                             .precision = o.exact ? G4_PRECISION_EXACT : G4_PRECISION_FAST};
    const int kv_type = o.kv_type ? g4_kv_type_parse(o.kv_type) : G4_KV_AUTO;
    g4_status st = kv_type < 0 ? g4_fail(G4_ERR_INVALID_ARGUMENT, "kv_type must be f32, bf16, fp8 or auto, got '%s'",
                                         o.kv_type)
                               : g4_context_open(model, &co, &h->ctx);
    g4_engine_options eo = {.max_seqs = o.max_seqs, .n_ctx = o.n_ctx, .max_queue = o.max_queue, .threads = o.threads,
                            .kv_type = G4_KV_AUTO};
    if (st == G4_OK) eo.kv_type = h->kv_type = g4_kv_type_resolve((g4_kv_type)kv_type, co.precision, h->ctx->model);
    if (st == G4_OK && o.draft) st = open_drafter(o.draft, h->ctx->model, &h->drafter, &h->draft_dir);
    if (st == G4_OK && (o.draft_max < 0 || o.draft_max > G4_MAX_DRAFTS))
        st = g4_fail(G4_ERR_INVALID_ARGUMENT, "draft_max %d outside 1..%d", o.draft_max, G4_MAX_DRAFTS);
    h->draft_max = o.draft_max > 0 ? o.draft_max : 1;
    eo.drafter = h->drafter;
    eo.draft_max = o.draft_max;
    eo.draft_min_p = o.draft_min_p;
    eo.draft_max_batch = o.draft_max_batch;
    if (st == G4_OK && !o.sequences_only) st = g4_engine_create(h->ctx->model, &eo, &h->engine);
    if (st == G4_OK && !o.sequences_only) st = g4_engine_start(h->engine);
    if (st != G4_OK) {
        g4_close(h);
        return st;
    }
    *out = h;
    return G4_OK;
}

void g4_close(g4_handle *h) {
    if (!h) return;
    if (h->engine) {
        g4_engine_stop(h->engine, 1);
        g4_engine_destroy(h->engine);
    }
    g4_assistant_release(h->drafter);
    free(h->draft_dir);
    g4_context_close(h->ctx);
    free(h);
}

const char *g4_draft_dir(const g4_handle *h) { return h ? h->draft_dir : NULL; }

void g4_params_default(g4_params *p) {
    memset(p, 0, sizeof *p);
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
}

void g4_params_model_default(const g4_handle *h, g4_params *p) {
    g4_params_default(p);
    g4_sampler_params sp;
    g4_sampler_params_from_generation_config(&sp, &h->ctx->generation);
    p->temperature = sp.temperature;
    p->top_k = sp.top_k;
    p->top_p = sp.top_p;
    p->min_p = sp.min_p;
    p->repetition_penalty = sp.repetition_penalty;
    p->suppress = sp.suppress;
    p->n_suppress = (int)sp.n_suppress;
}

void g4_sampler_params_from_api(const g4_params *p, g4_sampler_params *out) {
    g4_sampler_params_default(out);
    out->temperature = p->temperature;
    out->top_k = p->top_k;
    out->top_p = p->top_p > 0 ? p->top_p : 1.0f;
    out->min_p = p->min_p;
    out->repetition_penalty = p->repetition_penalty > 0 ? p->repetition_penalty : 1.0f;
    out->presence_penalty = p->presence_penalty;
    out->frequency_penalty = p->frequency_penalty;
    out->suppress = p->n_suppress > 0 ? p->suppress : NULL;
    out->n_suppress = p->n_suppress > 0 ? (size_t)p->n_suppress : 0;
    out->seed = p->seed;
}

g4_status g4_params_constraint(const g4_handle *h, const g4_params *p, int thinking, int starts_in_reasoning,
                               g4_token_matcher **out) {
    *out = NULL;
    const int given = !!p->json_schema + !!p->grammar + !!p->regex + !!p->json_object;
    if (given > 1) return g4_fail(G4_ERR_INVALID_ARGUMENT, "give at most one of json_schema, grammar, regex and json_object");
    if (!given) return G4_OK;
    g4_constraint_spec spec = {p->json_object   ? G4_CONSTRAINT_JSON_OBJECT
                               : p->json_schema ? G4_CONSTRAINT_JSON_SCHEMA
                               : p->grammar     ? G4_CONSTRAINT_GBNF
                                                : G4_CONSTRAINT_REGEX,
                               (char *)(p->json_object   ? NULL
                                        : p->json_schema ? p->json_schema
                                        : p->grammar     ? p->grammar
                                                         : p->regex),
                               0};
    g4_constraint_use use = {.stop_ids = h->ctx->stop_ids, .n_stop = h->ctx->n_stop, .thinking = thinking,
                             .starts_in_thought = starts_in_reasoning};
    return h->ctx->constraints ? g4_constraints_matcher(h->ctx->constraints, &spec, &use, out)
                               : g4_fail(G4_ERR_INVALID_ARGUMENT, "constrained decoding needs a tokenizer");
}

static void deliver(api_request *r, const g4_token_event *ev, const char *text, size_t len, g4_text_kind kind,
                    int32_t token, const char *finish, const char *error, const char *tools) {
    g4_event out = {.request_id = ev->request_id,
                    .text = text ? text : "",
                    .len = text ? len : 0,
                    .kind = kind,
                    .token = token,
                    .done = finish != NULL,
                    .finish_reason = finish,
                    .error = error,
                    .tool_calls = tools,
                    .prompt_tokens = ev->n_prompt,
                    .completion_tokens = ev->n_generated,
                    .cached_tokens = ev->n_cached,
                    .draft_tokens = ev->n_drafted,
                    .accepted_tokens = ev->n_accepted,
                    .draft_rounds = ev->n_rounds};
    r->cb(r->user, &out);
}

/* The tool calls as a JSON array (heap), NULL when there are none. */
static char *tool_calls_json(const g4_reply_stream *s) {
    size_t n;
    const g4_tool_call *calls = g4_reply_stream_tool_calls(s, &n);
    if (!n) return NULL;
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", calls[i].name);
        cJSON *args = cJSON_Parse(calls[i].arguments);
        cJSON_AddItemToObject(c, "arguments", args ? args : cJSON_CreateObject());
        cJSON_AddItemToArray(arr, c);
    }
    char *text = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    return text;
}

/* Reasoning first, then content; `finish` rides on the last piece. */
static void deliver_delta(api_request *r, const g4_token_event *ev, const g4_reply_delta *d, int32_t token,
                          const char *finish, const char *error, const char *tools) {
    int both = d->reasoning_len && d->content_len;
    if (d->reasoning_len)
        deliver(r, ev, d->reasoning, d->reasoning_len, G4_TEXT_REASONING, token, both ? NULL : finish, error, tools);
    if (d->content_len || !d->reasoning_len)
        deliver(r, ev, d->content, d->content_len, G4_TEXT_CONTENT, both ? -1 : token, finish, error, tools);
}

static void finish_reply(api_request *r, const g4_token_event *ev, int32_t token, const char *finish) {
    g4_reply_delta d = {.content = "", .reasoning = "", .stop_index = -1};
    const char *error = NULL;
    if (g4_reply_stream_finish(r->reply, &d) != G4_OK) finish = "error", error = g4_error_message();
    char *tools = tool_calls_json(r->reply);
    if (tools && !strcmp(finish, "stop")) finish = "tool_calls";
    deliver_delta(r, ev, &d, token, finish, error, tools);
    free(tools);
    r->ended = 1;
}

static void on_token(void *user, const g4_token_event *ev) {
    api_request *r = user;
    if (!r->ended) {
        g4_reply_delta d = {.content = "", .reasoning = "", .stop_index = -1};
        int32_t token = ev->has_token ? ev->sample.token : -1;
        if (ev->has_token && !ev->is_stop_token && g4_reply_stream_push(r->reply, ev->sample.token, &d) != G4_OK) {
            deliver(r, ev, NULL, 0, G4_TEXT_CONTENT, token, "error", g4_error_message(), NULL);
            r->ended = 1;
            g4_engine_cancel(r->h->engine, ev->request_id);
        } else if (d.ended) {
            /* a stop string or end marker: the rest is not wanted */
            if (d.content_len || d.reasoning_len) deliver_delta(r, ev, &d, token, NULL, NULL, NULL), token = -1;
            finish_reply(r, ev, token, "stop");
            g4_engine_cancel(r->h->engine, ev->request_id);
        } else if (ev->finish == G4_FINISH_NONE) {
            deliver_delta(r, ev, &d, token, NULL, NULL, NULL);
        } else {
            if (d.content_len || d.reasoning_len) deliver_delta(r, ev, &d, token, NULL, NULL, NULL), token = -1;
            switch (ev->finish) {
            case G4_FINISH_STOP: finish_reply(r, ev, token, "stop"); break;
            case G4_FINISH_LENGTH: finish_reply(r, ev, token, "length"); break;
            case G4_FINISH_CANCELLED:
                deliver(r, ev, NULL, 0, G4_TEXT_CONTENT, token, "cancelled", NULL, NULL);
                r->ended = 1;
                break;
            default:
                deliver(r, ev, NULL, 0, G4_TEXT_CONTENT, token, "error", ev->message ? ev->message : "engine failure",
                        NULL);
                r->ended = 1;
                break;
            }
        }
    }
    if (ev->finish != G4_FINISH_NONE) {
        g4_reply_stream_free(r->reply);
        free(r);
    }
}

static g4_status submit(g4_handle *h, g4_prompt *pr, int chat, const g4_params *p, g4_event_callback cb, void *user,
                        uint64_t *request_id) {
    g4_params defaults;
    if (!p) {
        g4_params_default(&defaults);
        p = &defaults;
    }
    int n_ctx = g4_engine_n_ctx(h->engine);
    int max_tokens = p->max_tokens > 0 ? p->max_tokens : n_ctx - pr->n_ids;
    if (max_tokens <= 0 || pr->n_ids + max_tokens > n_ctx)
        return g4_fail(G4_ERR_LIMIT, "a prompt of %d tokens and max_tokens %d do not fit the context of %d", pr->n_ids,
                       max_tokens > 0 ? max_tokens : 0, n_ctx);
    api_request *r = calloc(1, sizeof *r);
    if (!r) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    r->h = h;
    r->cb = cb;
    r->user = user;
    r->chat = chat;
    g4_reply_options ro = {.mode = chat ? G4_REPLY_CHAT : G4_REPLY_RAW,
                           .starts_in_reasoning = pr->starts_in_reasoning,
                           .stop = p->stop,
                           .n_stop = p->n_stop > 0 ? (size_t)p->n_stop : 0};
    g4_status st = g4_reply_stream_create(h->ctx->tokenizer, &ro, &r->reply);
    if (st != G4_OK) {
        free(r);
        return st;
    }
    g4_token_matcher *matcher = NULL;
    st = g4_params_constraint(h, p, chat && p->enable_thinking, pr->starts_in_reasoning, &matcher);
    if (st != G4_OK) {
        g4_reply_stream_free(r->reply);
        free(r);
        return st;
    }
    g4_request req = {.prompt = pr->ids,
                      .n_prompt = pr->n_ids,
                      .media = pr->media,
                      .max_tokens = max_tokens,
                      .stop_ids = h->ctx->stop_ids,
                      .n_stop = h->ctx->n_stop,
                      .on_token = on_token,
                      .user = r,
                      .constraint = matcher,
                      .no_speculative = p->no_speculative};
    g4_sampler_params_from_api(p, &req.sampling);
    uint64_t id = 0;
    st = g4_engine_submit(h->engine, &req, &id);
    if (st != G4_OK) {
        g4_token_matcher_free(matcher);
        g4_reply_stream_free(r->reply);
        free(r);
        return st;
    }
    pr->media = (g4_request_media){0}; /* the engine's now */
    if (request_id) *request_id = id;
    return G4_OK;
}

g4_status g4_chat_json_parse(const char *messages_json, const char *tools_json, cJSON **messages, cJSON **tools) {
    *messages = *tools = NULL;
    /* the server's strict reading: cJSON alone would cut a string at an escaped NUL */
    size_t pos = 0;
    const char *why = NULL;
    if (g4_json_check(messages_json, strlen(messages_json), (size_t)-1, &pos, &why))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "messages: not valid JSON (%s at byte %zu)", why, pos);
    if (tools_json && g4_json_check(tools_json, strlen(tools_json), (size_t)-1, &pos, &why))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "tools: not valid JSON (%s at byte %zu)", why, pos);
    *messages = cJSON_Parse(messages_json);
    *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    char where[48];
    if (!cJSON_IsArray(*messages)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "messages: not a JSON array");
    if (tools_json && !cJSON_IsArray(*tools)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "tools: not a JSON array");
    if (g4_chat_check_messages(*messages, where, sizeof where) != G4_OK)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: %s", where, g4_error_message());
    return g4_chat_normalize_tool_arguments(*messages);
}

g4_status g4_submit_chat(g4_handle *h, const char *messages_json, const char *tools_json, const g4_params *p,
                         g4_event_callback cb, void *user, uint64_t *request_id) {
    if (!h || !messages_json || !cb) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_submit_chat: missing argument");
    if (!h->engine) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_submit_chat: the model was opened sequences_only");
    cJSON *messages = NULL, *tools = NULL;
    g4_status st = g4_chat_json_parse(messages_json, tools_json, &messages, &tools);
    g4_media_list media = {0};
    if (st == G4_OK) {
        g4_media_limits ml = {.max_images = 64, .max_audio = 64, .max_bytes = (size_t)256 << 20};
        st = g4_chat_collect_media(messages, &ml, &media);
    }
    g4_prompt pr = {0};
    if (st == G4_OK) {
        /* a prompt over the context is refused once tokenizing passes it */
        g4_prompt_options po = {.chat = {.add_generation_prompt = 1, .enable_thinking = p ? p->enable_thinking : 0},
                                .max_ids = g4_engine_n_ctx(h->engine)};
        st = g4_prompt_from_messages(h->ctx, messages, tools, &po, media.items, media.n, &pr);
    }
    if (st == G4_OK) st = submit(h, &pr, 1, p, cb, user, request_id);
    g4_prompt_free(h->ctx, &pr);
    g4_media_list_free(&media);
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    return st;
}

g4_status g4_submit_text(g4_handle *h, const char *prompt, const g4_params *p, g4_event_callback cb, void *user,
                         uint64_t *request_id) {
    if (!h || !prompt || !cb) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_submit_text: missing argument");
    if (!h->engine) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_submit_text: the model was opened sequences_only");
    int32_t *ids = NULL;
    size_t n = 0;
    g4_status st = g4_tokenizer_encode(h->ctx->tokenizer, prompt, strlen(prompt), G4_TOK_ADD_SPECIAL, &ids, &n);
    g4_prompt pr = {0};
    if (st == G4_OK) st = g4_prompt_from_ids(h->ctx, ids, (int)n, NULL, 0, &pr);
    free(ids);
    if (st == G4_OK) st = submit(h, &pr, 0, p, cb, user, request_id);
    g4_prompt_free(h->ctx, &pr);
    return st;
}

void g4_cancel(g4_handle *h, uint64_t request_id) {
    if (h && h->engine) g4_engine_cancel(h->engine, request_id);
}
