#include "server/openai_request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/chat_messages.h"
#include "text/json_strict.h"
#include "text/utf8.h"

int g4_oai_fail(g4_oai_error *err, int status, const char *param, const char *fmt, ...) {
    err->status = status;
    err->type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
    err->param = param;
    err->code = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v; /* null means "not given", as in the OpenAI API */
}

int g4_oai_get_bool(const cJSON *obj, const char *name, int *out, g4_oai_error *err) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return g4_oai_fail(err, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

int g4_oai_get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out, g4_oai_error *err) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return g4_oai_fail(err, 400, name, "'%s' must be an integer", name);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return g4_oai_fail(err, 400, name, "'%s' must be an integer", name);
    if (d < lo || d > hi) return g4_oai_fail(err, 400, name, "'%s' must be between %.0f and %.0f", name, lo, hi);
    *out = (int64_t)d;
    return 0;
}

static int get_float(const cJSON *obj, const char *name, double lo, double hi, int lo_open, float *out,
                     g4_oai_error *err) {
    const cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return g4_oai_fail(err, 400, name, "'%s' must be a number", name);
    double d = v->valuedouble;
    if (d < lo || d > hi || (lo_open && d == lo))
        return g4_oai_fail(err, 400, name, "'%s' must be %s %g and <= %g", name, lo_open ? ">" : ">=", lo, hi);
    *out = (float)d;
    return 0;
}

int g4_oai_get_ids(const cJSON *arr, const char *name, int vocab, int32_t **ids, int *n, g4_oai_error *err) {
    *ids = NULL;
    *n = 0;
    int count = cJSON_GetArraySize(arr);
    int32_t *out = malloc((size_t)(count > 0 ? count : 1) * sizeof *out);
    if (!out) return g4_oai_fail(err, 503, name, "out of memory");
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!cJSON_IsNumber(e) || !isfinite(d) || d != floor(d) || d < 0 || d >= vocab) {
            free(out);
            return g4_oai_fail(err, 400, name, "'%s' must list token ids in [0, %d) (item %d is not one)", name, vocab,
                               k);
        }
        out[k++] = (int32_t)d;
    }
    *ids = out;
    *n = k;
    return 0;
}

static int parse_stop(const cJSON *root, g4_oai_request *r, g4_oai_error *err) {
    const cJSON *v = field(root, "stop");
    if (!v) return 0;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return 0; /* "" stops nothing */
        r->stop[r->n_stop] = strdup(v->valuestring);
        if (!r->stop[r->n_stop]) return g4_oai_fail(err, 503, "stop", "out of memory");
        r->n_stop++;
        return 0;
    }
    if (!cJSON_IsArray(v)) return g4_oai_fail(err, 400, "stop", "'stop' must be a string or a list of strings");
    if (cJSON_GetArraySize(v) > G4_OAI_MAX_STOP)
        return g4_oai_fail(err, 400, "stop", "'stop' may list at most %d strings", G4_OAI_MAX_STOP);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e)) return g4_oai_fail(err, 400, "stop", "'stop' must be a string or a list of strings");
        if (!e->valuestring[0]) return g4_oai_fail(err, 400, "stop", "stop strings must not be empty");
        if (strlen(e->valuestring) > 4096) return g4_oai_fail(err, 400, "stop", "a stop string is over 4096 bytes");
        r->stop[r->n_stop] = strdup(e->valuestring);
        if (!r->stop[r->n_stop]) return g4_oai_fail(err, 503, "stop", "out of memory");
        r->n_stop++;
    }
    return 0;
}

