/* Regular expressions (a documented subset, see regex.c) -> grammar rules. */
#ifndef G4_CONSTRAIN_REGEX_H
#define G4_CONSTRAIN_REGEX_H

#include <stddef.h>

#include "constrain/charclass.h"

/* A rule matching the text the regex re[0..n) describes, written per mode
 * (JSON-escaped inside a JSON string, raw, or Gemma tool-call text). With
 * `search` the semantics are those of Python's re.search (and JSON Schema's
 * `pattern`): unanchored ends match any text; otherwise re.fullmatch.
 * -1 with the builder's error set on unsupported syntax. */
int g4_regex_rule(g4_gbuilder *b, const char *re, size_t n, g4_cc_mode mode, int search);

#endif
