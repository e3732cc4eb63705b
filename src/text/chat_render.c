/* Renders a conversation exactly as the Gemma 4 chat_template.jinja does.
 *
 * The code follows the template's structure block by block (macros
 * format_parameters, format_function_declaration, format_argument,
 * strip_thinking, format_tool_response_block; then the system block, the
 * message loop and the generation prompt), with jinja's semantics on the
 * JSON values supplied by chat_pyvalue.c. Comments quote the template where
 * the behaviour is surprising. */
#include <stdio.h>
#include <string.h>

#include "text/chat.h"
#include "text/chat_pyvalue.h"
#include "text/chat_strbuf.h"

#define STR_DELIM "<|\"|>"

typedef struct {
    chat_strbuf out;
} render_ctx;

static int is_str(const cJSON *v, const char *s) { return v && cJSON_IsString(v) && strcmp(v->valuestring, s) == 0; }

static const char *type_of(const cJSON *v) {
    if (!v) return "missing";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an unknown value";
}

static g4_status unsupported_value(const char *where, const cJSON *v) {
    return g4_fail(G4_ERR_UNSUPPORTED, "chat: %s is %s, which the template would print with Python's repr/str; "
                                       "not supported",
                   where, type_of(v));
}

/* {{ v }} */
static g4_status put_str(chat_strbuf *b, const cJSON *v, const char *where) {
    return py_str_append(b, v) ? G4_OK : unsupported_value(where, v);
}

/* {{ v | upper }} */
static g4_status put_upper(chat_strbuf *b, const cJSON *v, const char *where) {
    if (py_upper_append(b, v)) return G4_OK;
    if (cJSON_IsString(v))
        return g4_fail(G4_ERR_UNSUPPORTED, "chat: %s \"%s\" has non-ASCII characters (Unicode upper-casing is not "
                                           "supported)",
                       where, v->valuestring);
    return unsupported_value(where, v);
}

/* (v | upper) == want, without output */
static g4_status upper_equals(const cJSON *v, const char *want, const char *where, int *eq) {
    chat_strbuf tmp = {0};
    g4_status st = put_upper(&tmp, v, where);
    if (st == G4_OK) *eq = tmp.data ? strcmp(tmp.data, want) == 0 : want[0] == 0;
    int failed = tmp.failed;
    chat_strbuf_free(&tmp);
    if (st == G4_OK && failed) return g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
    return st;
}

static const cJSON **sorted_items(const cJSON *obj, size_t *n, g4_status *st) {
    const cJSON **items = py_dictsort(obj, n);
    *st = (*n == (size_t)-1) ? g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory") : G4_OK;
    if (*st != G4_OK) *n = 0;
    return items;
}

/* ---- macro format_argument(argument, escape_keys) ---- */
static g4_status format_argument(chat_strbuf *b, const cJSON *arg, int escape_keys, int depth) {
    if (depth > 64) return g4_fail(G4_ERR_LIMIT, "chat: tool arguments nested deeper than 64 levels");
    if (!arg) {
        /* jinja's Undefined passes the `sequence` test and iterates as empty */
        chat_strbuf_puts(b, "[]");
    } else if (cJSON_IsNull(arg)) {
        chat_strbuf_puts(b, "null");
    } else if (cJSON_IsString(arg)) {
        chat_strbuf_puts(b, STR_DELIM);
        chat_strbuf_puts(b, arg->valuestring);
        chat_strbuf_puts(b, STR_DELIM);
    } else if (cJSON_IsBool(arg)) {
        chat_strbuf_puts(b, cJSON_IsTrue(arg) ? "true" : "false");
    } else if (cJSON_IsObject(arg)) {
        g4_status st;
        size_t n;
        const cJSON **items = sorted_items(arg, &n, &st);
        if (st != G4_OK) return st;
        chat_strbuf_putc(b, '{');
        for (size_t i = 0; i < n && st == G4_OK; i++) {
            if (i) chat_strbuf_putc(b, ',');
            if (escape_keys) chat_strbuf_puts(b, STR_DELIM);
            chat_strbuf_puts(b, items[i]->string);
            if (escape_keys) chat_strbuf_puts(b, STR_DELIM);
            chat_strbuf_putc(b, ':');
            st = format_argument(b, items[i], escape_keys, depth + 1);
        }
        free(items);
        if (st != G4_OK) return st;
        chat_strbuf_putc(b, '}');
    } else if (cJSON_IsArray(arg)) {
        chat_strbuf_putc(b, '[');
        const cJSON *c;
        int first = 1;
        cJSON_ArrayForEach(c, arg) {
            if (!first) chat_strbuf_putc(b, ',');
            first = 0;
            g4_status st = format_argument(b, c, escape_keys, depth + 1);
            if (st != G4_OK) return st;
        }
        chat_strbuf_putc(b, ']');
    } else {
        return put_str(b, arg, "a tool argument");
    }
    return G4_OK;
}

