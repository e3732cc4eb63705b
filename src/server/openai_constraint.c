/* The request fields that constrain a reply -> one g4_constraint_spec.
 *
 *   response_format {"type": "json_object"} | {"type": "json_schema",
 *       "json_schema": {"name", "schema", "strict"}} | {"type": "text"}  (chat)
 *   tool_choice "required" | {"type": "function", "function": {"name"}}  (chat, with tools)
 *   tools[i].function.strict true, tool_choice "auto": a call, once started, is constrained
 *   json_schema, grammar (llama-server); guided_json, guided_regex,
 *   guided_choice, guided_grammar (vLLM: GBNF here)                    (both endpoints)
 * At most one of them may be given. The schema or grammar itself is
 * compiled later, against the tokenizer (openai_generate.c). */
#include <stdlib.h>
#include <string.h>

#include "server/openai_request.h"

static int set_spec(g4_oai_request *r, g4_constraint_kind kind, const cJSON *value_or_null, const char *text,
                    const char *param, g4_oai_error *err) {
    if (r->constraint.kind != G4_CONSTRAINT_NONE)
        return g4_oai_fail(err, 400, param,
                           "'%s' conflicts with another constraint of the request (response_format, tool_choice, "
                           "json_schema, grammar, guided_*): give one",
                           param);
    r->constraint.kind = kind;
    r->constraint_param = param;
    if (value_or_null) r->constraint.text = cJSON_PrintUnformatted(value_or_null);
    else if (text) r->constraint.text = strdup(text);
    if ((value_or_null || text) && !r->constraint.text) return g4_oai_fail(err, 503, NULL, "out of memory");
    return 0;
}

int g4_oai_parse_format(const cJSON *fmt, int flat, const char *param, g4_oai_request *r, g4_oai_error *err) {
    if (!fmt || cJSON_IsNull(fmt)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(fmt, "type");
    if (!cJSON_IsObject(fmt) || !cJSON_IsString(type))
        return g4_oai_fail(err, 400, param, "%s must be an object with a string 'type'", param);
    if (!strcmp(type->valuestring, "text")) return 0;
    if (!strcmp(type->valuestring, "json_object")) return set_spec(r, G4_CONSTRAINT_JSON_OBJECT, NULL, NULL, param, err);
    if (!strcmp(type->valuestring, "json_schema")) {
        /* chat: {"type", "json_schema": {"name", "schema", "strict"}}; Responses: {"type", "name", "schema", "strict"} */
        const cJSON *js = flat ? fmt : cJSON_GetObjectItemCaseSensitive(fmt, "json_schema");
        if (!cJSON_IsObject(js))
            return g4_oai_fail(err, 400, param, "%s {\"type\": \"json_schema\"} needs 'json_schema': {\"name\", \"schema\"}",
                               param);
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        if (name && !cJSON_IsString(name)) return g4_oai_fail(err, 400, param, "the format's 'name' must be a string");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return g4_oai_fail(err, 400, param, "the format's 'strict' must be a boolean");
        if (!schema) return set_spec(r, G4_CONSTRAINT_JSON_OBJECT, NULL, NULL, param, err);
        if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
            return g4_oai_fail(err, 400, param, "the format's 'schema' must be a JSON Schema object");
        return set_spec(r, G4_CONSTRAINT_JSON_SCHEMA, schema, NULL, param, err);
    }
    return g4_oai_fail(err, 400, param, "%s type must be \"text\", \"json_object\" or \"json_schema\", not \"%s\"",
                       param, type->valuestring);
}

/* tools -> the JSON list of {name, parameters} the tool grammar wants;
 * with `only`, that tool alone; with `strict_only`, parameters only of tools
 * marked strict (the others' arguments are any object). */
static char *tool_list(const cJSON *tools, const char *only, int strict_only) {
    cJSON *list = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (only && strcmp(name->valuestring, only) != 0) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        int strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
        cJSON *item = cJSON_CreateObject();
        cJSON_AddStringToObject(item, "name", name->valuestring);
        if (params && (!strict_only || strict)) cJSON_AddItemToObject(item, "parameters", cJSON_Duplicate(params, 1));
        cJSON_AddItemToArray(list, item);
    }
    char *text = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(list);
    return text;
}

