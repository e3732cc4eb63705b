/* Loading a tokenizer.json. The file is walked with a pull scanner: the
 * vocabulary and merges (the bulk of a 14 MB Gemma file) go straight into
 * hash tables, and only the small sections are parsed with cJSON. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/file.h"
#include "base/log.h"
#include "text/json_scan.h"
#include "text/tokenizer_load.h"
#include "text/utf8.h"

#define MAX_TOKEN_ID (1 << 26)
#define MAX_FILE_BYTES ((size_t)1 << 30)

typedef struct {
    const char *start;
    size_t len;
} extent;

/* Raw extents of the sections, collected in one pass over the file. */
typedef struct {
    extent added_tokens, normalizer, pre_tokenizer, post_processor, decoder;
    int have_model;
    extent type, vocab, merges, unk_token, prefix, suffix, dropout;
    int fuse_unk, byte_fallback, ignore_merges;
} sections;

static int key_is(const char *key, size_t n, const char *want) { return strlen(want) == n && !memcmp(key, want, n); }

static int is_null(const extent *e) { return !e->start || (e->len == 4 && !memcmp(e->start, "null", 4)); }

static g4_status read_bool(g4_json_scan *s, const char *key, int *out) {
    const char *v;
    size_t n;
    g4_status st = g4_json_skip(s, &v, &n);
    if (st) return st;
    if (n == 4 && !memcmp(v, "true", 4)) *out = 1;
    else if (n == 5 && !memcmp(v, "false", 5)) *out = 0;
    else if (!(n == 4 && !memcmp(v, "null", 4))) {
        char what[96];
        snprintf(what, sizeof what, "\"%s\" must be true or false", key);
        return g4_json_error(s, what);
    }
    return G4_OK;
}

static g4_status scan_model(g4_json_scan *s, sections *sec, g4_strbuf *key_buf) {
    g4_status st = g4_json_expect(s, '{');
    int first = 1, done = 0;
    while (!st) {
        const char *key;
        size_t kn;
        if ((st = g4_json_next_member(s, &first, &done, key_buf, &key, &kn)) || done) break;
        extent *e = key_is(key, kn, "type") ? &sec->type
                    : key_is(key, kn, "vocab") ? &sec->vocab
                    : key_is(key, kn, "merges") ? &sec->merges
                    : key_is(key, kn, "unk_token") ? &sec->unk_token
                    : key_is(key, kn, "continuing_subword_prefix") ? &sec->prefix
                    : key_is(key, kn, "end_of_word_suffix") ? &sec->suffix
                    : key_is(key, kn, "dropout") ? &sec->dropout
                    : NULL;
        if (key_is(key, kn, "fuse_unk")) st = read_bool(s, "fuse_unk", &sec->fuse_unk);
        else if (key_is(key, kn, "byte_fallback")) st = read_bool(s, "byte_fallback", &sec->byte_fallback);
        else if (key_is(key, kn, "ignore_merges")) st = read_bool(s, "ignore_merges", &sec->ignore_merges);
        else {
            extent scratch;
            if (!e) e = &scratch;
            st = g4_json_skip(s, &e->start, &e->len);
        }
    }
    return st;
}

static g4_status scan_top(g4_json_scan *s, sections *sec) {
    g4_strbuf key_buf = {0};
    g4_status st = g4_json_expect(s, '{');
    int first = 1, done = 0;
    while (!st) {
        const char *key;
        size_t kn;
        if ((st = g4_json_next_member(s, &first, &done, &key_buf, &key, &kn)) || done) break;
        if (key_is(key, kn, "model")) {
            sec->have_model = 1;
            st = scan_model(s, sec, &key_buf);
            continue;
        }
        extent *e = key_is(key, kn, "added_tokens") ? &sec->added_tokens
                    : key_is(key, kn, "normalizer") ? &sec->normalizer
                    : key_is(key, kn, "pre_tokenizer") ? &sec->pre_tokenizer
                    : key_is(key, kn, "post_processor") ? &sec->post_processor
                    : key_is(key, kn, "decoder") ? &sec->decoder
                    : NULL;
        int must_be_null = key_is(key, kn, "truncation") || key_is(key, kn, "padding");
        extent scratch;
        if (!e) e = &scratch;
        if ((st = g4_json_skip(s, &e->start, &e->len))) break;
        if (must_be_null && !is_null(e))
            st = g4_fail(G4_ERR_UNSUPPORTED, "%s: \"%.*s\" is set; truncation and padding are not supported", s->label, (int)kn, key);
    }
    if (!st && g4_json_peek(s) >= 0) st = g4_json_error(s, "unexpected text after the top-level object");
    g4_strbuf_free(&key_buf);
    return st;
}

