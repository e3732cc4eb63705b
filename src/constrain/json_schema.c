/* JSON Schema -> grammar (see constrain.h for the accepted subset).
 *
 * The grammar describes a subset of the instances the schema accepts, never
 * more: optional properties keep the schema's order, additional properties
 * beside listed ones are never produced, integers have at most 16 digits,
 * date-time days stop at 28 and years start at 0001. Keywords outside the subset are refused with
 * their JSON pointer rather than ignored, so a reply never silently misses
 * a constraint. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/constrain.h"
#include "constrain/regex.h"

typedef struct {
    const cJSON *node;
    int rule;
} memo_entry;

typedef struct {
    g4_gbuilder *b;
    const cJSON *root;
    int dsl;       /* Gemma tool-call syntax instead of JSON */
    int32_t delim; /* <|"|> token id (dsl) */
    memo_entry *memo;
    int n_memo, cap_memo;
    int ws, string, number, integer, boolean, null_, any, key;
    int depth;
} sc;

static const char *const ignored_keywords[] = {"title", "description", "default", "examples", "$schema", "$id",
                                               "$comment", "deprecated", "readOnly", "writeOnly", "strict",
                                               "$defs", "definitions", NULL};
static const char *const known_keywords[] = {"type", "properties", "required", "additionalProperties", "enum",
                                             "const", "anyOf", "allOf", "items", "minItems", "maxItems", "$ref",
                                             "pattern", "format", "nullable", "minLength", "maxLength", NULL};

static int in_list(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], s) == 0) return 1;
    return 0;
}

static int fail_at(sc *c, const char *path, const char *fmt, const char *what) {
    char msg[400];
    snprintf(msg, sizeof msg, fmt, what);
    g4_gb_error(c->b, "json schema: %s at #%s", msg, path);
    return -1;
}

/* path + "/" + segment, escaped as a JSON pointer. */
static void path_push(char *out, size_t cap, const char *path, const char *seg) {
    size_t n = (size_t)snprintf(out, cap, "%s/", path);
    for (const char *p = seg; *p && n + 3 < cap; p++) {
        if (*p == '~') out[n++] = '~', out[n++] = '0';
        else if (*p == '/') out[n++] = '~', out[n++] = '1';
        else out[n++] = *p;
    }
    out[n < cap ? n : cap - 1] = 0;
}

static void path_index(char *out, size_t cap, const char *path, const char *key, int i) {
    snprintf(out, cap, "%s/%s/%d", path, key, i);
}

/* ---- lexical rules ---- */

static int lit_rule(sc *c, const char *text) {
    g4_gseq q = {0};
    g4_gseq_str(&q, text, c->b);
    return g4_gb_seq_rule(c->b, text, &q);
}

static int ws_rule(sc *c) {
    if (c->ws >= 0) return c->ws;
    g4_gbuilder *b = c->b;
    int r = g4_gb_rule(b, "ws");
    g4_gseq q = {0};
    g4_gb_alt(b, r, &q); /* nothing */
    if (!c->dsl) {
        g4_gseq_byte(&q, ' ', b);
        g4_gb_alt(b, r, &q);
        g4_gseq sp = {0};
        g4_gseq_byte(&sp, ' ', b);
        int indent = g4_gb_repeat(b, g4_gb_seq_rule(b, "sp", &sp), 0, 20);
        g4_gseq_byte(&q, '\n', b);
        g4_gseq_rule(&q, indent);
        g4_gb_alt(b, r, &q);
    }
    return c->ws = r;
}

/* The characters of a string: any character, encoded per dialect. */
static int char_rule(sc *c) {
    g4_charclass cc = {0};
    g4_cc_add(&cc, 0, 0x10FFFF);
    int r = g4_cc_rule(c->b, &cc, c->dsl ? G4_CC_DSL : G4_CC_JSON);
    g4_cc_free(&cc);
    return r;
}

/* Opening / closing quote of a string into q. */
static void quote(sc *c, g4_gseq *q) {
    if (c->dsl) g4_gseq_token(q, c->delim);
    else g4_gseq_byte(q, '"', c->b);
}

static int string_of(sc *c, int body) {
    g4_gseq q = {0};
    quote(c, &q);
    g4_gseq_rule(&q, body);
    quote(c, &q);
    return g4_gb_seq_rule(c->b, "string", &q);
}

