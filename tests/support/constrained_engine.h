/* What the tests of constrained requests through the engine share
 * (test_constrain_engine, test_constrain_engine_masks,
 * test_cuda_masked_top): the bundled trained model, a chat prompt, the
 * backend with its masked op hidden (the host path), and one engine run of
 * JSON Schema requests whose samples are collected. */
#ifndef G4_TESTS_SUPPORT_CONSTRAINED_ENGINE_H
#define G4_TESTS_SUPPORT_CONSTRAINED_ENGINE_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/constraints.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"
#include "test_util.h"

#define CONSTRAINED_MAX_NEW 48 /* the most tokens a collected reply holds */

/* a person of the bundled model's text: a name, an age, one of three kinds */
static inline const char *constrained_person_schema(void) {
    return "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},\"age\":{\"type\":"
           "\"integer\"},\"kind\":{\"enum\":[\"patriarch\",\"king\",\"prophet\"]}},\"required\":[\"name\",\"age\","
           "\"kind\"],\"additionalProperties\":false}";
}

/* models/tiny of the source tree on `device`; NULL (a failed check) when it does not open */
static inline g4_context *constrained_model_open(const char *device, int threads) {
    const char *src = getenv("G4_SOURCE");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/tiny", src ? src : ".");
    g4_context *c = NULL;
    g4_context_options co = {.device = device, .threads = threads, .require_tokenizer = 1};
    if (g4_context_open(dir, &co, &c) != G4_OK) CHECK(0, "open %s on %s: %s", dir, device, g4_error_message());
    return c;
}

/* the chat prompt of one user message, ready for a reply */
static inline void constrained_prompt(g4_context *c, const char *user_text, g4_prompt *p) {
    cJSON *messages = cJSON_CreateArray(), *user = cJSON_CreateObject();
    cJSON_AddStringToObject(user, "role", "user");
    cJSON_AddStringToObject(user, "content", user_text);
    cJSON_AddItemToArray(messages, user);
    g4_prompt_options po = {.chat = {.add_generation_prompt = 1}};
    CHECK(g4_prompt_from_messages(c, messages, NULL, &po, NULL, 0, p) == G4_OK, "%s", g4_error_message());
    cJSON_Delete(messages);
}

/* `with_masks` without top_logits_masked: the engine then masks full rows on the host */
typedef struct {
    g4_backend_ops ops;
    g4_backend backend;
} host_path_backend;

static inline void host_path_backend_init(host_path_backend *h, const g4_backend *with_masks) {
    h->ops = *with_masks->ops;
    h->ops.top_logits_masked = NULL;
    h->backend = (g4_backend){.ops = &h->ops, .impl = with_masks->impl};
}

static inline g4_token_matcher *constrained_matcher(g4_context *c, const char *schema) {
    g4_constraint_spec spec = {G4_CONSTRAINT_JSON_SCHEMA, (char *)schema, 0};
    g4_constraint_use use = {.stop_ids = c->stop_ids, .n_stop = c->n_stop};
    g4_token_matcher *m = NULL;
    CHECK(g4_constraints_matcher(c->constraints, &spec, &use, &m) == G4_OK, "%s", g4_error_message());
    return m;
}

/* one request's reply */
typedef struct {
    g4_sample samples[CONSTRAINED_MAX_NEW + 1];
    int n;
    g4_finish_reason finish;
} constrained_reply;

static inline void constrained_on_token(void *user, const g4_token_event *ev) {
    constrained_reply *c = user;
    if (ev->has_token && c->n <= CONSTRAINED_MAX_NEW) c->samples[c->n++] = ev->sample;
    if (ev->finish != G4_FINISH_NONE) c->finish = ev->finish;
}

/* The requests of a run: their schema, reply budget and the engine's threads. */
typedef struct {
    const char *schema;   /* NULL: constrained_person_schema() */
    int max_new;          /* <= CONSTRAINED_MAX_NEW */
    int threads;          /* the engine's (0: the backend's) */
} constrained_run_options;

/* One engine (4 sequences, 256 positions) over n_req requests of the
 * schema, request i sampling with sp and the seed sp->seed + i; stats when
 * not NULL. */
static inline void constrained_run(g4_context *c, const g4_prompt *p, const constrained_run_options *o,
                                   const g4_sampler_params *sp, int n_req, constrained_reply *out,
                                   g4_engine_stats *stats) {
    g4_engine *e = NULL;
    g4_engine_options eo = {.max_seqs = 4, .n_ctx = 256, .threads = o->threads};
    CHECK(g4_engine_create(c->model, &eo, &e) == G4_OK, "%s", g4_error_message());
    if (!e) return;
    for (int i = 0; i < n_req; i++) {
        memset(&out[i], 0, sizeof out[i]);
        g4_sampler_params s = *sp;
        s.seed = sp->seed + (uint64_t)i;
        g4_request r = {.prompt = p->ids, .n_prompt = p->n_ids, .sampling = s, .max_tokens = o->max_new,
                        .stop_ids = c->stop_ids, .n_stop = c->n_stop, .on_token = constrained_on_token,
                        .user = &out[i], .constraint = constrained_matcher(c, o->schema ? o->schema : constrained_person_schema())};
        CHECK(g4_engine_submit(e, &r, NULL) == G4_OK, "submit: %s", g4_error_message());
    }
    for (int guard = 0; guard < 10000 && g4_engine_step(e) > 0; guard++) {
    }
    if (stats) g4_engine_get_stats(e, stats);
    g4_engine_destroy(e);
}

#endif
