/* The text tokenizer: a general implementation of what a Hugging Face
 * tokenizer.json declares, giving the ids and text that the `tokenizers`
 * library (0.23) gives. Special tokens (turn markers, image placeholders...)
 * are looked up by name in the loaded file, never by fixed id.
 *
 * Supported: normalizers Replace (String pattern), Prepend, Strip, Sequence;
 * pre-tokenizers Split (String pattern, every behaviour, invert),
 * WhitespaceSplit, Sequence; the BPE model (merges as pairs or "a b" lines,
 * byte_fallback, unk_token with fuse_unk, ignore_merges, subword prefix and
 * word suffix); added tokens with special, normalized, lstrip and rstrip;
 * post-processors TemplateProcessing, Bert/RobertaProcessing, ByteLevel,
 * Sequence; decoders Replace, ByteFallback, Fuse, Strip, Sequence. Anything
 * else (Regex patterns, NFC..., Metaspace, ByteLevel, other models,
 * single_word tokens, truncation/padding, BPE dropout) fails to load with
 * G4_ERR_UNSUPPORTED naming it.
 *
 * Where this differs from `tokenizers` on purpose: decoding an unknown id is
 * an error (it silently drops it); an unk_token missing from the vocab fails
 * at load (it fails when an unknown character is met); a Strip decoder that
 * would cut past a token's start stops there (it panics).
 *
 * Input that is not valid UTF-8 is repaired before encoding: each maximal
 * invalid subpart becomes U+FFFD, the rule of Python's
 * bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy, so the
 * ids equal those of `tokenizers` on the repaired string.
 *
 * A loaded tokenizer is read-only: encode and decode may run on many threads
 * at once. A detokenizer belongs to one thread. */
#ifndef G4_TEXT_TOKENIZER_H
#define G4_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct g4_tokenizer g4_tokenizer;

/* Encode flags. */
enum {
    /* Apply the post-processor's template (Gemma: a leading <bos>). Off by
     * default, unlike Python's Tokenizer.encode. */
    G4_TOK_ADD_SPECIAL = 1,
    /* Tokenize added tokens flagged "special" in the text as ordinary text
     * (`tokenizers`' encode_special_tokens = True). Non-special added tokens
     * such as "\n\n" or <unusedN> are still recognised, as there. */
    G4_TOK_PLAIN_TEXT = 2,
    /* The text holds escaped spans, U+FDD0 ... U+FDD1 (two Unicode
     * noncharacters, see g4_tokenizer_escape_special): inside one, special
     * tokens are plain text (as with G4_TOK_PLAIN_TEXT); the two marks
     * give no tokens. */
    G4_TOK_ESCAPED_SPANS = 4,
};

/* Wraps every special token's text in s[0..n) in an escaped span, so that
 * encoding with G4_TOK_ESCAPED_SPANS reads it as text; U+FDD0 / U+FDD1
 * already in s become U+FFFD. *out is a heap string of *out_len bytes. */
g4_status g4_tokenizer_escape_special(const g4_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len);

/* path_or_dir: a tokenizer.json, or a folder holding one. */
g4_status g4_tokenizer_load(const char *path_or_dir, g4_tokenizer **out);
/* label names the source in error messages. */
g4_status g4_tokenizer_load_from_memory(const char *json, size_t len, const char *label, g4_tokenizer **out);
void g4_tokenizer_free(g4_tokenizer *t);

/* Number of ids: one past the largest id of the vocabulary and added tokens
 * (`tokenizers`' get_vocab_size(with_added_tokens=True) for dense ids). */
int g4_tokenizer_vocab_size(const g4_tokenizer *t);

/* Encodes text[0..len) into a heap array *ids (caller frees) of *n ids. */
g4_status g4_tokenizer_encode(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                              size_t *n);

/* The same, but stops with G4_ERR_LIMIT as soon as the text proves longer
 * than max_ids tokens (0: no limit), so refusing a huge text costs about
 * what encoding max_ids tokens costs, beyond normalization and splitting. */
g4_status g4_tokenizer_encode_max(const g4_tokenizer *t, const char *text, size_t len, int flags, size_t max_ids,
                                  int32_t **ids, size_t *n);
/* Bytes of the longest token (text as stored): no text of n bytes is fewer
 * than n / this many tokens, give or take the normalizer. */
size_t g4_tokenizer_max_token_bytes(const g4_tokenizer *t);

/* Decodes ids into a heap NUL-terminated string (caller frees). skip_special
 * leaves out tokens flagged special. Ids outside [0, vocab_size) or with no
 * token are an error (G4_ERR_INVALID_ARGUMENT); `tokenizers` drops them. */
g4_status g4_tokenizer_decode(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                              size_t *len);

/* Id of a token by its exact text (added tokens first, then the vocabulary),
 * or -1 if absent. */
int32_t g4_tokenizer_token_id(const g4_tokenizer *t, const char *token);
/* The token's text as stored in the file (e.g. "▁the", "<0x0A>"), or NULL. */
const char *g4_tokenizer_token_text(const g4_tokenizer *t, int32_t id);
/* The byte of a byte-fallback token ("<0xC3>" -> 0xC3) when the decoder
 * turns such tokens into bytes; -1 for every other token. */
int g4_tokenizer_token_byte(const g4_tokenizer *t, int32_t id);
/* 1 if the id's token is an added token flagged special. */
int g4_tokenizer_is_special(const g4_tokenizer *t, int32_t id);

/* The streaming detokenizer (g4_detokenizer_new/push/flush/free) is
 * declared in gemma4.h. A run of byte-fallback tokens (<0xNN>) is held
 * until the next other token or flush, because `tokenizers` decides on the
 * whole run (valid UTF-8 -> its text, otherwise one U+FFFD per byte).
 * Decoders whose output cannot be cut at token boundaries are handled by
 * holding everything until flush. */

#endif
