#include "runtime/reply_stream.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/stop_strings.h"
#include "text/chat_pyvalue.h"
#include "text/strbuf.h"

enum { S_CONTENT, S_HEADER, S_REASONING, S_TOOL, S_ENDED };

static const char OPEN_CHANNEL[] = "<|channel>", CLOSE_CHANNEL[] = "<channel|>";
static const char OPEN_TOOL[] = "<|tool_call>", CLOSE_TOOL[] = "<tool_call|>";

/* Special tokens whose text the chat splitter needs. */
static const char *const kept_specials[] = {"<|channel>",  "<channel|>", "<|tool_call>",     "<tool_call|>",
                                            "<|\"|>",      "<turn|>",    "<|tool_response>", "<eos>"};
#define N_KEPT (sizeof kept_specials / sizeof kept_specials[0])

struct g4_reply_stream {
    const g4_tokenizer *tok;
    g4_reply_mode mode;
    g4_detokenizer *detok;
    g4_stop_matcher *stops;
    int32_t kept_ids[N_KEPT];
    int state;
    int ignore_end; /* end markers are no end (ignore_eos): the end tokens are dropped as specials */
    int ended_from; /* the state an end marker was met in */
    g4_strbuf pending;  /* text not yet routed: could be the start of a marker */
    g4_strbuf tool;     /* body of the tool call being read */
    g4_strbuf text;     /* everything routed so far (markers included) */
    int content_started;
    g4_strbuf content_ws; /* trailing whitespace of the content, held back */
    int have_reasoning, block_after_other, block_emitted, held_newline;
    g4_strbuf out_content, out_reasoning;
    g4_tool_call *calls;
    size_t n_calls, cap_calls;
    int ended, finished, oom;
};

g4_status g4_reply_stream_create(const g4_tokenizer *t, const g4_reply_options *opt, g4_reply_stream **out) {
    *out = NULL;
    g4_reply_stream *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->tok = t;
    s->mode = opt ? opt->mode : G4_REPLY_RAW;
    g4_status st = G4_OK;
    if (t) st = g4_detokenizer_new(t, s->mode == G4_REPLY_RAW, &s->detok);
    if (st == G4_OK)
        st = g4_stop_matcher_create(opt ? opt->stop : NULL, opt ? opt->n_stop : 0, &s->stops);
    if (st != G4_OK) {
        g4_reply_stream_free(s);
        return st;
    }
    s->ignore_end = opt && opt->ignore_end;
    for (size_t i = 0; i < N_KEPT; i++) {
        int end_marker = i >= N_KEPT - 3; /* <turn|>, <|tool_response>, <eos> */
        s->kept_ids[i] = t && !(end_marker && s->ignore_end) ? g4_tokenizer_token_id(t, kept_specials[i]) : -1;
    }
    s->state = S_CONTENT;
    if (opt && opt->starts_in_reasoning && s->mode == G4_REPLY_CHAT) {
        s->state = S_REASONING;
        s->have_reasoning = 1;
    }
    *out = s;
    return G4_OK;
}

void g4_reply_stream_free(g4_reply_stream *s) {
    if (!s) return;
    g4_detokenizer_free(s->detok);
    g4_stop_matcher_free(s->stops);
    g4_strbuf_free(&s->pending);
    g4_strbuf_free(&s->tool);
    g4_strbuf_free(&s->text);
    g4_strbuf_free(&s->content_ws);
    g4_strbuf_free(&s->out_content);
    g4_strbuf_free(&s->out_reasoning);
    for (size_t i = 0; i < s->n_calls; i++) {
        free(s->calls[i].name);
        free(s->calls[i].arguments);
    }
    free(s->calls);
    free(s);
}

static void put(g4_reply_stream *s, g4_strbuf *b, const char *p, size_t n) {
    if (n && !g4_strbuf_append(b, p, n)) s->oom = 1;
}

/* Content is stripped at both ends, as g4_chat_parse_reply strips it. */
static void emit_content(g4_reply_stream *s, const char *p, size_t n) {
    if (s->mode == G4_REPLY_RAW) {
        put(s, &s->out_content, p, n);
        return;
    }
    size_t a, len;
    py_strip(p, n, &a, &len);
    if (len == 0) {
        if (s->content_started) put(s, &s->content_ws, p, n);
        return;
    }
    if (!s->content_started) {
        p += a;
        n -= a;
        a = 0;
        s->content_started = 1;
    } else {
        put(s, &s->out_content, s->content_ws.data, s->content_ws.len);
        g4_strbuf_clear(&s->content_ws);
    }
    put(s, &s->out_content, p, a + len);
    put(s, &s->content_ws, p + a + len, n - a - len);
}

/* Reasoning: one trailing newline is held back (dropped before "<channel|>"),
 * and a block after an earlier one starts with "\n". */