static int parse_tool_choice(const cJSON *root, g4_oai_request *r, g4_oai_error *err) {
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *tools = r->tools;
    const char *only = NULL;
    g4_tool_mode mode;
    if (!choice || cJSON_IsNull(choice) || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto"))) {
        int any_strict = 0;
        const cJSON *t;
        if (tools)
            cJSON_ArrayForEach(t, tools) any_strict |= cJSON_IsTrue(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "strict"));
        if (!any_strict) return 0;
        mode = G4_TOOLS_LAZY;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
        return 0;
    } else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
        if (!tools) return g4_oai_fail(err, 400, "tool_choice", "tool_choice \"required\" needs 'tools'");
        mode = G4_TOOLS_REQUIRED;
    } else if (cJSON_IsObject(choice)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name))
            return g4_oai_fail(err, 400, "tool_choice",
                               "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                               "\"function\": {\"name\": ...}}");
        int found = 0;
        const cJSON *t;
        if (tools)
            cJSON_ArrayForEach(t, tools) found |= !strcmp(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")->valuestring,
                name->valuestring);
        if (!found)
            return g4_oai_fail(err, 400, "tool_choice", "tool_choice names '%s', which is not among the tools",
                               name->valuestring);
        only = name->valuestring;
        mode = G4_TOOLS_NAMED;
    } else {
        return g4_oai_fail(err, 400, "tool_choice",
                           "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
    }
    char *list = tool_list(tools, only, mode == G4_TOOLS_LAZY);
    if (!list) return g4_oai_fail(err, 503, NULL, "out of memory");
    int rc = set_spec(r, G4_CONSTRAINT_TOOL_CALLS, NULL, list, "tool_choice", err);
    free(list);
    r->constraint.tool_mode = mode;
    return rc;
}

/* llama-server / vLLM fields (both endpoints). */
static int parse_aliases(const cJSON *root, g4_oai_request *r, g4_oai_error *err) {
    static const struct {
        const char *name;
        g4_constraint_kind kind;
        int is_string; /* the value is the text itself (else JSON, printed) */
    } aliases[] = {
        {"json_schema", G4_CONSTRAINT_JSON_SCHEMA, 0}, {"grammar", G4_CONSTRAINT_GBNF, 1},
        {"guided_json", G4_CONSTRAINT_JSON_SCHEMA, 0}, {"guided_regex", G4_CONSTRAINT_REGEX, 1},
        {"guided_choice", G4_CONSTRAINT_CHOICE, 0},    {"guided_grammar", G4_CONSTRAINT_GBNF, 1},
    };
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, aliases[i].name);
        if (!v || cJSON_IsNull(v)) continue;
        if (aliases[i].is_string) {
            if (!cJSON_IsString(v)) return g4_oai_fail(err, 400, aliases[i].name, "'%s' must be a string", aliases[i].name);
            if (set_spec(r, aliases[i].kind, NULL, v->valuestring, aliases[i].name, err)) return -1;
        } else if (aliases[i].kind == G4_CONSTRAINT_CHOICE) {
            if (!cJSON_IsArray(v)) return g4_oai_fail(err, 400, aliases[i].name, "'guided_choice' must be a list of strings");
            if (set_spec(r, aliases[i].kind, v, NULL, aliases[i].name, err)) return -1;
        } else {
            /* vLLM also takes the schema as a JSON string */
            if (cJSON_IsString(v)) {
                if (set_spec(r, aliases[i].kind, NULL, v->valuestring, aliases[i].name, err)) return -1;
            } else if (cJSON_IsObject(v) || cJSON_IsBool(v)) {
                if (set_spec(r, aliases[i].kind, v, NULL, aliases[i].name, err)) return -1;
            } else return g4_oai_fail(err, 400, aliases[i].name, "'%s' must be a JSON Schema", aliases[i].name);
        }
    }
    return 0;
}

int g4_oai_parse_constraint(const cJSON *root, g4_oai_request *r, g4_oai_error *err) {
    if (r->kind == G4_OAI_CHAT) {
        if (g4_oai_parse_format(cJSON_GetObjectItemCaseSensitive(root, "response_format"), 0, "response_format", r, err))
            return -1;
        if (parse_tool_choice(root, r, err)) return -1;
    }
    return parse_aliases(root, r, err);
}
