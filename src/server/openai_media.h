/* The images and audio clips of an OpenAI chat request, in the order the
 * chat template places their placeholders.
 *
 *   {"type": "image_url", "image_url": {"url": URL, "detail": D}}  (or "image_url": URL)
 *       URL: a data: URI with base64 data, or a local file (an absolute path
 *       or file:// URL) inside the server's --allowed-media-dir. Remote
 *       http(s) URLs are refused: the server fetches nothing.
 *       D: "low" = 70 soft tokens, "high" = 1120, "auto"/absent = the
 *       model's default (processor_config image_seq_length, else 280).
 *   {"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}
 *       any format the audio decoder reads (WAV, FLAC, Ogg, MP3), sniffed
 *       from the bytes; `format` is not trusted. */
#ifndef G4_SERVER_OPENAI_MEDIA_H
#define G4_SERVER_OPENAI_MEDIA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "runtime/prompt.h"
#include "server/openai_request.h"

typedef struct {
    int max_images, max_audio;
    size_t max_bytes;        /* per item, decoded */
    const char *allowed_dir; /* NULL: local files are refused */
} g4_media_limits;

typedef struct {
    g4_media_input *items; /* data and label owned by the list */
    int n;
} g4_media_list;

/* Returns 0, or -1 with err filled (400 for bad parts, 403 for files
 * outside the allowed folder). */
int g4_oai_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out, g4_oai_error *err);
void g4_media_list_free(g4_media_list *l);

#endif
