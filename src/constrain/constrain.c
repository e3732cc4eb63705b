/* Constraint specs -> grammars: the dispatcher, choices and tool calls. */
#include "constrain/constrain.h"

#include <stdlib.h>
#include <string.h>

#include "constrain/regex.h"

void g4_constraint_spec_free(g4_constraint_spec *s) {
    if (!s) return;
    free(s->text);
    memset(s, 0, sizeof *s);
}

/* <|tool_call>call:NAME{args}<tool_call|> for every tool, as alternatives. */
static int tool_calls_rule(g4_gbuilder *b, const cJSON *tools, const g4_constraint_tokens *tk, g4_tool_mode mode) {
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0) {
        g4_gb_error(b, "tools: a non-empty list is needed");
        return -1;
    }
    if (tk->str_delim < 0 || tk->tool_call < 0 || tk->tool_call_end < 0) {
        g4_gb_error(b, "tools: the tokenizer lacks Gemma 4's tool-call tokens (<|tool_call>, <tool_call|>, <|\"|>)");
        return -1;
    }
    int call = g4_gb_rule(b, "call");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(t, "parameters");
        if (!cJSON_IsString(name) || !name->valuestring[0]) {
            g4_gb_error(b, "tools[%d]: a function name is needed", i);
            return -1;
        }
        for (const char *p = name->valuestring; *p; p++)
            if (strchr("{}<>:, \n\t", *p)) {
                g4_gb_error(b, "tools[%d]: the function name '%s' cannot be written in a tool call", i,
                            name->valuestring);
                return -1;
            }
        int args;
        if (params && !cJSON_IsNull(params)) {
            /* the arguments are an object whatever the schema says */
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "type");
            if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "object") == 0)) {
                g4_gb_error(b, "tools[%d].function.parameters: the type must be \"object\"", i);
                return -1;
            }
            args = g4_json_schema_rule(b, params, 1, tk->str_delim);
        } else args = g4_json_any_object_rule(b, 1, tk->str_delim);
        if (args < 0) {
            g4_gb_error_context(b, "tools[%d] (%s) parameters", i, name->valuestring);
            return -1;
        }
        g4_gseq q = {0};
        g4_gseq_token(&q, tk->tool_call);
        g4_gseq_str(&q, "call:", b);
        g4_gseq_str(&q, name->valuestring, b);
        g4_gseq_rule(&q, args);
        g4_gseq_token(&q, tk->tool_call_end);
        g4_gb_alt(b, call, &q);
    }
    if (mode == G4_TOOLS_REQUIRED) return g4_gb_plus(b, call);
    return call;
}

static int choice_rule(g4_gbuilder *b, const cJSON *list) {
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0) {
        g4_gb_error(b, "guided_choice: a non-empty list of strings is needed");
        return -1;
    }
    int r = g4_gb_rule(b, "choice");
    for (const cJSON *s = list->child; s; s = s->next) {
        if (!cJSON_IsString(s) || !s->valuestring[0]) {
            g4_gb_error(b, "guided_choice: every choice must be a non-empty string");
            return -1;
        }
        g4_gseq q = {0};
        g4_gseq_str(&q, s->valuestring, b);
        g4_gb_alt(b, r, &q);
    }
    return r;
}

g4_status g4_constraint_compile(const g4_constraint_spec *spec, const g4_constraint_tokens *tokens,
                                g4_grammar **out) {
    *out = NULL;
    g4_gbuilder *b = g4_gbuilder_new();
    if (!b) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    const char *text = spec->text ? spec->text : "";
    int32_t delim = tokens ? tokens->str_delim : -1;
    cJSON *json = NULL;
    int root = -1;
    switch (spec->kind) {
    case G4_CONSTRAINT_JSON_OBJECT: root = g4_json_any_object_rule(b, 0, delim); break;
    case G4_CONSTRAINT_JSON_SCHEMA:
    case G4_CONSTRAINT_CHOICE:
    case G4_CONSTRAINT_TOOL_CALLS:
        json = cJSON_Parse(text);
        if (!json) {
            g4_gb_error(b, "%s is not valid JSON",
                        spec->kind == G4_CONSTRAINT_JSON_SCHEMA ? "the schema" : "the constraint");
            break;
        }
        if (spec->kind == G4_CONSTRAINT_JSON_SCHEMA) root = g4_json_schema_rule(b, json, 0, delim);
        else if (spec->kind == G4_CONSTRAINT_CHOICE) root = choice_rule(b, json);
        else {
            static const g4_constraint_tokens none = {-1, -1, -1};
            root = tool_calls_rule(b, json, tokens ? tokens : &none, spec->tool_mode);
        }
        break;
    case G4_CONSTRAINT_GBNF: root = g4_gbnf_rule(b, text, strlen(text)); break;
    case G4_CONSTRAINT_REGEX: root = g4_regex_rule(b, text, strlen(text), G4_CC_RAW, 0); break;
    default: g4_gb_error(b, "no constraint");
    }
    cJSON_Delete(json);
    g4_status st = g4_grammar_finish(b, root, out);
    /* a grammar whose very first step exceeds the limits is refused now, as a compile error */
    if (st == G4_OK && g4_grammar_start(*out) < 0) {
        g4_grammar_free(*out);
        *out = NULL;
        return g4_fail_context(G4_ERR_INVALID_ARGUMENT, "the grammar cannot start");
    }
    return st;
}
