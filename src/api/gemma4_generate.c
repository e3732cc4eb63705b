/* Generating on a g4_sequence (gemma4.h, "Generating on a sequence"):
 * prompts built once (g4_input), replies chosen token by token on the
 * caller's thread through the session's engine (sampling, constraint, the
 * handle's drafter), and a chat reply's answer for the next turn. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_handle.h"
#include "base/file.h"
#include "base/status.h"
#include "runtime/prompt.h"
#include "runtime/speculative.h"
#include "text/chat.h"
#include "text/reply_decode.h"

struct g4_input {
    g4_handle *h;
    g4_prompt prompt;
    int thinking; /* rendered with the template's thinking mode: the reply may open with a thought */
};

static g4_status new_input(g4_handle *h, g4_input **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    (*out)->h = h;
    return G4_OK;
}

/* The prompt built by st's call, or the input freed on failure. */
static g4_status finish_input(g4_status st, g4_input *in, g4_input **out) {
    if (st != G4_OK) {
        g4_input_free(in);
        return st;
    }
    *out = in;
    return G4_OK;
}

g4_status g4_input_chat(g4_handle *h, const char *messages_json, const char *tools_json, int enable_thinking,
                        const g4_media_file *media, int n_media, g4_input **out) {
    if (!h || !messages_json || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_input_chat: missing argument");
    *out = NULL;
    cJSON *messages = NULL, *tools = NULL;
    g4_media_input *items = NULL;
    g4_input *in = NULL;
    g4_status st = g4_chat_json_parse(messages_json, tools_json, &messages, &tools);
    if (st == G4_OK) st = g4_media_inputs_from_files(media, n_media, &items);
    if (st == G4_OK) st = new_input(h, &in);
    if (st == G4_OK) {
        g4_prompt_options po = {.chat = {.add_generation_prompt = 1, .enable_thinking = enable_thinking}};
        st = g4_prompt_from_messages(h->ctx, messages, tools, &po, items, n_media, &in->prompt);
        in->thinking = enable_thinking;
    }
    free(items);
    cJSON_Delete(messages);
    cJSON_Delete(tools);
    return in ? finish_input(st, in, out) : st;
}

g4_status g4_input_text(g4_handle *h, const char *text, size_t len, const g4_media_file *media, int n_media,
                        g4_input **out) {
    if (!h || (!text && len) || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_input_text: missing argument");
    *out = NULL;
    g4_media_input *items = NULL;
    g4_input *in = NULL;
    g4_status st = g4_media_inputs_from_files(media, n_media, &items);
    if (st == G4_OK) st = new_input(h, &in);
    if (st == G4_OK) st = g4_prompt_from_text(h->ctx, text ? text : "", len, items, n_media, &in->prompt);
    free(items);
    return in ? finish_input(st, in, out) : st;
}

g4_status g4_input_ids(g4_handle *h, const int32_t *ids, int n, const g4_media_file *media, int n_media,
                       g4_input **out) {
    if (!h || !ids || n <= 0 || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_input_ids: missing argument");
    *out = NULL;
    g4_media_input *items = NULL;
    g4_input *in = NULL;
    g4_status st = g4_media_inputs_from_files(media, n_media, &items);
    if (st == G4_OK) st = new_input(h, &in);
    if (st == G4_OK) st = g4_prompt_from_ids(h->ctx, ids, n, items, n_media, &in->prompt);
    free(items);
    return in ? finish_input(st, in, out) : st;
}

void g4_input_get_info(const g4_input *in, g4_input_info *out) {
    *out = (g4_input_info){.ids = in->prompt.ids,
                           .n_ids = in->prompt.n_ids,
                           .starts_in_reasoning = in->prompt.starts_in_reasoning,
                           .audio_truncated = in->prompt.audio_truncated};
}

void g4_input_free(g4_input *in) {
    if (!in) return;
    g4_prompt_free(in->h->ctx, &in->prompt);
    free(in);
}

/* What one reply needs besides the session: its sampler, constraint,
 * drafter round and the soft tokens of the part still to evaluate. */
typedef struct {
    g4_sampler *sampler;
    g4_token_matcher *matcher;
    g4_speculative *spec;
    float *logits;
    int32_t *rows;
    g4_soft_tokens soft;
} reply_state;

static void reply_state_free(reply_state *rs) {
    g4_speculative_free(rs->spec);
    g4_token_matcher_free(rs->matcher);
    g4_sampler_free(rs->sampler);
    free(rs->logits);
    free(rs->rows);
}

/* The input's soft tokens from row `from` on, rows counted from there. */
static g4_status soft_tokens_from(const g4_prompt *p, int from, int hidden, reply_state *rs) {
    rs->rows = malloc((size_t)(p->media.n + 1) * sizeof *rs->rows);
    if (!rs->rows) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    int first = 0;
    while (first < p->media.n && p->media.rows[first] < from) first++;
    for (int k = first; k < p->media.n; k++) rs->rows[k - first] = p->media.rows[k] - from;
    rs->soft.n = p->media.n - first;
    rs->soft.rows = rs->rows;
    rs->soft.embeds = p->media.n ? p->media.embeds + (size_t)first * hidden : NULL;
    return G4_OK;
}

static int is_stop(int32_t tok, const int32_t *stop_ids, int n_stop) {
    for (int k = 0; k < n_stop; k++)
        if (tok == stop_ids[k]) return 1;
    return 0;
}

g4_status g4_sequence_generate(g4_sequence *s, const g4_input *in, const g4_generate_options *o,
                               g4_reply_token_fn cb, void *user, g4_generate_result *result) {
    g4_generate_result local;
    g4_generate_result *r = result ? result : &local;
    memset(r, 0, sizeof *r);
    if (!s || !in || !o || !cb) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_generate: missing argument");
    if (o->n_stop < 0 || (o->n_stop > 0 && !o->stop_ids))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_generate: n_stop %d without stop ids", o->n_stop);
    g4_handle *h = s->h;
    g4_session *session = s->session;
    const g4_prompt *p = &in->prompt;
    const int32_t *stop_ids = o->stop_ids ? o->stop_ids : h->ctx->stop_ids;
    const int n_stop = o->stop_ids ? o->n_stop : h->ctx->n_stop;
    const int n_ctx = session->opt.n_ctx;
    if (p->n_ids >= n_ctx)
        return g4_fail(G4_ERR_LIMIT, "an input of %d tokens leaves no room in the context of %d", p->n_ids, n_ctx);
    const int max_tokens = o->params.max_tokens > 0 ? o->params.max_tokens : n_ctx - p->n_ids;
    const g4_model *m = h->ctx->model;
    reply_state rs = {0};
    g4_sampler_params sp;
    g4_sampler_params_from_api(&o->params, &sp);
    const int vocab = m->config.text.vocab_size;
    /* before the sequence changes, in the model's words */
    for (int i = 0; i < p->n_ids; i++)
        if (p->ids[i] < 0 || p->ids[i] >= vocab)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "token id %d (row %d) is outside the vocabulary [0, %d)", p->ids[i],
                           i, vocab);
    /* the longest prefix of what the sequence holds that the input repeats */
    const int from = g4_session_reuse(session, p->ids, p->n_ids);
    rs.logits = malloc((size_t)vocab * sizeof *rs.logits);
    g4_status st = rs.logits ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) st = soft_tokens_from(p, from, m->config.text.hidden_size, &rs);
    if (st == G4_OK) st = g4_sampler_create(vocab, &sp, &rs.sampler);
    if (st == G4_OK) st = g4_sampler_add_prompt(rs.sampler, p->ids, (size_t)p->n_ids);
    if (st == G4_OK) st = g4_params_constraint(h, &o->params, in->thinking, p->starts_in_reasoning, &rs.matcher);
    const int draft = h->drafter && !o->params.no_speculative && !rs.matcher;
    if (st == G4_OK && draft) st = g4_speculative_create(session, h->drafter, h->draft_max, &rs.spec);
    int none = 0; /* the constraint allows no token: the reply is complete */
    r->n_prompt = p->n_ids - from;
    const g4_soft_tokens *soft = rs.soft.n ? &rs.soft : NULL;
    /* each evaluation chooses its next token: from the row's largest logits
     * (copied back alone) where the sampling parameters allow, else the row */
    g4_sample sample;
    double t0 = g4_now_seconds();
    if (st == G4_OK && rs.spec)
        st = g4_speculative_prefill(rs.spec, p->ids + from, r->n_prompt, soft, rs.sampler, &sample.token);
    else if (st == G4_OK)
        st = g4_session_eval_sample_constrained(session, p->ids + from, r->n_prompt, soft, rs.sampler, rs.logits,
                                                rs.matcher, max_tokens, &sample, &none);
    r->prefill_seconds = g4_now_seconds() - t0;
    /* the cache length plain decoding would have now: speculation runs ahead */
    const int base_length = g4_session_length(session);
    /* speculation: the tokens of the last round still to emit; all but its
     * last were accepted by the sampler in the round */
    int32_t queue[G4_DRAFT_MAX + 1];
    int queued = 0, next_in_queue = 0, accepted_already = 0;
    t0 = g4_now_seconds();
    while (st == G4_OK && r->n_generated < max_tokens) {
        if (none) {
            r->hit_stop = 1;
            break;
        }
        if (!accepted_already) st = g4_sampler_accept(rs.sampler, sample.token);
        if (st == G4_OK && rs.matcher) st = g4_token_matcher_accept(rs.matcher, sample.token);
        if (st != G4_OK) break;
        int32_t tok = sample.token;
        if (is_stop(tok, stop_ids, n_stop)) {
            r->hit_stop = 1;
            break;
        }
        r->n_generated++;
        if (cb(user, tok)) {
            r->stopped = 1;
            break;
        }
        if (r->n_generated == max_tokens || base_length + r->n_generated >= n_ctx) break;
        if (!rs.spec) {
            st = g4_session_eval_sample_constrained(session, &tok, 1, NULL, rs.sampler, rs.logits, rs.matcher,
                                                    max_tokens - r->n_generated, &sample, &none);
            continue;
        }
        if (next_in_queue == queued) {
            st = g4_speculative_step(rs.spec, tok, rs.sampler, max_tokens - r->n_generated, queue, &queued);
            next_in_queue = 0;
        }
        if (st == G4_OK) {
            sample.token = queue[next_in_queue++];
            accepted_already = next_in_queue < queued;
        }
    }
    r->decode_seconds = g4_now_seconds() - t0;
    if (rs.spec) {
        r->drafted = 1;
        r->draft_max = h->draft_max;
        r->draft = *g4_speculative_get_stats(rs.spec);
    }
    reply_state_free(&rs);
    return st;
}

g4_status g4_reply_content(const g4_handle *h, const int32_t *ids, size_t n, int starts_in_reasoning,
                           char **content) {
    if (!h || (!ids && n) || !content) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_reply_content: missing argument");
    *content = NULL;
    if (!h->ctx->tokenizer) return g4_fail(G4_ERR_UNSUPPORTED, "%s has no tokenizer.json", h->ctx->dir);
    char *said = NULL;
    size_t said_len = 0;
    g4_chat_reply reply = {0};
    g4_status st = g4_decode_reply(h->ctx->tokenizer, ids, n, &said, &said_len);
    if (st == G4_OK) st = g4_chat_parse_reply(said, said_len, starts_in_reasoning, &reply);
    if (st == G4_OK) {
        *content = strdup(reply.content ? reply.content : "");
        if (!*content) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    g4_chat_reply_free(&reply);
    free(said);
    return st;
}