static void emit_reasoning(g4_reply_stream *s, const char *p, size_t n) {
    if (n == 0) return;
    int newline_first = s->held_newline;
    s->held_newline = 0;
    if (p[n - 1] == '\n') {
        s->held_newline = 1;
        n--;
    }
    if (!newline_first && n == 0) return;
    if (!s->block_emitted && s->block_after_other) put(s, &s->out_reasoning, "\n", 1);
    s->block_emitted = 1;
    if (newline_first) put(s, &s->out_reasoning, "\n", 1);
    put(s, &s->out_reasoning, p, n);
}

static void route(g4_reply_stream *s, const char *p, size_t n) {
    switch (s->state) {
    case S_CONTENT: emit_content(s, p, n); break;
    case S_REASONING: emit_reasoning(s, p, n); break;
    case S_TOOL: put(s, &s->tool, p, n); break;
    default: break; /* the channel name line; text after the end */
    }
}

static void add_tool_call(g4_reply_stream *s) {
    g4_strbuf raw = {0};
    put(s, &raw, OPEN_TOOL, sizeof OPEN_TOOL - 1);
    put(s, &raw, s->tool.data, s->tool.len);
    put(s, &raw, CLOSE_TOOL, sizeof CLOSE_TOOL - 1);
    g4_chat_reply reply;
    if (!s->oom && g4_chat_parse_reply(raw.data, raw.len, 0, &reply) == G4_OK) {
        if (reply.n_tool_calls == 1) {
            if (s->n_calls == s->cap_calls) {
                size_t cap = s->cap_calls ? s->cap_calls * 2 : 4;
                g4_tool_call *grown = realloc(s->calls, cap * sizeof *grown);
                if (grown) s->calls = grown, s->cap_calls = cap;
            }
            if (s->n_calls < s->cap_calls) {
                s->calls[s->n_calls++] = reply.tool_calls[0];
                reply.n_tool_calls = 0; /* moved */
            } else {
                s->oom = 1;
            }
        } else {
            emit_content(s, raw.data, raw.len); /* malformed: stays as text */
        }
        g4_chat_reply_free(&reply);
    } else {
        s->oom = 1;
    }
    g4_strbuf_free(&raw);
    g4_strbuf_clear(&s->tool);
}

static void transition(g4_reply_stream *s, const char *marker) {
    if (!strcmp(marker, OPEN_CHANNEL)) {
        s->state = S_HEADER;
        s->block_after_other = s->have_reasoning;
        s->have_reasoning = 1;
        s->block_emitted = 0;
        s->held_newline = 0;
    } else if (!strcmp(marker, "\n")) {
        s->state = S_REASONING;
    } else if (!strcmp(marker, CLOSE_CHANNEL)) {
        s->held_newline = 0;
        s->state = S_CONTENT;
    } else if (!strcmp(marker, OPEN_TOOL)) {
        g4_strbuf_clear(&s->tool);
        s->state = S_TOOL;
    } else if (!strcmp(marker, CLOSE_TOOL)) {
        add_tool_call(s);
        s->state = S_CONTENT;
    } else {
        s->ended_from = s->state;
        s->state = S_ENDED; /* an end-of-turn marker */
        s->ended = 1;
    }
}

/* The markers that change the state, per state (end markers everywhere
 * unless they are ignored). */
static int markers_for(int state, int ignore_end, const char **m) {
    int n = 0;
    if (state == S_CONTENT) m[n++] = OPEN_CHANNEL, m[n++] = OPEN_TOOL;
    if (state == S_HEADER) m[n++] = "\n", m[n++] = CLOSE_CHANNEL;
    if (state == S_REASONING) m[n++] = CLOSE_CHANNEL;
    if (state == S_TOOL) m[n++] = CLOSE_TOOL;
    if (!ignore_end) m[n++] = "<turn|>", m[n++] = "<eos>", m[n++] = "<|tool_response>";
    return n;
}

static void split(g4_reply_stream *s, const char *p, size_t n) {
    if (s->mode == G4_REPLY_RAW) {
        put(s, &s->text, p, n);
        emit_content(s, p, n);
        return;
    }
    if (s->state == S_ENDED) return;
    put(s, &s->pending, p, n);
    size_t pos = 0;
    while (s->state != S_ENDED && !s->oom) {
        const char *markers[8];
        int nm = markers_for(s->state, s->ignore_end, markers);
        const char *buf = s->pending.data ? s->pending.data : "";
        size_t len = s->pending.len;
        size_t best = len;
        const char *which = NULL;
        for (size_t i = pos; i < len && !which; i++) {
            if (buf[i] != '<' && buf[i] != '\n') continue;
            for (int k = 0; k < nm; k++) {
                size_t ml = strlen(markers[k]);
                if (i + ml <= len && memcmp(buf + i, markers[k], ml) == 0) {
                    best = i, which = markers[k];
                    break;
                }
            }
        }
        if (which) {
            put(s, &s->text, buf + pos, best + strlen(which) - pos);
            route(s, buf + pos, best - pos);
            pos = best + strlen(which);
            transition(s, which);
            continue;
        }
        /* hold back the longest tail that could still grow into a marker */
        size_t hold = 0;
        for (int k = 0; k < nm; k++) {
            size_t ml = strlen(markers[k]);
            for (size_t h = ml - 1; h > hold; h--)
                if (h <= len - pos && memcmp(buf + len - h, markers[k], h) == 0) {
                    hold = h;
                    break;
                }
        }
        put(s, &s->text, buf + pos, len - hold - pos);
        route(s, buf + pos, len - hold - pos);
        pos = len - hold;
        break;
    }
    if (s->state == S_ENDED) pos = s->pending.len;
    if (s->pending.data) {
        memmove(s->pending.data, s->pending.data + pos, s->pending.len - pos);
        s->pending.len -= pos;
        s->pending.data[s->pending.len] = 0;
    }
}

