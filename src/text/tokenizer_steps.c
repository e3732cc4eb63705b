/* Reading the small sections of a tokenizer.json (normalizer,
 * pre_tokenizer, decoder, post_processor) from their cJSON trees into step
 * lists. Types that are not implemented are refused with a clear error
 * rather than approximated. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "text/tokenizer_load.h"
#include "text/utf8.h"

void g4_steps_free(g4_steps *s) {
    for (int i = 0; i < s->count; i++) {
        free(s->items[i].pattern);
        free(s->items[i].content);
    }
    free(s->items);
    s->items = NULL;
    s->count = 0;
}

static g4_step *steps_add(g4_steps *s, g4_step_kind kind) {
    g4_step *p = realloc(s->items, (size_t)(s->count + 1) * sizeof *p);
    if (!p) return NULL;
    s->items = p;
    g4_step *st = &p[s->count++];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    return st;
}

const char *g4_json_type_name(const cJSON *obj) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

int g4_json_bool(const cJSON *obj, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Reads {"String": "..."}; refuses {"Regex": ...}. */
static g4_status read_pattern(const char *label, const char *where, const cJSON *obj, g4_step *st) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (cJSON_IsString(str)) {
        st->pattern_len = strlen(str->valuestring);
        st->pattern = g4_dup_bytes(str->valuestring, st->pattern_len);
        return st->pattern ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    }
    if (cJSON_GetObjectItemCaseSensitive(pat, "Regex"))
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: %s with a Regex pattern is not supported (only String patterns)", label, where);
    return g4_fail(G4_ERR_FORMAT, "%s: %s without a pattern", label, where);
}

static g4_status read_content(const char *label, const char *where, const cJSON *obj, const char *key, g4_step *st) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(c)) return g4_fail(G4_ERR_FORMAT, "%s: %s needs a string \"%s\"", label, where, key);
    st->content_len = strlen(c->valuestring);
    st->content = g4_dup_bytes(c->valuestring, st->content_len);
    return st->content ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
}

