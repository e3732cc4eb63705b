/* The streaming reply splitter against the whole-text parser: for random
 * token streams full of chat markers, whitespace and tool calls, the
 * content, reasoning and tool calls accumulated over the deltas equal
 * g4_chat_parse_reply of the decoded text (cut at the first stop string
 * when there are stop strings), for every way the text falls into tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/reply_stream.h"
#include "text/strbuf.h"
#include "test_util.h"

static const char *const fragments[] = {
    "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>", "thought\n", "thought", "\n", "\n\n",
    " ",          "  ",         "Hello",        " world",       "call:",  "get_weather", "{city:", "Paris", "}",
    ",days:3",    "<turn|>",    "<eos>",        "<|tool_response>", "<|image|>", "<|turn>", "<mask>", "é", "日本",
    "<",          "|",          "channel",      ">",            "tool_call", "\t", "x", "The sky is blue.", "<bos>",
};
#define N_FRAG (sizeof fragments / sizeof fragments[0])

typedef struct {
    g4_strbuf content, reasoning;
} collected;

static void collect(collected *c, const g4_reply_delta *d) {
    g4_strbuf_append(&c->content, d->content, d->content_len);
    g4_strbuf_append(&c->reasoning, d->reasoning, d->reasoning_len);
}

/* The match that ends first cuts the text (ties: the one starting first). */
static size_t cut_at_stops(const char *text, size_t len, const char *const *stops, int n_stop) {
    for (size_t end = 1; end <= len; end++) {
        size_t cut = len;
        for (int k = 0; k < n_stop; k++) {
            size_t sl = strlen(stops[k]);
            if (sl <= end && memcmp(text + end - sl, stops[k], sl) == 0 && end - sl < cut) cut = end - sl;
        }
        if (cut < len) return cut;
    }
    return len;
}

static int is_kept(const g4_tokenizer *t, int32_t id) {
    static const char *const kept[] = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>",
                                       "<turn|>",    "<|tool_response>", "<eos>"};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (g4_tokenizer_token_id(t, kept[i]) == id) return 1;
    return 0;
}

static int run_case(const g4_tokenizer *t, unsigned seed, int with_stops) {
    srand(seed);
    int32_t ids[512];
    int n = 0;
    int n_frag = 1 + rand() % 30;
    for (int f = 0; f < n_frag && n < 400; f++) {
        const char *frag = fragments[rand() % N_FRAG];
        int32_t *enc;
        size_t ne;
        if (g4_tokenizer_encode(t, frag, strlen(frag), 0, &enc, &ne) != G4_OK) return 0;
        for (size_t i = 0; i < ne && n < 512; i++) ids[n++] = enc[i];
        free(enc);
    }
    int starts_in_reasoning = rand() % 4 == 0;
    /* the whole text, as the reference parser sees it */
    int32_t kept[512];
    int nk = 0;
    for (int i = 0; i < n; i++)
        if (!g4_tokenizer_is_special(t, ids[i]) || is_kept(t, ids[i])) kept[nk++] = ids[i];
    char *text = NULL;
    size_t len = 0;
    if (g4_tokenizer_decode(t, kept, (size_t)nk, 0, &text, &len) != G4_OK) return 0;
    const char *stops[2] = {NULL, NULL};
    char stop_buf[2][8];
    int n_stop = 0;
    if (with_stops && len > 4) {
        for (int k = 0; k < 2; k++) {
            size_t at = (size_t)rand() % (len - 2), sl = 1 + (size_t)rand() % 3;
            if (at + sl > len) sl = len - at;
            memcpy(stop_buf[k], text + at, sl);
            stop_buf[k][sl] = 0;
            /* whole UTF-8 characters only */
            if ((stop_buf[k][0] & 0xC0) == 0x80 || strlen(stop_buf[k]) != sl) continue;
            stops[n_stop++] = stop_buf[k];
        }
    }
    size_t cut = cut_at_stops(text, len, stops, n_stop);
    g4_chat_reply want;
    if (g4_chat_parse_reply(text, cut, starts_in_reasoning, &want) != G4_OK) return 0;

    g4_reply_options opt = {.mode = G4_REPLY_CHAT, .starts_in_reasoning = starts_in_reasoning, .stop = stops,
                            .n_stop = (size_t)n_stop};
    g4_reply_stream *s;
    collected got = {0};
    int ok = g4_reply_stream_create(t, &opt, &s) == G4_OK;
    for (int i = 0; ok && i < n; i++) {
        g4_reply_delta d;
        ok = g4_reply_stream_push(s, ids[i], &d) == G4_OK;
        if (ok) collect(&got, &d);
    }
    g4_reply_delta d;
    ok = ok && g4_reply_stream_finish(s, &d) == G4_OK;
    if (ok) collect(&got, &d);
    size_t n_calls = 0;
    const g4_tool_call *calls = ok ? g4_reply_stream_tool_calls(s, &n_calls) : NULL;
    const char *gc = got.content.data ? got.content.data : "";
    const char *gr = got.reasoning.data ? got.reasoning.data : "";
    int same = ok && !strcmp(gc, want.content) && !strcmp(gr, want.reasoning ? want.reasoning : "") &&
               g4_reply_stream_has_reasoning(s) == (want.reasoning != NULL) && n_calls == want.n_tool_calls;
    for (size_t i = 0; same && i < n_calls; i++)
        same = !strcmp(calls[i].name, want.tool_calls[i].name) &&
               !strcmp(calls[i].arguments, want.tool_calls[i].arguments);
    if (!same) {
        for (int k = 0; k < n_stop; k++) fprintf(stderr, "stop [%s] ", stops[k]);
        fprintf(stderr, "case %u (stops %d, reasoning %d): text [%.*s]\n got content [%s] reasoning [%s] calls %zu\n"
                        " want content [%s] reasoning [%s] calls %zu\n",
                seed, n_stop, starts_in_reasoning, (int)cut, text, gc, gr, n_calls, want.content,
                want.reasoning ? want.reasoning : "(none)", want.n_tool_calls);
    }
    g4_reply_stream_free(s);
    g4_chat_reply_free(&want);
    g4_strbuf_free(&got.content);
    g4_strbuf_free(&got.reasoning);
    free(text);
    return same;
}

