/* The small endpoints: models, health, metrics, tokenize, detokenize. */
#include <stdlib.h>
#include <string.h>

#include "runtime/prompt.h"
#include "server/openai_request.h"
#include "server/server_internal.h"

static cJSON *model_object(const g4_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "gemma4.c");
    cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
    return m;
}

void g4_serve_models(const g4_http_request *q, const char *name, g4_http_reply *r) {
    const g4_server *s = q->srv;
    if (name) {
        if (strcmp(name, s->model_name) != 0) {
            g4_oai_error e;
            g4_oai_fail(&e, 404, "model", "The model '%.200s' does not exist", name);
            e.code = "model_not_found";
            g4_reply_error(r, &e);
            return;
        }
        g4_reply_json(r, 200, model_object(s));
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_object(s));
    g4_reply_json(r, 200, root);
}

void g4_serve_health(const g4_http_request *q, g4_http_reply *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", "ok");
    g4_reply_json(r, 200, root);
    (void)q;
}

void g4_serve_metrics(const g4_http_request *q, g4_http_reply *r) {
    g4_engine_stats st;
    g4_engine_get_stats(q->srv->engine, &st);
    size_t len = 0;
    char *text = g4_metrics_render(q->srv->metrics, &st, &len);
    if (!text) {
        g4_reply_errorf(r, 503, NULL, "out of memory");
        return;
    }
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
    r->body = text;
    r->body_len = len;
}

