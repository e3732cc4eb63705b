/* POST /v1/chat/completions and /v1/completions: validate, build the
 * prompt, submit to the engine, then either wait for the whole reply or
 * stream it as server-sent events, one chunk per token. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "runtime/constraints.h"
#include "runtime/prompt.h"
#include "runtime/reply_stream.h"
#include "server/api_writer.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_internal.h"
#include "text/strbuf.h"

typedef struct generation generation;

/* The stream of a generation as API writers see it. */
struct g4_sse {
    generation *g;
};

struct generation {
    g4_server *srv;
    g4_context *ctx;
    g4_oai_request req;
    /* another API's writer (Responses, Messages); NULL: chat completions / completions */
    const g4_api_writer *api;
    void *api_state;
    g4_sse sse;
    g4_job *job;
    g4_reply_stream *reply;
    int fd;
    char id[48];
    long created;
    int32_t *prompt_ids;
    int n_prompt;
    /* progress */
    int done;      /* the reply is complete (or failed): no more events are used */
    int finalized; /* the last chunks / the whole answer are written */
    const char *finish_reason;
    int err_status;
    char err_message[300];
    int n_completion;
    double t_arrival, t_prev;
    /* the whole answer (non-streaming) */
    g4_strbuf content, reasoning;
    cJSON *logprobs;
    g4_text_counter offsets; /* completions' text_offset, in characters */
    int32_t *out_ids;
    int n_out, cap_out;
    /* streaming */
    g4_strbuf out;
    size_t out_pos;
    double t_last_out; /* when the stream last handed bytes to the connection */
    int oom;
    /* how the reply ended, for API writers */
    int n_cached, n_reasoning;
    int n_drafted, n_accepted, n_rounds;
    g4_gen_end end;
    int stop_index;
};

static int fail_status(g4_status st) {
    return st == G4_ERR_OUT_OF_MEMORY ? 503 : (st == G4_ERR_INTERNAL || st == G4_ERR_IO) ? 500 : 400;
}

/* ---- output -------------------------------------------------------------- */

static void sse(generation *g, cJSON *obj) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text || !g4_strbuf_append(&g->out, "data: ", 6) || !g4_strbuf_append(&g->out, text, strlen(text)) ||
        !g4_strbuf_append(&g->out, "\n\n", 2))
        g->oom = 1;
    free(text);
}

void g4_sse_event(g4_sse *out, const char *event, cJSON *obj) {
    generation *g = out->g;
    if (event && (!g4_strbuf_append(&g->out, "event: ", 7) || !g4_strbuf_append(&g->out, event, strlen(event)) ||
                  !g4_strbuf_append(&g->out, "\n", 1)))
        g->oom = 1;
    sse(g, obj);
}

static g4_gen_summary summary(generation *g) {
    g4_gen_summary sum = {.n_prompt = g->n_prompt,
                          .n_cached = g->n_cached,
                          .n_completion = g->n_completion,
                          .n_reasoning = g->n_reasoning,
                          .end = g->end,
                          .stop_index = g->stop_index,
                          .has_reasoning = g->reply ? g4_reply_stream_has_reasoning(g->reply) : 0,
                          .prompt_ids = g->req.return_token_ids ? g->prompt_ids : NULL,
                          .out_ids = g->out_ids,
                          .n_out = g->n_out,
                          .n_drafted = g->n_drafted,
                          .n_accepted = g->n_accepted,
                          .n_rounds = g->n_rounds};
    if (g->reply) sum.calls = g4_reply_stream_tool_calls(g->reply, &sum.n_calls);
    return sum;
}

static cJSON *new_chunk(generation *g, cJSON **choice) {
    cJSON *c = g4_oai_chunk(g->req.kind, g->id, g->created, g->srv->model_name, choice);
    if (g->req.include_usage) cJSON_AddNullToObject(c, "usage");
    return c;
}

/* Where the token's text starts in the completion's text, in characters:
 * from the tokens' own bytes, so text held back (an unfinished character,
 * a possible stop string) does not delay the offsets. Completions decode
 * without special tokens, so those take no room. */
