/* UTF-8 helpers for the tokenizer: decoding one code point, repairing
 * invalid input, and the few Unicode classes the tokenizer needs. */
#ifndef G4_TEXT_UTF8_H
#define G4_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 when the
 * bytes there are not a complete, valid, shortest-form sequence. Sets *cp. */
size_t g4_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Length in bytes of the character starting at s, assuming valid UTF-8. */
static inline size_t g4_utf8_char_len(unsigned char lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/* Writes cp as UTF-8 into out (4 bytes room); returns the byte count. */
size_t g4_utf8_encode(uint32_t cp, char *out);

/* 1 if s[0..n) is valid UTF-8. */
int g4_utf8_valid(const char *s, size_t n);

/* Returns a heap copy of s[0..n) where each maximal invalid subpart is
 * replaced by U+FFFD (the rule of Python's errors="replace" and Rust's
 * String::from_utf8_lossy). *out_len receives the new length. NULL on OOM. */
char *g4_utf8_repair(const char *s, size_t n, size_t *out_len);

/* Unicode White_Space (what Rust's char::is_whitespace and regex \s accept). */
int g4_unicode_is_space(uint32_t cp);

#endif