static void start_delta(g4_reply_stream *s, g4_reply_delta *out) {
    memset(out, 0, sizeof *out);
    out->stop_index = -1;
    g4_strbuf_clear(&s->out_content);
    g4_strbuf_clear(&s->out_reasoning);
}

static g4_status end_delta(g4_reply_stream *s, g4_reply_delta *out) {
    if (s->oom) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the reply text");
    out->content = s->out_content.data ? s->out_content.data : "";
    out->content_len = s->out_content.len;
    out->reasoning = s->out_reasoning.data ? s->out_reasoning.data : "";
    out->reasoning_len = s->out_reasoning.len;
    out->ended = s->ended;
    return G4_OK;
}

static int is_kept(const g4_reply_stream *s, int32_t token) {
    for (size_t i = 0; i < N_KEPT; i++)
        if (s->kept_ids[i] == token) return 1;
    return 0;
}

static g4_status feed_matcher(g4_reply_stream *s, const char *text, size_t len, int flush, g4_reply_delta *out) {
    g4_stop_result r;
    g4_status st = flush ? g4_stop_matcher_flush(s->stops, &r) : g4_stop_matcher_feed(s->stops, text, len, &r);
    if (st != G4_OK) return st;
    split(s, r.emit, r.emit_len);
    if (r.stopped) {
        s->ended = 1;
        out->stop_index = r.stop_index;
    }
    return G4_OK;
}

g4_status g4_reply_stream_push(g4_reply_stream *s, int32_t token, g4_reply_delta *out) {
    start_delta(s, out);
    if (s->ended || s->finished || !s->detok) return end_delta(s, out);
    if (s->mode == G4_REPLY_CHAT && g4_tokenizer_is_special(s->tok, token) && !is_kept(s, token))
        return end_delta(s, out);
    const char *text;
    size_t len;
    g4_status st = g4_detokenizer_push(s->detok, token, &text, &len);
    if (st == G4_OK && len) st = feed_matcher(s, text, len, 0, out);
    return st == G4_OK ? end_delta(s, out) : st;
}

g4_status g4_reply_stream_finish(g4_reply_stream *s, g4_reply_delta *out) {
    start_delta(s, out);
    if (s->finished) return end_delta(s, out);
    s->finished = 1;
    g4_status st = G4_OK;
    if (!s->ended && s->detok) {
        const char *text;
        size_t len;
        st = g4_detokenizer_flush(s->detok, &text, &len);
        if (st == G4_OK && len) st = feed_matcher(s, text, len, 0, out);
        if (st == G4_OK && !s->ended) st = feed_matcher(s, NULL, 0, 1, out);
    }
    if (st != G4_OK) return st;
    if (s->state != S_ENDED && s->pending.len) {
        /* no marker can complete any more: what was held is plain text */
        put(s, &s->text, s->pending.data, s->pending.len);
        route(s, s->pending.data, s->pending.len);
        g4_strbuf_clear(&s->pending);
    }
    int last = s->state == S_ENDED ? s->ended_from : s->state;
    if (s->held_newline && last == S_REASONING) {
        /* the channel never closed: its last newline is text */
        s->held_newline = 0;
        if (!s->block_emitted && s->block_after_other) put(s, &s->out_reasoning, "\n", 1);
        s->block_emitted = 1;
        put(s, &s->out_reasoning, "\n", 1);
    }
    if (last == S_TOOL) {
        /* an unfinished tool call stays in the content as raw text */
        g4_strbuf raw = {0};
        put(s, &raw, OPEN_TOOL, sizeof OPEN_TOOL - 1);
        put(s, &raw, s->tool.data, s->tool.len);
        emit_content(s, raw.data, raw.len);
        g4_strbuf_free(&raw);
        g4_strbuf_clear(&s->tool);
    }
    return end_delta(s, out);
}

const g4_tool_call *g4_reply_stream_tool_calls(const g4_reply_stream *s, size_t *n) {
    *n = s->n_calls;
    return s->calls;
}

int g4_reply_stream_has_reasoning(const g4_reply_stream *s) { return s->have_reasoning; }

const char *g4_reply_stream_text(const g4_reply_stream *s, size_t *len) {
    *len = s->text.len;
    return s->text.data ? s->text.data : "";
}

int g4_reply_stream_in_reasoning(const g4_reply_stream *s) {
    return s && (s->state == S_HEADER || s->state == S_REASONING);
}
