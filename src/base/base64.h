/* Base64 (RFC 4648, standard alphabet) decoding for uploads: data: URIs and
 * OpenAI `input_audio.data`. */
#ifndef G4_BASE_BASE64_H
#define G4_BASE_BASE64_H

#include <stddef.h>

#include "base/status.h"

/* Decodes text[0..len) into a heap buffer *out of *out_len bytes (free()).
 * ASCII whitespace is skipped; '=' padding is optional but, when present,
 * must end the data; any other character, or a length that cannot be base64
 * (one leftover character), is G4_ERR_FORMAT naming `what` and the offset.
 * Output larger than max_out bytes is G4_ERR_LIMIT (0: no limit). */
g4_status g4_base64_decode(const char *text, size_t len, size_t max_out, const char *what, unsigned char **out,
                           size_t *out_len);

#endif
