/* Constrained rows through token masks on the backend equal the host path:
 * on the bundled trained model, the engine runs the same JSON Schema
 * requests twice, once as it does (each row's mask uploaded, the backend's
 * top_logits_masked choosing its candidates) and once on a copy of the CPU
 * backend without that op (every constrained row's full logits masked and
 * sampled on the host). Per sampling setup (greedy, top-k/top-p with RAW
 * and PROCESSED log-probabilities, temperature 1 without top-k, a
 * repetition penalty) the two runs give the same tokens, log-probabilities
 * and top log-probabilities bit for bit and the same finish; the stats show
 * which path each run took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/constraints.h"
#include "runtime/context.h"
#include "runtime/engine.h"
#include "runtime/prompt.h"
#include "test_util.h"

#define MAX_NEW 36
#define N_REQ 2

typedef struct {
    g4_sample samples[MAX_NEW + 1];
    int n;
    g4_finish_reason finish;
} collected;

static void on_token(void *user, const g4_token_event *ev) {
    collected *c = user;
    if (ev->has_token && c->n <= MAX_NEW) c->samples[c->n++] = ev->sample;
    if (ev->finish != G4_FINISH_NONE) c->finish = ev->finish;
}

static const char *const SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},\"age\":{\"type\":"
    "\"integer\"},\"kind\":{\"enum\":[\"patriarch\",\"king\",\"prophet\"]}},\"required\":[\"name\",\"age\",\"kind\"],"
    "\"additionalProperties\":false}";

static int same_sample(const g4_sample *a, const g4_sample *b) {
    if (a->token != b->token || memcmp(&a->logprob, &b->logprob, sizeof a->logprob) || a->n_top != b->n_top) return 0;
    for (int i = 0; i < a->n_top; i++)
        if (a->top[i].id != b->top[i].id || memcmp(&a->top[i].logprob, &b->top[i].logprob, sizeof(float))) return 0;
    return 1;
}

/* One engine over N_REQ requests with these parameters (seeds differ). */
static void run(g4_context *c, const g4_prompt *p, const g4_sampler_params *sp, collected *out,
                g4_engine_stats *stats) {
    g4_engine *e = NULL;
    g4_engine_options eo = {.max_seqs = 4, .n_ctx = 256, .threads = 2};
    CHECK(g4_engine_create(c->model, &eo, &e) == G4_OK, "%s", g4_error_message());
    if (!e) return;
    for (int i = 0; i < N_REQ; i++) {
        g4_constraint_spec spec = {G4_CONSTRAINT_JSON_SCHEMA, (char *)SCHEMA, 0};
        g4_constraint_use use = {.stop_ids = c->stop_ids, .n_stop = c->n_stop};
        g4_token_matcher *m = NULL;
        CHECK(g4_constraints_matcher(c->constraints, &spec, &use, &m) == G4_OK, "%s", g4_error_message());
        g4_sampler_params s = *sp;
        s.seed = sp->seed + (uint64_t)i;
        memset(&out[i], 0, sizeof out[i]);
        g4_request r = {.prompt = p->ids, .n_prompt = p->n_ids, .sampling = s, .max_tokens = MAX_NEW,
                        .stop_ids = c->stop_ids, .n_stop = c->n_stop, .on_token = on_token, .user = &out[i],
                        .constraint = m};
        CHECK(g4_engine_submit(e, &r, NULL) == G4_OK, "submit: %s", g4_error_message());
    }
    for (int guard = 0; guard < 10000 && g4_engine_step(e) > 0; guard++) {
    }
    g4_engine_get_stats(e, stats);
    g4_engine_destroy(e);
}

