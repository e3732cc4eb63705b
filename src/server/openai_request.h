/* OpenAI request bodies -> validated generation requests.
 *
 * Every field the server understands is type- and range-checked; a request
 * that fails gets an OpenAI error (HTTP status, type, param, message).
 * Unknown fields are ignored, as vLLM does. Fields:
 *
 *   both:   model, stream, stream_options.include_usage, max_tokens,
 *           temperature [0, 2], top_p (0, 1], top_k (-1/0: off), min_p [0, 1],
 *           presence_penalty / frequency_penalty [-2, 2], repetition_penalty
 *           (0, 2], seed (any 64-bit integer), stop (string or up to 16
 *           strings), n (1 only), logit_bias {"id": -100..100},
 *           ignore_eos, return_token_ids (vLLM extensions), speculative (false: no drafting)
 *   chat:   messages, tools, tool_choice ("auto", "none", "required" or
 *           {"type": "function", "function": {"name"}}),
 *           max_completion_tokens (wins over max_tokens), logprobs (bool),
 *           top_logprobs 0..20, chat_template_kwargs.enable_thinking,
 *           reasoning_effort ("none" turns thinking off, any other value on),
 *           response_format {"type": "text" | "json_object" | "json_schema"}
 *   both, constraints (openai_constraint.c): json_schema, grammar
 *           (llama-server), guided_json / guided_regex / guided_choice /
 *           guided_grammar (vLLM); one constraint per request
 *   completions: prompt (string, token ids, or a one-element list of
 *           either), add_special_tokens (default true: a leading <bos>),
 *           logprobs 0..20 (top alternatives per token), echo false,
 *           best_of 1, suffix null, and (gemma4 extension) media: a list of
 *           chat content parts (image_url / input_audio) whose soft tokens
 *           fill the image/audio placeholder ids of a token-id prompt, in order
 * Sampling fields left out take the model's generation_config.json values
 * (as transformers and vLLM do). */
#ifndef G4_SERVER_OPENAI_REQUEST_H
#define G4_SERVER_OPENAI_REQUEST_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/constrain.h"
#include "io/config.h"
#include "runtime/chat_messages.h"
#include "runtime/sampler.h"

#define G4_OAI_MAX_STOP 16

typedef enum { G4_OAI_CHAT = 0, G4_OAI_COMPLETION = 1 } g4_oai_kind;

typedef struct {
    int status;        /* HTTP status: 400, 404, 413, 503 ... */
    const char *type;  /* "invalid_request_error", "not_found_error", "server_error" ... */
    const char *param; /* the offending field, or NULL */
    const char *code;  /* e.g. "model_not_found", or NULL */
    char message[600];
    char param_buf[48]; /* param when it names an item ("messages[2].role"): param points here */
} g4_oai_error;

/* Fills err and returns -1 (for `return g4_oai_fail(...)`). */
int g4_oai_fail(g4_oai_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct {
    const char *model_name;                /* requests naming another model get 404 */
    int vocab_size;
    const g4_generation_config *generation; /* sampling defaults (may be NULL: greedy) */
    size_t max_json_values;                 /* values in the body (0: G4_OAI_DEFAULT_MAX_VALUES) */
} g4_oai_limits;

#define G4_OAI_DEFAULT_MAX_VALUES 65536

typedef struct {
    g4_oai_kind kind;
    cJSON *root; /* the parsed body; the pointers below point into it */
    /* chat */
    cJSON *messages;
    const cJSON *tools; /* NULL when absent or tool_choice is "none" */
    int enable_thinking;
    /* completions: the prompt as text or as ids */
    const char *prompt_text;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    int add_special_tokens;
    const cJSON *media; /* completions extension: content parts for the placeholders */
    /* generation */
    g4_sampler_params sampling;
    g4_logit_bias *logit_bias;
    int max_tokens; /* 0: not given */
    char *stop[G4_OAI_MAX_STOP];
    int n_stop;
    int stream, include_usage;
    int logprobs, top_logprobs;
    int ignore_eos, return_token_ids;
    int speculative; /* 0: "speculative": false, never drafted (default 1: where the server drafts) */
    /* what the reply must obey (kind NONE: free text). The one field every
     * API layer fills (chat completions here, the Responses API's
     * text.format, ...); compiled against the tokenizer when generating. */
    g4_constraint_spec constraint;
    const char *constraint_param; /* the field that set it (a static string), for errors */
} g4_oai_request;

/* Strict JSON text -> cJSON: valid UTF-8, RFC 8259 syntax (json_strict.h:
 * no \u0000, at most max_values values; 0: the default), one value and
 * nothing after it but whitespace (cJSON alone is more lenient). NULL with
 * err filled (400) otherwise. */
cJSON *g4_oai_parse_json(const char *body, size_t len, size_t max_values, g4_oai_error *err);

/* Parses and validates body[0..len). Returns 0, or -1 with err filled. */
int g4_oai_parse(const char *body, size_t len, g4_oai_kind kind, const g4_oai_limits *lim, g4_oai_request *out,
                 g4_oai_error *err);
/* The same for a body already parsed (the Responses and Messages APIs
 * translate theirs into a chat completions body): takes root, which the
 * request owns (and frees) whatever the outcome. */
int g4_oai_parse_root(cJSON *root, g4_oai_kind kind, const g4_oai_limits *lim, g4_oai_request *out,
                      g4_oai_error *err);
void g4_oai_request_free(g4_oai_request *r);

/* Fills r->constraint from the body's response_format / tool_choice (chat;
 * r->tools already parsed) and the llama-server / vLLM aliases. -1 with err
 * filled on a malformed or conflicting field. */
int g4_oai_parse_constraint(const cJSON *root, g4_oai_request *r, g4_oai_error *err);
/* One format object into r->constraint: chat's response_format (flat 0:
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}) or the
 * Responses API's text.format (flat 1: {"type": "json_schema", "name",
 * "schema", "strict"}); "text" leaves it free. param names the field in
 * errors. -1 with err filled when malformed or when another constraint is
 * already set. */
int g4_oai_parse_format(const cJSON *fmt, int flat, const char *param, g4_oai_request *r, g4_oai_error *err);

/* g4_chat_check_messages with an OpenAI error (400, param naming the item,
 * e.g. "messages[1].content"): -1 with err filled. */
int g4_oai_check_messages(const cJSON *messages, g4_oai_error *err);
/* g4_chat_collect_media with an OpenAI error: 400 for bad parts, 403
 * (permission_error) for files outside the allowed folder, 503 out of
 * memory, 500 when the folder is missing; -1 with err filled. */
int g4_oai_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out, g4_oai_error *err);

/* Shared field readers (also for /tokenize): -1 with err filled when the
 * field has the wrong type or range; absent fields leave *out unchanged. */
int g4_oai_get_bool(const cJSON *obj, const char *name, int *out, g4_oai_error *err);
int g4_oai_get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out, g4_oai_error *err);
/* A JSON array of token ids in [0, vocab) -> malloc'd ids. */
int g4_oai_get_ids(const cJSON *arr, const char *name, int vocab, int32_t **ids, int *n, g4_oai_error *err);

#endif
