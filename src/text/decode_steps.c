/* Decoder steps over a list of token texts, as `tokenizers`' decoders'
 * decode_chain: Replace, ByteFallback, Fuse and Strip. */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

static int strlist_grow(g4_strlist *l) {
    if (l->count < l->cap) return 1;
    size_t cap = l->cap ? l->cap * 2 : 64;
    size_t *o = realloc(l->off, cap * sizeof *o);
    if (!o) return 0;
    l->off = o;
    size_t *q = realloc(l->len, cap * sizeof *q);
    if (!q) return 0;
    l->len = q;
    l->cap = cap;
    return 1;
}

int g4_strlist_push(g4_strlist *l, const char *s, size_t n) {
    if (!strlist_grow(l)) return 0;
    size_t at = l->bytes.len;
    if (!g4_strbuf_append(&l->bytes, s, n)) return 0;
    l->off[l->count] = at;
    l->len[l->count] = n;
    l->count++;
    return 1;
}

void g4_strlist_clear(g4_strlist *l) {
    l->count = 0;
    g4_strbuf_clear(&l->bytes);
}

void g4_strlist_free(g4_strlist *l) {
    g4_strbuf_free(&l->bytes);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int g4_byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    /* u8::from_str_radix(s[3..5], 16): an optional '+' sign, then digits */
    if (s[3] == '+') return hex_digit(s[4]);
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Registers the bytes appended to l->bytes since `at` as one entry. */
static int strlist_commit(g4_strlist *l, size_t at) {
    if (!strlist_grow(l)) return 0;
    l->off[l->count] = at;
    l->len[l->count] = l->bytes.len - at;
    l->count++;
    return 1;
}

static int push_replaced(g4_strlist *out, const char *s, size_t n, const g4_step *st) {
    size_t at = out->bytes.len, i = 0, m = st->pattern_len;
    while (i < n) {
        size_t j = n;
        if (m && m <= n - i)
            for (const char *p = s + i; (p = memchr(p, st->pattern[0], (size_t)(s + n - p))) && p + m <= s + n; p++)
                if (!memcmp(p, st->pattern, m)) {
                    j = (size_t)(p - s);
                    break;
                }
        if (!g4_strbuf_append(&out->bytes, s + i, j - i)) return 0;
        if (j == n) break;
        if (!g4_strbuf_append(&out->bytes, st->content, st->content_len)) return 0;
        i = j + m;
    }
    return strlist_commit(out, at);
}

static int flush_bytes(g4_strlist *out, const unsigned char *bytes, size_t n) {
    if (!n) return 1;
    if (g4_utf8_valid((const char *)bytes, n)) return g4_strlist_push(out, (const char *)bytes, n);
    for (size_t i = 0; i < n; i++)
        if (!g4_strlist_push(out, "\xEF\xBF\xBD", 3)) return 0;
    return 1;
}

static int strip_chars(g4_strlist *out, const char *s, size_t n, const g4_step *st) {
    size_t a = 0, b = n;
    char enc[4];
    size_t k = g4_utf8_encode(st->content_char, enc);
    for (int i = 0; i < st->n1 && a + k <= b && !memcmp(s + a, enc, k); i++) a += k;
    for (int i = 0; i < st->n2 && b >= a + k && !memcmp(s + b - k, enc, k); i++) b -= k;
    return g4_strlist_push(out, s + a, b - a);
}

int g4_decode_steps(const g4_steps *steps, int from, int to, g4_strlist *in, g4_strlist *tmp) {
    unsigned char *run = NULL;
    size_t run_cap = 0;
    int ok = 1;
    for (int si = from; si < to && ok; si++) {
        const g4_step *st = &steps->items[si];
        g4_strlist_clear(tmp);
        if (st->kind == G4_STEP_FUSE) {
            ok = g4_strlist_push(tmp, in->bytes.data ? in->bytes.data : "", in->bytes.len);
        } else if (st->kind == G4_STEP_BYTE_FALLBACK) {
            if (run_cap < in->count) {
                free(run);
                run_cap = in->count;
                run = malloc(run_cap);
                if (!run) return 0;
            }
            size_t nrun = 0;
            for (size_t i = 0; i < in->count && ok; i++) {
                const char *s = in->bytes.data + in->off[i];
                int v = g4_byte_token_value(s, in->len[i]);
                if (v >= 0) {
                    run[nrun++] = (unsigned char)v;
                    continue;
                }
                ok = flush_bytes(tmp, run, nrun) && g4_strlist_push(tmp, s, in->len[i]);
                nrun = 0;
            }
            ok = ok && flush_bytes(tmp, run, nrun);
        } else {
            for (size_t i = 0; i < in->count && ok; i++) {
                const char *s = in->bytes.data + in->off[i];
                if (st->kind == G4_STEP_REPLACE) ok = push_replaced(tmp, s, in->len[i], st);
                else if (st->kind == G4_STEP_STRIP_CHAR) ok = strip_chars(tmp, s, in->len[i], st);
                else ok = g4_strlist_push(tmp, s, in->len[i]);
            }
        }
        g4_strlist swap = *in;
        *in = *tmp;
        *tmp = swap;
    }
    free(run);
    return ok;
}
