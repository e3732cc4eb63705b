/* Model replies: reasoning channel, answer text and tool calls. */
#include <stdio.h>
#include <string.h>

#include "text/chat.h"
#include "text/chat_pyvalue.h"
#include "text/chat_strbuf.h"
#include "text/strbuf.h"

#define STR_DELIM "<|\"|>"
#define STR_DELIM_LEN 5

const char *const g4_chat_stop_token_names[] = {"<turn|>", "<eos>", "<|tool_response>", NULL};

/* ---- Gemma tool-call arguments -> JSON ---- */

typedef struct {
    const char *s;
    size_t len, pos;
} dsl_reader;

static int at(const dsl_reader *r, const char *lit) {
    size_t n = strlen(lit);
    return r->pos + n <= r->len && memcmp(r->s + r->pos, lit, n) == 0;
}

static void skip_space(dsl_reader *r) {
    while (r->pos < r->len && (r->s[r->pos] == ' ' || r->s[r->pos] == '\n' || r->s[r->pos] == '\t' ||
                               r->s[r->pos] == '\r'))
        r->pos++;
}

static g4_status dsl_error(const dsl_reader *r, const char *what) {
    return g4_fail(G4_ERR_FORMAT, "tool call arguments: %s at byte %zu", what, r->pos);
}

/* <|"|>...<|"|> -> heap copy of the inner text */
static g4_status read_delimited(dsl_reader *r, char **out) {
    r->pos += STR_DELIM_LEN;
    const char *start = r->s + r->pos;
    const char *end = NULL;
    for (size_t i = r->pos; i + STR_DELIM_LEN <= r->len; i++)
        if (memcmp(r->s + i, STR_DELIM, STR_DELIM_LEN) == 0) {
            end = r->s + i;
            break;
        }
    if (!end) return dsl_error(r, "unterminated <|\"|> string");
    size_t n = (size_t)(end - start);
    *out = g4_dup_bytes(start, n);
    if (!*out) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    r->pos += n + STR_DELIM_LEN;
    return G4_OK;
}

/* A bare scalar up to the next , } ] (or : for keys). */
static g4_status read_bare(dsl_reader *r, const char *stops, char **out) {
    size_t start = r->pos;
    while (r->pos < r->len && !strchr(stops, r->s[r->pos])) r->pos++;
    size_t a, n;
    py_strip(r->s + start, r->pos - start, &a, &n);
    *out = g4_dup_bytes(r->s + start + a, n);
    if (!*out) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    return G4_OK;
}

static int is_json_number(const char *s) {
    const char *p = s;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return 0;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == 0;
}

static g4_status read_value(dsl_reader *r, int depth, cJSON **out);

static g4_status read_object(dsl_reader *r, int depth, cJSON **out) {
    cJSON *obj = cJSON_CreateObject();
    if (!obj) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    r->pos++; /* { */
    skip_space(r);
    g4_status st = G4_OK;
    if (at(r, "}")) {
        r->pos++;
        *out = obj;
        return G4_OK;
    }
    for (;;) {
        skip_space(r);
        char *key = NULL;
        if (at(r, STR_DELIM)) st = read_delimited(r, &key);
        else st = read_bare(r, ":,}", &key);
        if (st != G4_OK) break;
        skip_space(r);
        if (!at(r, ":") || key[0] == 0) {
            free(key);
            st = dsl_error(r, "expected key:value");
            break;
        }
        r->pos++;
        cJSON *v = NULL;
        st = read_value(r, depth + 1, &v);
        if (st != G4_OK) {
            free(key);
            break;
        }
        cJSON_AddItemToObject(obj, key, v);
        free(key);
        skip_space(r);
        if (at(r, ",")) {
            r->pos++;
            continue;
        }
        if (at(r, "}")) {
            r->pos++;
            break;
        }
        st = dsl_error(r, "expected ',' or '}'");
        break;
    }
    if (st != G4_OK) {
        cJSON_Delete(obj);
        return st;
    }
    *out = obj;
    return G4_OK;
}

