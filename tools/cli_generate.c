#include "cli_generate.h"

#include "base/file.h"
#include "cli_common.h"
#include "constrain/token_mask.h"
#include "runtime/constraints.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_draft.h"

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
    g4_sampler_params *p = &o->sampling;
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

void cli_sampling_resolve(cli_generate_options *o, const g4_generation_config *gc) {
    const g4_sampler_params user = o->sampling;
    const unsigned given = o->sampling_given;
    g4_sampler_params *p = &o->sampling;
    g4_sampler_params_from_generation_config(p, gc);
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

g4_status cli_generate(g4_context *c, g4_session *s, const g4_prompt *p, int from, const cli_generate_options *o,
                       volatile sig_atomic_t *interrupt, cli_generate_result *r) {
    memset(r, 0, sizeof *r);
    const int V = c->model->config.text.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    r->ids = malloc((size_t)(o->max_tokens + 1) * sizeof *r->ids);
    int32_t *rows = malloc((size_t)(p->media.n + 1) * sizeof *rows);
    g4_sampler *sampler = NULL;
    g4_detokenizer *detok = NULL;
    g4_status st = (logits && r->ids && rows) ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) st = g4_sampler_create(V, &o->sampling, &sampler);
    if (st == G4_OK) st = g4_sampler_add_prompt(sampler, p->ids, (size_t)p->n_ids);
    if (st == G4_OK) st = g4_detokenizer_new(c->tokenizer, 1, &detok);
    /* soft tokens of the part still to evaluate, rows relative to `from` */
    g4_soft_tokens soft = {0};
    int first = 0;
    while (first < p->media.n && p->media.rows[first] < from) first++;
    for (int k = first; k < p->media.n; k++) rows[k - first] = p->media.rows[k] - from;
    soft.n = p->media.n - first;
    soft.rows = rows;
    soft.embeds = p->media.n ? p->media.embeds + (size_t)first * c->model->config.text.hidden_size : NULL;
    g4_speculative *spec = NULL;
    if (o->draft && o->constraint) fprintf(stderr, "gemma4: drafting is off for a constrained reply\n");
    if (st == G4_OK && o->draft && !o->constraint) st = g4_speculative_create(s, o->draft, o->draft_max, &spec);
    int none = 0; /* the constraint allows no token: the reply is complete */
    double t0 = g4_now_seconds();
    r->n_prompt = p->n_ids - from;
    /* each evaluation chooses its next token: from the row's largest logits
     * (copied back alone) where the sampling parameters allow, else the row */
    g4_sample sample;
    if (st == G4_OK && r->n_prompt <= 0)
        st = g4_fail(G4_ERR_INVALID_ARGUMENT, "nothing to evaluate: the prompt is already in the session");
    if (st == G4_OK && spec)
        st = g4_speculative_prefill(spec, p->ids + from, r->n_prompt, soft.n ? &soft : NULL, sampler, &sample.token);
    else if (st == G4_OK)
        st = g4_session_eval_sample_constrained(s, p->ids + from, r->n_prompt, soft.n ? &soft : NULL, sampler, logits,
                                                o->constraint, o->max_tokens, &sample, &none);
    r->prefill_seconds = g4_now_seconds() - t0;
    /* the cache length plain decoding would have now: speculation runs ahead */
    const int base_length = g4_session_length(s);
    /* speculation: the tokens of the last round still to emit; all but its
     * last were accepted by the sampler in the round */
    int32_t queue[G4_DRAFT_MAX + 1];
    int queued = 0, next_in_queue = 0, accepted_already = 0;
    text_router tr = {.in_reasoning = p->starts_in_reasoning, .show_reasoning = o->show_reasoning};
    const int32_t open_id = g4_tokenizer_token_id(c->tokenizer, "<|channel>");
    const int32_t close_id = g4_tokenizer_token_id(c->tokenizer, "<channel|>");
    t0 = g4_now_seconds();
    while (st == G4_OK && r->n_generated < o->max_tokens && !(interrupt && *interrupt)) {
        if (none) {
            r->hit_stop = 1;
            break;
        }
        if (!accepted_already) st = g4_sampler_accept(sampler, sample.token);
        if (st == G4_OK && o->constraint) st = g4_token_matcher_accept(o->constraint, sample.token);
        if (st != G4_OK) break;
        int32_t tok = sample.token;
        int stop = 0;
        for (int k = 0; k < c->n_stop; k++) stop |= tok == c->stop_ids[k];
        if (stop) {
            r->hit_stop = 1;
            break;
        }
        r->ids[r->n_generated++] = tok;
        const char *text;
        size_t len;
        if (tok == open_id || tok == close_id) {
            if (g4_detokenizer_flush(detok, &text, &len) == G4_OK) route_text(&tr, text, len);
            tr.in_reasoning = tok == open_id;
            tr.label_left = tok == open_id ? 8 : 0;
            if (tok == close_id && o->show_reasoning) fputc('\n', stderr);
        } else if (g4_detokenizer_push(detok, tok, &text, &len) == G4_OK) {
            route_text(&tr, text, len);
        }
        if (r->n_generated == o->max_tokens || base_length + r->n_generated >= s->opt.n_ctx) break;
        if (!spec) {
            st = g4_session_eval_sample_constrained(s, &tok, 1, NULL, sampler, logits, o->constraint,
                                                    o->max_tokens - r->n_generated, &sample, &none);
            continue;
        }
        if (next_in_queue == queued) {
            st = g4_speculative_step(spec, tok, sampler, o->max_tokens - r->n_generated, queue, &queued);
            next_in_queue = 0;
        }
        if (st == G4_OK) {
            sample.token = queue[next_in_queue++];
            accepted_already = next_in_queue < queued;
        }
    }
    const char *text;
    size_t len;
    if (detok && g4_detokenizer_flush(detok, &text, &len) == G4_OK) route_text(&tr, text, len);
    r->decode_seconds = g4_now_seconds() - t0;
    r->interrupted = interrupt && *interrupt;
    fputc('\n', stdout);
    fflush(stdout);
    if (spec) {
        r->drafted = 1;
        r->draft_max = o->draft_max;
        r->draft_stats = *g4_speculative_get_stats(spec);
        g4_speculative_free(spec);
    }
    g4_detokenizer_free(detok);
    g4_sampler_free(sampler);
    free(rows);
    free(logits);
    return st;
}