/* "<|"|>a<|"|>,<|"|>b<|"|>" for a `required` list */
static g4_status put_required_list(chat_strbuf *b, const cJSON *list, const char *where) {
    if (!cJSON_IsArray(list))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: %s must be an array (it is %s)", where, type_of(list));
    const cJSON *c;
    int first = 1;
    cJSON_ArrayForEach(c, list) {
        if (!first) chat_strbuf_putc(b, ',');
        first = 0;
        chat_strbuf_puts(b, STR_DELIM);
        g4_status st = put_str(b, c, where);
        if (st != G4_OK) return st;
        chat_strbuf_puts(b, STR_DELIM);
    }
    return G4_OK;
}

/* {%- if add_comma %},{%- else -%} {%- set add_comma = true -%} {% endif -%} */
static void comma(chat_strbuf *b, int *add_comma) {
    if (*add_comma) chat_strbuf_putc(b, ',');
    *add_comma = 1;
}

static int is_standard_key(const char *k) {
    static const char *const keys[] = {"description", "type", "properties", "required", "nullable"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(k, keys[i]) == 0) return 1;
    return 0;
}

static g4_status format_parameters(chat_strbuf *b, const cJSON *properties, int filter_keys, int depth);

/* The items:{...} block of an ARRAY property. */
static g4_status format_items(chat_strbuf *b, const cJSON *items, int depth) {
    g4_status st;
    size_t n;
    const cJSON **kv = sorted_items(items, &n, &st);
    if (st != G4_OK) return st;
    chat_strbuf_puts(b, "items:{");
    int found_first = 0;
    for (size_t i = 0; i < n && st == G4_OK; i++) {
        const cJSON *v = kv[i];
        const char *k = v->string;
        if (cJSON_IsNull(v)) continue; /* item_value is not none */
        if (found_first) chat_strbuf_putc(b, ',');
        found_first = 1;
        if (strcmp(k, "properties") == 0) {
            chat_strbuf_puts(b, "properties:{");
            if (cJSON_IsObject(v)) st = format_parameters(b, v, 0, depth + 1);
            chat_strbuf_putc(b, '}');
        } else if (strcmp(k, "required") == 0) {
            chat_strbuf_puts(b, "required:[");
            st = put_required_list(b, v, "items.required");
            chat_strbuf_putc(b, ']');
        } else if (strcmp(k, "type") == 0) {
            chat_strbuf_puts(b, "type:");
            if (cJSON_IsString(v)) {
                /* format_argument(item_value | upper) */
                chat_strbuf_puts(b, STR_DELIM);
                st = put_upper(b, v, "items.type");
                chat_strbuf_puts(b, STR_DELIM);
            } else if (cJSON_IsArray(v)) {
                /* format_argument(item_value | map('upper') | list) */
                chat_strbuf_putc(b, '[');
                const cJSON *c;
                int first = 1;
                cJSON_ArrayForEach(c, v) {
                    if (!first) chat_strbuf_putc(b, ',');
                    first = 0;
                    chat_strbuf_puts(b, STR_DELIM);
                    if ((st = put_upper(b, c, "items.type[]")) != G4_OK) break;
                    chat_strbuf_puts(b, STR_DELIM);
                }
                chat_strbuf_putc(b, ']');
            } else {
                st = g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: items.type must be a string or an array (it is %s)",
                             type_of(v));
            }
        } else {
            chat_strbuf_puts(b, k);
            chat_strbuf_putc(b, ':');
            st = format_argument(b, v, 1, depth + 1);
        }
    }
    free(kv);
    if (st != G4_OK) return st;
    chat_strbuf_putc(b, '}');
    return G4_OK;
}

