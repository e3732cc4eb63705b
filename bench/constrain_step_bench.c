/* constrain_step_bench: the engine's decode step with every sequence under
 * a JSON Schema against the same step unconstrained (issue 31's speed goal,
 * without a server in between).
 *
 * usage: constrain_step_bench MODEL_DIR [--device cpu|cuda] [--seqs N] [--tokens N] [--threads N] [--rounds N]
 *
 * Runs N sequences (default 32) of greedy decoding from chat prompts that
 * differ in a number,
 * `tokens` each (default 64), in three ways, `rounds` times in turn (default
 * 2; the best of each kept): free (no constraint), masks (the schema; each
 * row's token mask on the backend, as the engine runs), host (the schema
 * with the backend's masked op hidden: every constrained row's full logits
 * come to the host, masked and sampled there, as the engine did before the
 * masks went to the backend whenever the allowed tokens were not among the
 * 4x candidates, i.e. nearly always with random weights). The time of the
 * steps where all N sequences decode is reported per step and as tokens/s;
 * the constrained modes' ratios to free are the goal's numbers (<= 5%
 * slower). The sequences end where the grammar does; a run whose replies
 * all ended early counts only its full steps. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/constraints.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"

static const char *const SCHEMA =
    "{\"type\": \"object\", \"properties\": {\"answer\": {\"type\": \"string\"}, \"points\": {\"type\": \"array\", "
    "\"items\": {\"type\": \"object\", \"properties\": {\"title\": {\"type\": \"string\"}, \"score\": {\"type\": "
    "\"number\"}}, \"required\": [\"title\", \"score\"], \"additionalProperties\": false}}}, \"required\": "
    "[\"answer\", \"points\"], \"additionalProperties\": false}";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    double seconds; /* in steps where every sequence decoded */
    int steps, tokens;
    g4_engine_stats stats;
} result;

enum { FREE = 0, MASKS = 1, HOST = 2 };
static const char *const MODE_NAMES[3] = {"free", "masks", "host"};