void cli_print_stats(const cli_generate_result *r) {
    char draft[256] = "";
    if (r->drafted) cli_format_draft_stats(&r->draft_stats, r->draft_max, draft, sizeof draft);
    fprintf(stderr, "[prompt %d tokens, %.1f tok/s | %d tokens, %.1f tok/s%s%s]\n", r->n_prompt,
            r->prefill_seconds > 0 ? r->n_prompt / r->prefill_seconds : 0.0, r->n_generated,
            r->decode_seconds > 0 ? r->n_generated / r->decode_seconds : 0.0, draft,
            r->interrupted ? ", interrupted" : "");
}

int cli_constraint_option(int argc, char **argv, int *i, g4_constraint_spec *spec) {
    static const struct {
        const char *flag;
        g4_constraint_kind kind;
        int is_file;
    } opts[] = {{"--json-schema", G4_CONSTRAINT_JSON_SCHEMA, 1},
                {"--grammar", G4_CONSTRAINT_GBNF, 1},
                {"--regex", G4_CONSTRAINT_REGEX, 0}};
    if (cli_flag(argv, *i, "--json")) {
        g4_constraint_spec_free(spec);
        spec->kind = G4_CONSTRAINT_JSON_OBJECT;
        return 1;
    }
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        const char *value;
        int r = cli_option(argc, argv, i, opts[k].flag, &value);
        if (r <= 0) {
            if (r < 0) return -1;
            continue;
        }
        g4_constraint_spec_free(spec);
        spec->kind = opts[k].kind;
        if (opts[k].is_file) {
            size_t n;
            if (g4_read_file(value, 64u << 20, &spec->text, &n) != G4_OK) {
                fprintf(stderr, "gemma4: %s\n", g4_error_message());
                return -1;
            }
        } else spec->text = strdup(value);
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

int cli_constraint_matcher(g4_context *c, const g4_constraint_spec *spec, int think, int starts_in_reasoning,
                           struct g4_token_matcher **out) {
    *out = NULL;
    if (spec->kind == G4_CONSTRAINT_NONE) return 0;
    if (!c->constraints) {
        fprintf(stderr, "gemma4: constrained decoding needs the model's tokenizer.json\n");
        return 1;
    }
    g4_constraint_use use = {.stop_ids = c->stop_ids, .n_stop = c->n_stop, .thinking = think,
                             .starts_in_thought = starts_in_reasoning};
    if (g4_constraints_matcher(c->constraints, spec, &use, out) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", g4_error_message());
        return 1;
    }
    return 0;
}