static int string_rule(sc *c) {
    if (c->string >= 0) return c->string;
    return c->string = string_of(c, g4_gb_star(c->b, char_rule(c)));
}

static int digits(sc *c, int min, int max) {
    g4_byteset d = {{0}};
    g4_byteset_add_range(&d, '0', '9');
    g4_gseq q = {0};
    g4_gseq_class(&q, &d, c->b);
    return g4_gb_repeat(c->b, g4_gb_seq_rule(c->b, "digit", &q), min, max);
}

static int integer_rule(sc *c) {
    if (c->integer >= 0) return c->integer;
    g4_gbuilder *b = c->b;
    int r = g4_gb_rule(b, "integer");
    g4_byteset nz = {{0}};
    g4_byteset_add_range(&nz, '1', '9');
    int more = digits(c, 0, 15);
    int minus = g4_gb_opt(b, lit_rule(c, "-"));
    g4_gseq q = {0};
    g4_gseq_rule(&q, minus);
    g4_gseq_byte(&q, '0', b);
    g4_gb_alt(b, r, &q);
    g4_gseq_rule(&q, minus);
    g4_gseq_class(&q, &nz, b);
    g4_gseq_rule(&q, more);
    g4_gb_alt(b, r, &q);
    return c->integer = r;
}

static int number_rule(sc *c) {
    if (c->number >= 0) return c->number;
    g4_gbuilder *b = c->b;
    g4_gseq q = {0};
    g4_gseq_byte(&q, '.', b);
    g4_gseq_rule(&q, digits(c, 1, 16));
    int frac = g4_gb_opt(b, g4_gb_seq_rule(b, "frac", &q));
    g4_byteset e = {{0}}, sign = {{0}};
    g4_byteset_add(&e, 'e');
    g4_byteset_add(&e, 'E');
    g4_byteset_add(&sign, '+');
    g4_byteset_add(&sign, '-');
    g4_gseq s = {0};
    g4_gseq_class(&s, &sign, b);
    g4_gseq_class(&q, &e, b);
    g4_gseq_rule(&q, g4_gb_opt(b, g4_gb_seq_rule(b, "sign", &s)));
    g4_gseq_rule(&q, digits(c, 1, 2)); /* |exponent| < 100: never an overflow to inf */
    int exp = g4_gb_opt(b, g4_gb_seq_rule(b, "exp", &q));
    g4_gseq_rule(&q, integer_rule(c));
    g4_gseq_rule(&q, frac);
    g4_gseq_rule(&q, exp);
    return c->number = g4_gb_seq_rule(b, "number", &q);
}

static int boolean_rule(sc *c) {
    if (c->boolean >= 0) return c->boolean;
    int r = g4_gb_rule(c->b, "boolean");
    g4_gseq q = {0};
    g4_gseq_str(&q, "true", c->b);
    g4_gb_alt(c->b, r, &q);
    g4_gseq_str(&q, "false", c->b);
    g4_gb_alt(c->b, r, &q);
    return c->boolean = r;
}

static int null_rule(sc *c) {
    if (c->null_ < 0) c->null_ = lit_rule(c, "null");
    return c->null_;
}

/* A bare key of the tool-call syntax (any object's keys). */
static int key_rule(sc *c) {
    if (c->key >= 0) return c->key;
    g4_byteset first = {{0}}, rest = {{0}};
    g4_byteset_add_range(&first, 'a', 'z');
    g4_byteset_add_range(&first, 'A', 'Z');
    g4_byteset_add(&first, '_');
    rest = first;
    g4_byteset_add_range(&rest, '0', '9');
    g4_gseq q = {0};
    g4_gseq_class(&q, &rest, c->b);
    int tail = g4_gb_repeat(c->b, g4_gb_seq_rule(c->b, "keychar", &q), 0, 63);
    g4_gseq_class(&q, &first, c->b);
    g4_gseq_rule(&q, tail);
    return c->key = g4_gb_seq_rule(c->b, "key", &q);
}

