#include "cli_generate.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_sampling_usage(FILE *f) {
    fprintf(f, "  -n N              at most N new tokens (default 512)\n"
               "  --temp T          temperature (0 = greedy; default from generation_config.json)\n"
               "  --top-k K  --top-p P  --min-p P\n"
               "  --repeat-penalty R  --presence-penalty P  --frequency-penalty F\n"
               "  --seed S          random seed (default 0: reproducible)\n"
               "  --hide-thinking   do not print the model's reasoning\n");
}

static int parse_float(const char *text, const char *what, float *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end) {
        fprintf(stderr, "gemma4: %s must be a number, got '%s'\n", what, text);
        return -1;
    }
    *out = (float)v;
    return 1;
}

enum {
    GIVEN_TEMP = 1,
    GIVEN_TOP_P = 2,
    GIVEN_MIN_P = 4,
    GIVEN_REPEAT = 8,
    GIVEN_PRESENCE = 16,
    GIVEN_FREQUENCY = 32,
    GIVEN_TOP_K = 64,
    GIVEN_SEED = 128
};

static int float_option(int argc, char **argv, int *i, const char *name, float *value, unsigned bit,
                        cli_generate_options *o) {
    const char *v;
    const int r = cli_option(argc, argv, i, name, &v);
    if (r <= 0) return r;
    if (parse_float(v, name, value) < 0) return -1;
    o->sampling_given |= bit;
    return 1;
}

int cli_sampling_option(int argc, char **argv, int *i, cli_generate_options *o) {
    const char *v;
    int r;
    g4_params *p = &o->sampling;
    if ((r = cli_option(argc, argv, i, "-n", &v))) {
        long n = r > 0 ? cli_parse_count(v, "-n") : -1;
        if (n <= 0) return -1;
        o->max_tokens = (int)n;
        return 1;
    }
    if ((r = float_option(argc, argv, i, "--temp", &p->temperature, GIVEN_TEMP, o)) ||
        (r = float_option(argc, argv, i, "--top-p", &p->top_p, GIVEN_TOP_P, o)) ||
        (r = float_option(argc, argv, i, "--min-p", &p->min_p, GIVEN_MIN_P, o)) ||
        (r = float_option(argc, argv, i, "--repeat-penalty", &p->repetition_penalty, GIVEN_REPEAT, o)) ||
        (r = float_option(argc, argv, i, "--presence-penalty", &p->presence_penalty, GIVEN_PRESENCE, o)) ||
        (r = float_option(argc, argv, i, "--frequency-penalty", &p->frequency_penalty, GIVEN_FREQUENCY, o)))
        return r;
    if ((r = cli_option(argc, argv, i, "--top-k", &v))) {
        long k = r > 0 ? cli_parse_count(v, "--top-k") : -1;
        if (k < 0) return -1;
        p->top_k = (int)k;
        o->sampling_given |= GIVEN_TOP_K;
        return 1;
    }
    if ((r = cli_option(argc, argv, i, "--seed", &v))) {
        long s = r > 0 ? cli_parse_count(v, "--seed") : -1;
        if (s < 0) return -1;
        p->seed = (uint64_t)s;
        o->sampling_given |= GIVEN_SEED;
        return 1;
    }
    if (cli_flag(argv, *i, "--hide-thinking")) {
        o->show_reasoning = 0;
        return 1;
    }
    return 0;
}

void cli_sampling_resolve(cli_generate_options *o, const g4_handle *h) {
    const g4_params user = o->sampling;
    const unsigned given = o->sampling_given;
    g4_params *p = &o->sampling;
    g4_params_model_default(h, p);
    if (given & GIVEN_TEMP) p->temperature = user.temperature;
    if (given & GIVEN_TOP_P) p->top_p = user.top_p;
    if (given & GIVEN_MIN_P) p->min_p = user.min_p;
    if (given & GIVEN_REPEAT) p->repetition_penalty = user.repetition_penalty;
    if (given & GIVEN_PRESENCE) p->presence_penalty = user.presence_penalty;
    if (given & GIVEN_FREQUENCY) p->frequency_penalty = user.frequency_penalty;
    if (given & GIVEN_TOP_K) p->top_k = user.top_k;
    p->seed = given & GIVEN_SEED ? user.seed : p->seed;
}

