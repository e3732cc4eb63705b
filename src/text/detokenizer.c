/* Streaming detokenizer. The decoder steps before the first Fuse act on
 * each token alone, except ByteFallback, which decides on a whole run of
 * <0xNN> tokens; so text is produced per "unit" (one ordinary token, or a
 * byte run closed by the next ordinary token or by flush) and equals the
 * full decode. After Fuse only leading-character Strip steps can be
 * streamed; other decoders are decoded in full at flush. */
#include <stdlib.h>

#include "text/tokenizer_internal.h"
#include "text/utf8.h"

struct g4_detokenizer {
    const g4_tokenizer *t;
    int skip_special;
    int byte_step; /* index of the ByteFallback step, or -1 */
    int fuse_step; /* index of the first Fuse step, or the step count */
    g4_strlist run, unit, tmp;
    g4_strbuf out;
    int emitted;          /* a token was output (no decoder: the next gets a space) */
    int *strip_left;      /* per post-Fuse Strip step: leading chars still to strip */
    g4_id_list held;      /* ids kept for a full decode (non-streamable decoders) */
};

static void reset(g4_detokenizer *d) {
    g4_strlist_clear(&d->run);
    d->emitted = 0;
    d->held.count = 0;
    for (int i = d->fuse_step; i < d->t->decoder.count; i++) d->strip_left[i] = d->t->decoder.items[i].n1;
}

g4_status g4_detokenizer_new(const g4_tokenizer *t, int skip_special, g4_detokenizer **out) {
    if (!t || !out) return g4_fail(G4_ERR_INVALID_ARGUMENT, "detokenizer: missing argument");
    g4_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    d->t = t;
    d->skip_special = skip_special;
    d->byte_step = -1;
    d->fuse_step = t->decoder.count;
    for (int i = t->decoder.count - 1; i >= 0; i--) {
        if (t->decoder.items[i].kind == G4_STEP_FUSE) d->fuse_step = i;
        if (t->decoder.items[i].kind == G4_STEP_BYTE_FALLBACK) d->byte_step = i;
    }
    if (d->byte_step > d->fuse_step) d->byte_step = -1; /* not streamable anyway */
    d->strip_left = calloc((size_t)t->decoder.count + 1, sizeof *d->strip_left);
    if (!d->strip_left) {
        free(d);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    }
    reset(d);
    *out = d;
    return G4_OK;
}

void g4_detokenizer_free(g4_detokenizer *d) {
    if (!d) return;
    g4_strlist_free(&d->run);
    g4_strlist_free(&d->unit);
    g4_strlist_free(&d->tmp);
    g4_strbuf_free(&d->out);
    free(d->strip_left);
    free(d->held.data);
    free(d);
}

/* Decodes the unit (steps from `from` up to Fuse), applies the streamed
 * post-Fuse Strip steps, and appends the text to d->out. */
static int finish_unit(g4_detokenizer *d, int from) {
    const g4_steps *steps = &d->t->decoder;
    if (!g4_decode_steps(steps, from, d->fuse_step, &d->unit, &d->tmp)) return 0;
    const char *s = d->unit.bytes.data ? d->unit.bytes.data : "";
    size_t n = d->unit.bytes.len;
    for (int i = d->fuse_step + 1; i < steps->count; i++) {
        const g4_step *st = &steps->items[i];
        if (st->kind != G4_STEP_STRIP_CHAR || d->strip_left[i] < 0) continue;
        char enc[4];
        size_t k = g4_utf8_encode(st->content_char, enc);
        while (d->strip_left[i] > 0 && n >= k && !memcmp(s, enc, k)) s += k, n -= k, d->strip_left[i]--;
        if (n) d->strip_left[i] = -1; /* past the start of the text: nothing more to strip */
    }
    return g4_strbuf_append(&d->out, s, n);
}

static g4_status emit(g4_detokenizer *d, const char **text, size_t *len) {
    *text = d->out.data ? d->out.data : "";
    *len = d->out.len;
    return G4_OK;
}

g4_status g4_detokenizer_push(g4_detokenizer *d, int32_t id, const char **text, size_t *len) {
    if (!d || !text || !len) return g4_fail(G4_ERR_INVALID_ARGUMENT, "detokenizer: missing argument");
    const g4_tokenizer *t = d->t;
    g4_strbuf_clear(&d->out);
    if (id < 0 || id >= t->n_ids || !t->id_text[id])
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "detokenizer: id %d is not in the vocabulary (0..%d)", (int)id, (int)t->n_ids - 1);
    if (d->skip_special && t->id_special[id]) return emit(d, text, len);
    if (!t->decoder_streamable) {
        if (!g4_id_list_push(&d->held, id)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
        return emit(d, text, len);
    }
    if (!t->has_decoder) { /* tokens joined by spaces */
        if ((d->emitted && !g4_strbuf_push(&d->out, ' ')) || !g4_strbuf_append(&d->out, t->id_text[id], t->id_len[id]))
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
        d->emitted = 1;
        return emit(d, text, len);
    }
    g4_strlist_clear(&d->unit);
    int ok = g4_strlist_push(&d->unit, t->id_text[id], t->id_len[id]);
    if (d->byte_step < 0) {
        ok = ok && finish_unit(d, 0);
        return ok ? emit(d, text, len) : g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    }
    /* the per-token steps before ByteFallback, then: part of a byte run? */
    ok = ok && g4_decode_steps(&t->decoder, 0, d->byte_step, &d->unit, &d->tmp);
    if (!ok) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    const char *s = d->unit.bytes.data ? d->unit.bytes.data : "";
    if (d->unit.count == 1 && g4_byte_token_value(s, d->unit.len[0]) >= 0) {
        if (!g4_strlist_push(&d->run, s, d->unit.len[0])) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
        return emit(d, text, len);
    }
    /* close the run: unit = run + this token */
    g4_strlist_clear(&d->tmp);
    for (size_t i = 0; i < d->run.count && ok; i++) ok = g4_strlist_push(&d->tmp, d->run.bytes.data + d->run.off[i], d->run.len[i]);
    for (size_t i = 0; i < d->unit.count && ok; i++) ok = g4_strlist_push(&d->tmp, d->unit.bytes.data + d->unit.off[i], d->unit.len[i]);
    g4_strlist swap = d->unit;
    d->unit = d->tmp;
    d->tmp = swap;
    g4_strlist_clear(&d->run);
    ok = ok && finish_unit(d, d->byte_step);
    return ok ? emit(d, text, len) : g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
}

g4_status g4_detokenizer_flush(g4_detokenizer *d, const char **text, size_t *len) {
    if (!d || !text || !len) return g4_fail(G4_ERR_INVALID_ARGUMENT, "detokenizer: missing argument");
    g4_strbuf_clear(&d->out);
    if (!d->t->decoder_streamable) {
        char *full;
        size_t n;
        g4_status st = g4_tokenizer_decode(d->t, d->held.data, d->held.count, 0, &full, &n);
        if (st) return st;
        int ok = g4_strbuf_append(&d->out, full, n);
        free(full);
        if (!ok) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    } else if (d->run.count) {
        g4_strlist_clear(&d->unit);
        int ok = 1;
        for (size_t i = 0; i < d->run.count && ok; i++) ok = g4_strlist_push(&d->unit, d->run.bytes.data + d->run.off[i], d->run.len[i]);
        if (!ok || !finish_unit(d, d->byte_step)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "detokenizer");
    }
    reset(d);
    return emit(d, text, len);
}