static g4_status read_array(dsl_reader *r, int depth, cJSON **out) {
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    r->pos++; /* [ */
    skip_space(r);
    g4_status st = G4_OK;
    if (at(r, "]")) {
        r->pos++;
        *out = arr;
        return G4_OK;
    }
    for (;;) {
        cJSON *v = NULL;
        if ((st = read_value(r, depth + 1, &v)) != G4_OK) break;
        cJSON_AddItemToArray(arr, v);
        skip_space(r);
        if (at(r, ",")) {
            r->pos++;
            continue;
        }
        if (at(r, "]")) {
            r->pos++;
            break;
        }
        st = dsl_error(r, "expected ',' or ']'");
        break;
    }
    if (st != G4_OK) {
        cJSON_Delete(arr);
        return st;
    }
    *out = arr;
    return G4_OK;
}

static g4_status read_value(dsl_reader *r, int depth, cJSON **out) {
    if (depth > 64) return dsl_error(r, "nested deeper than 64 levels");
    skip_space(r);
    if (r->pos >= r->len) return dsl_error(r, "unexpected end");
    if (at(r, "{")) return read_object(r, depth, out);
    if (at(r, "[")) return read_array(r, depth, out);
    char *text = NULL;
    g4_status st;
    int delimited = at(r, STR_DELIM);
    st = delimited ? read_delimited(r, &text) : read_bare(r, ",}]", &text);
    if (st != G4_OK) return st;
    if (delimited) *out = cJSON_CreateString(text);
    else if (text[0] == 0) {
        free(text);
        return dsl_error(r, "missing value");
    } else if (strcmp(text, "true") == 0) *out = cJSON_CreateTrue();
    else if (strcmp(text, "false") == 0) *out = cJSON_CreateFalse();
    else if (strcmp(text, "null") == 0) *out = cJSON_CreateNull();
    else if (is_json_number(text)) *out = cJSON_CreateRaw(text); /* keeps the digits as written */
    else *out = cJSON_CreateString(text); /* a bare word: the model left out the delimiters */
    free(text);
    return *out ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
}

g4_status g4_chat_tool_args_to_json(const char *text, size_t len, char **json_out) {
    dsl_reader r = {text, len, 0};
    *json_out = NULL;
    skip_space(&r);
    if (!at(&r, "{")) return dsl_error(&r, "expected '{'");
    cJSON *obj = NULL;
    g4_status st = read_object(&r, 0, &obj);
    if (st != G4_OK) return st;
    skip_space(&r);
    if (r.pos != r.len) {
        cJSON_Delete(obj);
        return dsl_error(&r, "text after the closing '}'");
    }
    *json_out = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return *json_out ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
}

/* ---- replies ---- */

static const char *find(const char *s, const char *end, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = s; p + n <= end; p++)
        if (*p == needle[0] && memcmp(p, needle, n) == 0) return p;
    return NULL;
}

/* "<|tool_call>call:NAME{...}<tool_call|>" body (between the markers). */
static int parse_call(const char *s, size_t n, g4_tool_call *call) {
    static const char prefix[] = "call:";
    size_t a, len;
    py_strip(s, n, &a, &len);
    s += a;
    if (len < sizeof prefix - 1 || memcmp(s, prefix, sizeof prefix - 1) != 0) return 0;
    const char *name = s + sizeof prefix - 1, *end = s + len;
    const char *brace = memchr(name, '{', (size_t)(end - name));
    if (!brace || brace == name) return 0;
    size_t name_a, name_len;
    py_strip(name, (size_t)(brace - name), &name_a, &name_len);
    if (name_len == 0) return 0;
    char *args = NULL;
    if (g4_chat_tool_args_to_json(brace, (size_t)(end - brace), &args) != G4_OK) return 0;
    call->name = g4_dup_bytes(name + name_a, name_len);
    call->arguments = args;
    if (!call->name) {
        free(args);
        return 0;
    }
    return 1;
}