/* ---- macro format_parameters(properties, required, filter_keys) ---- */
static g4_status format_parameters(chat_strbuf *b, const cJSON *properties, int filter_keys, int depth) {
    if (depth > 32) return g4_fail(G4_ERR_LIMIT, "chat: tool schema nested deeper than 32 levels");
    if (!cJSON_IsObject(properties))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: tool schema \"properties\" must be an object (it is %s)",
                       type_of(properties));
    g4_status st;
    size_t n;
    const cJSON **kv = sorted_items(properties, &n, &st);
    if (st != G4_OK) return st;
    int found_first = 0;
    for (size_t i = 0; i < n && st == G4_OK; i++) {
        const cJSON *value = kv[i];
        const char *key = value->string;
        if (filter_keys && is_standard_key(key)) continue;
        if (found_first) chat_strbuf_putc(b, ',');
        found_first = 1;
        chat_strbuf_puts(b, key);
        chat_strbuf_puts(b, ":{");
        int add_comma = 0;
        const cJSON *desc = py_getitem(value, "description");
        if (py_truthy(desc)) {
            chat_strbuf_puts(b, "description:" STR_DELIM);
            if ((st = put_str(b, desc, "a property description")) != G4_OK) break;
            chat_strbuf_puts(b, STR_DELIM);
            add_comma = 1;
        }
        const cJSON *type = py_getitem(value, "type");
        int is_string = 0, is_array = 0, is_object = 0;
        if ((st = upper_equals(type, "STRING", "a property type", &is_string)) != G4_OK) break;
        if ((st = upper_equals(type, "ARRAY", "a property type", &is_array)) != G4_OK) break;
        if ((st = upper_equals(type, "OBJECT", "a property type", &is_object)) != G4_OK) break;
        if (is_string) {
            const cJSON *en = py_getitem(value, "enum");
            if (py_truthy(en)) {
                comma(b, &add_comma);
                chat_strbuf_puts(b, "enum:");
                if ((st = format_argument(b, en, 1, depth + 1)) != G4_OK) break;
            }
        } else if (is_array) {
            const cJSON *items = py_getitem(value, "items");
            if (cJSON_IsObject(items) && py_truthy(items)) {
                comma(b, &add_comma);
                if ((st = format_items(b, items, depth)) != G4_OK) break;
            }
        }
        if (py_truthy(py_getitem(value, "nullable"))) {
            comma(b, &add_comma);
            chat_strbuf_puts(b, "nullable:true");
        }
        if (is_object) {
            const cJSON *props = py_getitem(value, "properties");
            if (cJSON_IsObject(props)) {
                comma(b, &add_comma);
                chat_strbuf_puts(b, "properties:{");
                if ((st = format_parameters(b, props, 0, depth + 1)) != G4_OK) break;
                chat_strbuf_putc(b, '}');
            } else if (cJSON_IsObject(value)) {
                /* an object schema without "properties": its own non-standard keys */
                comma(b, &add_comma);
                chat_strbuf_puts(b, "properties:{");
                if ((st = format_parameters(b, value, 1, depth + 1)) != G4_OK) break;
                chat_strbuf_putc(b, '}');
            }
            const cJSON *req = py_getitem(value, "required");
            if (py_truthy(req)) {
                comma(b, &add_comma);
                chat_strbuf_puts(b, "required:[");
                if ((st = put_required_list(b, req, "a property's required")) != G4_OK) break;
                chat_strbuf_putc(b, ']');
            }
        }
        comma(b, &add_comma);
        chat_strbuf_puts(b, "type:" STR_DELIM);
        if ((st = put_upper(b, type, "a property type")) != G4_OK) break;
        chat_strbuf_puts(b, STR_DELIM "}");
    }
    free(kv);
    return st;
}

