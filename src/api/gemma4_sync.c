/* The synchronous part of gemma4.h: the tokenizer, the model's sizes and
 * summary, and g4_sequence, a thin wrapper over g4_session (one sequence
 * of a private engine, run on the caller's thread). */
#include <stdlib.h>
#include <string.h>

#include "api/api_handle.h"
#include "base/status.h"
#include "runtime/prompt.h"
#include "runtime/session.h"
#include "text/tokenizer.h"

void g4_free(void *p) { free(p); }

g4_status g4_tokenizer_open(const char *path, g4_tokenizer **out) {
    if (!path || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_tokenizer_open: missing argument");
    return g4_tokenizer_load(path, out);
}

void g4_tokenizer_close(g4_tokenizer *t) { g4_tokenizer_free(t); }

const g4_tokenizer *g4_model_tokenizer(const g4_handle *h) { return h ? h->ctx->tokenizer : NULL; }

g4_status g4_tokenize(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n) {
    if (!t || (!text && len) || !ids || !n) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_tokenize: missing argument");
    if (flags & ~(G4_TOKENIZE_ADD_SPECIAL | G4_TOKENIZE_PLAIN_TEXT))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_tokenize: unknown flags 0x%x", (unsigned)flags);
    const int internal = (flags & G4_TOKENIZE_ADD_SPECIAL ? G4_TOK_ADD_SPECIAL : 0) |
                         (flags & G4_TOKENIZE_PLAIN_TEXT ? G4_TOK_PLAIN_TEXT : 0);
    return g4_tokenizer_encode(t, text ? text : "", len, internal, ids, n);
}

g4_status g4_detokenize(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                        size_t *len) {
    if (!t || (!ids && n) || !text || !len) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_detokenize: missing argument");
    return g4_tokenizer_decode(t, ids, n, skip_special, text, len);
}

void g4_get_model_info(const g4_handle *h, g4_model_info *out) {
    const g4_model *m = h->ctx->model;
    *out = (g4_model_info){
        .vocab_size = m->config.text.vocab_size,
        .hidden_size = m->config.text.hidden_size,
        .n_layers = m->config.text.n_layers,
        .max_position = m->config.text.max_position,
        .bos_id = m->config.tokens.bos_id,
        .pad_id = m->config.tokens.pad_id,
    };
    for (int k = 0; k < m->config.tokens.n_eos && k < (int)(sizeof out->eos_ids / sizeof out->eos_ids[0]); k++)
        out->eos_ids[out->n_eos++] = m->config.tokens.eos_ids[k];
}

char *g4_model_summary(const g4_handle *h) { return g4_model_describe(h->ctx->model); }

g4_status g4_vision_mask_parse(const char *name, const char *what, g4_vision_mask *out) {
    if (!out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_vision_mask_parse: missing argument");
    if (!name || !strcmp(name, "default"))
        *out = G4_VISION_MASK_DEFAULT;
    else if (!strcmp(name, "causal"))
        *out = G4_VISION_MASK_CAUSAL;
    else if (!strcmp(name, "all-layers"))
        *out = G4_VISION_MASK_ALL_LAYERS;
    else
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s must be default, all-layers or causal, got '%s'",
                       what ? what : "vision_mask", name);
    return G4_OK;
}

g4_status g4_sequence_open(g4_handle *h, const g4_sequence_options *opt, g4_sequence **out) {
    if (!h || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_open: missing argument");
    *out = NULL;
    g4_sequence_options o = {0};
    if (opt) o = *opt;
    if (o.n_ctx < 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "n_ctx %d: positions are counted from 0 up", o.n_ctx);
    g4_session_options so = {.n_ctx = o.n_ctx, .kv_type = h->kv_type};
    g4_status st = g4_vision_mask_parse(o.vision_mask, "vision_mask", &so.vision_mask);
    if (st != G4_OK) return st;
    g4_sequence *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->h = h;
    st = g4_session_create(h->ctx->model, &so, &s->session);
    if (st != G4_OK) {
        free(s);
        return st;
    }
    *out = s;
    return G4_OK;
}

void g4_sequence_close(g4_sequence *s) {
    if (!s) return;
    g4_session_destroy(s->session);
    free(s);
}

int g4_sequence_length(const g4_sequence *s) { return g4_session_length(s->session); }

/* The session's hook: backend rows copied to where the caller's sink says. */
static void to_sink(void *ctx, const char *name, const float *data, int rows, int dim) {
    g4_sequence *s = ctx;
    float *dest = s->sink(s->sink_user, name, rows, dim);
    g4_backend *be = s->h->ctx->backend;
    if (dest) be->ops->to_host(be, dest, data, (size_t)rows * dim * sizeof(float));
}

void g4_sequence_set_hidden_sink(g4_sequence *s, g4_hidden_sink sink, void *user) {
    s->sink = sink;
    s->sink_user = user;
    s->session->hook = sink ? to_sink : NULL;
    s->session->hook_ctx = sink ? s : NULL;
}

static g4_status check_rows(g4_rows rows, const float *logits, int n) {
    if (rows != G4_ROWS_NONE && rows != G4_ROWS_LAST && rows != G4_ROWS_ALL)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "rows must be G4_ROWS_NONE, LAST or ALL, got %d", (int)rows);
    if (rows != G4_ROWS_NONE && !logits) return g4_fail(G4_ERR_INVALID_ARGUMENT, "logit rows asked without a buffer");
    if (n <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "nothing to append (%d ids)", n);
    return G4_OK;
}

static g4_logits_mode logits_mode(g4_rows rows) {
    return rows == G4_ROWS_ALL ? G4_LOGITS_ALL : rows == G4_ROWS_LAST ? G4_LOGITS_LAST : G4_LOGITS_NONE;
}

g4_status g4_sequence_append(g4_sequence *s, const int32_t *ids, int n, g4_rows rows, float *logits) {
    if (!s || !ids) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_append: missing argument");
    g4_status st = check_rows(rows, logits, n);
    if (st != G4_OK) return st;
    return g4_session_eval(s->session, ids, n, NULL, logits_mode(rows), logits);
}

g4_status g4_media_inputs_from_files(const g4_media_file *media, int n_media, g4_media_input **out) {
    *out = NULL;
    if (n_media < 0 || (n_media > 0 && !media)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "media: missing argument");
    if (n_media == 0) return G4_OK;
    g4_media_input *items = calloc((size_t)n_media, sizeof *items);
    if (!items) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < n_media; k++)
        items[k] = (g4_media_input){.kind = media[k].audio ? G4_MEDIA_AUDIO : G4_MEDIA_IMAGE,
                                    .data = media[k].data,
                                    .size = media[k].size,
                                    .label = media[k].label,
                                    .max_soft_tokens = media[k].max_soft_tokens};
    *out = items;
    return G4_OK;
}