/* "{" ws (key ws ":" ws value (ws "," ws key ws ":" ws value)*)? ws "}" */
static int map_rule(sc *c, int value) {
    g4_gbuilder *b = c->b;
    int ws = ws_rule(c);
    g4_gseq q = {0};
    g4_gseq_rule(&q, c->dsl ? key_rule(c) : string_rule(c));
    g4_gseq_rule(&q, ws);
    g4_gseq_byte(&q, ':', b);
    g4_gseq_rule(&q, ws);
    g4_gseq_rule(&q, value);
    int member = g4_gb_seq_rule(b, "member", &q);
    g4_gseq_rule(&q, ws);
    g4_gseq_byte(&q, ',', b);
    g4_gseq_rule(&q, ws);
    g4_gseq_rule(&q, member);
    int more = g4_gb_star(b, g4_gb_seq_rule(b, "more", &q));
    g4_gseq_rule(&q, member);
    g4_gseq_rule(&q, more);
    int members = g4_gb_opt(b, g4_gb_seq_rule(b, "members", &q));
    g4_gseq_byte(&q, '{', b);
    g4_gseq_rule(&q, ws);
    g4_gseq_rule(&q, members);
    g4_gseq_rule(&q, ws);
    g4_gseq_byte(&q, '}', b);
    return g4_gb_seq_rule(b, "map", &q);
}

/* "[" ws (item (ws "," ws item){min-1,max-1})? ws "]" */
static int array_rule(sc *c, int item, int min, int max) {
    g4_gbuilder *b = c->b;
    int ws = ws_rule(c);
    g4_gseq q = {0};
    g4_gseq_rule(&q, ws);
    g4_gseq_byte(&q, ',', b);
    g4_gseq_rule(&q, ws);
    g4_gseq_rule(&q, item);
    int next = g4_gb_seq_rule(b, "next", &q);
    int rest = g4_gb_repeat(b, next, min > 0 ? min - 1 : 0, max < 0 ? -1 : max > 0 ? max - 1 : 0);
    g4_gseq_rule(&q, item);
    g4_gseq_rule(&q, rest);
    int items = g4_gb_seq_rule(b, "items", &q);
    if (min == 0) items = g4_gb_opt(b, items);
    if (max == 0) items = g4_gb_seq_rule(b, "none", &q); /* q is empty: "[]" only */
    g4_gseq_byte(&q, '[', b);
    g4_gseq_rule(&q, ws);
    g4_gseq_rule(&q, items);
    g4_gseq_rule(&q, ws);
    g4_gseq_byte(&q, ']', b);
    return g4_gb_seq_rule(b, "array", &q);
}

static int any_rule(sc *c) {
    if (c->any >= 0) return c->any;
    g4_gbuilder *b = c->b;
    int r = g4_gb_rule(b, "value");
    c->any = r;
    const int alts[6] = {map_rule(c, r), array_rule(c, r, 0, -1), string_rule(c), number_rule(c), boolean_rule(c),
                         null_rule(c)};
    for (int i = 0; i < 6; i++) {
        g4_gseq q = {0};
        g4_gseq_rule(&q, alts[i]);
        g4_gb_alt(b, r, &q);
    }
    return r;
}

/* ---- literal values (enum / const) ---- */

static int cmp_keys(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void emit_value(sc *c, g4_gseq *q, const cJSON *v, const char *path) {
    if (!c->dsl || cJSON_IsNumber(v) || cJSON_IsBool(v) || cJSON_IsNull(v)) {
        if (c->dsl && (cJSON_IsBool(v) || cJSON_IsNull(v))) {
            g4_gseq_str(q, cJSON_IsNull(v) ? "null" : cJSON_IsTrue(v) ? "true" : "false", c->b);
            return;
        }
        char *text = cJSON_PrintUnformatted(v);
        if (!text) {
            g4_gb_error(c->b, "out of memory");
            return;
        }
        g4_gseq_str(q, text, c->b);
        free(text);
        return;
    }
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        for (const char *p = s; *p; p++)
            if (*p == '<' || ((unsigned char)*p < 0x20 && *p != '\n' && *p != '\t')) {
                fail_at(c, path, "%s", "a string value holding '<' or a control character cannot be written in the tool-call syntax");
                return;
            }
        g4_gseq_token(q, c->delim);
        g4_gseq_str(q, s, c->b);
        g4_gseq_token(q, c->delim);
        return;
    }
    if (cJSON_IsArray(v)) {
        g4_gseq_byte(q, '[', c->b);
        int i = 0;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            if (i) g4_gseq_byte(q, ',', c->b);
            emit_value(c, q, e, path);
        }
        g4_gseq_byte(q, ']', c->b);
        return;
    }
    /* an object: keys sorted and bare, as the chat template writes them */
    int n = cJSON_GetArraySize(v);
    const cJSON **keys = malloc((size_t)(n + 1) * sizeof *keys);
    if (!keys) {
        g4_gb_error(c->b, "out of memory");
        return;
    }
    int k = 0;
    for (const cJSON *e = v->child; e; e = e->next) keys[k++] = e;
    qsort(keys, (size_t)k, sizeof *keys, cmp_keys);
    g4_gseq_byte(q, '{', c->b);
    for (int i = 0; i < k; i++) {
        if (i) g4_gseq_byte(q, ',', c->b);
        g4_gseq_str(q, keys[i]->string, c->b);
        g4_gseq_byte(q, ':', c->b);
        emit_value(c, q, keys[i], path);
    }
    g4_gseq_byte(q, '}', c->b);
    free(keys);
}

