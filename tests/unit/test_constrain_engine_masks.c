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

#include "support/candidates.h"
#include "support/constrained_engine.h"
#include "test_util.h"

#define MAX_NEW 36
#define N_REQ 2

/* the person schema's requests */
static const constrained_run_options opts = {.max_new = MAX_NEW, .threads = 2};

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
    g4_context *c = constrained_model_open("cpu", 2);
    if (!c) return test_finish();
    g4_prompt p;
    constrained_prompt(c, "Who was Methuselah? Answer in JSON.", &p);

    /* the host path: the same backend without its masked op */
    g4_backend *with_masks = c->model->backend;
    host_path_backend host_only;
    host_path_backend_init(&host_only, with_masks);

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
        constrained_reply device[N_REQ], host[N_REQ];
        g4_engine_stats sd, sh;
        c->model->backend = with_masks;
        constrained_run(c, &p, &opts, &sp, N_REQ, device, &sd);
        c->model->backend = &host_only.backend;
        constrained_run(c, &p, &opts, &sp, N_REQ, host, &sh);
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