/* Routes decoded text: the answer to stdout; reasoning (inside the thought
 * channel, without its "thought\n" label) to stderr or nowhere. */
typedef struct {
    int in_reasoning;
    int label_left; /* bytes of "thought\n" still to drop */
    int show_reasoning;
} text_router;

static void route_text(text_router *tr, const char *text, size_t len) {
    if (!len) return;
    if (!tr->in_reasoning) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        return;
    }
    static const char label[] = "thought\n";
    while (tr->label_left > 0 && len > 0) {
        const char *expect = label + (sizeof label - 1) - (size_t)tr->label_left;
        if (*text != *expect) {
            tr->label_left = 0;
            break;
        }
        text++, len--, tr->label_left--;
    }
    if (tr->show_reasoning && len) {
        fwrite(text, 1, len, stderr);
        fflush(stderr);
    }
}

/* The id of a special token written as text, or -1 when the tokenizer has none. */
static int32_t special_id(const g4_tokenizer *t, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t id = -1;
    if (g4_tokenize(t, text, strlen(text), 0, &ids, &n) == G4_OK && n == 1) id = ids[0];
    g4_free(ids);
    return id;
}

/* g4_sequence_generate's callback: each token kept, decoded and routed. */
typedef struct {
    text_router tr;
    g4_detokenizer *detok;
    int32_t open_id, close_id; /* <|channel> and <channel|> */
    int32_t *ids;
    int n, cap;
    int out_of_memory;
    volatile sig_atomic_t *interrupt;
} reply_printer;

static int print_token(void *user, int32_t tok) {
    reply_printer *rp = user;
    if (rp->n == rp->cap) {
        int cap = rp->cap ? 2 * rp->cap : 256;
        int32_t *grown = realloc(rp->ids, (size_t)cap * sizeof *grown);
        if (!grown) {
            rp->out_of_memory = 1;
            return 1;
        }
        rp->ids = grown;
        rp->cap = cap;
    }
    rp->ids[rp->n++] = tok;
    const char *text;
    size_t len;
    if (tok == rp->open_id || tok == rp->close_id) {
        if (g4_detokenizer_flush(rp->detok, &text, &len) == G4_OK) route_text(&rp->tr, text, len);
        rp->tr.in_reasoning = tok == rp->open_id;
        rp->tr.label_left = tok == rp->open_id ? 8 : 0;
        if (tok == rp->close_id && rp->tr.show_reasoning) fputc('\n', stderr);
    } else if (g4_detokenizer_push(rp->detok, tok, &text, &len) == G4_OK) {
        route_text(&rp->tr, text, len);
    }
    return rp->interrupt && *rp->interrupt;
}

g4_status cli_generate(g4_handle *h, g4_sequence *s, const g4_input *in, const cli_generate_options *o,
                       const cli_constraint *constraint, volatile sig_atomic_t *interrupt, cli_generate_result *r) {
    memset(r, 0, sizeof *r);
    const g4_tokenizer *t = g4_model_tokenizer(h);
    g4_input_info info;
    g4_input_get_info(in, &info);
    reply_printer rp = {.tr = {.in_reasoning = info.starts_in_reasoning, .show_reasoning = o->show_reasoning},
                        .open_id = special_id(t, "<|channel>"),
                        .close_id = special_id(t, "<channel|>"),
                        .interrupt = interrupt};
    g4_generate_options go = {.params = o->sampling};
    go.params.max_tokens = o->max_tokens;
    go.params.json_object = constraint->json_object;
    go.params.json_schema = constraint->json_schema;
    go.params.grammar = constraint->grammar;
    go.params.regex = constraint->regex;
    g4_status st = g4_detokenizer_new(t, 1, &rp.detok);
    if (st == G4_OK) st = g4_sequence_generate(s, in, &go, print_token, &rp, &r->gen);
    if (st == G4_OK && rp.out_of_memory) st = cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    const char *text;
    size_t len;
    if (rp.detok && g4_detokenizer_flush(rp.detok, &text, &len) == G4_OK) route_text(&rp.tr, text, len);
    r->interrupted = interrupt && *interrupt;
    if (st == G4_OK || rp.n > 0) fputc('\n', stdout); /* nothing printed when the reply could not start */
    fflush(stdout);
    g4_detokenizer_free(rp.detok);
    r->ids = rp.ids;
    r->n_ids = rp.n;
    return st;
}

