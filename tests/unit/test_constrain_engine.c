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

#include "runtime/session.h"
#include "support/constrained_engine.h"
#include "test_util.h"

#define MAX_NEW 48
#define N_REQ 2

/* a reply's token ids */
typedef struct {
    int32_t ids[MAX_NEW + 1];
    int n;
} collected;

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2}},\"required\":[\"name\","
    "\"age\",\"tags\"],\"additionalProperties\":false}";

static void run_alone(g4_context *c, const g4_prompt *p, const g4_sampler_params *sp, collected *out) {
    const int V = c->model->config.text.vocab_size;
    g4_session_options so = {.n_ctx = p->n_ids + MAX_NEW + 1};
    g4_session *s = NULL;
    g4_sampler *sampler = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    g4_token_matcher *m = constrained_matcher(c, SCHEMA);
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
    g4_context *c = constrained_model_open("cpu", 2);
    if (!c) return test_finish();
    g4_prompt p;
    constrained_prompt(c, "Who begat Enos? Answer in JSON.", &p);

    constrained_reply got[N_REQ];
    collected want[N_REQ];
    g4_sampler_params sp;
    g4_sampler_params_from_generation_config(&sp, &c->generation);
    sp.temperature = 1.0f;
    sp.seed = 11;
    const constrained_run_options o = {.schema = SCHEMA, .max_new = MAX_NEW, .threads = 2};
    constrained_run(c, &p, &o, &sp, N_REQ, got, NULL);
    for (int i = 0; i < N_REQ; i++) {
        g4_sampler_params spi = sp;
        spi.seed = sp.seed + (uint64_t)i;
        run_alone(c, &p, &spi, &want[i]);
        CHECK(got[i].finish == G4_FINISH_STOP || got[i].finish == G4_FINISH_LENGTH, "request %d finished (%d)", i,
              got[i].finish);
        int32_t ids[CONSTRAINED_MAX_NEW + 1];
        for (int t = 0; t < got[i].n; t++) ids[t] = got[i].samples[t].token;
        CHECK(got[i].n == want[i].n && !memcmp(ids, want[i].ids, (size_t)got[i].n * sizeof(int32_t)),
              "request %d: the engine's %d tokens equal the plain masked loop's %d", i, got[i].n, want[i].n);
        char *text = NULL;
        size_t len;
        int n_text = got[i].n && got[i].finish == G4_FINISH_STOP ? got[i].n - 1 : got[i].n;
        g4_tokenizer_decode(c->tokenizer, ids, (size_t)n_text, 1, &text, &len);
        cJSON *v = text ? cJSON_Parse(text) : NULL;
        CHECK(v && cJSON_IsObject(v) && cJSON_IsString(cJSON_GetObjectItem(v, "name")) &&
                  cJSON_IsNumber(cJSON_GetObjectItem(v, "age")) && cJSON_IsArray(cJSON_GetObjectItem(v, "tags")),
              "request %d: the reply is the schema's object: %s", i, text ? text : "");
        cJSON_Delete(v);
        free(text);
    }
    g4_prompt_free(c, &p);
    g4_context_close(c);
    return test_finish();
}
