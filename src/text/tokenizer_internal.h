/* The tokenizer's internal state, shared by its source files (loading,
 * added-token matching, normalizing, BPE, decoding). Not a public header. */
#ifndef G4_TEXT_TOKENIZER_INTERNAL_H
#define G4_TEXT_TOKENIZER_INTERNAL_H

#include <stdint.h>

#include "text/hash_tables.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"

/* One step of a normalizer, pre-tokenizer or decoder (Sequences are
 * flattened into lists of steps, which `tokenizers` applies in order). */
typedef enum {
    G4_STEP_REPLACE,       /* normalizer/decoder: literal pattern -> content */
    G4_STEP_PREPEND,       /* normalizer: prepend content to non-empty text */
    G4_STEP_STRIP_SPACE,   /* normalizer Strip: whitespace left (n1) / right (n2) */
    G4_STEP_SPLIT,         /* pre-tokenizer Split with a literal pattern */
    G4_STEP_WS_SPLIT,      /* pre-tokenizer WhitespaceSplit */
    G4_STEP_BYTE_FALLBACK, /* decoder: <0xNN> runs -> bytes */
    G4_STEP_FUSE,          /* decoder: join all tokens */
    G4_STEP_STRIP_CHAR,    /* decoder Strip: up to n1 leading / n2 trailing `content` chars */
} g4_step_kind;

typedef enum {
    G4_SPLIT_REMOVED,
    G4_SPLIT_ISOLATED,
    G4_SPLIT_MERGED_WITH_PREVIOUS,
    G4_SPLIT_MERGED_WITH_NEXT,
    G4_SPLIT_CONTIGUOUS,
} g4_split_behavior;

typedef struct {
    g4_step_kind kind;
    char *pattern; /* owned */
    size_t pattern_len;
    char *content; /* owned */
    size_t content_len;
    uint32_t content_char; /* G4_STEP_STRIP_CHAR */
    int n1, n2;
    g4_split_behavior behavior;
    int invert;
} g4_step;

typedef struct {
    g4_step *items;
    int count;
} g4_steps;

typedef struct {
    char *content; /* owned, NUL-terminated */
    size_t len;
    /* what the id decodes to: the content, normalized when the token is
     * matched after normalization (as `tokenizers` 0.23 id_to_token gives) */
    char *text; /* owned, NUL-terminated */
    size_t text_len;
    int32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} g4_added_token;

/* A byte trie of added-token contents for leftmost-longest matching. */
typedef struct {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling node, -1 none */
    int32_t token;   /* index into added[], -1 if no token ends here */
    unsigned char byte;
} g4_trie_node;

typedef struct {
    g4_trie_node *nodes;
    int32_t count, cap;
    int32_t root_child[256]; /* children of the root by first byte */
} g4_trie;

/* Post-processor template for a single sequence: pieces are either the
 * sequence itself (n_ids < 0) or a list of special ids. */
typedef struct {
    int32_t *ids;
    int n_ids;
} g4_template_piece;

struct g4_tokenizer {
    char *label;

    /* ids: text of every id (added tokens override the model's), dense */
    int32_t n_ids;
    char *texts; /* arena holding model token texts */
    const char **id_text;
    uint32_t *id_len;
    uint8_t *id_special; /* per id: token text is a special added token */

    /* BPE model */
    g4_strmap vocab;
    g4_merge_map merges;
    int32_t unk_id; /* -1: none */
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix; /* continuing_subword_prefix, or NULL */
    size_t prefix_len;
    char *suffix; /* end_of_word_suffix, or NULL */
    size_t suffix_len;
    int32_t byte_ids[256];  /* vocab ids of "<0xNN>", -1 if absent */
    int32_t ascii_ids[128]; /* vocab ids of single ASCII chars, -1 if absent */

    /* added tokens */
    g4_added_token *added;
    int n_added;
    g4_strmap added_map; /* content -> index into added */
    g4_trie raw_trie;    /* non-normalized contents, matched in the input */
    g4_trie norm_trie;   /* normalized contents, matched after normalizing */

    g4_steps normalizer, pre_tokenizer, decoder;
    int has_decoder;
    int decoder_streamable; /* decoder output can be cut at token boundaries */

    g4_template_piece *post; /* NULL: no post-processor */
    int n_post;
};

/* loading helpers (tokenizer_load.c, tokenizer_steps.c) */
void g4_steps_free(g4_steps *s);

/* added_tokens.c */
void g4_trie_init(g4_trie *t);
int g4_trie_add(g4_trie *t, const char *s, size_t n, int32_t token);
void g4_trie_free(g4_trie *t);

/* One piece of text after added-token extraction: either an added token
 * (token >= 0: index into added[]) or plain text [start, end). */
typedef struct {
    size_t start, end;
    int32_t token;
} g4_segment;

typedef struct {
    g4_segment *items;
    size_t count, cap;
} g4_segments;

/* Appends one segment (added_tokens.c); 0 on allocation failure. */
int g4_segments_push(g4_segments *out, size_t start, size_t end, int32_t token);

/* Appends to out the splits of s[0..n) by the trie, as `tokenizers`'
 * AddedVocabulary::find_matches does. 0 on allocation failure. */
int g4_added_split(const g4_tokenizer *t, const g4_trie *trie, const char *s, size_t n, int plain_text,
                   g4_segments *out);

/* normalize.c: normalizers and pre-tokenizers */
/* Writes the normalized text of s[0..n) to out; 0 on allocation failure. */
int g4_normalize(const g4_steps *steps, const char *s, size_t n, g4_strbuf *out);
/* Splits s[0..n) into words (start/end pairs in out, token = -1). */
int g4_pre_tokenize(const g4_steps *steps, const char *s, size_t n, g4_segments *out);

/* bpe.c */
typedef struct {
    int32_t *data;
    size_t count, cap;
} g4_id_list;

int g4_id_list_push(g4_id_list *l, int32_t id);

typedef struct g4_bpe_work g4_bpe_work;
g4_bpe_work *g4_bpe_work_new(void);
void g4_bpe_work_free(g4_bpe_work *w);
/* Appends the ids of one word. */
g4_status g4_bpe_encode_word(const g4_tokenizer *t, const char *w, size_t n, g4_bpe_work *work, g4_id_list *out);

/* decode.c: applies the decoder steps to token texts */
typedef struct {
    g4_strbuf bytes;
    size_t *off, *len;
    size_t count, cap;
} g4_strlist;

int g4_strlist_push(g4_strlist *l, const char *s, size_t n);
void g4_strlist_clear(g4_strlist *l);
void g4_strlist_free(g4_strlist *l);
/* Runs steps [from, to) of the decoder over `in`, leaving the result in
 * `in` (tmp is scratch). 0 on allocation failure. */
int g4_decode_steps(const g4_steps *steps, int from, int to, g4_strlist *in, g4_strlist *tmp);
/* Byte value of a "<0xNN>" token text as ByteFallback reads it, or -1. */
int g4_byte_token_value(const char *s, size_t n);

#endif