/* ---- schemas ---- */

static int compile(sc *c, const cJSON *node, const char *path);

static const cJSON *resolve_ref(sc *c, const char *ref, const char *path) {
    if (ref[0] != '#') {
        fail_at(c, path, "only local $ref (\"#...\") is supported, not '%s'", ref);
        return NULL;
    }
    const cJSON *node = c->root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') {
            fail_at(c, path, "bad $ref '%s'", ref);
            return NULL;
        }
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') seg[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') seg[n++] = '/', p += 2;
            else seg[n++] = *p++;
        }
        seg[n] = 0;
        if (cJSON_IsArray(node)) {
            char *end;
            long i = strtol(seg, &end, 10);
            node = *end ? NULL : cJSON_GetArrayItem(node, (int)i);
        } else node = cJSON_IsObject(node) ? cJSON_GetObjectItemCaseSensitive(node, seg) : NULL;
        if (!node) {
            fail_at(c, path, "$ref '%s' points to nothing", ref);
            return NULL;
        }
    }
    return node;
}

static int get_count(sc *c, const cJSON *node, const char *key, int def, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    if (!v) return def;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(int)v->valuedouble ||
        v->valuedouble > G4_GRAMMAR_MAX_REPEAT) {
        char p[600];
        path_push(p, sizeof p, path, key);
        fail_at(c, p, "'%s' must be an integer from 0 to 1000", key);
        return -2;
    }
    return (int)v->valuedouble;
}

