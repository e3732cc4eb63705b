/* The messages of a chat in the OpenAI shape, as every front end hands
 * them to the runtime (the server, the embedding API): checked, and their
 * images and audio clips collected in the order the chat template places
 * their placeholders. Errors are statuses; the server maps them to HTTP.
 *
 *   {"type": "image_url", "image_url": {"url": URL, "detail": D}}  (or "image_url": URL)
 *       URL: a data: URI with base64 data, or a local file (an absolute path
 *       or file:// URL) inside limits.allowed_dir. Remote http(s) URLs are
 *       refused: nothing is fetched.
 *       D: "low" = 70 soft tokens, "high" = 1120, "auto"/absent = the
 *       model's default (processor_config image_seq_length, else 280).
 *   {"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}
 *       any format the audio decoder reads (WAV, FLAC, Ogg, MP3), sniffed
 *       from the bytes; `format` is not trusted. */
#ifndef G4_RUNTIME_CHAT_MESSAGES_H
#define G4_RUNTIME_CHAT_MESSAGES_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "runtime/prompt.h"

/* A non-empty list of messages with known roles and string / list content
 * (required but for assistants). G4_ERR_INVALID_ARGUMENT otherwise, with
 * the offending item named in where[0..size) ("messages[1].content", or
 * "messages" for the list itself). */
g4_status g4_chat_check_messages(const cJSON *messages, char *where, size_t size);

typedef struct {
    int max_images, max_audio;
    size_t max_bytes;        /* per item, decoded */
    const char *allowed_dir; /* NULL: local files are refused */
} g4_media_limits;

typedef struct {
    g4_media_input *items; /* data and label owned by the list */
    int n;
} g4_media_list;

/* G4_OK, or: G4_ERR_INVALID_ARGUMENT for a malformed or refused part,
 * G4_ERR_PERMISSION for a file outside limits.allowed_dir,
 * G4_ERR_OUT_OF_MEMORY, G4_ERR_INTERNAL when allowed_dir itself is missing.
 * On failure the list is empty. */
g4_status g4_chat_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out);
void g4_media_list_free(g4_media_list *l);

#endif