static int parse_logit_bias(const cJSON *root, const g4_oai_limits *lim, g4_oai_request *r, g4_oai_error *err) {
    const cJSON *v = field(root, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return g4_oai_fail(err, 400, "logit_bias", "'logit_bias' must be an object");
    int n = cJSON_GetArraySize(v);
    if (n > 1024) return g4_oai_fail(err, 400, "logit_bias", "'logit_bias' may bias at most 1024 tokens");
    if (n == 0) return 0;
    r->logit_bias = calloc((size_t)n, sizeof *r->logit_bias);
    if (!r->logit_bias) return g4_oai_fail(err, 503, "logit_bias", "out of memory");
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        /* digits only: strtol alone would also take " 5", "+5" */
        size_t digits = strspn(e->string, "0123456789");
        char *end = NULL;
        long id = digits && digits < 10 && !e->string[digits] ? strtol(e->string, &end, 10) : -1;
        if (id < 0 || id >= lim->vocab_size)
            return g4_oai_fail(err, 400, "logit_bias", "logit_bias key '%.64s' is not a token id in [0, %d)", e->string,
                               lim->vocab_size);
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < -100 || e->valuedouble > 100)
            return g4_oai_fail(err, 400, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->logit_bias[k].id = (int32_t)id;
        r->logit_bias[k].bias = (float)e->valuedouble;
        k++;
    }
    r->sampling.logit_bias = r->logit_bias;
    r->sampling.n_logit_bias = (size_t)k;
    return 0;
}

/* Sampling, length, stop and streaming fields common to both endpoints. */
static int parse_common(const cJSON *root, const g4_oai_limits *lim, g4_oai_request *r, g4_oai_error *err) {
    g4_sampler_params *p = &r->sampling;
    g4_sampler_params_from_generation_config(p, lim->generation);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) return g4_oai_fail(err, 400, "model", "'model' must be a string");
        if (lim->model_name && strcmp(model->valuestring, lim->model_name) != 0) {
            g4_oai_fail(err, 404, "model", "The model '%.200s' does not exist (this server serves '%.200s')",
                        model->valuestring, lim->model_name);
            err->code = "model_not_found";
            return -1;
        }
    }
    int64_t n = 1;
    if (g4_oai_get_int(root, "n", 1, 128, &n, err)) return -1;
    if (n != 1) return g4_oai_fail(err, 400, "n", "only n=1 is supported");
    if (g4_oai_get_bool(root, "stream", &r->stream, err)) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return g4_oai_fail(err, 400, "stream_options", "'stream_options' must be an object");
        if (g4_oai_get_bool(so, "include_usage", &r->include_usage, err)) return -1;
    }
    int64_t max_tokens = 0;
    if (g4_oai_get_int(root, "max_tokens", 1, 1e12, &max_tokens, err)) return -1;
    if (r->kind == G4_OAI_CHAT && g4_oai_get_int(root, "max_completion_tokens", 1, 1e12, &max_tokens, err)) return -1;
    r->max_tokens = max_tokens > 1 << 30 ? 1 << 30 : (int)max_tokens;
    if (get_float(root, "temperature", 0, 2, 0, &p->temperature, err)) return -1;
    if (get_float(root, "top_p", 0, 1, 1, &p->top_p, err)) return -1;
    int64_t top_k = p->top_k;
    if (g4_oai_get_int(root, "top_k", -1, 1e9, &top_k, err)) return -1;
    p->top_k = top_k < 0 ? 0 : (int)(top_k > lim->vocab_size ? lim->vocab_size : top_k);
    if (get_float(root, "min_p", 0, 1, 0, &p->min_p, err)) return -1;
    if (get_float(root, "presence_penalty", -2, 2, 0, &p->presence_penalty, err)) return -1;
    if (get_float(root, "frequency_penalty", -2, 2, 0, &p->frequency_penalty, err)) return -1;
    if (get_float(root, "repetition_penalty", 0, 2, 1, &p->repetition_penalty, err)) return -1;
    const cJSON *sv = field(root, "seed");
    if (sv) {
        double d = cJSON_IsNumber(sv) ? sv->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < -9223372036854775808.0 || d >= 18446744073709551616.0)
            return g4_oai_fail(err, 400, "seed", "'seed' must be a 64-bit integer");
        p->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    } else {
        /* no seed: a fresh one per request */
        static _Atomic uint64_t counter;
        p->seed = (uint64_t)time(NULL) * 6364136223846793005ull + ++counter * 1442695040888963407ull;
    }
    if (parse_stop(root, r, err)) return -1;
    if (parse_logit_bias(root, lim, r, err)) return -1;
    if (g4_oai_get_bool(root, "ignore_eos", &r->ignore_eos, err)) return -1;
    if (g4_oai_get_bool(root, "return_token_ids", &r->return_token_ids, err)) return -1;
    r->speculative = 1;
    if (g4_oai_get_bool(root, "speculative", &r->speculative, err)) return -1;
    return 0;
}