g4_status g4_sequence_append_media(g4_sequence *s, const int32_t *ids, int n, const g4_media_file *media,
                                   int n_media, g4_rows rows, float *logits) {
    if (!s || !ids || (n_media > 0 && !media) || n_media < 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_append_media: missing argument");
    g4_status st = check_rows(rows, logits, n);
    if (st != G4_OK) return st;
    if (n_media == 0) return g4_session_eval(s->session, ids, n, NULL, logits_mode(rows), logits);
    g4_media_input *items = NULL;
    st = g4_media_inputs_from_files(media, n_media, &items);
    if (st != G4_OK) return st;
    g4_prompt prompt = {0};
    st = g4_prompt_from_ids(s->h->ctx, ids, n, items, n_media, &prompt);
    if (st == G4_OK) {
        const g4_soft_tokens soft = {prompt.media.n, prompt.media.rows, prompt.media.embeds};
        st = g4_session_eval(s->session, ids, n, soft.n ? &soft : NULL, logits_mode(rows), logits);
    }
    g4_prompt_free(s->h->ctx, &prompt);
    free(items);
    return st;
}

g4_status g4_sequence_truncate(g4_sequence *s, int length) {
    if (!s) return g4_fail(G4_ERR_INVALID_ARGUMENT, "g4_sequence_truncate: missing argument");
    return g4_session_truncate(s->session, length);
}