/* ---- macro format_function_declaration(tool_data) ---- */
static g4_status format_function_declaration(chat_strbuf *b, const cJSON *tool, size_t index) {
    const cJSON *fn = py_getitem(tool, "function");
    if (!cJSON_IsObject(fn))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: tools[%zu].function must be an object (it is %s)", index,
                       type_of(fn));
    g4_status st;
    chat_strbuf_puts(b, "declaration:");
    if ((st = put_str(b, py_getitem(fn, "name"), "a tool name")) != G4_OK) return st;
    chat_strbuf_puts(b, "{description:" STR_DELIM);
    if ((st = put_str(b, py_getitem(fn, "description"), "a tool description")) != G4_OK) return st;
    chat_strbuf_puts(b, STR_DELIM);
    const cJSON *params = py_getitem(fn, "parameters");
    if (py_truthy(params)) {
        chat_strbuf_puts(b, ",parameters:{");
        const cJSON *props = py_getitem(params, "properties");
        if (py_truthy(props)) {
            chat_strbuf_puts(b, "properties:{");
            if ((st = format_parameters(b, props, 0, 0)) != G4_OK) return st;
            chat_strbuf_puts(b, "},");
        }
        const cJSON *req = py_getitem(params, "required");
        if (py_truthy(req)) {
            chat_strbuf_puts(b, "required:[");
            if ((st = put_required_list(b, req, "parameters.required")) != G4_OK) return st;
            chat_strbuf_puts(b, "],");
        }
        const cJSON *type = py_getitem(params, "type");
        if (py_truthy(type)) {
            /* the only '}' closing "parameters:{": without a type it stays open, as in the template */
            chat_strbuf_puts(b, "type:" STR_DELIM);
            if ((st = put_upper(b, type, "parameters.type")) != G4_OK) return st;
            chat_strbuf_puts(b, STR_DELIM "}");
        }
    }
    if (py_getitem(fn, "response")) {
        const cJSON *resp = py_getitem(fn, "response");
        chat_strbuf_puts(b, ",response:{");
        const cJSON *desc = py_getitem(resp, "description");
        if (py_truthy(desc)) {
            chat_strbuf_puts(b, "description:" STR_DELIM);
            if ((st = put_str(b, desc, "a tool response description")) != G4_OK) return st;
            chat_strbuf_puts(b, STR_DELIM ",");
        }
        int is_object = 0;
        const cJSON *type = py_getitem(resp, "type");
        if ((st = upper_equals(type, "OBJECT", "response.type", &is_object)) != G4_OK) return st;
        if (is_object) {
            chat_strbuf_puts(b, "type:" STR_DELIM);
            if ((st = put_upper(b, type, "response.type")) != G4_OK) return st;
            chat_strbuf_puts(b, STR_DELIM "}");
        }
    }
    chat_strbuf_putc(b, '}');
    return G4_OK;
}

/* ---- macro strip_thinking(text): drop <|channel>...<channel|> blocks, then trim ---- */
static void strip_thinking(chat_strbuf *b, const char *text) {
    static const char open[] = "<|channel>", close[] = "<channel|>";
    chat_strbuf kept = {0};
    const char *p = text;
    for (;;) {
        /* for part in text.split('<channel|>') */
        const char *end = strstr(p, close);
        size_t part_len = end ? (size_t)(end - p) : strlen(p);
        /* part.split('<|channel>')[0] when the part holds an opener */
        const char *o = strstr(p, open);
        if (o && o < p + part_len) part_len = (size_t)(o - p);
        chat_strbuf_append(&kept, p, part_len);
        if (!end) break;
        p = end + sizeof close - 1;
    }
    if (kept.failed) b->failed = 1;
    py_strip_append(b, kept.data ? kept.data : "", kept.len);
    chat_strbuf_free(&kept);
}

/* ---- macro format_tool_response_block(tool_name, response) ---- */
static g4_status format_tool_response_block(chat_strbuf *b, const char *tool_name, const cJSON *response) {
    chat_strbuf_puts(b, "<|tool_response>response:");
    chat_strbuf_puts(b, tool_name);
    chat_strbuf_putc(b, '{');
    g4_status st = G4_OK;
    if (cJSON_IsObject(response)) {
        size_t n;
        const cJSON **kv = sorted_items(response, &n, &st);
        if (st != G4_OK) return st;
        for (size_t i = 0; i < n && st == G4_OK; i++) {
            if (i) chat_strbuf_putc(b, ',');
            chat_strbuf_puts(b, kv[i]->string);
            chat_strbuf_putc(b, ':');
            st = format_argument(b, kv[i], 0, 0);
        }
        free(kv);
    } else {
        chat_strbuf_puts(b, "value:");
        st = format_argument(b, response, 0, 0);
    }
    if (st != G4_OK) return st;
    chat_strbuf_puts(b, "}<tool_response|>");
    return G4_OK;
}

static const char *media_placeholder(const cJSON *type) {
    if (is_str(type, "image") || is_str(type, "image_url")) return "<|image|>";
    if (is_str(type, "audio") || is_str(type, "input_audio")) return "<|audio|>";
    if (is_str(type, "video")) return "<|video|>";
    return NULL;
}