/* A string-or-null extent as a heap string (NULL for null). */
static g4_status extent_string(const char *label, const extent *e, const char *what, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (is_null(e)) return G4_OK;
    g4_json_scan s;
    g4_strbuf buf = {0};
    const char *v;
    g4_json_scan_init(&s, e->start, e->len, label);
    g4_status st = g4_json_string(&s, &buf, &v, len);
    if (st) {
        g4_strbuf_free(&buf);
        return g4_fail_context(st, "model.%s", what);
    }
    *out = malloc(*len + 1);
    if (*out) {
        memcpy(*out, v, *len);
        (*out)[*len] = 0;
    }
    g4_strbuf_free(&buf);
    return *out ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
}

typedef struct {
    uint32_t off, len;
    int32_t id;
} vocab_entry;

/* model.vocab: {"token": id, ...} into the text arena and the vocab map. */
static g4_status load_vocab(g4_tokenizer *t, const extent *e, vocab_entry **entries, size_t *count, int32_t *max_id) {
    g4_json_scan s;
    g4_json_scan_init(&s, e->start, e->len, t->label);
    g4_strbuf arena = {0}, key_buf = {0};
    vocab_entry *ent = NULL;
    size_t n = 0, cap = 0;
    *max_id = -1;
    g4_status st = g4_json_expect(&s, '{');
    int first = 1, done = 0;
    if (!st && !g4_strbuf_reserve(&arena, e->len)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: vocab", t->label);
    while (!st) {
        const char *key;
        size_t kn;
        int64_t id;
        if ((st = g4_json_next_member(&s, &first, &done, &key_buf, &key, &kn)) || done) break;
        if ((st = g4_json_int(&s, &id))) break;
        if (id < 0 || id >= MAX_TOKEN_ID) {
            st = g4_fail(G4_ERR_FORMAT, "%s: vocab id %lld of token '%.*s' is out of range", t->label, (long long)id, (int)kn, key);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            vocab_entry *p = realloc(ent, cap * sizeof *p);
            if (!p) {
                st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: vocab", t->label);
                break;
            }
            ent = p;
        }
        ent[n++] = (vocab_entry){(uint32_t)arena.len, (uint32_t)kn, (int32_t)id};
        if (!g4_strbuf_append(&arena, key, kn) || !g4_strbuf_push(&arena, 0)) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: vocab", t->label);
            break;
        }
        if (id > *max_id) *max_id = (int32_t)id;
    }
    g4_strbuf_free(&key_buf);
    if (!st && !g4_strmap_init(&t->vocab, n)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: vocab", t->label);
    for (size_t i = 0; i < n && !st; i++) {
        int32_t old = g4_strmap_put(&t->vocab, arena.data + ent[i].off, ent[i].len, ent[i].id);
        if (old >= 0)
            st = g4_fail(G4_ERR_FORMAT, "%s: vocab lists token '%s' twice", t->label, arena.data + ent[i].off);
    }
    t->texts = arena.data;
    *entries = ent;
    *count = n;
    return st;
}

/* Merges are resolved in batches: the three hash slots of each merge (left,
 * right, merged token) are prefetched before any is read, which hides most
 * of the cache misses of 1.5 million lookups in a 12 MB table. */
#define MERGE_BATCH 64

typedef struct {
    size_t a_off, a_len, b_off, b_len, c_off, c_len; /* into the batch bytes */
    uint64_t ha, hb, hc;
} pending_merge;

typedef struct {
    pending_merge items[MERGE_BATCH];
    int count;
    size_t first_rank;
    g4_strbuf bytes;
    int32_t *triples; /* (left, right, merged) per rank */
    size_t n, cap;
} merge_batch;

static g4_status resolve_batch(g4_tokenizer *t, merge_batch *mb) {
    const g4_strmap *v = &t->vocab;
    for (int i = 0; i < mb->count; i++) {
        pending_merge *p = &mb->items[i];
        const char *base = mb->bytes.data;
        p->ha = g4_hash_bytes(base + p->a_off, p->a_len);
        p->hb = g4_hash_bytes(base + p->b_off, p->b_len);
        p->hc = g4_hash_bytes(base + p->c_off, p->c_len);
        __builtin_prefetch(&v->slots[g4_strmap_index(v, p->ha)]);
        __builtin_prefetch(&v->slots[g4_strmap_index(v, p->hb)]);
        __builtin_prefetch(&v->slots[g4_strmap_index(v, p->hc)]);
    }
    if (mb->n + (size_t)mb->count > mb->cap) {
        size_t cap = mb->cap ? mb->cap * 2 : 8192;
        int32_t *q = realloc(mb->triples, cap * 3 * sizeof *q);
        if (!q) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: merges", t->label);
        mb->triples = q;
        mb->cap = cap;
    }
    for (int i = 0; i < mb->count; i++) {
        const pending_merge *p = &mb->items[i];
        const char *base = mb->bytes.data;
        size_t rank = mb->first_rank + (size_t)i + 1;
        int32_t ia = g4_strmap_get_hashed(v, base + p->a_off, p->a_len, p->ha);
        int32_t ib = g4_strmap_get_hashed(v, base + p->b_off, p->b_len, p->hb);
        if (ia < 0 || ib < 0)
            return g4_fail(G4_ERR_FORMAT, "%s: merge %zu uses token '%.*s' that is not in the vocab", t->label, rank,
                           (int)(ia < 0 ? p->a_len : p->b_len), base + (ia < 0 ? p->a_off : p->b_off));
        int32_t ic = g4_strmap_get_hashed(v, base + p->c_off, p->c_len, p->hc);
        if (ic < 0)
            return g4_fail(G4_ERR_FORMAT, "%s: merge %zu: the merged token '%.*s' is not in the vocab", t->label, rank,
                           (int)p->c_len, base + p->c_off);
        int32_t *tr = &mb->triples[3 * mb->n++];
        tr[0] = ia, tr[1] = ib, tr[2] = ic;
    }
    mb->first_rank += (size_t)mb->count;
    mb->count = 0;
    g4_strbuf_clear(&mb->bytes);
    return G4_OK;
}

static g4_status queue_merge(g4_tokenizer *t, merge_batch *mb, const char *a, size_t an, const char *b, size_t bn) {
    size_t skip = t->prefix ? t->prefix_len : 0;
    if (bn < skip)
        return g4_fail(G4_ERR_FORMAT, "%s: merge %zu: '%.*s' is shorter than the subword prefix", t->label,
                       mb->first_rank + (size_t)mb->count + 1, (int)bn, b);
    pending_merge *p = &mb->items[mb->count++];
    g4_strbuf *w = &mb->bytes;
    p->a_off = w->len, p->a_len = an;
    p->b_off = w->len + an, p->b_len = bn;
    p->c_off = w->len + an + bn, p->c_len = an + bn - skip;
    if (!g4_strbuf_reserve(w, 2 * (an + bn))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: merges", t->label);
    g4_strbuf_append(w, a, an);
    g4_strbuf_append(w, b, bn);
    g4_strbuf_append(w, a, an);
    g4_strbuf_append(w, b + skip, bn - skip);
    return mb->count == MERGE_BATCH ? resolve_batch(t, mb) : G4_OK;
}

/* model.merges: [["a","b"], ...] or ["a b", ...]; rank = position. */
static g4_status load_merges(g4_tokenizer *t, const extent *e) {
    if (is_null(e)) return g4_merge_map_init(&t->merges, 0) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", t->label);
    g4_json_scan s;
    g4_json_scan_init(&s, e->start, e->len, t->label);
    g4_strbuf buf_a = {0}, buf_b = {0};
    merge_batch *mb = calloc(1, sizeof *mb);
    if (!mb) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: merges", t->label);
    g4_status st = g4_json_expect(&s, '[');
    int first = 1, done = 0;
    while (!st) {
        if ((st = g4_json_next_element(&s, &first, &done)) || done) break;
        const char *a, *b;
        size_t an, bn;
        if (g4_json_peek(&s) == '[') {
            s.p++;
            if ((st = g4_json_string(&s, &buf_a, &a, &an)) || (st = g4_json_expect(&s, ',')) ||
                (st = g4_json_string(&s, &buf_b, &b, &bn)) || (st = g4_json_expect(&s, ']')))
                break;
        } else {
            const char *line;
            size_t ln;
            if ((st = g4_json_string(&s, &buf_a, &line, &ln))) break;
            const char *sp = memchr(line, ' ', ln);
            if (!sp || memchr(sp + 1, ' ', ln - (size_t)(sp + 1 - line))) {
                st = g4_fail(G4_ERR_FORMAT, "%s: merge %zu is not two tokens separated by one space", t->label,
                             mb->first_rank + (size_t)mb->count + 1);
                break;
            }
            a = line, an = (size_t)(sp - line), b = sp + 1, bn = ln - an - 1;
        }
        st = queue_merge(t, mb, a, an, b, bn);
    }
    if (!st && mb->count) st = resolve_batch(t, mb);
    if (!st && !g4_merge_map_init(&t->merges, mb->n)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: merges", t->label);
    for (size_t i = 0; i < mb->n && !st; i++)
        g4_merge_map_put(&t->merges, mb->triples[3 * i], mb->triples[3 * i + 1], (uint32_t)i, mb->triples[3 * i + 2]);
    free(mb->triples);
    g4_strbuf_free(&mb->bytes);
    free(mb);
    g4_strbuf_free(&buf_a);
    g4_strbuf_free(&buf_b);
    return st;
}

/* added_tokens, with `tokenizers`' AddedVocabulary::add_tokens rules: a
 * token already in the vocab keeps its id, a new one gets the next id past
 * the vocab; repeated contents update the flags of the first. */
static g4_status load_added(g4_tokenizer *t, const cJSON *list, size_t vocab_count, int32_t *max_id) {
    if (!list || cJSON_IsNull(list)) return G4_OK;
    if (!cJSON_IsArray(list)) return g4_fail(G4_ERR_FORMAT, "%s: added_tokens is not an array", t->label);
    int total = cJSON_GetArraySize(list);
    t->added = calloc((size_t)(total ? total : 1), sizeof *t->added);
    if (!t->added) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", t->label);
    int32_t max_added = -1;
    const cJSON *it;
    int index = 0;
    cJSON_ArrayForEach(it, list) {
        index++;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(content))
            return g4_fail(G4_ERR_FORMAT, "%s: added token %d has no string \"content\"", t->label, index);
        size_t len = strlen(content->valuestring);
        if (!len) continue;
        int special = g4_json_bool(it, "special", 0);
        if (g4_json_bool(it, "single_word", 0))
            return g4_fail(G4_ERR_UNSUPPORTED, "%s: added token '%s' has single_word set, which is not supported", t->label, content->valuestring);
        int32_t k = g4_strmap_get(&t->added_map, content->valuestring, len);
        g4_added_token *a;
        if (k >= 0) {
            a = &t->added[k];
            a->special |= special;
        } else {
            a = &t->added[t->n_added];
            a->content = malloc(len + 1);
            if (!a->content) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", t->label);
            memcpy(a->content, content->valuestring, len + 1);
            a->len = len;
            a->special = special;
            a->id = g4_strmap_get(&t->vocab, a->content, len);
            if (a->id < 0) a->id = max_added >= (int32_t)vocab_count ? max_added + 1 : (int32_t)vocab_count;
            if (a->id >= MAX_TOKEN_ID) return g4_fail(G4_ERR_FORMAT, "%s: too many added tokens", t->label);
            if (g4_strmap_put(&t->added_map, a->content, len, t->n_added) == -2)
                return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", t->label);
            t->n_added++;
        }
        a->normalized = g4_json_bool(it, "normalized", !special);
        a->lstrip = g4_json_bool(it, "lstrip", 0);
        a->rstrip = g4_json_bool(it, "rstrip", 0);
        if (a->id > max_added) max_added = a->id;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (cJSON_IsNumber(id) && (int32_t)id->valuedouble != a->id)
            g4_log(G4_LOG_WARN, "%s: added token '%s' is declared with id %d but gets id %d", t->label, a->content,
                   (int)id->valuedouble, (int)a->id);
    }
    if (max_added > *max_id) *max_id = max_added;
    return G4_OK;
}

static g4_status build_tries(g4_tokenizer *t) {
    g4_trie_init(&t->raw_trie);
    g4_trie_init(&t->norm_trie);
    g4_strbuf norm = {0};
    for (int i = 0; i < t->n_added; i++) {
        g4_added_token *a = &t->added[i];
        int ok;
        if (a->normalized) {
            ok = g4_normalize(&t->normalizer, a->content, a->len, &norm) && g4_trie_add(&t->norm_trie, norm.data, norm.len, i);
            a->text_len = norm.len;
        } else {
            ok = g4_trie_add(&t->raw_trie, a->content, a->len, i);
            g4_strbuf_clear(&norm);
            ok = ok && g4_strbuf_append(&norm, a->content, a->len);
            a->text_len = a->len;
        }
        a->text = ok ? malloc(a->text_len + 1) : NULL;
        if (a->text) {
            memcpy(a->text, norm.data ? norm.data : "", a->text_len);
            a->text[a->text_len] = 0;
        }
        ok = ok && a->text;
        if (!ok) {
            g4_strbuf_free(&norm);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s: added tokens", t->label);
        }
    }
    g4_strbuf_free(&norm);
    return G4_OK;
}

/* Whether decoded text can be emitted token by token (see detokenizer.c). */
static int decoder_streamable(const g4_steps *d) {
    int fused = 0, byte_fallbacks = 0;
    for (int i = 0; i < d->count; i++) {
        g4_step_kind k = d->items[i].kind;
        if (k == G4_STEP_FUSE) fused = 1;
        else if (fused && !(k == G4_STEP_STRIP_CHAR && d->items[i].n2 == 0)) return 0;
        else if (k == G4_STEP_BYTE_FALLBACK && ++byte_fallbacks > 1) return 0;
    }
    return 1;
}

static g4_status build_model(g4_tokenizer *t, const sections *sec) {
    char *type = NULL;
    size_t n;
    g4_status st = extent_string(t->label, &sec->type, "type", &type, &n);
    if (st) return st;
    if (!type && !sec->merges.start) st = g4_fail(G4_ERR_FORMAT, "%s: model has no type", t->label);
    else if (type && strcmp(type, "BPE"))
        st = g4_fail(G4_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", t->label, type);
    free(type);
    if (st) return st;
    if (!sec->vocab.start) return g4_fail(G4_ERR_FORMAT, "%s: BPE model without a vocab", t->label);
    if (!is_null(&sec->dropout)) {
        double p = atof(sec->dropout.start);
        if (p > 0) return g4_fail(G4_ERR_UNSUPPORTED, "%s: BPE dropout (%g) is not supported: it makes encoding random", t->label, p);
    }
    t->fuse_unk = sec->fuse_unk;
    t->byte_fallback = sec->byte_fallback;
    t->ignore_merges = sec->ignore_merges;
    if ((st = extent_string(t->label, &sec->prefix, "continuing_subword_prefix", &t->prefix, &t->prefix_len)) ||
        (st = extent_string(t->label, &sec->suffix, "end_of_word_suffix", &t->suffix, &t->suffix_len)))
        return st;
    return G4_OK;
}

static g4_status build(g4_tokenizer *t, const sections *sec) {
    if (!sec->have_model) return g4_fail(G4_ERR_FORMAT, "%s: no \"model\" section", t->label);
    g4_status st = build_model(t, sec);
    if (st) return st;

    cJSON *norm = NULL, *pre = NULL, *dec = NULL, *post = NULL, *added = NULL;
    const struct {
        const extent *e;
        cJSON **out;
        const char *name;
    } parts[] = {{&sec->normalizer, &norm, "normalizer"},         {&sec->pre_tokenizer, &pre, "pre_tokenizer"},
                 {&sec->decoder, &dec, "decoder"},                {&sec->post_processor, &post, "post_processor"},
                 {&sec->added_tokens, &added, "added_tokens"}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && !st; i++) {
        if (!parts[i].e->start) continue;
        *parts[i].out = cJSON_ParseWithLength(parts[i].e->start, parts[i].e->len);
        if (!*parts[i].out) st = g4_fail(G4_ERR_FORMAT, "%s: \"%s\" is not valid JSON", t->label, parts[i].name);
    }
    vocab_entry *ent = NULL;
    size_t n_vocab = 0;
    int32_t max_id = -1;
    if (!st) st = g4_read_normalizer(t->label, norm, &t->normalizer);
    if (!st) st = g4_read_pre_tokenizer(t->label, pre, &t->pre_tokenizer);
    if (!st) st = g4_read_decoder(t->label, dec, &t->decoder);
    if (!st) st = g4_read_post_processor(t->label, post, &t->post, &t->n_post);
    t->has_decoder = dec && !cJSON_IsNull(dec);
    t->decoder_streamable = decoder_streamable(&t->decoder);
    if (!st) st = load_vocab(t, &sec->vocab, &ent, &n_vocab, &max_id);
    if (!st) st = load_merges(t, &sec->merges);
    if (!st) st = load_added(t, added, n_vocab, &max_id);
    if (!st) st = build_tries(t);
    cJSON_Delete(norm);
    cJSON_Delete(pre);
    cJSON_Delete(dec);
    cJSON_Delete(post);
    cJSON_Delete(added);
    if (st) {
        free(ent);
        return st;
    }

    t->n_ids = max_id + 1;
    t->id_text = calloc((size_t)t->n_ids + 1, sizeof *t->id_text);
    t->id_len = calloc((size_t)t->n_ids + 1, sizeof *t->id_len);
    t->id_special = calloc((size_t)t->n_ids + 1, 1);
    if (!t->id_text || !t->id_len || !t->id_special) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", t->label);
    for (size_t i = 0; i < n_vocab && !st; i++) {
        int32_t id = ent[i].id;
        if (t->id_text[id])
            st = g4_fail(G4_ERR_FORMAT, "%s: vocab gives id %d to both '%s' and '%s'", t->label, (int)id, t->id_text[id],
                         t->texts + ent[i].off);
        t->id_text[id] = t->texts + ent[i].off;
        t->id_len[id] = ent[i].len;
    }
    free(ent);
    if (st) return st;
    for (int i = 0; i < t->n_added; i++) { /* added tokens' texts win, as in id_to_token */
        const g4_added_token *a = &t->added[i];
        t->id_text[a->id] = a->text;
        t->id_len[a->id] = (uint32_t)a->text_len;
    }
    /* special-ness follows the text an id decodes to, as decode's check of
     * the special set does (it differs from the content only for
     * normalized tokens) */
    for (int i = 0; i < t->n_added; i++) {
        int32_t k = g4_strmap_get(&t->added_map, t->added[i].text, t->added[i].text_len);
        t->id_special[t->added[i].id] = k >= 0 && t->added[k].special;
    }

    t->unk_id = -1;
    if (sec->unk_token.start && !is_null(&sec->unk_token)) {
        char *unk;
        size_t un;
        if ((st = extent_string(t->label, &sec->unk_token, "unk_token", &unk, &un))) return st;
        t->unk_id = g4_strmap_get(&t->vocab, unk, un);
        if (t->unk_id < 0) st = g4_fail(G4_ERR_FORMAT, "%s: unk_token '%s' is not in the vocab", t->label, unk);
        free(unk);
        if (st) return st;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = g4_strmap_get(&t->vocab, name, 6);
    }
    for (int c = 0; c < 128; c++) {
        char ch = (char)c;
        t->ascii_ids[c] = g4_strmap_get(&t->vocab, &ch, 1);
    }
    for (int i = 0; i < t->n_post; i++)
        for (int j = 0; j < t->post[i].n_ids; j++)
            if (t->post[i].ids[j] < 0 || t->post[i].ids[j] >= t->n_ids)
                return g4_fail(G4_ERR_FORMAT, "%s: post_processor uses id %d outside the vocabulary", t->label, (int)t->post[i].ids[j]);
    return G4_OK;
}

g4_status g4_tokenizer_load_from_memory(const char *json, size_t len, const char *label, g4_tokenizer **out) {
    *out = NULL;
    if (!json) return g4_fail(G4_ERR_INVALID_ARGUMENT, "tokenizer: no JSON text");
    g4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return g4_fail(G4_ERR_OUT_OF_MEMORY, "tokenizer");
    t->label = strdup(label ? label : "tokenizer.json");
    t->unk_id = -1;
    if (!t->label) {
        free(t);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "tokenizer");
    }
    g4_status st = G4_OK;
    if (!g4_utf8_valid(json, len)) st = g4_fail(G4_ERR_FORMAT, "%s: the file is not valid UTF-8", t->label);
    sections sec = {0};
    g4_json_scan s;
    g4_json_scan_init(&s, json, len, t->label);
    if (!st) st = scan_top(&s, &sec);
    if (!st) st = build(t, &sec);
    if (st) {
        g4_tokenizer_free(t);
        return st;
    }
    *out = t;
    return G4_OK;
}

g4_status g4_tokenizer_load(const char *path_or_dir, g4_tokenizer **out) {
    *out = NULL;
    if (!path_or_dir) return g4_fail(G4_ERR_INVALID_ARGUMENT, "tokenizer: no path");
    char *path = g4_is_directory(path_or_dir) ? g4_path_join(path_or_dir, "tokenizer.json") : strdup(path_or_dir);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "tokenizer");
    char *data = NULL;
    size_t len = 0;
    g4_status st = g4_read_file(path, MAX_FILE_BYTES, &data, &len);
    if (!st) st = g4_tokenizer_load_from_memory(data, len, path, out);
    free(data);
    free(path);
    return st;
}

void g4_tokenizer_free(g4_tokenizer *t) {
    if (!t) return;
    free(t->label);
    free(t->texts);
    free(t->id_text);
    free(t->id_len);
    free(t->id_special);
    g4_strmap_free(&t->vocab);
    g4_merge_map_free(&t->merges);
    free(t->prefix);
    free(t->suffix);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].text);
    }
    free(t->added);
    g4_strmap_free(&t->added_map);
    g4_trie_free(&t->raw_trie);
    g4_trie_free(&t->norm_trie);
    g4_steps_free(&t->normalizer);
    g4_steps_free(&t->pre_tokenizer);
    g4_steps_free(&t->decoder);
    for (int i = 0; i < t->n_post; i++) free(t->post[i].ids);
    free(t->post);
    free(t);
}