g4_status g4_read_normalizer(const char *label, const cJSON *obj, g4_steps *out) {
    if (!obj || cJSON_IsNull(obj)) return G4_OK;
    const char *type = g4_json_type_name(obj);
    if (!type) return g4_fail(G4_ERR_FORMAT, "%s: normalizer without a type", label);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "normalizers"), *it;
        if (!cJSON_IsArray(list)) return g4_fail(G4_ERR_FORMAT, "%s: Sequence normalizer without \"normalizers\"", label);
        cJSON_ArrayForEach(it, list) {
            g4_status st = g4_read_normalizer(label, it, out);
            if (st) return st;
        }
        return G4_OK;
    }
    g4_step *st;
    if (!strcmp(type, "Replace")) {
        if (!(st = steps_add(out, G4_STEP_REPLACE))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        g4_status s = read_pattern(label, "Replace normalizer", obj, st);
        return s ? s : read_content(label, "Replace normalizer", obj, "content", st);
    }
    if (!strcmp(type, "Prepend")) {
        if (!(st = steps_add(out, G4_STEP_PREPEND))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        return read_content(label, "Prepend normalizer", obj, "prepend", st);
    }
    if (!strcmp(type, "Strip")) {
        if (!(st = steps_add(out, G4_STEP_STRIP_SPACE))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        st->n1 = g4_json_bool(obj, "strip_left", 1);
        st->n2 = g4_json_bool(obj, "strip_right", 1);
        return G4_OK;
    }
    return g4_fail(G4_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported (supported: Replace, Prepend, Strip, Sequence)", label, type);
}

static const struct {
    const char *name;
    g4_split_behavior value;
} behaviors[] = {
    {"Removed", G4_SPLIT_REMOVED},
    {"Isolated", G4_SPLIT_ISOLATED},
    {"MergedWithPrevious", G4_SPLIT_MERGED_WITH_PREVIOUS},
    {"MergedWithNext", G4_SPLIT_MERGED_WITH_NEXT},
    {"Contiguous", G4_SPLIT_CONTIGUOUS},
};

g4_status g4_read_pre_tokenizer(const char *label, const cJSON *obj, g4_steps *out) {
    if (!obj || cJSON_IsNull(obj)) return G4_OK;
    const char *type = g4_json_type_name(obj);
    if (!type) return g4_fail(G4_ERR_FORMAT, "%s: pre_tokenizer without a type", label);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "pretokenizers"), *it;
        if (!cJSON_IsArray(list)) return g4_fail(G4_ERR_FORMAT, "%s: Sequence pre_tokenizer without \"pretokenizers\"", label);
        cJSON_ArrayForEach(it, list) {
            g4_status st = g4_read_pre_tokenizer(label, it, out);
            if (st) return st;
        }
        return G4_OK;
    }
    g4_step *st;
    if (!strcmp(type, "Split")) {
        if (!(st = steps_add(out, G4_STEP_SPLIT))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        g4_status s = read_pattern(label, "Split pre_tokenizer", obj, st);
        if (s) return s;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(obj, "behavior");
        if (!cJSON_IsString(b)) return g4_fail(G4_ERR_FORMAT, "%s: Split pre_tokenizer without a behavior", label);
        size_t i = 0;
        while (i < sizeof behaviors / sizeof behaviors[0] && strcmp(behaviors[i].name, b->valuestring)) i++;
        if (i == sizeof behaviors / sizeof behaviors[0])
            return g4_fail(G4_ERR_FORMAT, "%s: unknown Split behavior '%s'", label, b->valuestring);
        st->behavior = behaviors[i].value;
        st->invert = g4_json_bool(obj, "invert", 0);
        return G4_OK;
    }
    if (!strcmp(type, "WhitespaceSplit")) return steps_add(out, G4_STEP_WS_SPLIT) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    return g4_fail(G4_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported (supported: Split with a String pattern, WhitespaceSplit, Sequence)", label, type);
}

static int json_int(const cJSON *obj, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : dflt;
}

g4_status g4_read_decoder(const char *label, const cJSON *obj, g4_steps *out) {
    if (!obj || cJSON_IsNull(obj)) return G4_OK;
    const char *type = g4_json_type_name(obj);
    if (!type) return g4_fail(G4_ERR_FORMAT, "%s: decoder without a type", label);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "decoders"), *it;
        if (!cJSON_IsArray(list)) return g4_fail(G4_ERR_FORMAT, "%s: Sequence decoder without \"decoders\"", label);
        cJSON_ArrayForEach(it, list) {
            g4_status st = g4_read_decoder(label, it, out);
            if (st) return st;
        }
        return G4_OK;
    }
    g4_step *st;
    if (!strcmp(type, "Replace")) {
        if (!(st = steps_add(out, G4_STEP_REPLACE))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        g4_status s = read_pattern(label, "Replace decoder", obj, st);
        return s ? s : read_content(label, "Replace decoder", obj, "content", st);
    }
    if (!strcmp(type, "ByteFallback")) return steps_add(out, G4_STEP_BYTE_FALLBACK) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    if (!strcmp(type, "Fuse")) return steps_add(out, G4_STEP_FUSE) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    if (!strcmp(type, "Strip")) {
        if (!(st = steps_add(out, G4_STEP_STRIP_CHAR))) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, "content");
        uint32_t cp;
        size_t n = cJSON_IsString(c) ? strlen(c->valuestring) : 0;
        if (!n || g4_utf8_decode((const unsigned char *)c->valuestring, n, &cp) != n)
            return g4_fail(G4_ERR_FORMAT, "%s: Strip decoder needs a one-character \"content\"", label);
        st->content_char = cp;
        st->n1 = json_int(obj, "start", 0);
        st->n2 = json_int(obj, "stop", 0);
        if (st->n1 < 0 || st->n2 < 0) return g4_fail(G4_ERR_FORMAT, "%s: Strip decoder with a negative count", label);
        return G4_OK;
    }
    return g4_fail(G4_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported (supported: Replace, ByteFallback, Fuse, Strip, Sequence)", label, type);
}

/* Substitutes `inner` for the Sequence piece of a template (composition of
 * post-processors applied in order). */
static g4_status wrap_template(const char *label, g4_template_piece **pieces, int *n, g4_template_piece *tmpl,
                               int n_tmpl) {
    int seq = -1;
    for (int i = 0; i < n_tmpl; i++)
        if (tmpl[i].n_ids < 0) seq = i;
    if (seq < 0) return g4_fail(G4_ERR_FORMAT, "%s: post_processor template without the sequence", label);
    g4_template_piece *out = malloc((size_t)(n_tmpl - 1 + *n) * sizeof *out);
    if (!out) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    int k = 0;
    for (int i = 0; i < n_tmpl; i++) {
        if (i == seq)
            for (int j = 0; j < *n; j++) out[k++] = (*pieces)[j];
        else
            out[k++] = tmpl[i];
    }
    free(*pieces);
    free(tmpl);
    *pieces = out;
    *n = k;
    return G4_OK;
}

static g4_status special_piece(const char *label, int32_t id, g4_template_piece *p) {
    p->ids = malloc(sizeof(int32_t));
    if (!p->ids) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    p->ids[0] = id;
    p->n_ids = 1;
    return G4_OK;
}

/* [name, id] as BertProcessing stores cls and sep. */
static g4_status pair_id(const char *label, const cJSON *obj, const char *key, int32_t *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    const cJSON *n = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 1) : NULL;
    if (!cJSON_IsNumber(n)) return g4_fail(G4_ERR_FORMAT, "%s: post_processor needs \"%s\": [token, id]", label, key);
    *id = (int32_t)n->valuedouble;
    return G4_OK;
}

g4_status g4_read_post_processor(const char *label, const cJSON *obj, g4_template_piece **pieces, int *n) {
    if (!obj || cJSON_IsNull(obj)) return G4_OK;
    if (!*pieces) { /* start from the bare sequence */
        *pieces = calloc(1, sizeof **pieces);
        if (!*pieces) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        (*pieces)[0].n_ids = -1;
        *n = 1;
    }
    const char *type = g4_json_type_name(obj);
    if (!type) return g4_fail(G4_ERR_FORMAT, "%s: post_processor without a type", label);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, "processors"), *it;
        if (!cJSON_IsArray(list)) return g4_fail(G4_ERR_FORMAT, "%s: Sequence post_processor without \"processors\"", label);
        cJSON_ArrayForEach(it, list) {
            g4_status st = g4_read_post_processor(label, it, pieces, n);
            if (st) return st;
        }
        return G4_OK;
    }
    if (!strcmp(type, "ByteLevel")) return G4_OK; /* only adjusts offsets */
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls, sep;
        g4_status st = pair_id(label, obj, "cls", &cls);
        if (!st) st = pair_id(label, obj, "sep", &sep);
        if (st) return st;
        g4_template_piece *t = calloc(3, sizeof *t);
        if (!t) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
        t[1].n_ids = -1;
        if ((st = special_piece(label, cls, &t[0])) || (st = special_piece(label, sep, &t[2]))) {
            free(t[0].ids);
            free(t);
            return st;
        }
        return wrap_template(label, pieces, n, t, 3);
    }
    if (strcmp(type, "TemplateProcessing"))
        return g4_fail(G4_ERR_UNSUPPORTED, "%s: post_processor type '%s' is not supported (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)", label, type);
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(obj, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(obj, "special_tokens");
    if (!cJSON_IsArray(single)) return g4_fail(G4_ERR_FORMAT, "%s: TemplateProcessing without a \"single\" template", label);
    int count = cJSON_GetArraySize(single);
    g4_template_piece *t = calloc((size_t)(count ? count : 1), sizeof *t);
    if (!t) return g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
    int k = 0;
    const cJSON *it;
    g4_status st = G4_OK;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            t[k++].n_ids = -1;
            continue;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsString(name)) {
            st = g4_fail(G4_ERR_FORMAT, "%s: TemplateProcessing piece is neither SpecialToken nor Sequence", label);
            break;
        }
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *idv;
        if (!cJSON_IsArray(ids)) {
            st = g4_fail(G4_ERR_FORMAT, "%s: TemplateProcessing special token '%s' is not defined", label, name->valuestring);
            break;
        }
        int m = cJSON_GetArraySize(ids), j = 0;
        t[k].ids = malloc((size_t)(m ? m : 1) * sizeof(int32_t));
        if (!t[k].ids) {
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "%s", label);
            break;
        }
        cJSON_ArrayForEach(idv, ids) t[k].ids[j++] = (int32_t)idv->valuedouble;
        t[k++].n_ids = m;
    }
    if (st) {
        for (int i = 0; i < k; i++) free(t[i].ids);
        free(t);
        return st;
    }
    return wrap_template(label, pieces, n, t, k);
}