static int run(g4_context *c, const g4_prompt *prompts, int mode, int seqs, int tokens, int threads, result *out) {
    g4_backend *be = c->model->backend;
    g4_backend_ops hidden = *be->ops;
    hidden.top_logits_masked = NULL;
    g4_backend host_only = {.ops = &hidden, .impl = be->impl};
    if (mode == HOST) c->model->backend = &host_only;
    g4_engine *e = NULL;
    g4_engine_options eo = {.max_seqs = seqs, .n_ctx = prompts[0].n_ids + tokens + 64, .threads = threads};
    g4_status st = g4_engine_create(c->model, &eo, &e);
    for (int i = 0; st == G4_OK && i < seqs; i++) {
        const g4_prompt *p = &prompts[i];
        g4_token_matcher *m = NULL;
        if (mode != FREE) {
            g4_constraint_spec spec = {G4_CONSTRAINT_JSON_SCHEMA, (char *)SCHEMA, 0};
            g4_constraint_use use = {.stop_ids = c->stop_ids, .n_stop = c->n_stop};
            st = g4_constraints_matcher(c->constraints, &spec, &use, &m);
        }
        g4_sampler_params sp;
        g4_sampler_params_default(&sp); /* greedy, as bench/server_load.py asks */
        g4_request r = {.prompt = p->ids, .n_prompt = p->n_ids, .sampling = sp, .max_tokens = tokens,
                        .stop_ids = mode == FREE ? NULL : c->stop_ids, .n_stop = mode == FREE ? 0 : c->n_stop,
                        .constraint = m};
        if (st == G4_OK) st = g4_engine_submit(e, &r, NULL);
    }
    memset(out, 0, sizeof *out);
    g4_engine_stats before, after;
    for (int pending = 1; st == G4_OK && pending > 0;) {
        g4_engine_get_stats(e, &before);
        const double t0 = now();
        pending = g4_engine_step(e);
        const double dt = now() - t0;
        g4_engine_get_stats(e, &after);
        if (pending < 0) st = G4_ERR_INTERNAL;
        if (after.tokens_generated - before.tokens_generated == (uint64_t)seqs &&
            after.tokens_prefilled == before.tokens_prefilled) {
            out->seconds += dt;
            out->steps++;
            out->tokens += seqs;
        }
    }
    if (e) g4_engine_get_stats(e, &out->stats);
    g4_engine_destroy(e);
    c->model->backend = be;
    if (st != G4_OK) fprintf(stderr, "%s: %s\n", MODE_NAMES[mode], g4_error_message());
    return st == G4_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: constrain_step_bench MODEL_DIR [--device cpu|cuda] [--seqs N] [--tokens N] "
                        "[--threads N] [--rounds N]\n");
        return 2;
    }
    const char *device = "cpu";
    int seqs = 32, tokens = 64, threads = 0, rounds = 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--seqs")) seqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (seqs < 1 || tokens < 2 || rounds < 1) {
        fprintf(stderr, "--seqs, --tokens (>= 2) and --rounds must be positive\n");
        return 2;
    }
    g4_context *c = NULL;
    g4_context_options co = {.device = device, .threads = threads, .require_tokenizer = 1};
    if (g4_context_open(argv[1], &co, &c) != G4_OK) {
        fprintf(stderr, "open %s: %s\n", argv[1], g4_error_message());
        return 1;
    }
    /* one prompt per sequence (their replies, and so their grammar states, part) */
    g4_prompt *p = calloc((size_t)seqs, sizeof *p);
    for (int i = 0; i < seqs; i++) {
        char text[256];
        snprintf(text, sizeof text, "[{\"role\": \"user\", \"content\": \"Summarise play number %d of a "
                 "long list as JSON.\"}]", i * 37 + 5);
        cJSON *messages = cJSON_Parse(text);
        g4_prompt_options po = {.chat = {.add_generation_prompt = 1}};
        if (g4_prompt_from_messages(c, messages, NULL, &po, NULL, 0, &p[i]) != G4_OK) {
            fprintf(stderr, "prompt: %s\n", g4_error_message());
            return 1;
        }
        cJSON_Delete(messages);
    }
    printf("%s, %s, vocabulary %d: %d sequences x %d tokens, greedy, prompts of %d tokens\n", argv[1], device,
           c->model->config.text.vocab_size, seqs, tokens, p[0].n_ids);
    result best[3] = {{0}};
    int ok = 1;
    for (int r = 0; r < rounds && ok; r++)
        for (int mode = 0; mode < 3 && ok; mode++) {
            result got;
            ok = run(c, p, mode, seqs, tokens, threads, &got);
            const double per = got.steps ? got.seconds / got.steps : 0;
            const double all_steps = got.stats.steps ? (double)got.stats.steps : 1;
            printf("  round %d %-5s %3d full steps, %8.3f ms a step, %9.1f tok/s  (masked rows %llu, uploads %llu, "
                   "on the host %llu; masks %.3f ms a step, waited for %.3f; sampling %.3f)\n",
                   r + 1, MODE_NAMES[mode], got.steps, per * 1e3, got.seconds > 0 ? got.tokens / got.seconds : 0,
                   (unsigned long long)got.stats.masked_rows, (unsigned long long)got.stats.mask_uploads,
                   (unsigned long long)got.stats.masked_rows_on_host, got.stats.mask_seconds / all_steps * 1e3,
                   got.stats.mask_wait_seconds / all_steps * 1e3, got.stats.sample_seconds / all_steps * 1e3);
            const double best_per = best[mode].steps ? best[mode].seconds / best[mode].steps : 1e30;
            if (got.steps && per < best_per) best[mode] = got;
        }
    if (ok && best[FREE].steps) {
        const double free_per = best[FREE].seconds / best[FREE].steps;
        for (int mode = MASKS; mode <= HOST; mode++)
            if (best[mode].steps)
                printf("best %-5s %8.3f ms a step vs free %8.3f: %+.1f%%\n", MODE_NAMES[mode],
                       best[mode].seconds / best[mode].steps * 1e3, free_per * 1e3,
                       (best[mode].seconds / best[mode].steps / free_per - 1) * 100);
    }
    for (int i = 0; i < seqs; i++) g4_prompt_free(c, &p[i]);
    free(p);
    g4_context_close(c);
    return ok ? 0 : 1;
}
