/* From a conversation (or plain text) and its images/audio to what the
 * engine runs: token ids with each media placeholder expanded as
 * transformers' processor does, and the soft tokens that replace them.
 *
 *   messages --chat template--> text with <|image|>/<|audio|>
 *            --expand placeholders (counts from each item)--> text
 *            --tokenizer--> ids
 *   images/audio --preprocess--> tower --> soft tokens at the placeholder rows */
#ifndef G4_RUNTIME_PROMPT_H
#define G4_RUNTIME_PROMPT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/context.h"
#include "runtime/engine.h"

typedef struct {
    g4_media_kind kind;          /* G4_MEDIA_IMAGE or G4_MEDIA_AUDIO */
    const unsigned char *data;   /* the encoded file (PNG/JPEG/WebP, WAV/FLAC/MP3/Ogg) */
    size_t size;
    const char *label;           /* names the item in errors (file name, "image 2"...) */
    int max_soft_tokens;         /* images: 70, 140, 280, 560 or 1120 (0: the model's default) */
} g4_media_input;

typedef struct {
    int32_t *ids;
    int n_ids;
    g4_request_media media;      /* soft tokens (backend memory) and their rows; handed to the engine */
    char *text;                  /* the prompt text before tokenisation */
    int starts_in_reasoning;     /* the reply begins inside a thought block */
    int audio_truncated;         /* an audio clip was cut to 30 s */
} g4_prompt;

typedef struct {
    g4_chat_options chat;        /* add_generation_prompt, enable_thinking, ... */
    int max_ids;                 /* > 0: G4_ERR_LIMIT once the prompt passes this many tokens (the work
                                    done on a prompt too long is bounded by the limit) */
    int escaped_spans;           /* the text holds g4_tokenizer's escaped spans (G4_TOK_ESCAPED_SPANS) */
} g4_prompt_options;

/* Renders `messages` (OpenAI/transformers chat shape; image and audio parts
 * in order of appearance correspond to media[0..n_media)) with the model's
 * chat template and builds the prompt. */
g4_status g4_prompt_from_messages(g4_context *c, const cJSON *messages, const cJSON *tools,
                                  const g4_prompt_options *opt, const g4_media_input *media, int n_media,
                                  g4_prompt *out);

/* A raw completion prompt: `text` is tokenised as is (special token strings
 * recognised); media placeholders "<|image|>"/"<|audio|>" in it are expanded
 * for media[0..n_media). */
g4_status g4_prompt_from_text(g4_context *c, const char *text, size_t len, const g4_media_input *media, int n_media,
                              g4_prompt *out);

/* Token ids already expanded (e.g. a processor's input_ids): encodes the
 * media and places their soft tokens at the image/audio placeholder ids in
 * order. Needs no tokenizer. */
g4_status g4_prompt_from_ids(g4_context *c, const int32_t *ids, int n_ids, const g4_media_input *media, int n_media,
                             g4_prompt *out);

/* Frees what the engine did not take (media ownership moves to the engine
 * on a successful submit: set out->media to zeros then). */
void g4_prompt_free(g4_context *c, g4_prompt *p);

#endif
