/* Encoding and decoding with a loaded tokenizer, in the order of
 * `tokenizers`' Tokenizer::encode: added tokens are cut out of the raw text,
 * the rest is normalized (then normalized added tokens are cut out), split
 * into words by the pre-tokenizer, and each word goes through BPE; the
 * post-processor template adds <bos> and the like on request. */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

int g4_tokenizer_vocab_size(const g4_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t g4_tokenizer_token_id(const g4_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t k = g4_strmap_get(&t->added_map, token, n);
    if (k >= 0) return t->added[k].id;
    return g4_strmap_get(&t->vocab, token, n);
}

const char *g4_tokenizer_token_text(const g4_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids) return NULL;
    return t->id_text[id];
}

size_t g4_tokenizer_max_token_bytes(const g4_tokenizer *t) {
    size_t most = 1;
    for (int32_t i = 0; t && i < t->n_ids; i++)
        if (t->id_text[i] && t->id_len[i] > most) most = t->id_len[i];
    return most;
}

int g4_tokenizer_token_byte(const g4_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids || !t->id_text[id]) return -1;
    int byte_fallback = 0;
    for (int i = 0; i < t->decoder.count; i++) byte_fallback |= t->decoder.items[i].kind == G4_STEP_BYTE_FALLBACK;
    return byte_fallback ? g4_byte_token_value(t->id_text[id], t->id_len[id]) : -1;
}

int g4_tokenizer_is_special(const g4_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_ids) return 0;
    return t->id_special[id];
}

typedef struct {
    g4_segments raw, norm, words;
    g4_strbuf normalized;
    g4_bpe_work *bpe;
} encode_scratch;

static void scratch_free(encode_scratch *s) {
    free(s->raw.items);
    free(s->norm.items);
    free(s->words.items);
    g4_strbuf_free(&s->normalized);
    g4_bpe_work_free(s->bpe);
}

/* Normalized text piece -> ids (normalized added tokens, words, BPE). */
/* More ids than the caller's limit: stop (the work is bounded by the limit,
 * not by the text). */
static g4_status over_limit(const g4_id_list *out, size_t max_ids) {
    if (max_ids && out->count > max_ids) return g4_fail(G4_ERR_LIMIT, "the text has more than %zu tokens", max_ids);
    return G4_OK;
}

