/* Sets of Unicode code points, lowered to byte-level grammar rules (UTF-8
 * sequences), for the regex and GBNF front ends and the JSON string lexer. */
#ifndef G4_CONSTRAIN_CHARCLASS_H
#define G4_CONSTRAIN_CHARCLASS_H

#include <stdint.h>

#include "constrain/grammar.h"

typedef struct {
    uint32_t lo, hi;
} g4_cp_range;

typedef struct {
    g4_cp_range *r;
    int n, cap;
    int failed;
} g4_charclass;

void g4_cc_add(g4_charclass *cc, uint32_t lo, uint32_t hi);
/* Sorted, merged ranges. */
void g4_cc_normalize(g4_charclass *cc);
/* The complement within [0, 0x10FFFF]. */
void g4_cc_negate(g4_charclass *cc);
void g4_cc_free(g4_charclass *cc);

/* How a character is written in the output. */
typedef enum {
    G4_CC_RAW = 0,  /* its UTF-8 bytes */
    G4_CC_JSON = 1, /* inside a JSON string: '"', '\\' and controls as escapes */
    G4_CC_DSL = 2,  /* inside a Gemma <|"|> string: raw, no controls but \t \n, no '<' (keeps "<|" out) */
} g4_cc_mode;

/* A new rule matching exactly one character of the class (surrogates left
 * out), encoded per mode; -1 when the class is empty in that mode. */
int g4_cc_rule(g4_gbuilder *b, const g4_charclass *cc, g4_cc_mode mode);

/* Appends to q the encoding of one code point (a literal character). */
void g4_cc_literal(g4_gseq *q, uint32_t cp, g4_cc_mode mode, g4_gbuilder *b);

/* UTF-8 encoding; returns the byte count (0 for surrogates / beyond U+10FFFF). */
int g4_utf8_put(uint32_t cp, unsigned char *out);
/* Decodes one code point from s[0..n); returns bytes used, 0 if invalid. */
int g4_utf8_get(const unsigned char *s, size_t n, uint32_t *cp);

#endif