int g4_oai_check_messages(const cJSON *messages, g4_oai_error *err) {
    char where[sizeof err->param_buf];
    if (g4_chat_check_messages(messages, where, sizeof where) == G4_OK) return 0;
    g4_oai_fail(err, 400, NULL, "%s", g4_error_message());
    snprintf(err->param_buf, sizeof err->param_buf, "%s", where);
    err->param = err->param_buf;
    return -1;
}

int g4_oai_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out, g4_oai_error *err) {
    g4_status st = g4_chat_collect_media(messages, lim, out);
    if (st == G4_OK) return 0;
    int status = st == G4_ERR_PERMISSION ? 403 : st == G4_ERR_OUT_OF_MEMORY ? 503 : st == G4_ERR_INTERNAL ? 500 : 400;
    g4_oai_fail(err, status, "messages", "%s", g4_error_message());
    if (status == 403) err->type = "permission_error";
    return -1;
}

static int parse_chat(cJSON *root, g4_oai_request *r, g4_oai_error *err) {
    cJSON *messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (g4_oai_check_messages(messages, err)) return -1;
    r->messages = messages;
    const cJSON *tools = field(root, "tools");
    if (tools && !cJSON_IsArray(tools)) return g4_oai_fail(err, 400, "tools", "'tools' must be a list");
    if (tools) {
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsObject(fn) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
                return g4_oai_fail(err, 400, "tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        if (cJSON_GetArraySize(tools) > 0) r->tools = tools;
    }
    const cJSON *choice = field(root, "tool_choice");
    if (field(root, "functions") || field(root, "function_call"))
        return g4_oai_fail(err, 400, "functions", "'functions' is deprecated and not supported: use 'tools'");
    if (g4_oai_parse_constraint(root, r, err)) return -1;
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) r->tools = NULL;
    if (g4_oai_get_bool(root, "logprobs", &r->logprobs, err)) return -1;
    int64_t top = 0;
    if (g4_oai_get_int(root, "top_logprobs", 0, G4_SAMPLER_MAX_TOP_LOGPROBS, &top, err)) return -1;
    if (top > 0 && !r->logprobs)
        return g4_oai_fail(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    r->top_logprobs = (int)top;
    const cJSON *kwargs = field(root, "chat_template_kwargs");
    if (kwargs) {
        if (!cJSON_IsObject(kwargs))
            return g4_oai_fail(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (g4_oai_get_bool(kwargs, "enable_thinking", &r->enable_thinking, err)) return -1;
    }
    const cJSON *effort = field(root, "reasoning_effort");
    if (effort) {
        if (!cJSON_IsString(effort))
            return g4_oai_fail(err, 400, "reasoning_effort", "'reasoning_effort' must be a string");
        r->enable_thinking = strcmp(effort->valuestring, "none") != 0;
    }
    return 0;
}

static int parse_completion(const cJSON *root, const g4_oai_limits *lim, g4_oai_request *r, g4_oai_error *err) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!prompt || cJSON_IsNull(prompt)) return g4_oai_fail(err, 400, "prompt", "'prompt' is required");
    /* a one-element batch is the same as its element */
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 &&
        (cJSON_IsString(prompt->child) || cJSON_IsArray(prompt->child)))
        prompt = prompt->child;
    else if (cJSON_IsArray(prompt) && prompt->child && (cJSON_IsString(prompt->child) || cJSON_IsArray(prompt->child)))
        return g4_oai_fail(err, 400, "prompt", "only one prompt per request is supported");
    if (cJSON_IsString(prompt)) {
        r->prompt_text = prompt->valuestring;
        r->prompt_len = strlen(prompt->valuestring);
    } else if (cJSON_IsArray(prompt)) {
        if (g4_oai_get_ids(prompt, "prompt", lim->vocab_size, &r->prompt_ids, &r->n_prompt_ids, err)) return -1;
        if (r->n_prompt_ids == 0) return g4_oai_fail(err, 400, "prompt", "'prompt' must not be empty");
    } else {
        return g4_oai_fail(err, 400, "prompt", "'prompt' must be a string or a list of token ids");
    }
    r->add_special_tokens = 1;
    if (g4_oai_get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) return -1;
    int64_t lp = 0;
    if (g4_oai_get_int(root, "logprobs", 0, G4_SAMPLER_MAX_TOP_LOGPROBS, &lp, err)) return -1;
    if (field(root, "logprobs")) r->logprobs = 1, r->top_logprobs = (int)lp;
    int echo = 0;
    if (g4_oai_get_bool(root, "echo", &echo, err)) return -1;
    if (echo) return g4_oai_fail(err, 400, "echo", "'echo' is not supported");
    int64_t best_of = 1;
    if (g4_oai_get_int(root, "best_of", 1, 128, &best_of, err)) return -1;
    if (best_of != 1) return g4_oai_fail(err, 400, "best_of", "only best_of=1 is supported");
    if (field(root, "suffix")) return g4_oai_fail(err, 400, "suffix", "'suffix' is not supported");
    const cJSON *media = field(root, "media");
    if (media && !cJSON_IsArray(media))
        return g4_oai_fail(err, 400, "media", "'media' must be a list of image_url / input_audio parts");
    if (media && !r->prompt_ids)
        return g4_oai_fail(err, 400, "media", "'media' needs the prompt as token ids with placeholder ids");
    r->media = media;
    return g4_oai_parse_constraint(root, r, err);
}

