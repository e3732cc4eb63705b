/* Constrained decoding: what a request asks its reply to obey, compiled
 * into a grammar (grammar.h) over the model's tokens.
 *
 * Front ends:
 *   - JSON Schema, the subset OpenAI's `strict: true` accepts: type (string,
 *     number, integer, boolean, null, object, array, or a list of them),
 *     properties, required, additionalProperties (false, true or a schema;
 *     beside `properties` extra keys are never produced), enum, const,
 *     anyOf, allOf of one schema, nullable, items, minItems/maxItems,
 *     minLength/maxLength, pattern (regex.c's subset, re.search semantics),
 *     format date-time/date/time/uuid, $ref to "#..." pointers ($defs,
 *     definitions, "#") including recursion; title, description, default,
 *     examples, $schema, $id, $comment, deprecated, readOnly, writeOnly are
 *     ignored. Anything else is refused naming the keyword and its pointer.
 *   - json_object: any JSON object.
 *   - GBNF (gbnf.c), regex (full match), a choice among fixed strings.
 *   - tool calls in Gemma 4's own syntax
 *     <|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|> whose
 *     arguments follow each tool's `parameters` schema (keys sorted as the
 *     chat template writes them). */
#ifndef G4_CONSTRAIN_CONSTRAIN_H
#define G4_CONSTRAIN_CONSTRAIN_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/grammar.h"

typedef enum {
    G4_CONSTRAINT_NONE = 0,
    G4_CONSTRAINT_JSON_OBJECT, /* any JSON object */
    G4_CONSTRAINT_JSON_SCHEMA, /* text: the schema (JSON) */
    G4_CONSTRAINT_GBNF,        /* text: the grammar */
    G4_CONSTRAINT_REGEX,       /* text: the regex; the whole reply matches */
    G4_CONSTRAINT_CHOICE,      /* text: a JSON array of strings; the reply is one of them */
    G4_CONSTRAINT_TOOL_CALLS,  /* text: a JSON array of {name, parameters}, see tool_mode */
} g4_constraint_kind;

typedef enum {
    G4_TOOLS_REQUIRED = 0, /* one or more calls, nothing else */
    G4_TOOLS_NAMED = 1,    /* exactly one call (of the only listed tool) */
    G4_TOOLS_LAZY = 2,     /* free text; a call, once its <|tool_call> comes, follows the grammar */
} g4_tool_mode;

/* A request's constraint as the API layers parse it: plain data, compiled
 * later against the model's tokenizer. */
typedef struct {
    g4_constraint_kind kind;
    char *text;       /* heap, see the kinds */
    g4_tool_mode tool_mode;
} g4_constraint_spec;

void g4_constraint_spec_free(g4_constraint_spec *s);

/* Special tokens the grammars need. */
typedef struct {
    int32_t str_delim;    /* <|"|> */
    int32_t tool_call;    /* <|tool_call> */
    int32_t tool_call_end; /* <tool_call|> */
} g4_constraint_tokens;

/* The spec -> a grammar (one reference, g4_grammar_free). Failure:
 * G4_ERR_INVALID_ARGUMENT with a message naming the problem (for schemas the
 * keyword and its JSON pointer). */
g4_status g4_constraint_compile(const g4_constraint_spec *spec, const g4_constraint_tokens *tokens,
                                g4_grammar **out);

/* Front ends, on a builder (return a rule, -1 with the builder's error). */
int g4_json_schema_rule(g4_gbuilder *b, const cJSON *schema, int dsl, int32_t delim_token);
int g4_json_any_object_rule(g4_gbuilder *b, int dsl, int32_t delim_token);
int g4_gbnf_rule(g4_gbuilder *b, const char *text, size_t len);

#endif