/* ---- the system turn's content ---- */
static g4_status render_system_content(chat_strbuf *b, const cJSON *content) {
    if (cJSON_IsString(content)) {
        py_strip_append(b, content->valuestring, strlen(content->valuestring));
    } else if (cJSON_IsArray(content)) {
        /* {{- item['text'] | trim + ' ' -}} for every part, media parts included */
        const cJSON *item;
        size_t i = 0;
        cJSON_ArrayForEach(item, content) {
            if (!cJSON_IsObject(item))
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[0].content[%zu] must be an object (it is %s)",
                               i, type_of(item));
            const cJSON *text = py_getitem(item, "text");
            if (text && !cJSON_IsString(text))
                return unsupported_value("a system content part's \"text\"", text);
            if (text) py_strip_append(b, text->valuestring, strlen(text->valuestring));
            chat_strbuf_putc(b, ' ');
            i++;
        }
    } else if (cJSON_IsObject(content)) {
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[0].content must be a string or an array of parts "
                                                "(it is an object)");
    }
    return G4_OK;
}

/* ---- a message's content (the template's captured_content) ---- */
static g4_status render_content(chat_strbuf *b, const cJSON *content, int is_model, size_t mi) {
    if (cJSON_IsString(content)) {
        if (is_model) strip_thinking(b, content->valuestring);
        else py_strip_append(b, content->valuestring, strlen(content->valuestring));
    } else if (cJSON_IsArray(content)) {
        const cJSON *item;
        size_t i = 0;
        cJSON_ArrayForEach(item, content) {
            if (!cJSON_IsObject(item))
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].content[%zu] must be an object (it is %s)",
                               mi, i, type_of(item));
            const cJSON *type = py_getitem(item, "type");
            const char *media = media_placeholder(type);
            if (is_str(type, "text")) {
                const cJSON *text = py_getitem(item, "text");
                if (!cJSON_IsString(text))
                    return g4_fail(G4_ERR_UNSUPPORTED, "chat: messages[%zu].content[%zu].text must be a string (it is "
                                                       "%s)",
                                   mi, i, type_of(text));
                if (is_model) strip_thinking(b, text->valuestring);
                else py_strip_append(b, text->valuestring, strlen(text->valuestring));
            } else if (media) {
                chat_strbuf_puts(b, media);
            }
            i++;
        }
    } else if (cJSON_IsObject(content)) {
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].content must be a string, an array of parts or "
                                                "null (it is an object)",
                       mi);
    }
    /* null, missing, numbers, booleans: nothing, as in the template */
    return G4_OK;
}

/* The body of a role:tool message following a tool call. */
static g4_status render_tool_message(chat_strbuf *b, const char *name, const cJSON *body, size_t mi) {
    if (cJSON_IsString(body)) return format_tool_response_block(b, name, body);
    if (cJSON_IsArray(body)) {
        chat_strbuf text = {0};
        const cJSON *part;
        size_t i = 0;
        cJSON_ArrayForEach(part, body) {
            if (!cJSON_IsObject(part)) {
                chat_strbuf_free(&text);
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].content[%zu] must be an object (it is %s)",
                               mi, i, type_of(part));
            }
            if (is_str(py_getitem(part, "type"), "text")) {
                const cJSON *t = py_getitem(part, "text");
                if (!cJSON_IsString(t)) {
                    chat_strbuf_free(&text);
                    return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].content[%zu].text must be a string "
                                                            "(it is %s)",
                                   mi, i, type_of(t));
                }
                chat_strbuf_puts(&text, t->valuestring);
            }
            i++;
        }
        cJSON *joined = cJSON_CreateString(text.data ? text.data : "");
        int oom = text.failed || !joined;
        chat_strbuf_free(&text);
        if (oom) {
            cJSON_Delete(joined);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
        }
        g4_status st = format_tool_response_block(b, name, joined);
        cJSON_Delete(joined);
        if (st != G4_OK) return st;
        cJSON_ArrayForEach(part, body) {
            const char *media = media_placeholder(py_getitem(part, "type"));
            if (media) chat_strbuf_puts(b, media);
        }
        return G4_OK;
    }
    if (cJSON_IsObject(body))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].content of a tool message must be a string or "
                                                "an array of parts (it is an object)",
                       mi);
    return format_tool_response_block(b, name, body);
}