cJSON *g4_oai_parse_json(const char *body, size_t len, size_t max_values, g4_oai_error *err) {
    if (len == 0) {
        g4_oai_fail(err, 400, NULL, "the request body is empty: send a JSON object");
        return NULL;
    }
    if (!g4_utf8_valid(body, len)) {
        g4_oai_fail(err, 400, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    size_t pos = 0;
    const char *why = NULL;
    if (g4_json_check(body, len, max_values ? max_values : G4_OAI_DEFAULT_MAX_VALUES, &pos, &why)) {
        g4_oai_fail(err, 400, NULL, "the request body is not valid JSON (%s at byte %zu)", why, pos);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        g4_oai_fail(err, 400, NULL, "the request body is not valid JSON");
        return NULL;
    }
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end && end < body + len) {
        cJSON_Delete(root);
        g4_oai_fail(err, 400, NULL, "the request body is not valid JSON (text after the value at byte %zu)",
                    (size_t)(end - body));
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        g4_oai_fail(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

int g4_oai_parse(const char *body, size_t len, g4_oai_kind kind, const g4_oai_limits *lim, g4_oai_request *out,
                 g4_oai_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = g4_oai_parse_json(body, len, lim->max_json_values, err);
    if (!root) return -1;
    return g4_oai_parse_root(root, kind, lim, out, err);
}

int g4_oai_parse_root(cJSON *root, g4_oai_kind kind, const g4_oai_limits *lim, g4_oai_request *out,
                      g4_oai_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->root = root;
    if (parse_common(out->root, lim, out, err)) return -1;
    if (kind == G4_OAI_CHAT ? parse_chat(out->root, out, err) : parse_completion(out->root, lim, out, err)) return -1;
    out->sampling.logprobs = out->logprobs;
    out->sampling.top_logprobs = out->top_logprobs;
    return 0;
}

void g4_oai_request_free(g4_oai_request *r) {
    cJSON_Delete(r->root);
    free(r->prompt_ids);
    free(r->logit_bias);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    g4_constraint_spec_free(&r->constraint);
    memset(r, 0, sizeof *r);
}