static const char *format_regex(const char *format) {
    /* years from 0001: 0000 is no year to the validators built on Python's
     * datetime (rfc3339-validator rejects it), though RFC 3339's grammar allows it */
    static const char date[] = "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])";
    static const char time[] = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    static char buf[256];
    if (strcmp(format, "date") == 0) snprintf(buf, sizeof buf, "^%s$", date);
    else if (strcmp(format, "time") == 0) snprintf(buf, sizeof buf, "^%s$", time);
    else if (strcmp(format, "date-time") == 0) snprintf(buf, sizeof buf, "^%sT%s$", date, time);
    else if (strcmp(format, "uuid") == 0)
        snprintf(buf, sizeof buf, "^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
    else return NULL;
    return buf;
}

static int string_schema(sc *c, const cJSON *node, const char *path) {
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(node, "format");
    int min = get_count(c, node, "minLength", 0, path), max = get_count(c, node, "maxLength", -1, path);
    if (min == -2 || max == -2) return -1;
    if (max >= 0 && max < min) return fail_at(c, path, "%s", "maxLength is below minLength");
    int constrained_length = min > 0 || max >= 0;
    if (pattern || format) {
        if (constrained_length) return fail_at(c, path, "%s", "minLength/maxLength together with pattern or format");
        if (pattern && format) return fail_at(c, path, "%s", "pattern together with format");
        const char *re;
        char p[600];
        if (pattern) {
            if (!cJSON_IsString(pattern)) return fail_at(c, path, "%s", "pattern must be a string");
            re = pattern->valuestring;
            path_push(p, sizeof p, path, "pattern");
        } else {
            if (!cJSON_IsString(format)) return fail_at(c, path, "%s", "format must be a string");
            re = format_regex(format->valuestring);
            path_push(p, sizeof p, path, "format");
            if (!re) return fail_at(c, p, "unsupported format '%s' (date-time, date, time, uuid are)", format->valuestring);
        }
        int body = g4_regex_rule(c->b, re, strlen(re), c->dsl ? G4_CC_DSL : G4_CC_JSON, 1);
        if (body < 0) {
            g4_gb_error_context(c->b, "json schema: %s at #%s", pattern ? "pattern" : "format", p);
            return -1;
        }
        return string_of(c, body);
    }
    if (constrained_length) return string_of(c, g4_gb_repeat(c->b, char_rule(c), min, max));
    return string_rule(c);
}

typedef struct {
    const char *name;
    const cJSON *schema;
    int required;
} prop;

static int cmp_prop(const void *a, const void *b) { return strcmp(((const prop *)a)->name, ((const prop *)b)->name); }

static int object_schema(sc *c, const cJSON *node, const char *path) {
    g4_gbuilder *b = c->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    char p[600];
    if (props && !cJSON_IsObject(props)) return fail_at(c, path, "%s", "properties must be an object");
    if (required && !cJSON_IsArray(required)) return fail_at(c, path, "%s", "required must be an array");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return fail_at(c, path, "%s", "additionalProperties must be a boolean or a schema");
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n == 0) {
        if (required && cJSON_GetArraySize(required) > 0)
            return fail_at(c, path, "%s", "required names without properties");
        if (addl && cJSON_IsFalse(addl)) return lit_rule(c, "{}");
        int value;
        if (addl && cJSON_IsObject(addl)) {
            path_push(p, sizeof p, path, "additionalProperties");
            value = compile(c, addl, p);
        } else value = any_rule(c);
        return value < 0 ? -1 : map_rule(c, value);
    }
    prop *list = calloc((size_t)n, sizeof *list);
    if (!list) return fail_at(c, path, "%s", "out of memory");
    int k = 0;
    for (const cJSON *e = props->child; e; e = e->next) list[k].name = e->string, list[k++].schema = e;
    for (const cJSON *r = required ? required->child : NULL; r; r = r->next) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (cJSON_IsString(r) && strcmp(list[i].name, r->valuestring) == 0) list[i].required = found = 1;
        if (!found) {
            free(list);
            return fail_at(c, path, "required name '%s' is not among the properties",
                           cJSON_IsString(r) ? r->valuestring : "?");
        }
    }
    if (c->dsl) qsort(list, (size_t)n, sizeof *list, cmp_prop); /* the template's dictsort */
    /* A[i]: no property written yet among i..n-1; B[i]: one was, the next needs a comma */
    int *A = malloc((size_t)(n + 1) * sizeof *A), *B = malloc((size_t)(n + 1) * sizeof *B);
    int ws = ws_rule(c), st = 0;
    if (!A || !B) st = fail_at(c, path, "%s", "out of memory");
    for (int i = 0; i <= n && st == 0; i++) {
        A[i] = g4_gb_rule(b, "props");
        B[i] = g4_gb_rule(b, "props_more");
    }
    for (int i = 0; i < n && st == 0; i++) {
        char pp[600];
        path_push(p, sizeof p, path, "properties");
        path_push(pp, sizeof pp, p, list[i].name);
        int value = compile(c, list[i].schema, pp);
        if (value < 0) {
            st = -1;
            break;
        }
        g4_gseq q = {0};
        if (c->dsl) {
            for (const char *s = list[i].name; *s; s++)
                if (strchr(":,{}[]<> \n\t", *s)) {
                    st = fail_at(c, pp, "%s", "a property name with punctuation or spaces cannot be written in the tool-call syntax");
                    break;
                }
            if (st) break;
            g4_gseq_str(&q, list[i].name, b);
        } else {
            cJSON *name = cJSON_CreateString(list[i].name);
            char *text = name ? cJSON_PrintUnformatted(name) : NULL;
            cJSON_Delete(name);
            if (!text) {
                st = fail_at(c, path, "%s", "out of memory");
                break;
            }
            g4_gseq_str(&q, text, b);
            free(text);
        }
        g4_gseq_rule(&q, ws);
        g4_gseq_byte(&q, ':', b);
        g4_gseq_rule(&q, ws);
        g4_gseq_rule(&q, value);
        int member = g4_gb_seq_rule(b, list[i].name, &q);
        g4_gseq_rule(&q, member);
        g4_gseq_rule(&q, B[i + 1]);
        g4_gb_alt(b, A[i], &q);
        g4_gseq_rule(&q, ws);
        g4_gseq_byte(&q, ',', b);
        g4_gseq_rule(&q, ws);
        g4_gseq_rule(&q, member);
        g4_gseq_rule(&q, B[i + 1]);
        g4_gb_alt(b, B[i], &q);
        if (!list[i].required) {
            g4_gseq_rule(&q, A[i + 1]);
            g4_gb_alt(b, A[i], &q);
            g4_gseq_rule(&q, B[i + 1]);
            g4_gb_alt(b, B[i], &q);
        }
    }
    int r = -1;
    if (st == 0) {
        g4_gseq q = {0};
        g4_gb_alt(b, A[n], &q);
        g4_gb_alt(b, B[n], &q);
        g4_gseq_byte(&q, '{', b);
        g4_gseq_rule(&q, ws);
        g4_gseq_rule(&q, A[0]);
        g4_gseq_rule(&q, ws);
        g4_gseq_byte(&q, '}', b);
        r = g4_gb_seq_rule(b, "object", &q);
    }
    free(A);
    free(B);
    free(list);
    return r;
}

