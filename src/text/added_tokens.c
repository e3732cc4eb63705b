/* Added tokens: a byte trie of their contents and the splitting of text
 * around them, following `tokenizers`' AddedVocabulary::find_matches
 * (Aho-Corasick, leftmost-longest, non-overlapping). */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

static int32_t trie_new_node(g4_trie *t, unsigned char byte) {
    if (t->count == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 256;
        g4_trie_node *n = realloc(t->nodes, (size_t)cap * sizeof *n);
        if (!n) return -1;
        t->nodes = n;
        t->cap = cap;
    }
    g4_trie_node *n = &t->nodes[t->count];
    n->child = n->sibling = n->token = -1;
    n->byte = byte;
    return t->count++;
}

int g4_trie_add(g4_trie *t, const char *s, size_t n, int32_t token) {
    if (!n) return 1;
    const unsigned char *p = (const unsigned char *)s;
    int32_t node = t->root_child[p[0]];
    if (node < 0) {
        node = trie_new_node(t, p[0]);
        if (node < 0) return 0;
        t->root_child[p[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != p[i]) c = t->nodes[c].sibling;
        if (c < 0) {
            c = trie_new_node(t, p[i]);
            if (c < 0) return 0;
            t->nodes[c].sibling = t->nodes[node].child;
            t->nodes[node].child = c;
        }
        node = c;
    }
    /* Aho-Corasick keeps the first of identical patterns */
    if (t->nodes[node].token < 0) t->nodes[node].token = token;
    return 1;
}

void g4_trie_init(g4_trie *t) {
    t->nodes = NULL;
    t->count = t->cap = 0;
    for (int i = 0; i < 256; i++) t->root_child[i] = -1;
}

void g4_trie_free(g4_trie *t) {
    free(t->nodes);
    t->nodes = NULL;
    t->count = t->cap = 0;
}

/* Longest token starting at s[i]; returns its end (or 0) and sets *token. */
static size_t trie_longest(const g4_trie *t, const unsigned char *s, size_t n, size_t i, int32_t *token) {
    int32_t node = t->root_child[s[i]];
    size_t best = 0;
    for (size_t j = i + 1;; j++) {
        if (t->nodes[node].token >= 0) {
            best = j;
            *token = t->nodes[node].token;
        }
        if (j >= n) break;
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != s[j]) c = t->nodes[c].sibling;
        if (c < 0) break;
        node = c;
    }
    return best;
}

int g4_segments_push(g4_segments *out, size_t start, size_t end, int32_t token) {
    if (out->count == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 16;
        g4_segment *p = realloc(out->items, cap * sizeof *p);
        if (!p) return 0;
        out->items = p;
        out->cap = cap;
    }
    out->items[out->count++] = (g4_segment){start, end, token};
    return 1;
}

/* Start of the run of whitespace that ends at s[end] (regex \s*$), but not
 * before `floor` (the caller clamps there anyway; stopping keeps runs of
 * whitespace tokens linear). */
static size_t trailing_space_start(const char *s, size_t end, size_t floor) {
    size_t i = end;
    while (i > floor) {
        size_t j = i - 1;
        while (j > floor && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        if (!g4_utf8_decode((const unsigned char *)s + j, i - j, &cp) || !g4_unicode_is_space(cp)) break;
        i = j;
    }
    return i;
}

/* Length of the run of whitespace starting at s[start] (regex ^\s*). */
static size_t leading_space_len(const char *s, size_t start, size_t n) {
    size_t i = start;
    while (i < n) {
        uint32_t cp;
        size_t k = g4_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k || !g4_unicode_is_space(cp)) break;
        i += k;
    }
    return i - start;
}

int g4_added_split(const g4_tokenizer *t, const g4_trie *trie, const char *s, size_t n, int plain_text,
                   g4_segments *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t start_offset = 0;
    size_t ws_from = 1, ws_end = 0; /* last whitespace run found for rstrip (none yet) */
    if (trie->count > 0) {
        size_t i = 0;
        while (i < n) {
            if (trie->root_child[p[i]] < 0) {
                i++;
                continue;
            }
            int32_t tok = -1;
            size_t end = trie_longest(trie, p, n, i, &tok);
            if (!end) {
                i++;
                continue;
            }
            size_t start = i, stop = end;
            i = end; /* the automaton resumes after the match, whatever happens to it */
            const g4_added_token *a = &t->added[tok];
            if (plain_text && a->special) continue;
            /* single_word is refused at load time (it needs Unicode \w) */
            if (a->lstrip) {
                size_t ns = trailing_space_start(s, start, start_offset);
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip) {
                /* reuse the last scan when stop lies inside the whitespace run it found */
                if (stop < ws_from || stop > ws_end) {
                    ws_from = stop;
                    ws_end = stop + leading_space_len(s, stop, n);
                }
                stop = ws_end;
            }
            if (start_offset < start && !g4_segments_push(out, start_offset, start, -1)) return 0;
            if (!g4_segments_push(out, start, stop, tok)) return 0;
            start_offset = stop;
        }
    }
    if (start_offset < n && !g4_segments_push(out, start_offset, n, -1)) return 0;
    return 1;
}
