/* The Gemma 4 chat format: conversation -> prompt text, placeholder
 * expansion for media, and model reply -> reasoning / content / tool calls.
 *
 * Rendering reproduces the official chat_template.jinja (the "Canonical Chat
 * Template" of 2026-07-09) as transformers' apply_chat_template renders it,
 * byte for byte. Output is text with the special markers as their literal
 * strings ("<bos>", "<|turn>", "<|image|>", ...); the tokenizer maps them to
 * ids.
 *
 * Conversations are JSON values in the shape transformers takes (the OpenAI
 * chat shape): `messages` is an array of objects
 *   {"role": "system"|"developer"|"user"|"assistant"|"model"|"tool",
 *    "content": "text" | [{"type": "text", "text": ...},
 *                         {"type": "image"|"image_url"}, {"type": "audio"|"input_audio"},
 *                         {"type": "video"}, ...] | null,
 *    "reasoning" or "reasoning_content": "...",            (assistant)
 *    "tool_calls": [{"id": ..., "function": {"name": ..., "arguments": {...}}}],
 *    "tool_responses": [{"name": ..., "response": ...}],   (assistant, Gemma native)
 *    "tool_call_id": ..., "name": ...}                     (tool)
 * and `tools` an array of {"type": "function", "function": {"name",
 * "description", "parameters": JSON schema, "response"}} (or NULL).
 *
 * Two template variants exist (see g4_chat_variant): the small models' (E2B,
 * E4B) and the large models' (12B, 26B-A4B, 31B). They differ only in the
 * generation prompt with thinking off: the large template appends an empty
 * thought block "<|channel>thought\n<channel|>".
 *
 * transformers' preprocessing is reproduced too: an empty conversation is
 * refused, and reasoning is taken from "reasoning", else from the first
 * non-null of "reasoning_content", "thinking", "reasoning" (transformers'
 * reasoning-field aliasing, so a gpt-oss style "thinking" field renders).
 * Tested against transformers 5.24 / jinja2 3.1.6 (tests/data/chat).
 *
 * Deliberately unsupported (clear G4_ERR_INVALID_ARGUMENT / UNSUPPORTED
 * instead of Python-specific output): non-string "text" in content parts
 * (jinja prints None/5), JSON schema "type" given as a list at property level
 * (jinja prints Python's list repr), dicts where the template iterates a list
 * (content, tool content), non-ASCII schema type names. JSON numbers that
 * are integral are printed as integers (cJSON does not keep "1.0" apart
 * from "1"; Python would print 1.0). */
#ifndef G4_TEXT_CHAT_H
#define G4_TEXT_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "io/config.h"

typedef enum {
    G4_CHAT_SMALL = 0, /* E2B / E4B template */
    G4_CHAT_LARGE = 1, /* 12B / 26B-A4B / 31B template: empty thought block when thinking is off */
} g4_chat_variant;

typedef struct {
    int add_generation_prompt; /* end with the model turn opener */
    int enable_thinking;       /* "<|think|>" in the system turn; no empty thought block */
    int preserve_thinking;     /* the template's preserve_thinking: keep reasoning of earlier tool-call turns */
    const char *bos_token;     /* NULL: "<bos>" */
} g4_chat_options;

/* Renders a conversation. `tools` may be NULL. On success *out is a
 * NUL-terminated heap string (free()) of *out_len bytes. Errors (malformed
 * messages, cases the template itself rejects such as string tool-call
 * arguments) name the offending message and field. */
g4_status g4_chat_render(g4_chat_variant variant, const cJSON *messages, const cJSON *tools,
                         const g4_chat_options *opt, char **out, size_t *out_len);

/* OpenAI requests carry tool-call arguments as JSON text; the template wants
 * objects. Parses every messages[i].tool_calls[j].function.arguments that is
 * a string into an object, in place. A string that is not a JSON object is
 * an error naming the message. */
g4_status g4_chat_normalize_tool_arguments(cJSON *messages);

/* True when a rendered prompt ends inside an open thought channel (the
 * template's generation prompt after a tool response with thinking on), so
 * the reply starts with reasoning text. */
int g4_chat_prompt_opens_reasoning(const char *prompt, size_t len);

/* ---- which template a model uses ---- */

typedef enum {
    G4_CHAT_FROM_TEMPLATE_FILE = 0, /* DIR/chat_template.jinja */
    G4_CHAT_FROM_TOKENIZER_CONFIG,  /* DIR/tokenizer_config.json "chat_template" */
    G4_CHAT_FROM_CONFIG,            /* no template: decided from config.json */
} g4_chat_variant_source;