static int array_schema(sc *c, const cJSON *node, const char *path) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    int min = get_count(c, node, "minItems", 0, path), max = get_count(c, node, "maxItems", -1, path);
    if (min == -2 || max == -2) return -1;
    if (max >= 0 && max < min) return fail_at(c, path, "%s", "maxItems is below minItems");
    int item;
    if (items) {
        if (!cJSON_IsObject(items) && !cJSON_IsBool(items))
            return fail_at(c, path, "%s", "items must be a schema (tuple items are not supported)");
        char p[600];
        path_push(p, sizeof p, path, "items");
        item = compile(c, items, p);
    } else item = any_rule(c);
    return item < 0 ? -1 : array_rule(c, item, min, max);
}

static int type_schema(sc *c, const cJSON *node, const char *type, const char *path) {
    if (strcmp(type, "string") == 0) return string_schema(c, node, path);
    if (strcmp(type, "number") == 0) return number_rule(c);
    if (strcmp(type, "integer") == 0) return integer_rule(c);
    if (strcmp(type, "boolean") == 0) return boolean_rule(c);
    if (strcmp(type, "null") == 0) return null_rule(c);
    if (strcmp(type, "object") == 0) return object_schema(c, node, path);
    if (strcmp(type, "array") == 0) return array_schema(c, node, path);
    char p[600];
    path_push(p, sizeof p, path, "type");
    return fail_at(c, p, "unknown type '%s'", type);
}

static void add_alt(sc *c, int rule, int sub) {
    g4_gseq q = {0};
    g4_gseq_rule(&q, sub);
    g4_gb_alt(c->b, rule, &q);
}