static cJSON *parse_body(const g4_http_request *q, g4_http_reply *r) {
    g4_oai_error err;
    cJSON *root = g4_oai_parse_json(q->body, q->body_len, q->srv->max_json_values, &err);
    if (!root) {
        g4_reply_error(r, &err);
        return NULL;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, q->srv->model_name))) {
        g4_oai_error e;
        g4_oai_fail(&e, 404, "model", "The model does not exist (this server serves '%.200s')", q->srv->model_name);
        e.code = "model_not_found";
        g4_reply_error(r, &e);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* A text longer than the context: refused, like vLLM, and no more than a
 * context's worth of tokens is ever produced (the answer stays small). */
static int too_many_tokens(const g4_server *s, const char *param, g4_oai_error *err) {
    g4_oai_fail(err, 400, param, "the text has more than max_model_len = %d tokens", s->n_ctx);
    err->code = "context_length_exceeded";
    return -1;
}

/* vLLM's /tokenize: {"prompt": TEXT, "add_special_tokens": true} or
 * {"messages": [...], "tools": [...], "add_generation_prompt": true} ->
 * {"count", "max_model_len", "tokens"}; at most max_model_len tokens. */
void g4_serve_tokenize(const g4_http_request *q, g4_http_reply *r) {
    g4_server *s = q->srv;
    g4_context *ctx = s->ctx;
    if (!ctx->tokenizer) {
        g4_reply_errorf(r, 400, NULL, "this model has no tokenizer.json");
        return;
    }
    cJSON *root = parse_body(q, r);
    if (!root) return;
    g4_oai_error err;
    int rc = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    g4_prompt prompt = {0};
    cJSON *messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(messages)) {
        int add_generation_prompt = 1, thinking = 0;
        rc = g4_oai_check_messages(messages, &err);
        if (!rc && !g4_oai_text_may_fit(s, g4_oai_messages_text_bytes(messages), s->n_ctx))
            rc = too_many_tokens(s, "messages", &err);
        if (!rc && s->opt.no_special_in_content) rc = g4_oai_escape_content(ctx->tokenizer, messages, &err);
        if (!rc) rc = g4_oai_get_bool(root, "add_generation_prompt", &add_generation_prompt, &err);
        const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
        if (!rc && cJSON_IsObject(kwargs)) rc = g4_oai_get_bool(kwargs, "enable_thinking", &thinking, &err);
        g4_media_limits ml = {s->opt.max_images, s->opt.max_audio, s->opt.max_body, s->opt.allowed_media_dir};
        g4_media_list media = {0};
        if (!rc) rc = g4_oai_collect_media(messages, &ml, &media, &err);
        if (!rc) {
            g4_prompt_options po = {.chat = {.add_generation_prompt = add_generation_prompt, .enable_thinking = thinking},
                                    .max_ids = s->n_ctx,
                                    .escaped_spans = s->opt.no_special_in_content};
            const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
            g4_status st = g4_chat_normalize_tool_arguments(messages);
            if (st == G4_OK && tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
                st = g4_fail(G4_ERR_INVALID_ARGUMENT, "'tools' must be a list");
            if (st == G4_OK) {
                if (media.n) pthread_mutex_lock(&s->media_lock);
                st = g4_prompt_from_messages(ctx, messages, cJSON_IsArray(tools) ? tools : NULL, &po, media.items,
                                             media.n, &prompt);
                if (media.n) pthread_mutex_unlock(&s->media_lock);
            }
            if (st == G4_ERR_LIMIT) rc = too_many_tokens(s, "messages", &err);
            else if (st != G4_OK)
                rc = g4_oai_fail(&err, st == G4_ERR_OUT_OF_MEMORY ? 503 : 400, "messages", "%s", g4_error_message());
        }
        g4_media_list_free(&media);
        ids = prompt.ids;
        n = (size_t)prompt.n_ids;
    } else if (cJSON_IsString(text)) {
        int add_special = 1;
        rc = g4_oai_get_bool(root, "add_special_tokens", &add_special, &err);
        size_t len = strlen(text->valuestring);
        if (!rc && !g4_oai_text_may_fit(s, len, s->n_ctx)) rc = too_many_tokens(s, "prompt", &err);
        if (!rc) {
            g4_status st = g4_tokenizer_encode_max(ctx->tokenizer, text->valuestring, len,
                                                   add_special ? G4_TOK_ADD_SPECIAL : 0, (size_t)s->n_ctx, &ids, &n);
            if (st == G4_ERR_LIMIT) rc = too_many_tokens(s, "prompt", &err);
            else if (st != G4_OK) rc = g4_oai_fail(&err, 400, "prompt", "%s", g4_error_message());
        }
    } else {
        rc = g4_oai_fail(&err, 400, "prompt", "send \"prompt\" (a string) or \"messages\" (a list)");
    }
    if (rc) {
        g4_reply_error(r, &err);
    } else {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddNumberToObject(out, "count", (double)n);
        cJSON_AddNumberToObject(out, "max_model_len", s->n_ctx);
        cJSON_AddItemToObject(out, "tokens", cJSON_CreateIntArray(ids ? ids : (int32_t[]){0}, (int)n));
        g4_reply_json(r, 200, out);
    }
    if (ids != prompt.ids) free(ids);
    g4_prompt_free(ctx, &prompt);
    cJSON_Delete(root);
}

/* vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": TEXT}; at most
 * max_model_len ids, so the text is at most that many tokens long. */
void g4_serve_detokenize(const g4_http_request *q, g4_http_reply *r) {
    g4_context *ctx = q->srv->ctx;
    if (!ctx->tokenizer) {
        g4_reply_errorf(r, 400, NULL, "this model has no tokenizer.json");
        return;
    }
    cJSON *root = parse_body(q, r);
    if (!root) return;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    g4_oai_error err;
    int32_t *ids = NULL;
    int n = 0;
    if (!cJSON_IsArray(tokens)) {
        g4_reply_errorf(r, 400, "tokens", "'tokens' must be a list of token ids");
    } else if (cJSON_GetArraySize(tokens) > q->srv->n_ctx) {
        g4_reply_errorf(r, 400, "tokens", "'tokens' lists %d ids; at most max_model_len = %d", cJSON_GetArraySize(tokens),
                        q->srv->n_ctx);
    } else if (g4_oai_get_ids(tokens, "tokens", g4_tokenizer_vocab_size(ctx->tokenizer), &ids, &n, &err)) {
        g4_reply_error(r, &err);
    } else {
        char *text = NULL;
        size_t len = 0;
        g4_status st = g4_tokenizer_decode(ctx->tokenizer, ids, (size_t)n, 0, &text, &len);
        if (st != G4_OK) {
            g4_reply_errorf(r, 400, "tokens", "%s", g4_error_message());
        } else {
            cJSON *out = cJSON_CreateObject();
            cJSON_AddStringToObject(out, "prompt", text);
            g4_reply_json(r, 200, out);
        }
        free(text);
    }
    free(ids);
    cJSON_Delete(root);
}