/* Completions: all text is content, special tokens dropped, stop strings cut. */
static void check_raw(const g4_tokenizer *t) {
    const char *text = "Hello<|channel>thought\n world<turn|> end";
    int32_t *ids;
    size_t n;
    CHECK(g4_tokenizer_encode(t, text, strlen(text), 0, &ids, &n) == G4_OK, "encode");
    const char *stops[] = {"end"};
    g4_reply_options opt = {.mode = G4_REPLY_RAW, .stop = stops, .n_stop = 1};
    g4_reply_stream *s;
    CHECK(g4_reply_stream_create(t, &opt, &s) == G4_OK, "create");
    g4_strbuf out = {0};
    int ended = 0;
    for (size_t i = 0; i < n; i++) {
        g4_reply_delta d;
        CHECK(g4_reply_stream_push(s, ids[i], &d) == G4_OK, "push");
        g4_strbuf_append(&out, d.content, d.content_len);
        ended |= d.ended;
    }
    g4_reply_delta d;
    CHECK(g4_reply_stream_finish(s, &d) == G4_OK, "finish");
    g4_strbuf_append(&out, d.content, d.content_len);
    CHECK(ended, "the stop string ends the reply");
    CHECK(out.data && !strcmp(out.data, "Hellothought\n world "), "raw text: [%s]", out.data ? out.data : "");
    g4_strbuf_free(&out);
    g4_reply_stream_free(s);
    free(ids);
}

/* ignore_eos in chat: end-of-turn / eos tokens neither end the reply nor
 * appear in it (they are dropped like other special tokens); without it
 * the first one ends the reply. */
static void check_ignore_end(const g4_tokenizer *t) {
    const char *text = "Hello<turn|> more<eos> still<|tool_response> text";
    int32_t *ids;
    size_t n;
    CHECK(g4_tokenizer_encode(t, text, strlen(text), 0, &ids, &n) == G4_OK, "encode");
    for (int ignore = 0; ignore <= 1; ignore++) {
        g4_reply_options opt = {.mode = G4_REPLY_CHAT, .ignore_end = ignore};
        g4_reply_stream *s;
        CHECK(g4_reply_stream_create(t, &opt, &s) == G4_OK, "create");
        g4_strbuf out = {0};
        int ended = 0;
        for (size_t i = 0; i < n; i++) {
            g4_reply_delta d;
            CHECK(g4_reply_stream_push(s, ids[i], &d) == G4_OK, "push");
            g4_strbuf_append(&out, d.content, d.content_len);
            ended |= d.ended;
        }
        g4_reply_delta d;
        CHECK(g4_reply_stream_finish(s, &d) == G4_OK, "finish");
        g4_strbuf_append(&out, d.content, d.content_len);
        const char *want = ignore ? "Hello more still text" : "Hello";
        CHECK(ended == !ignore, "ignore_end %d: ended %d", ignore, ended);
        CHECK(out.data && !strcmp(out.data, want), "ignore_end %d: [%s], want [%s]", ignore,
              out.data ? out.data : "", want);
        g4_strbuf_free(&out);
        g4_reply_stream_free(s);
    }
    free(ids);
}

int main(void) {
    const char *data = getenv("G4_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny_tokenizer/tokenizer.json", data ? data : "tests/data");
    g4_tokenizer *t;
    if (g4_tokenizer_load(path, &t) != G4_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, g4_error_message());
        return 1;
    }
    int bad = 0;
    for (unsigned seed = 1; seed <= 3000; seed++) bad += !run_case(t, seed, 0);
    CHECK(bad == 0, "%d of 3000 streams differ from g4_chat_parse_reply", bad);
    bad = 0;
    for (unsigned seed = 5001; seed <= 8000; seed++) bad += !run_case(t, seed, 1);
    CHECK(bad == 0, "%d of 3000 streams with stop strings differ", bad);
    check_raw(t);
    check_ignore_end(t);
    g4_tokenizer_free(t);
    return test_finish();
}