static int compile_body(sc *c, const cJSON *node, int rule, const char *path) {
    char p[600];
    if (cJSON_IsBool(node)) {
        if (cJSON_IsFalse(node)) return fail_at(c, path, "%s", "the schema 'false' matches nothing");
        add_alt(c, rule, any_rule(c));
        return 0;
    }
    if (!cJSON_IsObject(node)) return fail_at(c, path, "%s", "a schema must be an object or a boolean");
    for (const cJSON *k = node->child; k; k = k->next)
        if (!in_list(known_keywords, k->string) && !in_list(ignored_keywords, k->string)) {
            path_push(p, sizeof p, path, k->string);
            return fail_at(c, p, "unsupported keyword '%s'", k->string);
        }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref");
    const cJSON *enm = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *cnst = cJSON_GetObjectItemCaseSensitive(node, "const");
    const cJSON *any_of = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    const cJSON *all_of = cJSON_GetObjectItemCaseSensitive(node, "allOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    const cJSON *nullable = cJSON_GetObjectItemCaseSensitive(node, "nullable");
    int n_kinds = !!ref + !!enm + !!cnst + !!any_of + !!all_of;
    if (n_kinds > 1) return fail_at(c, path, "%s", "combine at most one of $ref, enum, const, anyOf, allOf");
    if (nullable && cJSON_IsTrue(nullable)) add_alt(c, rule, null_rule(c));
    if (ref) {
        if (!cJSON_IsString(ref)) return fail_at(c, path, "%s", "$ref must be a string");
        path_push(p, sizeof p, path, "$ref");
        const cJSON *target = resolve_ref(c, ref->valuestring, p);
        if (!target) return -1;
        int sub = compile(c, target, ref->valuestring + 1);
        if (sub < 0) return -1;
        add_alt(c, rule, sub);
        return 0;
    }
    if (enm || cnst) {
        if (enm && (!cJSON_IsArray(enm) || cJSON_GetArraySize(enm) == 0))
            return fail_at(c, path, "%s", "enum must be a non-empty array");
        int i = 0;
        for (const cJSON *v = enm ? enm->child : cnst; v; v = enm ? v->next : NULL, i++) {
            path_index(p, sizeof p, path, enm ? "enum" : "const", i);
            g4_gseq q = {0};
            emit_value(c, &q, v, p);
            g4_gb_alt(c->b, rule, &q);
            if (!enm) break;
        }
        return g4_gb_failed(c->b) ? -1 : 0;
    }
    if (any_of || all_of) {
        const cJSON *list = any_of ? any_of : all_of;
        const char *key = any_of ? "anyOf" : "allOf";
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
            return fail_at(c, path, "%s must be a non-empty array", key);
        if (all_of && cJSON_GetArraySize(list) != 1)
            return fail_at(c, path, "%s", "allOf with more than one schema is not supported");
        int i = 0;
        for (const cJSON *s = list->child; s; s = s->next, i++) {
            path_index(p, sizeof p, path, key, i);
            int sub = compile(c, s, p);
            if (sub < 0) return -1;
            add_alt(c, rule, sub);
        }
        return 0;
    }
    if (!type) {
        /* no type: infer it from the keywords, or any value */
        const char *t = cJSON_GetObjectItemCaseSensitive(node, "properties") ||
                                cJSON_GetObjectItemCaseSensitive(node, "additionalProperties")
                            ? "object"
                        : cJSON_GetObjectItemCaseSensitive(node, "items") ? "array"
                        : cJSON_GetObjectItemCaseSensitive(node, "pattern") ||
                                cJSON_GetObjectItemCaseSensitive(node, "format")
                            ? "string"
                            : NULL;
        int sub = t ? type_schema(c, node, t, path) : any_rule(c);
        if (sub < 0) return -1;
        add_alt(c, rule, sub);
        return 0;
    }
    if (cJSON_IsString(type)) {
        int sub = type_schema(c, node, type->valuestring, path);
        if (sub < 0) return -1;
        add_alt(c, rule, sub);
        return 0;
    }
    if (!cJSON_IsArray(type) || cJSON_GetArraySize(type) == 0)
        return fail_at(c, path, "%s", "type must be a string or a non-empty array of strings");
    for (const cJSON *t = type->child; t; t = t->next) {
        if (!cJSON_IsString(t)) return fail_at(c, path, "%s", "type must be a string or a non-empty array of strings");
        int sub = type_schema(c, node, t->valuestring, path);
        if (sub < 0) return -1;
        add_alt(c, rule, sub);
    }
    return 0;
}

static int compile(sc *c, const cJSON *node, const char *path) {
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == node) return c->memo[i].rule;
    if (++c->depth > 200) return fail_at(c, path, "%s", "schema nested deeper than 200 levels");
    int rule = g4_gb_rule(c->b, path[0] ? path : "root");
    if (rule < 0) return -1;
    if (c->n_memo == c->cap_memo) {
        int cap = c->cap_memo ? c->cap_memo * 2 : 32;
        memo_entry *m = realloc(c->memo, (size_t)cap * sizeof *m);
        if (!m) return fail_at(c, path, "%s", "out of memory");
        c->memo = m;
        c->cap_memo = cap;
    }
    c->memo[c->n_memo].node = node;
    c->memo[c->n_memo++].rule = rule;
    int st = compile_body(c, node, rule, path);
    c->depth--;
    return st < 0 || g4_gb_failed(c->b) ? -1 : rule;
}

int g4_json_schema_rule(g4_gbuilder *b, const cJSON *schema, int dsl, int32_t delim_token) {
    sc c = {0};
    c.b = b;
    c.root = schema;
    c.dsl = dsl;
    c.delim = delim_token;
    c.ws = c.string = c.number = c.integer = c.boolean = c.null_ = c.any = c.key = -1;
    int r = compile(&c, schema, "");
    free(c.memo);
    return r;
}

int g4_json_any_object_rule(g4_gbuilder *b, int dsl, int32_t delim_token) {
    sc c = {0};
    c.b = b;
    c.dsl = dsl;
    c.delim = delim_token;
    c.ws = c.string = c.number = c.integer = c.boolean = c.null_ = c.any = c.key = -1;
    return map_rule(&c, any_rule(&c));
}