static const char *role_of(const cJSON *m) { return py_getitem(m, "role")->valuestring; }

/* message.get('reasoning') or message.get('reasoning_content'), after
 * transformers' _alias_reasoning_fields has set reasoning_content to the
 * first non-None of reasoning_content, thinking, reasoning. */
static const cJSON *thinking_text_of(const cJSON *m) {
    const cJSON *reasoning = py_getitem(m, "reasoning");
    if (py_truthy(reasoning)) return reasoning;
    static const char *const aliases[] = {"reasoning_content", "thinking", "reasoning"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = py_getitem(m, aliases[i]);
        if (v && !cJSON_IsNull(v)) return v;
    }
    return NULL;
}

static g4_status check_messages(const cJSON *messages) {
    if (!cJSON_IsArray(messages))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages must be an array (it is %s)", type_of(messages));
    if (!messages->child) /* transformers refuses an empty conversation */
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: the conversation is empty; give at least one message");
    const cJSON *m;
    size_t i = 0;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu] must be an object (it is %s)", i, type_of(m));
        const cJSON *role = py_getitem(m, "role");
        if (!cJSON_IsString(role))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].role must be a string (it is %s)", i,
                           type_of(role));
        const cJSON *calls = py_getitem(m, "tool_calls");
        if (py_truthy(calls)) {
            if (!cJSON_IsArray(calls))
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_calls must be an array (it is %s)",
                               i, type_of(calls));
            const cJSON *tc;
            size_t j = 0;
            cJSON_ArrayForEach(tc, calls) {
                const cJSON *fn = py_getitem(tc, "function");
                if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn))
                    return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_calls[%zu] must be an object "
                                                            "with a \"function\" object",
                                   i, j);
                if (!cJSON_IsString(py_getitem(fn, "name")))
                    return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_calls[%zu].function.name must "
                                                            "be a string",
                                   i, j);
                const cJSON *args = py_getitem(fn, "arguments");
                if (!cJSON_IsObject(args) && !cJSON_IsNull(args))
                    /* the template's raise_exception */
                    return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_calls[%zu].function.arguments "
                                                            "must be a JSON object (mapping), not %s; deserialize "
                                                            "arguments before rendering",
                                   i, j, type_of(args));
                j++;
            }
        }
        const cJSON *responses = py_getitem(m, "tool_responses");
        if (py_truthy(responses)) {
            if (!cJSON_IsArray(responses))
                return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_responses must be an array", i);
            const cJSON *tr;
            size_t j = 0;
            cJSON_ArrayForEach(tr, responses) {
                const cJSON *name = py_getitem(tr, "name");
                if (!cJSON_IsObject(tr) || (py_truthy(name) && !cJSON_IsString(name)))
                    return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_responses[%zu] must be an "
                                                            "object with a string \"name\"",
                                   i, j);
                j++;
            }
        }
        const cJSON *reasoning = thinking_text_of(m);
        if (py_truthy(reasoning) && !cJSON_IsString(reasoning))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].reasoning must be a string (it is %s)", i,
                           type_of(reasoning));
        i++;
    }
    return G4_OK;
}

typedef enum { PREV_NONE, PREV_THINK, PREV_TOOL, PREV_TOOL_CALL, PREV_TOOL_RESPONSE } prev_type;