typedef struct {
    g4_chat_variant variant;
    g4_chat_variant_source source;
    int canonical; /* the template bytes are exactly the 2026-07-09 hub file of that variant */
} g4_chat_variant_info;

/* Classifies template text: LARGE iff it emits the empty thought block
 * "<|channel>thought\n<channel|>" (every large-model revision does, no
 * small-model revision does). `canonical` says whether the bytes equal the
 * current hub template (older or edited templates render with the current
 * template's rules; callers may warn). Text that is not a Gemma 4 template
 * (no "<|turn>") is G4_ERR_UNSUPPORTED. */
g4_status g4_chat_variant_from_template(const char *text, size_t len, int *canonical, g4_chat_variant *out);

/* Decides for a model folder: chat_template.jinja if present, else the
 * "chat_template" string of tokenizer_config.json, else config.json (models
 * with per-layer embeddings, i.e. E2B/E4B, are SMALL; others LARGE). */
g4_status g4_chat_variant_for_model(const char *model_dir, g4_chat_variant_info *out);

/* ---- media placeholders -> processor expansion ---- */

typedef enum { G4_MEDIA_IMAGE = 0, G4_MEDIA_AUDIO, G4_MEDIA_VIDEO } g4_media_kind;

typedef struct {
    g4_media_kind kind;
    int n_tokens;                /* soft tokens (image, audio) or soft tokens per frame (video) */
    int n_frames;                /* video: frames */
    const double *frame_seconds; /* video: timestamp of each frame in seconds */
} g4_media_item;

/* Gemma4Processor's placeholder expansion: the i-th "<|image|>" of the text
 * becomes "<|image>" + n_tokens x "<|image|>" + "<image|>" for the i-th IMAGE
 * item, "<|audio|>" becomes "<|audio>" + n x "<|audio|>" + "<audio|>", and
 * "<|video|>" becomes, per frame, "MM:SS <|image>" + n x "<|video|>" +
 * "<image|>" joined by spaces. Items are matched per kind in order; the
 * number of placeholders of each kind must equal the number of items. */
g4_status g4_chat_expand_media(const char *text, size_t len, const g4_media_item *items, size_t n_items,
                               char **out, size_t *out_len);

/* ---- model replies ---- */

typedef struct {
    char *name;
    char *arguments; /* JSON object text, e.g. {"city":"Paris","days":3} */
} g4_tool_call;

typedef struct {
    char *reasoning;      /* text of the thought channel(s), NULL if none */
    int reasoning_open;   /* the thought channel was not closed (generation stopped inside it) */
    char *content;        /* answer text outside channels and tool calls, whitespace-stripped ("" if none) */
    g4_tool_call *tool_calls;
    size_t n_tool_calls;
    size_t n_malformed_tool_calls; /* tool-call blocks that did not parse; their raw text stays in content */
} g4_chat_reply;

/* Splits generated text (decoded with special tokens kept) into reasoning,
 * content and tool calls. Text from the first "<turn|>", "<eos>" or
 * "<|tool_response>" on is dropped (they end the model turn). With
 * `starts_in_reasoning` (g4_chat_prompt_opens_reasoning of the prompt) the
 * text begins inside the thought channel. One newline before "<channel|>" is
 * dropped from the reasoning (the template writes reasoning + "\n"). */
g4_status g4_chat_parse_reply(const char *text, size_t len, int starts_in_reasoning, g4_chat_reply *out);
void g4_chat_reply_free(g4_chat_reply *r);

/* Converts the argument block of a Gemma tool call ("{key:<|"|>str<|"|>,n:3}")
 * to JSON text. Keys may be bare or <|"|>-quoted; strings are <|"|>-delimited
 * (no escapes); bare words that are not JSON literals/numbers become strings. */
g4_status g4_chat_tool_args_to_json(const char *text, size_t len, char **json_out);

/* ---- stop tokens ---- */

/* The marker strings that end a model turn in this format, in order:
 * "<turn|>", "<eos>", "<|tool_response>" (the last ends a turn that made tool
 * calls). NULL-terminated. */
extern const char *const g4_chat_stop_token_names[];

/* Stop ids for generation: generation_config's eos_token_id list (may be
 * NULL) plus the ids of g4_chat_stop_token_names that `lookup` resolves
 * (returns -1 if unknown), without duplicates. Returns the count written
 * (at most cap). */
size_t g4_chat_stop_ids(const g4_generation_config *gc, int32_t (*lookup)(void *ctx, const char *token),
                        void *ctx, int32_t *out, size_t cap);

#endif