typedef struct {
    const char *name;
    float temperature;
    int top_k;
    float top_p, repetition_penalty;
    int top_logprobs;
    g4_logprobs_mode mode;
    int all_on_device; /* every constrained row decided by its masked candidates */
} setup;

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
    cJSON *messages = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Who was Methuselah? Answer in JSON.\"}]");
    g4_prompt p;
    g4_prompt_options po = {.chat = {.add_generation_prompt = 1}};
    CHECK(g4_prompt_from_messages(c, messages, NULL, &po, NULL, 0, &p) == G4_OK, "%s", g4_error_message());
    cJSON_Delete(messages);

    /* the host path: the same backend without its masked op */
    g4_backend *with_masks = c->model->backend;
    g4_backend_ops host_ops = *with_masks->ops;
    host_ops.top_logits_masked = NULL;
    g4_backend host_only = {.ops = &host_ops, .impl = with_masks->impl};

    const setup setups[] = {
        {"greedy, raw top 5", 0, 0, 1, 1, 5, G4_LOGPROBS_RAW, 1},
        {"T 1, top-k 64, top-p 0.95, raw top 3", 1, 64, 0.95f, 1, 3, G4_LOGPROBS_RAW, 1},
        {"T 0.8, top-k 8, processed top 2", 0.8f, 8, 1, 1, 2, G4_LOGPROBS_PROCESSED, 1},
        {"T 1, no top-k", 1, 0, 1, 1, 0, G4_LOGPROBS_RAW, 0},
        {"T 1, top-k 40, repetition penalty 1.2", 1, 40, 1, 1.2f, 0, G4_LOGPROBS_RAW, 0},
    };
    for (size_t u = 0; u < sizeof setups / sizeof setups[0]; u++) {
        const setup *su = &setups[u];
        g4_sampler_params sp;
        g4_sampler_params_default(&sp);
        sp.temperature = su->temperature;
        sp.top_k = su->top_k;
        sp.top_p = su->top_p;
        sp.repetition_penalty = su->repetition_penalty;
        sp.logprobs = 1;
        sp.top_logprobs = su->top_logprobs;
        sp.logprobs_mode = su->mode;
        sp.seed = 500 + u * 10;
        collected device[N_REQ], host[N_REQ];
        g4_engine_stats sd, sh;
        c->model->backend = with_masks;
        run(c, &p, &sp, device, &sd);
        c->model->backend = &host_only;
        run(c, &p, &sp, host, &sh);
        c->model->backend = with_masks;
        int tokens = 0;
        for (int i = 0; i < N_REQ; i++) {
            int same = device[i].n == host[i].n && device[i].finish == host[i].finish;
            for (int t = 0; same && t < device[i].n; t++) same = same_sample(&device[i].samples[t], &host[i].samples[t]);
            CHECK(same, "%s, request %d: masks on the backend give %d tokens (finish %d), the host path %d (finish %d), "
                  "or their samples differ", su->name, i, device[i].n, device[i].finish, host[i].n, host[i].finish);
            CHECK(device[i].finish == G4_FINISH_STOP, "%s, request %d: the reply ended on its stop token (%d)", su->name,
                  i, device[i].finish);
            tokens += device[i].n;
        }
        printf("%-40s %3d tokens; on the backend: %llu masked rows, %llu uploads, %llu on the host; host path: "
               "%llu on the host\n",
               su->name, tokens, (unsigned long long)sd.masked_rows, (unsigned long long)sd.mask_uploads,
               (unsigned long long)sd.masked_rows_on_host, (unsigned long long)sh.masked_rows_on_host);
        CHECK(sh.masked_rows == 0 && sh.masked_rows_on_host > 0, "%s: the host run took the host path", su->name);
        if (su->all_on_device)
            CHECK(sd.masked_rows > 0 && sd.masked_rows_on_host == 0 && sd.mask_uploads < sd.masked_rows,
                  "%s: every constrained row decided on the backend, masks reused across rows", su->name);
        else if (su->repetition_penalty == 1)
            CHECK(sd.masked_rows > sd.masked_rows_on_host, "%s: complete lists decided most rows", su->name);
        else
            CHECK(sd.masked_rows == 0, "%s: penalised rows take the full row", su->name);
    }
    g4_prompt_free(c, &p);
    g4_context_close(c);
    return test_finish();
}