g4_status g4_chat_render(g4_chat_variant variant, const cJSON *messages, const cJSON *tools,
                         const g4_chat_options *opt, char **out, size_t *out_len) {
    g4_chat_options defaults = {0};
    if (!opt) opt = &defaults;
    *out = NULL;
    if (out_len) *out_len = 0;
    g4_status st = check_messages(messages);
    if (st != G4_OK) return st;
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: tools must be an array (it is %s)", type_of(tools));

    size_t n_all = (size_t)cJSON_GetArraySize(messages);
    const cJSON **msgs = n_all ? malloc(n_all * sizeof *msgs) : NULL;
    if (n_all && !msgs) return g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
    {
        size_t i = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, messages) msgs[i++] = m;
    }

    chat_strbuf b = {0};
    prev_type prev = PREV_NONE;
    const char *prev_non_tool_role = NULL;
    int thinking = opt->enable_thinking;
    chat_strbuf_puts(&b, opt->bos_token ? opt->bos_token : "<bos>");

    /* System/tool-definition block */
    size_t first = 0; /* loop_messages = messages[first:] */
    int first_is_system = n_all && (strcmp(role_of(msgs[0]), "system") == 0 || strcmp(role_of(msgs[0]), "developer") == 0);
    if (thinking || py_truthy(tools) || first_is_system) {
        chat_strbuf_puts(&b, "<|turn>system\n");
        if (thinking) {
            chat_strbuf_puts(&b, "<|think|>\n");
            prev = PREV_THINK;
        }
        if (first_is_system) {
            if ((st = render_system_content(&b, py_getitem(msgs[0], "content"))) != G4_OK) goto fail;
            first = 1;
        }
        if (py_truthy(tools)) {
            const cJSON *tool;
            size_t ti = 0;
            cJSON_ArrayForEach(tool, tools) {
                chat_strbuf decl = {0};
                st = format_function_declaration(&decl, tool, ti++);
                if (st == G4_OK && decl.failed) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "chat: out of memory");
                if (st == G4_OK) {
                    chat_strbuf_puts(&b, "<|tool>");
                    py_strip_append(&b, decl.data, decl.len);
                    chat_strbuf_puts(&b, "<tool|>");
                }
                chat_strbuf_free(&decl);
                if (st != G4_OK) goto fail;
            }
            prev = PREV_TOOL;
        }
        chat_strbuf_puts(&b, "<turn|>\n");
    }

    const cJSON **loop = msgs + first;
    size_t n = n_all - first;
    long last_user = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(role_of(loop[i]), "user") == 0) last_user = (long)i;

    for (size_t i = 0; i < n; i++) {
        const cJSON *m = loop[i];
        size_t mi = i + first;
        const char *msg_role = role_of(m);
        if (strcmp(msg_role, "tool") == 0) continue; /* rendered by the preceding tool call */
        prev = PREV_NONE;
        int is_assistant = strcmp(msg_role, "assistant") == 0;
        const char *role = is_assistant ? "model" : msg_role;
        int is_model = strcmp(role, "model") == 0;
        int continue_same_model_turn = is_model && prev_non_tool_role && strcmp(prev_non_tool_role, "assistant") == 0;
        if (!continue_same_model_turn) {
            chat_strbuf_puts(&b, "<|turn>");
            chat_strbuf_puts(&b, role);
            chat_strbuf_putc(&b, '\n');
        }

        const cJSON *calls = py_getitem(m, "tool_calls");
        int has_calls = py_truthy(calls);
        const cJSON *thinking_text = thinking_text_of(m);
        int thinking_gate = (long)i > last_user || (opt->preserve_thinking && has_calls);
        if (py_truthy(thinking_text) && thinking_gate) {
            chat_strbuf_puts(&b, "<|channel>thought\n");
            chat_strbuf_puts(&b, thinking_text->valuestring);
            chat_strbuf_puts(&b, "\n<channel|>");
        }

        if (has_calls) {
            const cJSON *tc;
            cJSON_ArrayForEach(tc, calls) {
                const cJSON *fn = py_getitem(tc, "function");
                chat_strbuf_puts(&b, "<|tool_call>call:");
                chat_strbuf_puts(&b, py_getitem(fn, "name")->valuestring);
                chat_strbuf_putc(&b, '{');
                const cJSON *args = py_getitem(fn, "arguments");
                if (cJSON_IsObject(args)) {
                    size_t na;
                    const cJSON **kv = sorted_items(args, &na, &st);
                    for (size_t k = 0; k < na && st == G4_OK; k++) {
                        if (k) chat_strbuf_putc(&b, ',');
                        chat_strbuf_puts(&b, kv[k]->string);
                        chat_strbuf_putc(&b, ':');
                        st = format_argument(&b, kv[k], 0, 0);
                    }
                    free(kv);
                    if (st != G4_OK) goto fail;
                }
                chat_strbuf_puts(&b, "}<tool_call|>");
            }
            prev = PREV_TOOL_CALL;
        }

        int responded = 0; /* ns_tr_out.flag */
        const cJSON *responses = py_getitem(m, "tool_responses");
        if (py_truthy(responses)) {
            /* legacy: tool_responses embedded in the assistant message */
            const cJSON *tr;
            cJSON_ArrayForEach(tr, responses) {
                const cJSON *name = py_getitem(tr, "name");
                const char *tool_name = py_truthy(name) ? name->valuestring : "unknown";
                if ((st = format_tool_response_block(&b, tool_name, py_getitem(tr, "response"))) != G4_OK) goto fail;
                responded = 1;
                prev = PREV_TOOL_RESPONSE;
            }
        } else if (has_calls) {
            /* OpenAI shape: the role:tool messages that follow */
            for (size_t k = i + 1; k < n && strcmp(role_of(loop[k]), "tool") == 0; k++) {
                const cJSON *follow = loop[k];
                const cJSON *fname = py_getitem(follow, "name");
                const cJSON *name = py_truthy(fname) ? fname : NULL;
                const cJSON *call_id = py_getitem(follow, "tool_call_id");
                const cJSON *tc;
                cJSON_ArrayForEach(tc, calls) {
                    /* tc.get('id') == follow.get('tool_call_id'): two missing ids match */
                    if (py_equal(py_getitem(tc, "id"), call_id)) name = py_getitem(py_getitem(tc, "function"), "name");
                }
                if (name && !cJSON_IsString(name)) {
                    st = g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].name must be a string (it is %s)",
                                 k + first, type_of(name));
                    goto fail;
                }
                st = render_tool_message(&b, name ? name->valuestring : "unknown", py_getitem(follow, "content"),
                                         k + first);
                if (st != G4_OK) goto fail;
                responded = 1;
                prev = PREV_TOOL_RESPONSE;
            }
        }

        size_t content_start = b.len;
        if ((st = render_content(&b, py_getitem(m, "content"), is_model, mi)) != G4_OK) goto fail;
        size_t a, content_len;
        py_strip(b.data ? b.data + content_start : "", b.len - content_start, &a, &content_len);
        int has_content = content_len > 0;

        const char *next_role = NULL;
        for (size_t k = i + 1; k < n && !next_role; k++)
            if (strcmp(role_of(loop[k]), "tool") != 0) next_role = role_of(loop[k]);
        int continues_into_next = is_model && next_role && strcmp(next_role, "assistant") == 0 &&
                                  (!has_calls || responded);
        if (prev == PREV_TOOL_CALL && !responded) {
            chat_strbuf_puts(&b, "<|tool_response>");
        } else if (continues_into_next) {
            /* the next assistant message continues this model turn */
        } else if (!(responded && !has_content && !next_role)) {
            chat_strbuf_puts(&b, "<turn|>\n");
        }
        prev_non_tool_role = msg_role;
    }

    if (opt->add_generation_prompt) {
        if (prev != PREV_TOOL_RESPONSE && prev != PREV_TOOL_CALL) {
            chat_strbuf_puts(&b, "<|turn>model\n");
            if (variant == G4_CHAT_LARGE && !thinking) chat_strbuf_puts(&b, "<|channel>thought\n<channel|>");
        } else if (prev == PREV_TOOL_RESPONSE && thinking) {
            chat_strbuf_puts(&b, "<|channel>thought\n");
        }
    }
    free(msgs);
    return chat_strbuf_take(&b, out, out_len);

fail:
    free(msgs);
    chat_strbuf_free(&b);
    return st;
}

g4_status g4_chat_normalize_tool_arguments(cJSON *messages) {
    if (!cJSON_IsArray(messages)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages must be an array");
    cJSON *m;
    size_t i = 0;
    cJSON_ArrayForEach(m, messages) {
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        cJSON *tc;
        size_t j = 0;
        if (cJSON_IsArray(calls)) cJSON_ArrayForEach(tc, calls) {
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                if (cJSON_IsString(args)) {
                    cJSON *parsed = cJSON_Parse(args->valuestring);
                    if (!cJSON_IsObject(parsed)) {
                        cJSON_Delete(parsed);
                        return g4_fail(G4_ERR_INVALID_ARGUMENT, "chat: messages[%zu].tool_calls[%zu].function."
                                                                "arguments is not a JSON object",
                                       i, j);
                    }
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
                }
                j++;
            }
        i++;
    }
    return G4_OK;
}

int g4_chat_prompt_opens_reasoning(const char *prompt, size_t len) {
    static const char tail[] = "<|channel>thought\n";
    size_t n = sizeof tail - 1;
    return len >= n && memcmp(prompt + len - n, tail, n) == 0;
}
