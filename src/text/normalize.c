/* Normalizers (text -> text) and pre-tokenizers (text -> words), the ones
 * a tokenizer.json commonly declares for SentencePiece-style BPE. */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

/* Next occurrence of pat in s[from, n), or n. */
static size_t find_literal(const char *s, size_t n, size_t from, const char *pat, size_t m) {
    if (m == 0 || m > n) return n;
    const char *end = s + n - m + 1;
    for (const char *p = s + from; p < end;) {
        const char *q = memchr(p, pat[0], (size_t)(end - p));
        if (!q) return n;
        if (!memcmp(q, pat, m)) return (size_t)(q - s);
        p = q + 1;
    }
    return n;
}

static int replace_literal(const char *s, size_t n, const char *pat, size_t m, const char *rep, size_t r,
                           g4_strbuf *out) {
    g4_strbuf_clear(out);
    if (!g4_strbuf_reserve(out, n)) return 0;
    size_t i = 0;
    while (i < n) {
        size_t j = find_literal(s, n, i, pat, m);
        if (!g4_strbuf_append(out, s + i, j - i)) return 0;
        if (j >= n) break;
        if (!g4_strbuf_append(out, rep, r)) return 0;
        i = j + m;
    }
    return 1;
}

static int is_space_at(const char *s, size_t n, size_t i, size_t *k) {
    uint32_t cp = 0;
    *k = g4_utf8_decode((const unsigned char *)s + i, n - i, &cp);
    if (!*k) *k = 1;
    return g4_unicode_is_space(cp);
}

static int strip_space(const char *s, size_t n, int left, int right, g4_strbuf *out) {
    size_t a = 0, b = n, k;
    if (left)
        while (a < b && is_space_at(s, n, a, &k)) a += k;
    if (right)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            if (!is_space_at(s, b, j, &k)) break;
            b = j;
        }
    g4_strbuf_clear(out);
    return g4_strbuf_append(out, s + a, b - a);
}

int g4_normalize(const g4_steps *steps, const char *s, size_t n, g4_strbuf *out) {
    g4_strbuf tmp = {0};
    g4_strbuf_clear(out);
    if (!g4_strbuf_append(out, s, n)) return 0;
    int ok = 1;
    for (int i = 0; i < steps->count && ok; i++) {
        const g4_step *st = &steps->items[i];
        switch (st->kind) {
        case G4_STEP_REPLACE:
            if (!st->pattern_len) continue;
            ok = replace_literal(out->data, out->len, st->pattern, st->pattern_len, st->content, st->content_len, &tmp);
            break;
        case G4_STEP_PREPEND:
            if (!out->len) continue;
            g4_strbuf_clear(&tmp);
            ok = g4_strbuf_append(&tmp, st->content, st->content_len) && g4_strbuf_append(&tmp, out->data, out->len);
            break;
        case G4_STEP_STRIP_SPACE:
            ok = strip_space(out->data, out->len, st->n1, st->n2, &tmp);
            break;
        default:
            continue;
        }
        g4_strbuf swap = *out;
        *out = tmp;
        tmp = swap;
    }
    g4_strbuf_free(&tmp);
    return ok;
}

/* The (range, is_match) list of `tokenizers`' Pattern::find_matches for one
 * word, into m (token field = is_match). */
static int find_matches(const g4_step *st, const char *s, size_t start, size_t end, g4_segments *m) {
    m->count = 0;
    size_t prev = start;
    if (st->kind == G4_STEP_SPLIT) {
        if (!st->pattern_len) return g4_segments_push(m, start, end, 0);
        size_t i = start;
        while (i < end) {
            size_t j = start + find_literal(s + start, end - start, i - start, st->pattern, st->pattern_len);
            if (j >= end) break;
            if (prev != j && !g4_segments_push(m, prev, j, 0)) return 0;
            if (!g4_segments_push(m, j, j + st->pattern_len, 1)) return 0;
            prev = i = j + st->pattern_len;
        }
    } else { /* whitespace, one match per character */
        size_t i = start, k;
        while (i < end) {
            if (is_space_at(s, end, i, &k)) {
                if (prev != i && !g4_segments_push(m, prev, i, 0)) return 0;
                if (!g4_segments_push(m, i, i + k, 1)) return 0;
                prev = i + k;
            }
            i += k;
        }
    }
    if (prev != end && !g4_segments_push(m, prev, end, 0)) return 0;
    return 1;
}

/* Applies a split behaviour to the match list (as NormalizedString::split). */
static int apply_behavior(g4_split_behavior b, int invert, g4_segments *m, g4_segments *out) {
    size_t n = m->count;
    if (invert)
        for (size_t i = 0; i < n; i++) m->items[i].token = !m->items[i].token;
    size_t first = out->count;
    int prev_match = 0;
    switch (b) {
    case G4_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!m->items[i].token && !g4_segments_push(out, m->items[i].start, m->items[i].end, -1)) return 0;
        break;
    case G4_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            if (!g4_segments_push(out, m->items[i].start, m->items[i].end, -1)) return 0;
        break;
    case G4_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            int is = m->items[i].token;
            if (is && !prev_match && out->count > first) out->items[out->count - 1].end = m->items[i].end;
            else if (!g4_segments_push(out, m->items[i].start, m->items[i].end, -1)) return 0;
            prev_match = is;
        }
        break;
    case G4_SPLIT_MERGED_WITH_NEXT:
        for (size_t r = n; r-- > 0;) {
            int is = m->items[r].token;
            if (is && !prev_match && out->count > first) out->items[out->count - 1].start = m->items[r].start;
            else if (!g4_segments_push(out, m->items[r].start, m->items[r].end, -1)) return 0;
            prev_match = is;
        }
        for (size_t a = first, z = out->count; a + 1 < z; a++, z--) {
            g4_segment t = out->items[a];
            out->items[a] = out->items[z - 1];
            out->items[z - 1] = t;
        }
        break;
    case G4_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            int is = m->items[i].token;
            if (is == prev_match && out->count > first) out->items[out->count - 1].end = m->items[i].end;
            else if (!g4_segments_push(out, m->items[i].start, m->items[i].end, -1)) return 0;
            prev_match = is;
        }
        break;
    }
    return 1;
}

int g4_pre_tokenize(const g4_steps *steps, const char *s, size_t n, g4_segments *out) {
    out->count = 0;
    if (n == 0) return 1;
    if (!g4_segments_push(out, 0, n, -1)) return 0;
    g4_segments next = {0}, matches = {0};
    int ok = 1;
    for (int i = 0; i < steps->count && ok; i++) {
        const g4_step *st = &steps->items[i];
        next.count = 0;
        for (size_t w = 0; w < out->count && ok; w++) {
            size_t a = out->items[w].start, b = out->items[w].end;
            size_t before = next.count;
            ok = find_matches(st, s, a, b, &matches) &&
                 apply_behavior(st->kind == G4_STEP_WS_SPLIT ? G4_SPLIT_REMOVED : st->behavior,
                                st->kind == G4_STEP_WS_SPLIT ? 0 : st->invert, &matches, &next);
            /* empty pieces are dropped, as PreTokenizedString::split does */
            size_t k = before;
            for (size_t j = before; j < next.count; j++)
                if (next.items[j].end > next.items[j].start) next.items[k++] = next.items[j];
            next.count = k;
        }
        g4_segments swap = *out;
        *out = next;
        next = swap;
    }
    free(next.items);
    free(matches.items);
    return ok;
}
