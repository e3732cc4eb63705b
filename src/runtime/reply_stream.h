/* Generated tokens -> the text a client sees, as it streams.
 *
 * Per token: the streaming detokenizer gives text (never broken UTF-8), the
 * stop-string matcher holds back what could still become a stop string, and
 * in CHAT mode a splitter routes the text to `reasoning` (the thought
 * channel) or `content`, keeps tool-call blocks aside and recognises the
 * end-of-turn markers.
 *
 * CHAT mode reproduces g4_chat_parse_reply exactly: the content, reasoning
 * and tool calls accumulated over all deltas equal what g4_chat_parse_reply
 * gives for the whole text (tests/unit/test_reply_stream.c checks this on
 * random token streams), however the text was cut into tokens. That means:
 * content is whitespace-stripped at both ends (leading whitespace dropped,
 * trailing whitespace held back until more content follows), the channel
 * name line ("thought\n") is dropped, one newline before "<channel|>" is
 * dropped, reasoning blocks are joined with "\n", a malformed or unfinished
 * tool call stays in the content as raw text, and text from "<turn|>",
 * "<eos>" or "<|tool_response>" on ends the reply.
 *
 * Special tokens other than the chat markers ("<|channel>", "<channel|>",
 * "<|tool_call>", "<tool_call|>", "<|\"|>" and the end markers) are left
 * out of the text (as `skip_special_tokens` does); RAW mode (completions)
 * leaves out every special token and does no splitting.
 *
 * Stop strings are matched on the text before splitting (markers
 * included), in one piece: a stop string that spans the boundary between
 * reasoning and content text does match. */
#ifndef G4_RUNTIME_REPLY_STREAM_H
#define G4_RUNTIME_REPLY_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/chat.h"
#include "text/tokenizer.h"

typedef enum {
    G4_REPLY_RAW = 0,  /* completions: all text is content */
    G4_REPLY_CHAT = 1, /* chat: reasoning / content / tool calls */
} g4_reply_mode;

typedef struct {
    g4_reply_mode mode;
    int starts_in_reasoning; /* the prompt ends inside a thought channel (g4_prompt.starts_in_reasoning) */
    const char *const *stop; /* stop strings (copied); may be NULL */
    size_t n_stop;
    int ignore_end; /* CHAT: end-of-turn / eos markers do not end the reply (ignore_eos); their tokens are dropped */
} g4_reply_options;

typedef struct {
    const char *content; /* new content text (valid until the next call) */
    size_t content_len;
    const char *reasoning; /* new reasoning text */
    size_t reasoning_len;
    int ended;      /* a stop string or end marker ended the reply: generate no more */
    int stop_index; /* the stop string that matched, -1 if none */
} g4_reply_delta;

typedef struct g4_reply_stream g4_reply_stream;

g4_status g4_reply_stream_create(const g4_tokenizer *t, const g4_reply_options *opt, g4_reply_stream **out);
void g4_reply_stream_free(g4_reply_stream *s);

/* One generated token (not a stop token: those end generation and have no
 * text). After `ended`, further tokens are ignored. */
g4_status g4_reply_stream_push(g4_reply_stream *s, int32_t token, g4_reply_delta *out);

/* End of generation: releases what was held back and completes the tool
 * calls. Call once. */
g4_status g4_reply_stream_finish(g4_reply_stream *s, g4_reply_delta *out);

/* After finish: the tool calls found (CHAT mode), in order. */
const g4_tool_call *g4_reply_stream_tool_calls(const g4_reply_stream *s, size_t *n);
/* Whether the text so far ends inside a thought channel (its header or
 * body): the tokens pushed then are reasoning tokens. */
int g4_reply_stream_in_reasoning(const g4_reply_stream *s);
/* Whether any reasoning block was seen (an empty one counts). */
int g4_reply_stream_has_reasoning(const g4_reply_stream *s);
/* The whole text fed to the splitter so far (after stop strings; markers kept). */
const char *g4_reply_stream_text(const g4_reply_stream *s, size_t *len);

#endif
