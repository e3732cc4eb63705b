/* A pull scanner over JSON text: it walks objects and arrays member by
 * member without building a tree, so that the 14 MB vocab and merges of a
 * tokenizer.json can be read straight into hash tables. Small sections are
 * handed to cJSON through g4_json_skip's extent. */
#ifndef G4_TEXT_JSON_SCAN_H
#define G4_TEXT_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "text/strbuf.h"

typedef struct {
    const char *begin, *p, *end;
    const char *label; /* file name for messages */
} g4_json_scan;

void g4_json_scan_init(g4_json_scan *s, const char *data, size_t len, const char *label);

/* Skips whitespace; returns the next byte or -1 at the end. */
int g4_json_peek(g4_json_scan *s);

g4_status g4_json_expect(g4_json_scan *s, char c);

/* Reads a string. Without escapes *out points into the JSON text; otherwise
 * the decoded bytes go to `scratch` and *out points there. */
g4_status g4_json_string(g4_json_scan *s, g4_strbuf *scratch, const char **out, size_t *len);

g4_status g4_json_int(g4_json_scan *s, int64_t *v);

/* Skips one value, giving its raw extent (for cJSON_ParseWithLength). */
g4_status g4_json_skip(g4_json_scan *s, const char **start, size_t *len);

/* Object and array walking: call after '{' / '[' with *first = 1; returns
 * G4_OK with *done = 1 at the closing bracket, else positions the scanner on
 * the next member's key (objects: the key is read into key/key_len and the
 * ':' consumed) or element. */
g4_status g4_json_next_member(g4_json_scan *s, int *first, int *done, g4_strbuf *scratch,
                              const char **key, size_t *key_len);
g4_status g4_json_next_element(g4_json_scan *s, int *first, int *done);

/* "file:offset: what" error with the byte offset of the scanner. */
g4_status g4_json_error(g4_json_scan *s, const char *what);

#endif
