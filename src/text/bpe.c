/* The BPE model: a word is split into characters (or byte-fallback bytes),
 * then the adjacent pair with the lowest merge rank is merged until none is
 * left, leftmost first among equal ranks. A binary heap keeps this
 * O(n log n) per word, which matters because Gemma's pre-tokenizer leaves
 * whole lines as single words. Follows `tokenizers`' BPE::merge_word and
 * Word::merge_all, including their handling of unknown characters. */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

typedef struct {
    int32_t id; /* -1 once merged into its left neighbour */
    int32_t prev, next; /* neighbour positions, -1 at the ends */
} bpe_symbol;

/* Heap entries are (rank << 32 | position): one integer compare orders by
 * rank, then leftmost position, as `tokenizers`' Merge ordering does. The
 * merged id is looked up again when an entry is popped; an entry is stale
 * exactly when the pair at its position has changed, and a changed pair
 * always has a different rank (ranks are unique per pair). */
struct g4_bpe_work {
    bpe_symbol *sym;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_len, heap_cap;
    g4_strbuf piece;
};

g4_bpe_work *g4_bpe_work_new(void) { return calloc(1, sizeof(g4_bpe_work)); }

void g4_bpe_work_free(g4_bpe_work *w) {
    if (!w) return;
    free(w->sym);
    free(w->heap);
    g4_strbuf_free(&w->piece);
    free(w);
}

int g4_id_list_push(g4_id_list *l, int32_t id) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int32_t *p = realloc(l->data, cap * sizeof *p);
        if (!p) return 0;
        l->data = p;
        l->cap = cap;
    }
    l->data[l->count++] = id;
    return 1;
}

/* A 4-ary min-heap: shallower than a binary one, with siblings in one cache line. */
static int heap_push(g4_bpe_work *w, uint64_t key) {
    if (w->heap_len == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
        uint64_t *p = realloc(w->heap, cap * sizeof *p);
        if (!p) return 0;
        w->heap = p;
        w->heap_cap = cap;
    }
    uint64_t *h = w->heap;
    size_t i = w->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (h[parent] <= key) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = key;
    return 1;
}

static uint64_t heap_pop(g4_bpe_work *w) {
    uint64_t *h = w->heap;
    uint64_t top = h[0], last = h[--w->heap_len];
    size_t n = w->heap_len, i = 0;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n) break;
        size_t best = c;
        size_t end = c + 4 < n ? c + 4 : n;
        for (size_t k = c + 1; k < end; k++)
            if (h[k] < h[best]) best = k;
        if (h[best] >= last) break;
        h[i] = h[best];
        i = best;
    }
    if (n) h[i] = last;
    return top;
}

static inline uint64_t merge_key(uint32_t rank, size_t pos) { return ((uint64_t)rank << 32) | (uint64_t)pos; }

static int add_symbol(g4_bpe_work *w, size_t *count, int32_t id) {
    if (*count == w->sym_cap) {
        size_t cap = w->sym_cap ? w->sym_cap * 2 : 256;
        bpe_symbol *p = realloc(w->sym, cap * sizeof *p);
        if (!p) return 0;
        w->sym = p;
        w->sym_cap = cap;
    }
    size_t i = (*count)++;
    w->sym[i] = (bpe_symbol){id, (int32_t)i - 1, (int32_t)i + 1};
    return 1;
}

/* Vocabulary id of one character with the subword prefix/suffix, or -1. */
static int32_t char_id(const g4_tokenizer *t, g4_bpe_work *w, const char *c, size_t k, int first, int last) {
    int with_prefix = !first && t->prefix, with_suffix = last && t->suffix;
    if (!with_prefix && !with_suffix) {
        if (k == 1 && (unsigned char)c[0] < 128) return t->ascii_ids[(unsigned char)c[0]];
        return g4_strmap_get(&t->vocab, c, k);
    }
    g4_strbuf_clear(&w->piece);
    if ((with_prefix && !g4_strbuf_append(&w->piece, t->prefix, t->prefix_len)) || !g4_strbuf_append(&w->piece, c, k) ||
        (with_suffix && !g4_strbuf_append(&w->piece, t->suffix, t->suffix_len)))
        return -2;
    return g4_strmap_get(&t->vocab, w->piece.data, w->piece.len);
}

g4_status g4_bpe_encode_word(const g4_tokenizer *t, const char *w, size_t n, g4_bpe_work *work, g4_id_list *out) {
    if (n == 0) return G4_OK;
    if (t->ignore_merges) {
        int32_t id = g4_strmap_get(&t->vocab, w, n);
        if (id >= 0) return g4_id_list_push(out, id) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
    }
    size_t count = 0;
    int32_t unk = -1; /* a pending (possibly fused) unknown symbol */
    for (size_t i = 0; i < n;) {
        size_t k = g4_utf8_char_len((unsigned char)w[i]);
        if (i + k > n) k = n - i;
        int32_t id = char_id(t, work, w + i, k, i == 0, i + k >= n);
        if (id == -2) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
        if (id >= 0) {
            if (unk >= 0) {
                if (!add_symbol(work, &count, unk)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
                unk = -1;
            }
            if (!add_symbol(work, &count, id)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
            i += k;
            continue;
        }
        if (t->byte_fallback) {
            /* all bytes of the piece (with prefix/suffix, as `tokenizers` does) or none */
            const char *piece = w + i;
            size_t plen = k;
            int with_affix = (i > 0 && t->prefix) || (i + k >= n && t->suffix);
            if (with_affix) piece = work->piece.data, plen = work->piece.len;
            int all = 1;
            for (size_t b = 0; b < plen; b++)
                if (t->byte_ids[(unsigned char)piece[b]] < 0) all = 0;
            if (all) {
                for (size_t b = 0; b < plen; b++)
                    if (!add_symbol(work, &count, t->byte_ids[(unsigned char)piece[b]]))
                        return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
                i += k;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk && !add_symbol(work, &count, unk)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
            unk = t->unk_id;
        }
        i += k;
    }
    if (unk >= 0 && !add_symbol(work, &count, unk)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
    if (count == 0) return G4_OK;
    bpe_symbol *s = work->sym;
    s[count - 1].next = -1;

    work->heap_len = 0;
    for (size_t i = 0; i + 1 < count; i++) {
        const g4_merge_slot *m = g4_merge_map_get(&t->merges, s[i].id, s[i + 1].id);
        if (m && !heap_push(work, merge_key(m->rank, i))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
    }
    while (work->heap_len) {
        uint64_t top = heap_pop(work);
        uint32_t rank = (uint32_t)(top >> 32), pos = (uint32_t)top;
        bpe_symbol *cur = &s[pos];
        if (cur->id < 0 || cur->next < 0) continue;
        bpe_symbol *right = &s[cur->next];
        const g4_merge_slot *m = g4_merge_map_get(&t->merges, cur->id, right->id);
        if (!m || m->rank != rank) continue; /* stale */
        cur->id = m->new_id;
        right->id = -1;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = (int32_t)pos;
        if (cur->prev >= 0) {
            m = g4_merge_map_get(&t->merges, s[cur->prev].id, cur->id);
            if (m && !heap_push(work, merge_key(m->rank, (size_t)cur->prev))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
        }
        if (cur->next >= 0) {
            m = g4_merge_map_get(&t->merges, cur->id, s[cur->next].id);
            if (m && !heap_push(work, merge_key(m->rank, pos))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
        }
    }
    for (size_t i = 0; i < count; i++)
        if (s[i].id >= 0 && !g4_id_list_push(out, s[i].id)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "bpe");
    return G4_OK;
}