static size_t token_offset(generation *g, int32_t token) {
    size_t n = 0;
    char *bytes = g->ctx->tokenizer ? g4_token_bytes(g->ctx, token, 1, &n) : NULL; /* no tokenizer: no text */
    size_t offset = g4_text_counter_add(&g->offsets, bytes ? bytes : "", n);
    free(bytes);
    return offset;
}

/* One token's text, log-probabilities (sample, NULL for none) and id (-1
 * for none): a chunk, or added to the answer. */
static void emit(generation *g, const g4_reply_delta *d, const g4_sample *sample, int32_t token) {
    if (g->api) {
        if (d->content_len || d->reasoning_len)
            g->api->text(g->api_state, g->req.stream ? &g->sse : NULL, d->content, d->content_len, d->reasoning,
                         d->reasoning_len);
        return;
    }
    int with_lp = g->req.logprobs && sample;
    if (!g->req.stream) {
        if (!g4_strbuf_append(&g->content, d->content, d->content_len) ||
            !g4_strbuf_append(&g->reasoning, d->reasoning, d->reasoning_len))
            g->oom = 1;
        if (with_lp && g->req.kind == G4_OAI_CHAT)
            cJSON_AddItemToArray(g->logprobs, g4_oai_chat_logprob(g->ctx, sample, g->req.top_logprobs));
        else if (with_lp)
            g4_oai_completion_logprobs_add(g->logprobs, g->ctx, sample, g->req.top_logprobs, token_offset(g, token));
        return;
    }
    int with_ids = token >= 0 && g->req.return_token_ids;
    /* without a tokenizer every token is an (empty) chunk: the client still sees progress */
    int untexted = token >= 0 && !g->ctx->tokenizer;
    if (!d->content_len && !d->reasoning_len && !with_lp && !with_ids && !untexted) return;
    cJSON *choice;
    cJSON *chunk = new_chunk(g, &choice);
    if (g->req.kind == G4_OAI_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (d->reasoning_len) cJSON_AddItemToObject(delta, "reasoning_content", cJSON_CreateString(d->reasoning));
        if (d->content_len || !d->reasoning_len) cJSON_AddStringToObject(delta, "content", d->content);
        if (with_lp) {
            cJSON *lp = cJSON_AddObjectToObject(choice, "logprobs");
            cJSON *arr = cJSON_AddArrayToObject(lp, "content");
            cJSON_AddItemToArray(arr, g4_oai_chat_logprob(g->ctx, sample, g->req.top_logprobs));
        } else {
            cJSON_AddNullToObject(choice, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(choice, "text", d->content);
        if (with_lp) {
            cJSON *lp = g4_oai_completion_logprobs_new();
            g4_oai_completion_logprobs_add(lp, g->ctx, sample, g->req.top_logprobs, token_offset(g, token));
            cJSON_AddItemToObject(choice, "logprobs", lp);
        } else {
            cJSON_AddNullToObject(choice, "logprobs");
        }
    }
    if (with_ids) {
        cJSON *ids = cJSON_AddArrayToObject(choice, "token_ids");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(token));
    }
    cJSON_AddNullToObject(choice, "finish_reason");
    sse(g, chunk);
}

static void fail(generation *g, int status, const char *message) {
    if (g->done) return;
    g->done = 1;
    g->err_status = status;
    snprintf(g->err_message, sizeof g->err_message, "%s", message);
}

/* The end: held-back text, tool calls, finish reason, usage, [DONE]. */
static void finalize(generation *g) {
    if (g->finalized) return;
    g->finalized = 1;
    g4_server *s = g->srv;
    g4_metrics_duration(s->metrics, g4_now_seconds() - g->t_arrival);
    if (g->err_status && g->api) {
        g4_oai_error e;
        g4_oai_fail(&e, g->err_status, NULL, "%s", g->err_message);
        if (g->err_status >= 500) e.type = "server_error";
        if (g->req.stream) g->api->fail(g->api_state, &g->sse, &e);
        return;
    }
    if (g->err_status) {
        if (g->req.stream) {
            g4_oai_error e;
            g4_oai_fail(&e, g->err_status, NULL, "%s", g->err_message);
            sse(g, g4_error_json(&e));
            if (!g4_strbuf_append(&g->out, "data: [DONE]\n\n", 14)) g->oom = 1;
        }
        return;
    }
    g4_reply_delta d;
    if (g4_reply_stream_finish(g->reply, &d) != G4_OK) {
        g->err_status = 500;
        snprintf(g->err_message, sizeof g->err_message, "%s", g4_error_message());
        g->finalized = 0;
        finalize(g);
        return;
    }
    emit(g, &d, NULL, -1);
    size_t n_calls = 0;
    const g4_tool_call *calls = g4_reply_stream_tool_calls(g->reply, &n_calls);
    if (n_calls && !strcmp(g->finish_reason, "stop")) g->finish_reason = "tool_calls";
    if (g->api) {
        g4_gen_summary sum = summary(g);
        g->api->close(g->api_state, g->req.stream ? &g->sse : NULL, &sum);
        return;
    }
    if (!g->req.stream) return;
    cJSON *choice;
    if (n_calls) {
        cJSON *chunk = new_chunk(g, &choice);
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        cJSON_AddItemToObject(delta, "tool_calls", g4_oai_tool_calls(calls, n_calls, 1));
        cJSON_AddNullToObject(choice, "logprobs");
        cJSON_AddNullToObject(choice, "finish_reason");
        sse(g, chunk);
    }
    cJSON *chunk = new_chunk(g, &choice);
    if (g->req.kind == G4_OAI_CHAT) cJSON_AddObjectToObject(choice, "delta");
    else cJSON_AddStringToObject(choice, "text", "");
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", g->finish_reason);
    sse(g, chunk);
    if (g->req.include_usage) {
        chunk = new_chunk(g, &choice);
        cJSON_DeleteItemFromObject(chunk, "choices");
        cJSON_AddArrayToObject(chunk, "choices");
        cJSON *u = g4_oai_usage(g->n_prompt, g->n_completion, g->n_cached);
        g4_oai_usage_speculative(u, g->n_drafted, g->n_accepted, g->n_rounds);
        cJSON_ReplaceItemInObject(chunk, "usage", u);
        sse(g, chunk);
    }
    if (!g4_strbuf_append(&g->out, "data: [DONE]\n\n", 14)) g->oom = 1;
}

static void on_events(generation *g) {
    const g4_job_event *ev;
    int n = g4_job_take(g->job, &ev);
    int n_tokens = 0;
    for (int i = 0; i < n; i++) n_tokens += ev[i].has_token;
    if (n_tokens) g4_metrics_tokens(g->srv->metrics, 0, n_tokens); /* as they come: rates stay current */
    for (int i = 0; i < n && !g->done; i++) {
        const g4_job_event *e = &ev[i];
        if (e->n_cached > g->n_cached) g->n_cached = e->n_cached;
        if (e->n_rounds >= g->n_rounds)
            g->n_drafted = e->n_drafted, g->n_accepted = e->n_accepted, g->n_rounds = e->n_rounds;
        if (e->has_token) {
            if (g->n_completion == 0) g4_metrics_first_token(g->srv->metrics, e->time - g->t_arrival);
            else g4_metrics_token_gap(g->srv->metrics, e->time - g->t_prev);
            g->t_prev = e->time;
            g->n_completion++;
            if (g->req.return_token_ids && !g->req.stream) {
                if (g->n_out == g->cap_out) {
                    int cap = g->cap_out ? g->cap_out * 2 : 64;
                    int32_t *grown = realloc(g->out_ids, (size_t)cap * sizeof *grown);
                    if (grown) g->out_ids = grown, g->cap_out = cap;
                }
                if (g->n_out < g->cap_out) g->out_ids[g->n_out++] = e->sample.token;
            }
            g4_reply_delta d = {.content = "", .reasoning = "", .stop_index = -1};
            int thinking = g4_reply_stream_in_reasoning(g->reply);
            if (!e->is_stop_token && g4_reply_stream_push(g->reply, e->sample.token, &d) != G4_OK) {
                fail(g, 500, g4_error_message());
                break;
            }
            if (!e->is_stop_token && (thinking || g4_reply_stream_in_reasoning(g->reply))) g->n_reasoning++;
            /* a stop token is no text: it gets no log-probability entry */
            emit(g, &d, e->is_stop_token ? NULL : &e->sample, e->sample.token);
            if (d.ended) {
                /* a stop string or an end marker in the text: nothing more is wanted */
                g->finish_reason = "stop";
                g->end = d.stop_index >= 0 ? G4_GEN_END_STOP_STRING : G4_GEN_END_TURN;
                g->stop_index = d.stop_index;
                g->done = 1;
                g4_job_cancel(g->job);
                break;
            }
        }
        switch (e->finish) {
        case G4_FINISH_NONE: break;
        case G4_FINISH_STOP: g->finish_reason = "stop", g->done = 1; break;
        case G4_FINISH_LENGTH: g->finish_reason = "length", g->end = G4_GEN_END_LENGTH, g->done = 1; break;
        case G4_FINISH_CANCELLED: fail(g, 503, "the request was cancelled: the server is shutting down"); break;
        default: fail(g, 500, e->message[0] ? e->message : "the engine failed"); break;
        }
    }
    if (g->oom) fail(g, 503, "out of memory");
    if (g->done) finalize(g);
}

/* ---- lifecycle ------------------------------------------------------------- */

static void free_generation(generation *g) {
    if (!g) return;
    if (g->job) {
        g4_server_untrack(g->srv, g->job);
        if (!g->done) g4_job_cancel(g->job); /* the client left before the end */
        g4_job_release(g->job);
    }
    g4_reply_stream_free(g->reply);
    g4_oai_request_free(&g->req);
    free(g->prompt_ids);
    free(g->out_ids);
    g4_strbuf_free(&g->content);
    g4_strbuf_free(&g->reasoning);
    g4_strbuf_free(&g->out);
    cJSON_Delete(g->logprobs);
    if (g->api && g->api->free) g->api->free(g->api_state);
    free(g);
}

/* libmicrohttpd closes a connection whose last write is older than its idle
 * timeout as soon as this returns, so a stream never stays silent that
 * long: while it waits (queued, or tokens without text) it sends SSE
 * comments, which clients ignore. */
static long stream_read(void *cls, char *buf, size_t max) {
    generation *g = cls;
    double keepalive = g->srv->opt.idle_timeout_s / 3.0;
    if (keepalive > 10) keepalive = 10;
    while (g->out_pos == g->out.len) {
        g4_strbuf_clear(&g->out);
        g->out_pos = 0;
        if (g->finalized) return 0;
        double left = g->t_last_out + keepalive - g4_now_seconds();
        if (left <= 0) {
            if (!g4_strbuf_append(&g->out, ": waiting\n\n", 11)) return -1;
            break;
        }
        g4_job_wait_result w = g4_job_wait(g->job, g->fd, (int)(left * 1000) + 1);
        if (w == G4_JOB_HANGUP) {
            g4_metrics_disconnect(g->srv->metrics);
            return -1;
        }
        if (w == G4_JOB_READY) on_events(g);
        if (g->oom && !g->finalized) return -1;
    }
    size_t n = g->out.len - g->out_pos;
    if (n > max) n = max;
    memcpy(buf, g->out.data + g->out_pos, n);
    g->out_pos += n;
    g->t_last_out = g4_now_seconds();
    return (long)n;
}

static void stream_free(void *cls) { free_generation(cls); }

/* A prompt refused for its length before (or while) it is tokenized. */
static int too_long(const g4_server *s, const char *param, g4_oai_error *err) {
    g4_oai_fail(err, 400, param, "the prompt is longer than this server's limit of %d tokens", s->opt.max_prompt_tokens);
    err->code = "context_length_exceeded";
    return -1;
}

static int build_prompt(generation *g, g4_prompt *p, g4_oai_error *err) {
    g4_server *s = g->srv;
    g4_context *ctx = g->ctx;
    g4_status st;
    const char *param = g->req.kind == G4_OAI_CHAT ? "messages" : "prompt";
    if (s->opt.threads > 0) omp_set_num_threads(s->opt.threads);
    if (g->req.kind == G4_OAI_CHAT) {
        /* far too much text is refused before any work on it */
        if (ctx->tokenizer && !g4_oai_text_may_fit(s, g4_oai_messages_text_bytes(g->req.messages), s->opt.max_prompt_tokens))
            return too_long(s, param, err);
        if (s->opt.no_special_in_content && ctx->tokenizer && g4_oai_escape_content(ctx->tokenizer, g->req.messages, err))
            return -1;
        g4_media_limits ml = {s->opt.max_images, s->opt.max_audio, s->opt.max_body, s->opt.allowed_media_dir};
        g4_media_list media;
        if (g4_oai_collect_media(g->req.messages, &ml, &media, err)) return -1;
        st = g4_chat_normalize_tool_arguments(g->req.messages);
        if (st == G4_OK) {
            g4_prompt_options po = {.chat = {.add_generation_prompt = 1, .enable_thinking = g->req.enable_thinking},
                                    .max_ids = s->opt.max_prompt_tokens,
                                    .escaped_spans = s->opt.no_special_in_content};
            if (media.n) pthread_mutex_lock(&s->media_lock);
            st = g4_prompt_from_messages(ctx, g->req.messages, g->req.tools, &po, media.items, media.n, p);
            if (media.n) pthread_mutex_unlock(&s->media_lock);
        }
        g4_media_list_free(&media);
    } else if (g->req.prompt_ids) {
        g4_media_list media = {0};
        if (g->req.media) {
            /* the parts, read as one message's content */
            g4_media_limits ml = {s->opt.max_images, s->opt.max_audio, s->opt.max_body, s->opt.allowed_media_dir};
            cJSON *wrap = cJSON_CreateArray(), *msg = cJSON_CreateObject();
            cJSON_AddItemToArray(wrap, msg);
            cJSON_AddItemReferenceToObject(msg, "content", (cJSON *)g->req.media);
            int rc = g4_oai_collect_media(wrap, &ml, &media, err);
            cJSON_Delete(wrap);
            if (rc) {
                err->param = "media";
                return -1;
            }
        }
        if (media.n) pthread_mutex_lock(&s->media_lock);
        st = g4_prompt_from_ids(ctx, g->req.prompt_ids, g->req.n_prompt_ids, media.items, media.n, p);
        if (media.n) pthread_mutex_unlock(&s->media_lock);
        g4_media_list_free(&media);
    } else {
        if (!ctx->tokenizer)
            return g4_oai_fail(err, 400, "prompt", "this model has no tokenizer.json: send the prompt as token ids");
        if (!g4_oai_text_may_fit(s, g->req.prompt_len, s->opt.max_prompt_tokens)) return too_long(s, param, err);
        int32_t *ids = NULL;
        size_t n = 0;
        st = g4_tokenizer_encode_max(ctx->tokenizer, g->req.prompt_text, g->req.prompt_len,
                                     g->req.add_special_tokens ? G4_TOK_ADD_SPECIAL : 0,
                                     (size_t)s->opt.max_prompt_tokens, &ids, &n);
        if (st == G4_OK && n == 0) {
            free(ids);
            return g4_oai_fail(err, 400, "prompt", "the prompt is empty");
        }
        if (st == G4_OK) st = g4_prompt_from_ids(ctx, ids, (int)n, NULL, 0, p);
        free(ids);
    }
    if (st == G4_ERR_LIMIT) {
        g4_oai_fail(err, 400, param, "%s (this server's limit is %d prompt tokens)", g4_error_message(),
                    s->opt.max_prompt_tokens);
        err->code = "context_length_exceeded";
        return -1;
    }
    if (st != G4_OK) return g4_oai_fail(err, fail_status(st), param, "%s", g4_error_message());
    return 0;
}

/* Token budget of the request against the server's limits and the context. */
static int check_lengths(generation *g, int n_prompt, int *max_tokens, g4_oai_error *err) {
    const g4_server *s = g->srv;
    if (n_prompt > s->opt.max_prompt_tokens)
        return g4_oai_fail(err, 400, g->req.kind == G4_OAI_CHAT ? "messages" : "prompt",
                           "the prompt has %d tokens; this server accepts at most %d", n_prompt,
                           s->opt.max_prompt_tokens);
    int want = g->req.max_tokens;
    if (want > s->opt.max_tokens)
        return g4_oai_fail(err, 400, "max_tokens", "max_tokens %d is above this server's limit of %d", want,
                           s->opt.max_tokens);
    if (want == 0) want = s->n_ctx - n_prompt < s->opt.max_tokens ? s->n_ctx - n_prompt : s->opt.max_tokens;
    if (want <= 0 || n_prompt + want > s->n_ctx) {
        g4_oai_fail(err, 400, "max_tokens",
                    "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the "
                    "prompt, %d for the completion).",
                    s->n_ctx, n_prompt + (want > 0 ? want : 1), n_prompt, want > 0 ? want : 1);
        err->code = "context_length_exceeded";
        return -1;
    }
    *max_tokens = want;
    return 0;
}

static void answer(generation *g, g4_http_reply *r) {
    if (g->api) {
        g4_oai_error e;
        g4_gen_summary sum = summary(g);
        if (!g->err_status) {
            g->api->answer(g->api_state, &sum, r);
            return;
        }
        g4_oai_fail(&e, g->err_status, NULL, "%s", g->err_message);
        if (g->err_status >= 500) e.type = "server_error";
        g->api->reply_error(r, &e);
        return;
    }
    if (g->err_status) {
        g4_reply_errorf(r, g->err_status, NULL, "%s", g->err_message);
        return;
    }
    cJSON *root = cJSON_CreateObject();
    int chat = g->req.kind == G4_OAI_CHAT;
    cJSON_AddStringToObject(root, "id", g->id);
    cJSON_AddStringToObject(root, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)g->created);
    cJSON_AddStringToObject(root, "model", g->srv->model_name);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    const char *content = g->content.data ? g->content.data : "";
    if (chat) {
        size_t n_calls = 0;
        const g4_tool_call *calls = g4_reply_stream_tool_calls(g->reply, &n_calls);
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        if (n_calls && !content[0]) cJSON_AddNullToObject(msg, "content");
        else cJSON_AddStringToObject(msg, "content", content);
        if (g4_reply_stream_has_reasoning(g->reply))
            cJSON_AddStringToObject(msg, "reasoning_content", g->reasoning.data ? g->reasoning.data : "");
        else
            cJSON_AddNullToObject(msg, "reasoning_content");
        if (n_calls) cJSON_AddItemToObject(msg, "tool_calls", g4_oai_tool_calls(calls, n_calls, 0));
        if (g->req.logprobs) {
            cJSON *lp = cJSON_AddObjectToObject(choice, "logprobs");
            cJSON_AddItemToObject(lp, "content", g->logprobs);
            g->logprobs = NULL;
        } else {
            cJSON_AddNullToObject(choice, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(choice, "text", content);
        if (g->req.logprobs) {
            cJSON_AddItemToObject(choice, "logprobs", g->logprobs);
            g->logprobs = NULL;
        } else {
            cJSON_AddNullToObject(choice, "logprobs");
        }
    }
    cJSON_AddStringToObject(choice, "finish_reason", g->finish_reason);
    if (g->req.return_token_ids) {
        cJSON *prompt_ids = cJSON_CreateIntArray(g->prompt_ids, g->n_prompt);
        cJSON_AddItemToObject(chat ? root : choice, "prompt_token_ids", prompt_ids);
        cJSON_AddItemToObject(choice, "token_ids", cJSON_CreateIntArray(g->out_ids ? g->out_ids : (int32_t[]){0},
                                                                         g->n_out));
    }
    cJSON *u = g4_oai_usage(g->n_prompt, g->n_completion, g->n_cached);
    g4_oai_usage_speculative(u, g->n_drafted, g->n_accepted, g->n_rounds);
    cJSON_AddItemToObject(root, "usage", u);
    g4_reply_json(r, 200, root);
}

/* The request's constraint compiled against the tokenizer: 400 naming the
 * field for a schema or grammar outside what the compiler takes. */
static int make_matcher(generation *g, const g4_prompt *prompt, g4_token_matcher **out, g4_oai_error *err) {
    g4_context *ctx = g->ctx;
    const g4_constraint_spec *spec = &g->req.constraint;
    const char *param = g->req.constraint_param;
    if (!ctx->constraints) return g4_oai_fail(err, 400, param, "constrained decoding needs the model's tokenizer.json");
    g4_constraint_use use = {.stop_ids = g->req.ignore_eos ? NULL : ctx->stop_ids,
                             .n_stop = g->req.ignore_eos ? 0 : ctx->n_stop,
                             .thinking = g->req.kind == G4_OAI_CHAT && g->req.enable_thinking,
                             .starts_in_thought = prompt->starts_in_reasoning};
    g4_status st = g4_constraints_matcher(ctx->constraints, spec, &use, out);
    if (st == G4_ERR_INVALID_ARGUMENT || st == G4_ERR_LIMIT)
        return g4_oai_fail(err, 400, param, "%s", g4_error_message());
    if (st != G4_OK) return g4_oai_fail(err, fail_status(st), NULL, "%s", g4_error_message());
    return 0;
}

static generation *new_generation(const g4_http_request *q, g4_oai_kind kind) {
    generation *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->srv = q->srv;
    g->ctx = q->srv->ctx;
    g->fd = q->fd;
    g->t_arrival = q->t_arrival;
    g->created = (long)time(NULL);
    g->sse.g = g;
    g->stop_index = -1;
    g4_oai_new_id(kind == G4_OAI_CHAT ? "chatcmpl-" : "cmpl-", g->id, sizeof g->id);
    return g;
}

static void run_generation(const g4_http_request *q, generation *g, int rc, g4_oai_error *errp, g4_http_reply *r);

void g4_serve_generate(const g4_http_request *q, g4_oai_kind kind, g4_http_reply *r) {
    g4_server *s = q->srv;
    g4_context *ctx = s->ctx;
    generation *g = new_generation(q, kind);
    if (!g) {
        g4_reply_errorf(r, 503, NULL, "out of memory");
        return;
    }
    g4_oai_error err;
    g4_oai_limits lim = {s->model_name, ctx->model->config.text.vocab_size, &ctx->generation, s->max_json_values};
    int rc = g4_oai_parse(q->body, q->body_len, kind, &lim, &g->req, &err);
    run_generation(q, g, rc, &err, r);
}

void g4_serve_chat_with(const g4_http_request *q, g4_oai_request *req, const g4_api_writer *w, void *api,
                        g4_http_reply *r) {
    generation *g = new_generation(q, G4_OAI_CHAT);
    if (!g) {
        g4_oai_request_free(req);
        w->free(api);
        g4_oai_error e;
        g4_oai_fail(&e, 503, NULL, "out of memory");
        e.type = "server_error";
        w->reply_error(r, &e);
        return;
    }
    g->req = *req;
    memset(req, 0, sizeof *req);
    g->api = w;
    g->api_state = api;
    g4_oai_error err;
    run_generation(q, g, 0, &err, r);
}

int g4_count_chat_prompt(const g4_http_request *q, g4_oai_request *req, int *n_tokens, g4_oai_error *err) {
    generation *g = new_generation(q, G4_OAI_CHAT);
    if (!g) {
        g4_oai_request_free(req);
        return g4_oai_fail(err, 503, NULL, "out of memory");
    }
    g->req = *req;
    memset(req, 0, sizeof *req);
    g->done = 1; /* never submitted */
    g4_prompt prompt = {0};
    int rc = build_prompt(g, &prompt, err);
    *n_tokens = prompt.n_ids;
    g4_prompt_free(g->ctx, &prompt);
    free_generation(g);
    return rc;
}

/* Everything after the request is parsed (rc != 0: it failed, with *errp). */
static void run_generation(const g4_http_request *q, generation *g, int rc, g4_oai_error *errp, g4_http_reply *r) {
    g4_server *s = q->srv;
    g4_context *ctx = s->ctx;
    g4_oai_kind kind = g->req.kind;
    g4_oai_error err = *errp;
    g4_prompt prompt = {0};
    int max_tokens = 0;
    if (!rc && g->req.n_stop && !ctx->tokenizer)
        rc = g4_oai_fail(&err, 400, "stop", "stop strings need a tokenizer, and this model has no tokenizer.json");
    if (!rc) rc = build_prompt(g, &prompt, &err);
    if (!rc) rc = check_lengths(g, prompt.n_ids, &max_tokens, &err);
    g4_token_matcher *matcher = NULL;
    if (!rc && g->req.constraint.kind != G4_CONSTRAINT_NONE) rc = make_matcher(g, &prompt, &matcher, &err);
    g4_status st = G4_OK;
    if (!rc) {
        g4_reply_options ro = {.mode = kind == G4_OAI_CHAT ? G4_REPLY_CHAT : G4_REPLY_RAW,
                               .starts_in_reasoning = prompt.starts_in_reasoning,
                               .stop = (const char *const *)g->req.stop,
                               .n_stop = (size_t)g->req.n_stop,
                               .ignore_end = g->req.ignore_eos};
        st = g4_reply_stream_create(ctx->tokenizer, &ro, &g->reply);
        if (st == G4_OK) st = g4_job_create(s->engine, &g->job);
        if (st != G4_OK) rc = g4_oai_fail(&err, fail_status(st), NULL, "%s", g4_error_message());
    }
    if (!rc) {
        g4_request er = {.prompt = prompt.ids,
                         .n_prompt = prompt.n_ids,
                         .media = prompt.media,
                         .sampling = g->req.sampling,
                         .max_tokens = max_tokens,
                         .stop_ids = g->req.ignore_eos ? NULL : ctx->stop_ids,
                         .n_stop = g->req.ignore_eos ? 0 : ctx->n_stop,
                         .constraint = matcher,
                         .no_speculative = !g->req.speculative};
        g4_server_track(s, g->job);
        st = g4_job_submit(g->job, &er);
        if (st == G4_ERR_LIMIT) {
            rc = g4_oai_fail(&err, 503, NULL, "the server is overloaded (%s); try again later", g4_error_message());
            err.type = "server_error";
        } else if (st != G4_OK) {
            rc = g4_oai_fail(&err, fail_status(st), NULL, "%s", g4_error_message());
        }
        if (st == G4_OK) {
            matcher = NULL; /* the engine owns it now */
            prompt.media = (g4_request_media){0}; /* the engine owns it now */
            g->prompt_ids = prompt.ids;
            g->n_prompt = prompt.n_ids;
            prompt.ids = NULL;
            g4_metrics_tokens(s->metrics, g->n_prompt, 0);
        }
    }
    g4_prompt_free(ctx, &prompt);
    g4_token_matcher_free(matcher);
    if (rc) {
        g->done = 1; /* never submitted: nothing to cancel */
        void (*reply_error)(g4_http_reply *, const g4_oai_error *) = g->api ? g->api->reply_error : g4_reply_error;
        free_generation(g);
        reply_error(r, &err);
        return;
    }
    g->logprobs = kind == G4_OAI_CHAT ? cJSON_CreateArray() : g4_oai_completion_logprobs_new();
    if (g->req.stream) {
        if (g->api) {
            g4_gen_summary sum = summary(g);
            g->api->open(g->api_state, &g->sse, &sum);
        } else if (kind == G4_OAI_CHAT) {
            cJSON *choice;
            cJSON *chunk = new_chunk(g, &choice);
            cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
            cJSON_AddStringToObject(delta, "role", "assistant");
            cJSON_AddStringToObject(delta, "content", "");
            cJSON_AddNullToObject(choice, "logprobs");
            cJSON_AddNullToObject(choice, "finish_reason");
            sse(g, chunk);
        }
        g->t_last_out = g4_now_seconds();
        r->status = 200;
        r->content_type = "text/event-stream";
        r->stream = (g4_body_source){.read = stream_read, .free = stream_free, .cls = g};
        return;
    }
    while (!g->finalized) {
        g4_job_wait_result w = g4_job_wait(g->job, g->fd, 10000);
        if (w == G4_JOB_HANGUP) {
            g4_metrics_disconnect(s->metrics);
            free_generation(g);
            r->status = 0; /* nobody to answer */
            return;
        }
        on_events(g);
    }
    answer(g, r);
    free_generation(g);
}
