/* Constrained sampling in the batched engine equals the plain loop: on the
 * bundled trained model, requests with a JSON Schema (temperature 1, the
 * model's top-k/top-p) give exactly the tokens of the session loop that
 * masks the full row before sampling (g4_session_eval_sample_constrained),
 * although the engine draws from the candidates the backend chose from the
 * masked row; every reply ends where the grammar may end, within
 * max_tokens. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/constraints.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"
#include "runtime/session.h"
#include "test_util.h"

#define MAX_NEW 48
#define N_REQ 2

typedef struct {
    int32_t ids[MAX_NEW + 1];
    int n;
    g4_finish_reason finish;
} collected;

static void on_token(void *user, const g4_token_event *ev) {
    collected *c = user;
    if (ev->has_token && c->n <= MAX_NEW) c->ids[c->n++] = ev->sample.token;
    if (ev->finish != G4_FINISH_NONE) c->finish = ev->finish;
}

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2}},\"required\":[\"name\","
    "\"age\",\"tags\"],\"additionalProperties\":false}";

static g4_token_matcher *matcher(g4_context *c) {
    g4_constraint_spec spec = {G4_CONSTRAINT_JSON_SCHEMA, (char *)SCHEMA, 0};
    g4_constraint_use use = {.stop_ids = c->stop_ids, .n_stop = c->n_stop};
    g4_token_matcher *m = NULL;
    CHECK(g4_constraints_matcher(c->constraints, &spec, &use, &m) == G4_OK, "%s", g4_error_message());
    return m;
}

static void run_alone(g4_context *c, const g4_prompt *p, const g4_sampler_params *sp, collected *out) {
    const int V = c->model->config.text.vocab_size;
    g4_session_options so = {.n_ctx = p->n_ids + MAX_NEW + 1};
    g4_session *s = NULL;
    g4_sampler *sampler = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    g4_token_matcher *m = matcher(c);
    memset(out, 0, sizeof *out);
    g4_status st = g4_session_create(c->model, &so, &s);
    if (st == G4_OK) st = g4_sampler_create(V, sp, &sampler);
    if (st == G4_OK) st = g4_sampler_add_prompt(sampler, p->ids, (size_t)p->n_ids);
    g4_sample sample;
    int none = 0;
    if (st == G4_OK) st = g4_session_eval_sample_constrained(s, p->ids, p->n_ids, NULL, sampler, logits, m, MAX_NEW,
                                                             &sample, &none);
    while (st == G4_OK && !none && out->n < MAX_NEW) {
        out->ids[out->n++] = sample.token;
        st = g4_sampler_accept(sampler, sample.token);
        if (st == G4_OK) st = g4_token_matcher_accept(m, sample.token);
        int stop = 0;
        for (int k = 0; k < c->n_stop; k++) stop |= sample.token == c->stop_ids[k];
        if (stop || out->n == MAX_NEW || st != G4_OK) break;
        st = g4_session_eval_sample_constrained(s, &sample.token, 1, NULL, sampler, logits, m, MAX_NEW - out->n,
                                                &sample, &none);
    }
    CHECK(st == G4_OK, "alone: %s", g4_error_message());
    CHECK(g4_token_matcher_can_end(m), "the plain loop's reply is complete");
    g4_token_matcher_free(m);
    g4_sampler_free(sampler);
    g4_session_destroy(s);
    free(logits);
}

int main(void) {
    const char *src = getenv("G4_SOURCE");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/tiny", src ? src : ".");
    g4_context *c = NULL;
    g4_context_options co = {.device = "cpu", .threads = 2, .require_tokenizer = 1};
    if (g4_context_open(dir, &co, &c) != G4_OK) {
        CHECK(0, "open %s: %s", dir, g4_error_message());
        return test_finish();
    }
    cJSON *messages = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Who begat Enos? Answer in JSON.\"}]");
    g4_prompt p;
    g4_prompt_options po = {.chat = {.add_generation_prompt = 1}};
    CHECK(g4_prompt_from_messages(c, messages, NULL, &po, NULL, 0, &p) == G4_OK, "%s", g4_error_message());
    cJSON_Delete(messages);

    g4_engine *e = NULL;
    g4_engine_options eo = {.max_seqs = 4, .n_ctx = 256, .threads = 2};
    CHECK(g4_engine_create(c->model, &eo, &e) == G4_OK, "%s", g4_error_message());
    collected got[N_REQ], want[N_REQ];
    g4_sampler_params sp[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        g4_sampler_params_from_generation_config(&sp[i], &c->generation);
        sp[i].temperature = 1.0f;
        sp[i].seed = 11 + (uint64_t)i;
        memset(&got[i], 0, sizeof got[i]);
        g4_request r = {.prompt = p.ids, .n_prompt = p.n_ids, .sampling = sp[i], .max_tokens = MAX_NEW,
                        .stop_ids = c->stop_ids, .n_stop = c->n_stop, .on_token = on_token, .user = &got[i],
                        .constraint = matcher(c)};
        CHECK(g4_engine_submit(e, &r, NULL) == G4_OK, "submit: %s", g4_error_message());
    }
    for (int guard = 0; guard < 10000 && g4_engine_step(e) > 0; guard++) {
    }
    for (int i = 0; i < N_REQ; i++) {
        run_alone(c, &p, &sp[i], &want[i]);
        CHECK(got[i].finish == G4_FINISH_STOP || got[i].finish == G4_FINISH_LENGTH, "request %d finished (%d)", i,
              got[i].finish);
        CHECK(got[i].n == want[i].n && !memcmp(got[i].ids, want[i].ids, (size_t)got[i].n * sizeof(int32_t)),
              "request %d: the engine's %d tokens equal the plain masked loop's %d", i, got[i].n, want[i].n);
        char *text = NULL;
        size_t len;
        int n_text = got[i].n && got[i].finish == G4_FINISH_STOP ? got[i].n - 1 : got[i].n;
        g4_tokenizer_decode(c->tokenizer, got[i].ids, (size_t)n_text, 1, &text, &len);
        cJSON *v = text ? cJSON_Parse(text) : NULL;
        CHECK(v && cJSON_IsObject(v) && cJSON_IsString(cJSON_GetObjectItem(v, "name")) &&
                  cJSON_IsNumber(cJSON_GetObjectItem(v, "age")) && cJSON_IsArray(cJSON_GetObjectItem(v, "tags")),
              "request %d: the reply is the schema's object: %s", i, text ? text : "");
        cJSON_Delete(v);
        free(text);
    }
    g4_engine_destroy(e);
    g4_prompt_free(c, &p);
    g4_context_close(c);
    return test_finish();
}