void cli_print_stats(const cli_generate_result *r) {
    const g4_generate_result *g = &r->gen;
    char draft[256] = "";
    if (g->drafted) cli_format_draft_stats(&g->draft, g->draft_max, draft, sizeof draft);
    fprintf(stderr, "[prompt %d tokens, %.1f tok/s | %d tokens, %.1f tok/s%s%s]\n", g->n_prompt,
            g->prefill_seconds > 0 ? g->n_prompt / g->prefill_seconds : 0.0, g->n_generated,
            g->decode_seconds > 0 ? g->n_generated / g->decode_seconds : 0.0, draft,
            r->interrupted ? ", interrupted" : "");
}

void cli_constraint_free(cli_constraint *c) {
    free(c->json_schema);
    free(c->grammar);
    free(c->regex);
    *c = (cli_constraint){0};
}

int cli_constraint_given(const cli_constraint *c) {
    return c->json_object || c->json_schema || c->grammar || c->regex;
}

int cli_constraint_option(int argc, char **argv, int *i, cli_constraint *c) {
    if (cli_flag(argv, *i, "--json")) {
        cli_constraint_free(c);
        c->json_object = 1;
        return 1;
    }
    const char *value;
    int r;
    char *text = NULL;
    size_t n;
    if ((r = cli_option(argc, argv, i, "--json-schema", &value)) || (r = cli_option(argc, argv, i, "--grammar", &value))) {
        if (r < 0 || cli_read_file(value, 64u << 20, &text, &n) != 0) return -1;
        const int schema = !strcmp(argv[*i - 1], "--json-schema");
        cli_constraint_free(c);
        *(schema ? &c->json_schema : &c->grammar) = text;
        return 1;
    }
    if ((r = cli_option(argc, argv, i, "--regex", &value))) {
        if (r < 0) return -1;
        cli_constraint_free(c);
        c->regex = strdup(value);
        return 1;
    }
    return 0;
}

void cli_constraint_usage(FILE *f) {
    fprintf(f, "  --json-schema FILE  the reply is JSON valid against this schema (constrained decoding)\n"
               "  --grammar FILE      the reply follows this GBNF grammar\n"
               "  --regex TEXT        the reply matches this regular expression\n"
               "  --json              the reply is a JSON object\n");
}

g4_status cli_open_with_tokenizer(const char *model, const g4_open_options *o, g4_handle **h) {
    g4_status st = g4_open(model, o, h);
    if (st == G4_OK && !g4_model_tokenizer(*h)) {
        g4_close(*h);
        *h = NULL;
        st = cli_fail(G4_ERR_NOT_FOUND, "%s has no tokenizer.json (get the full model with `gemma4 pull ORG/NAME`)",
                      model);
    }
    return st;
}

void cli_add_user_message(void *messages, const g4_media_file *files, int n, const char *text) {
    cJSON *user = cJSON_CreateObject(), *content = cJSON_CreateArray();
    cJSON_AddStringToObject(user, "role", "user");
    for (int k = 0; k < n; k++) {
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", files[k].audio ? "audio" : "image");
        cJSON_AddItemToArray(content, part);
    }
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "text");
    cJSON_AddStringToObject(part, "text", text);
    cJSON_AddItemToArray(content, part);
    cJSON_AddItemToObject(user, "content", content);
    cJSON_AddItemToArray(messages, user);
}
