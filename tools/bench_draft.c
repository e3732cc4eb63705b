#include "bench_draft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli_common.h"
#include "runtime/session.h"
#include "runtime/speculative.h"
#include "text/tokenizer.h"

/* Plain greedy decoding of tg tokens after the prompt (only the argmax comes
 * back, as in the decode benchmark); the ids into out. */
static g4_status plain_run(g4_session *s, const int32_t *prompt, int P, int tg, int32_t *out, double *seconds) {
    g4_session_reset(s);
    int32_t next;
    float value;
    double lse;
    g4_status st = g4_session_eval_top(s, prompt, P, NULL, 1, &next, &value, &lse);
    double t0 = g4_now_seconds();
    for (int i = 0; st == G4_OK && i < tg; i++) {
        out[i] = next;
        if (i + 1 < tg) st = g4_session_eval_top(s, &out[i], 1, NULL, 1, &next, &value, &lse);
    }
    *seconds = g4_now_seconds() - t0;
    return st;
}

/* The same through speculative decoding; stats of the run into *stats. */
static g4_status drafted_run(g4_session *s, const g4_assistant *a, int draft_max, const int32_t *prompt, int P,
                             int tg, int32_t *out, double *seconds, g4_speculative_stats *stats) {
    g4_session_reset(s);
    int n = 0;
    return g4_speculative_greedy(s, a, draft_max, prompt, P, tg, NULL, 0, out, &n, stats, seconds);
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    *mean = *sd = 0;
    for (int i = 0; i < n; i++) *mean += v[i];
    *mean /= n;
    for (int i = 0; i < n; i++) *sd += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(*sd / (n - 1)) : 0;
}

int bench_draft(g4_model *model, const cli_draft_options *draft, const char *prompt, int tg, int reps, int json) {
    if (tg < 2) {
        fprintf(stderr, "gemma4 bench --draft: -n must be at least 2\n");
        return 2;
    }
    g4_assistant *a = NULL;
    if (cli_open_draft(draft, model, &a) != 0) return 1;
    g4_tokenizer *tok = NULL;
    int32_t *text_ids = NULL, *ids = NULL;
    size_t n_text = 0;
    g4_status st = g4_tokenizer_load(model->path, &tok);
    if (st == G4_OK) st = g4_tokenizer_encode(tok, prompt, strlen(prompt), 0, &text_ids, &n_text);
    const int P = (int)n_text + 1;
    ids = malloc((size_t)P * sizeof *ids);
    int32_t *plain = malloc((size_t)tg * sizeof *plain), *drafted = malloc((size_t)tg * sizeof *drafted);
    double *plain_tps = calloc((size_t)reps, sizeof(double)), *draft_tps = calloc((size_t)reps, sizeof(double));
    if (st == G4_OK && !(ids && plain && drafted && plain_tps && draft_tps)) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_session *s = NULL;
    if (st == G4_OK) {
        ids[0] = model->config.tokens.bos_id;
        memcpy(ids + 1, text_ids, n_text * sizeof *ids);
        g4_session_options opt = {.n_ctx = P + tg + G4_DRAFT_MAX + 8};
        st = g4_session_create(model, &opt, &s);
    }
    g4_speculative_stats stats = {0};
    int same = 1;
    double secs;
    /* warm-up of both paths */
    if (st == G4_OK) st = plain_run(s, ids, P, tg < 8 ? tg : 8, plain, &secs);
    if (st == G4_OK) st = drafted_run(s, a, draft->draft_max, ids, P, tg < 8 ? tg : 8, drafted, &secs, &stats);
    for (int r = 0; st == G4_OK && r < reps; r++) {
        st = plain_run(s, ids, P, tg, plain, &secs);
        plain_tps[r] = tg / secs;
        if (st == G4_OK) st = drafted_run(s, a, draft->draft_max, ids, P, tg, drafted, &secs, &stats);
        draft_tps[r] = tg / secs;
        same &= !memcmp(plain, drafted, (size_t)tg * sizeof *plain);
    }
    int rc = 1;
    if (st == G4_OK) {
        double pm, psd, dm, dsd;
        mean_sd(plain_tps, reps, &pm, &psd);
        mean_sd(draft_tps, reps, &dm, &dsd);
        char line[256];
        cli_format_draft_stats(&stats, draft->draft_max, line, sizeof line);
        if (json) {
            printf("{\"model\":\"%s\",\"drafter\":\"%s\",\"draft_max\":%d,\"prompt_tokens\":%d,\"tg\":%d,"
                   "\"plain_tps\":%.3f,\"plain_sd\":%.3f,\"draft_tps\":%.3f,\"draft_sd\":%.3f,\"speedup\":%.3f,"
                   "\"accepted_per_round\":%.4f,\"tokens_per_target_pass\":%.4f,\"same_ids\":%s,\"acceptance\":[",
                   model->path, a->model->path, draft->draft_max, P, tg, pm, psd, dm, dsd, dm / pm,
                   stats.rounds ? (double)stats.accepted / stats.rounds : 0.0,
                   stats.rounds ? (double)(stats.accepted + stats.rounds) / stats.rounds : 0.0,
                   same ? "true" : "false");
            for (int i = 0; i < draft->draft_max; i++)
                printf("%s%.4f", i ? "," : "", stats.drafted_at[i] ? (double)stats.accepted_at[i] / stats.drafted_at[i] : 0.0);
            printf("]}\n");
        } else {
            printf("\n| model | drafter | test | plain t/s | drafted t/s | speedup | same ids |\n"
                   "|---|---|---|---|---|---|---|\n"
                   "| %s | %s | tg%d greedy, draft %d | %.2f ± %.2f | %.2f ± %.2f | %.2fx | %s |\n"
                   "drafting (last run, %d prompt tokens)%s\n",
                   model->path, a->model->path, tg, draft->draft_max, pm, psd, dm, dsd, dm / pm, same ? "yes" : "NO",
                   P, line);
        }
        rc = same ? 0 : 1;
        if (!same) fprintf(stderr, "gemma4 bench --draft: drafted greedy ids differ from plain greedy ids\n");
    } else {
        cli_report_error("bench --draft", st);
    }
    g4_session_destroy(s);
    g4_tokenizer_free(tok);
    free(text_ids);
    free(ids);
    free(plain);
    free(drafted);
    free(plain_tps);
    free(draft_tps);
    g4_assistant_release(a);
    return rc;
}
