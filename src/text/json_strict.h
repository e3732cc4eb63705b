/* RFC 8259 syntax check of a request body, before cJSON parses it.
 *
 * cJSON is lenient (leading zeros, "1.", "+1", ".5", invalid escapes are
 * read somehow) and its strings end at the first NUL, so an escaped NUL
 * (\u0000) would silently cut the text. This check accepts exactly the
 * RFC 8259 grammar and additionally refuses, with a reason: \u0000 (the text
 * after it would be lost), unpaired surrogate escapes (no UTF-8 form),
 * nesting deeper than G4_JSON_MAX_DEPTH and more than max_values values
 * (each costs a cJSON node of ~80 bytes: a body of "[0,0,0...]" would
 * otherwise cost 40x its size). The text must already be valid UTF-8. */
#ifndef G4_TEXT_JSON_STRICT_H
#define G4_TEXT_JSON_STRICT_H

#include <stddef.h>

#define G4_JSON_MAX_DEPTH 512

/* 0 when s[0..n) is one JSON value (with optional surrounding whitespace);
 * else -1 with *pos the byte offset of the problem and *why its reason. */
int g4_json_check(const char *s, size_t n, size_t max_values, size_t *pos, const char **why);

#endif