static g4_status encode_normalized(const g4_tokenizer *t, const char *s, size_t n, int plain, size_t max_ids,
                                   encode_scratch *sc, g4_id_list *out) {
    sc->norm.count = 0;
    if (!g4_added_split(t, &t->norm_trie, s, n, plain, &sc->norm)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
    for (size_t i = 0; i < sc->norm.count; i++) {
        const g4_segment *g = &sc->norm.items[i];
        if (g->end == g->start) continue; /* empty splits are dropped, even added tokens' */
        if (g->token >= 0) {
            if (!g4_id_list_push(out, t->added[g->token].id)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
            if (over_limit(out, max_ids)) return G4_ERR_LIMIT;
            continue;
        }
        if (!g4_pre_tokenize(&t->pre_tokenizer, s + g->start, g->end - g->start, &sc->words))
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
        for (size_t w = 0; w < sc->words.count; w++) {
            const g4_segment *word = &sc->words.items[w];
            g4_status st = g4_bpe_encode_word(t, s + g->start + word->start, word->end - word->start, sc->bpe, out);
            if (!st) st = over_limit(out, max_ids);
            if (st) return st;
        }
    }
    return G4_OK;
}

static g4_status encode_text(const g4_tokenizer *t, const char *s, size_t n, int flags, size_t max_ids,
                             g4_id_list *out) {
    int plain = (flags & G4_TOK_PLAIN_TEXT) != 0;
    encode_scratch sc = {0};
    sc.bpe = g4_bpe_work_new();
    if (!sc.bpe || !g4_added_split(t, &t->raw_trie, s, n, plain, &sc.raw)) {
        scratch_free(&sc);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
    }
    g4_status st = G4_OK;
    for (size_t i = 0; i < sc.raw.count && !st; i++) {
        const g4_segment *g = &sc.raw.items[i];
        if (g->end == g->start) continue; /* empty splits are dropped, even added tokens' */
        if (g->token >= 0) {
            if (!g4_id_list_push(out, t->added[g->token].id)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
            if (!st) st = over_limit(out, max_ids);
            continue;
        }
        if (t->normalizer.count == 0) {
            st = encode_normalized(t, s + g->start, g->end - g->start, plain, max_ids, &sc, out);
            continue;
        }
        if (!g4_normalize(&t->normalizer, s + g->start, g->end - g->start, &sc.normalized)) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
            break;
        }
        if (sc.normalized.len) st = encode_normalized(t, sc.normalized.data, sc.normalized.len, plain, max_ids, &sc, out);
    }
    scratch_free(&sc);
    return st;
}

g4_status g4_tokenizer_encode(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                              size_t *n) {
    return g4_tokenizer_encode_max(t, text, len, flags, 0, ids, n);
}

static const char SPAN_OPEN[] = "\xEF\xB7\x90", SPAN_CLOSE[] = "\xEF\xB7\x91"; /* U+FDD0, U+FDD1 */

static const char *find3(const char *s, size_t n, const char *what) {
    for (size_t i = 0; i + 3 <= n; i++)
        if (s[i] == what[0] && s[i + 1] == what[1] && s[i + 2] == what[2]) return s + i;
    return NULL;
}

/* Text outside the spans as the flags say, text inside as plain text. */
static g4_status encode_spans(const g4_tokenizer *t, const char *s, size_t n, int flags, size_t max_ids,
                              g4_id_list *out) {
    size_t pos = 0;
    g4_status st = G4_OK;
    while (pos < n && !st) {
        const char *open = find3(s + pos, n - pos, SPAN_OPEN);
        size_t end = open ? (size_t)(open - s) : n;
        if (end > pos) st = encode_text(t, s + pos, end - pos, flags, max_ids, out);
        if (!open || st) break;
        size_t from = end + 3;
        const char *close = find3(s + from, n - from, SPAN_CLOSE);
        size_t stop = close ? (size_t)(close - s) : n;
        if (stop > from) st = encode_text(t, s + from, stop - from, flags | G4_TOK_PLAIN_TEXT, max_ids, out);
        pos = close ? stop + 3 : n;
    }
    return st;
}

g4_status g4_tokenizer_escape_special(const g4_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    g4_segments segs = {0};
    g4_strbuf b = {0};
    int ok = g4_added_split(t, &t->raw_trie, s, n, 0, &segs);
    for (size_t i = 0; ok && i < segs.count; i++) {
        const g4_segment *g = &segs.items[i];
        if (g->token >= 0 && t->added[g->token].special) {
            ok = g4_strbuf_append(&b, SPAN_OPEN, 3) && g4_strbuf_append(&b, s + g->start, g->end - g->start) &&
                 g4_strbuf_append(&b, SPAN_CLOSE, 3);
            continue;
        }
        /* the marks themselves, typed in: no longer marks */
        for (size_t k = g->start; ok && k < g->end;) {
            if (k + 3 <= g->end && (find3(s + k, 3, SPAN_OPEN) || find3(s + k, 3, SPAN_CLOSE))) {
                ok = g4_strbuf_append(&b, "\xEF\xBF\xBD", 3);
                k += 3;
            } else {
                ok = g4_strbuf_push(&b, s[k]);
                k++;
            }
        }
    }
    free(segs.items);
    if (ok) ok = g4_strbuf_reserve(&b, 0);
    if (!ok) {
        g4_strbuf_free(&b);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "escape");
    }
    b.data[b.len] = 0;
    *out = b.data;
    *out_len = b.len;
    return G4_OK;
}

g4_status g4_tokenizer_encode_max(const g4_tokenizer *t, const char *text, size_t len, int flags, size_t max_ids,
                                  int32_t **ids, size_t *n) {
    if (!t || !ids || !n || (!text && len)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "encode: missing argument");
    *ids = NULL;
    *n = 0;
    if (!text) text = "";
    char *repaired = NULL;
    if (!g4_utf8_valid(text, len)) {
        repaired = g4_utf8_repair(text, len, &len);
        if (!repaired) return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
        text = repaired;
    }
    g4_id_list body = {0}, full = {0};
    g4_status st = (flags & G4_TOK_ESCAPED_SPANS) ? encode_spans(t, text, len, flags & ~G4_TOK_ESCAPED_SPANS, max_ids, &body)
                                                  : encode_text(t, text, len, flags, max_ids, &body);
    free(repaired);
    if (!st && (flags & G4_TOK_ADD_SPECIAL) && t->post) {
        for (int i = 0; i < t->n_post && !st; i++) {
            const g4_template_piece *p = &t->post[i];
            if (p->n_ids < 0) {
                for (size_t j = 0; j < body.count && !st; j++)
                    if (!g4_id_list_push(&full, body.data[j])) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
            } else {
                for (int j = 0; j < p->n_ids && !st; j++)
                    if (!g4_id_list_push(&full, p->ids[j])) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
            }
        }
        free(body.data);
        body = full;
    }
    if (st) {
        free(body.data);
        return st;
    }
    if (!body.data) body.data = malloc(sizeof(int32_t)); /* a valid pointer even for no ids */
    if (!body.data) return g4_fail(G4_ERR_OUT_OF_MEMORY, "encode");
    *ids = body.data;
    *n = body.count;
    return G4_OK;
}

g4_status g4_tokenizer_decode(const g4_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                              size_t *len) {
    if (!t || !text || (!ids && n)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "decode: missing argument");
    *text = NULL;
    if (len) *len = 0;
    g4_strlist list = {0}, tmp = {0};
    g4_status st = G4_OK;
    for (size_t i = 0; i < n && !st; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_text[id]) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "decode: id %d at position %zu is not in the vocabulary (0..%d)", (int)id, i,
                         (int)t->n_ids - 1);
            break;
        }
        if (skip_special && t->id_special[id]) continue;
        if (!t->has_decoder && list.count && !g4_strbuf_push(&list.bytes, ' ')) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "decode");
        if (!g4_strlist_push(&list, t->id_text[id], t->id_len[id])) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "decode");
    }
    if (!st && t->has_decoder && !g4_decode_steps(&t->decoder, 0, t->decoder.count, &list, &tmp))
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "decode");
    g4_strlist_free(&tmp);
    if (!st && !g4_strbuf_reserve(&list.bytes, 0)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "decode");
    if (st) {
        g4_strlist_free(&list);
        return st;
    }
    /* entries are stored back to back, so the bytes are their concatenation */
    list.bytes.data[list.bytes.len] = 0;
    *text = list.bytes.data;
    if (len) *len = list.bytes.len;
    list.bytes.data = NULL;
    g4_strlist_free(&list);
    return G4_OK;
}