g4_status g4_chat_parse_reply(const char *text, size_t len, int starts_in_reasoning, g4_chat_reply *out) {
    memset(out, 0, sizeof *out);
    const char *end = text + len;
    for (int i = 0; g4_chat_stop_token_names[i]; i++) {
        const char *stop = find(text, end, g4_chat_stop_token_names[i]);
        if (stop) end = stop;
    }
    chat_strbuf content = {0}, reasoning = {0};
    int have_reasoning = 0;
    g4_tool_call *calls = NULL;
    size_t n_calls = 0, cap_calls = 0;
    const char *p = text;
    if (starts_in_reasoning) {
        const char *close = find(p, end, "<channel|>");
        const char *stop = close ? close : end;
        size_t n = (size_t)(stop - p);
        if (close && n && p[n - 1] == '\n') n--;
        chat_strbuf_append(&reasoning, p, n);
        have_reasoning = 1;
        out->reasoning_open = !close;
        p = close ? close + 10 : end;
    }
    while (p < end) {
        const char *ch = find(p, end, "<|channel>");
        const char *tc = find(p, end, "<|tool_call>");
        const char *next = ch && (!tc || ch < tc) ? ch : tc;
        if (!next) {
            chat_strbuf_append(&content, p, (size_t)(end - p));
            break;
        }
        chat_strbuf_append(&content, p, (size_t)(next - p));
        if (next == ch) {
            /* <|channel>NAME\n ... <channel|> ; the name line is not part of the text */
            const char *body = ch + 10;
            const char *nl = memchr(body, '\n', (size_t)(end - body));
            const char *close = find(body, end, "<channel|>");
            if (nl && (!close || nl < close)) body = nl + 1;
            else body = close ? close : end;
            const char *stop = close ? close : end;
            size_t n = (size_t)(stop - body);
            if (close && n && body[n - 1] == '\n') n--;
            if (have_reasoning && n) chat_strbuf_putc(&reasoning, '\n');
            chat_strbuf_append(&reasoning, body, n);
            have_reasoning = 1;
            out->reasoning_open = !close;
            p = close ? close + 10 : end;
        } else {
            const char *body = tc + 12;
            const char *close = find(body, end, "<tool_call|>");
            g4_tool_call call = {0};
            if (close && parse_call(body, (size_t)(close - body), &call)) {
                if (n_calls == cap_calls) {
                    size_t cap = cap_calls ? cap_calls * 2 : 4;
                    g4_tool_call *grown = realloc(calls, cap * sizeof *grown);
                    if (!grown) {
                        free(call.name);
                        free(call.arguments);
                        content.failed = 1;
                        break;
                    }
                    calls = grown;
                    cap_calls = cap;
                }
                calls[n_calls++] = call;
            } else {
                /* malformed or cut off: keep the raw text as content */
                out->n_malformed_tool_calls++;
                const char *stop = close ? close + 12 : end;
                chat_strbuf_append(&content, tc, (size_t)(stop - tc));
            }
            p = close ? close + 12 : end;
        }
    }
    out->tool_calls = calls;
    out->n_tool_calls = n_calls;
    if (content.failed || reasoning.failed) {
        chat_strbuf_free(&content);
        chat_strbuf_free(&reasoning);
        g4_chat_reply_free(out);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
    }
    chat_strbuf stripped = {0};
    py_strip_append(&stripped, content.data ? content.data : "", content.len);
    chat_strbuf_free(&content);
    g4_status st = chat_strbuf_take(&stripped, &out->content, NULL);
    if (st == G4_OK && have_reasoning) st = chat_strbuf_take(&reasoning, &out->reasoning, NULL);
    chat_strbuf_free(&reasoning);
    if (st != G4_OK) g4_chat_reply_free(out);
    return st;
}

void g4_chat_reply_free(g4_chat_reply *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    for (size_t i = 0; i < r->n_tool_calls; i++) {
        free(r->tool_calls[i].name);
        free(r->tool_calls[i].arguments);
    }
    free(r->tool_calls);
    memset(r, 0, sizeof *r);
}

size_t g4_chat_stop_ids(const g4_generation_config *gc, int32_t (*lookup)(void *ctx, const char *token), void *ctx,
                        int32_t *out, size_t cap) {
    size_t n = 0;
    int32_t cand[G4_MAX_EOS_IDS + 8];
    size_t nc = 0;
    if (gc)
        for (int i = 0; i < gc->n_eos && i < G4_MAX_EOS_IDS; i++) cand[nc++] = gc->eos_ids[i];
    if (lookup)
        for (int i = 0; g4_chat_stop_token_names[i]; i++) {
            int32_t id = lookup(ctx, g4_chat_stop_token_names[i]);
            if (id >= 0) cand[nc++] = id;
        }
    for (size_t i = 0; i < nc && n < cap; i++) {
        int dup = 0;
        for (size_t j = 0; j < n; j++) dup |= out[j] == cand[i];
        if (!dup) out[n++] = cand[i];
    }
    return n;
}
