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
static g4_status drafted_run(g4_session *s, const g4_assistant *a, int draft_max, int forced, const int32_t *prompt,
                             int P, int tg, int32_t *out, double *seconds, g4_speculative_stats *stats) {
    g4_session_reset(s);
    int n = 0;
    return g4_speculative_greedy(s, a, draft_max, forced, prompt, P, tg, NULL, 0, out, &n, stats, seconds);
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    *mean = *sd = 0;
    for (int i = 0; i < n; i++) *mean += v[i];
    *mean /= n;
    for (int i = 0; i < n; i++) *sd += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(*sd / (n - 1)) : 0;
}

/* The drafter: --draft DIR, or --draft synthetic beside --synthetic NAME. */
static int open_drafter(const bench_draft_options *o, g4_model *model, g4_assistant **a) {
    return cli_open_draft_any(o->draft, o->synthetic, model, a);
}

/* <bos> and the prompt's ids: tokenized with the model's tokenizer, or (a
 * synthetic model has none) 32 fixed ids. */
static g4_status prompt_ids(const g4_model *model, const char *prompt, int32_t **ids, int *n) {
    g4_tokenizer *tok = NULL;
    int32_t *text_ids = NULL;
    size_t n_text = 0;
    g4_status st = G4_OK;
    if (model->synthetic) {
        n_text = 32;
        text_ids = malloc(n_text * sizeof *text_ids);
        if (!text_ids) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < n_text; i++) text_ids[i] = (int32_t)(1000 + 7919 * i) % model->config.text.vocab_size;
    } else {
        st = g4_tokenizer_load(model->path, &tok);
        if (st == G4_OK) st = g4_tokenizer_encode(tok, prompt, strlen(prompt), 0, &text_ids, &n_text);
        g4_tokenizer_free(tok);
    }
    *n = (int)n_text + 1;
    *ids = st == G4_OK ? malloc((size_t)*n * sizeof **ids) : NULL;
    if (st == G4_OK && !*ids) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) {
        (*ids)[0] = model->config.tokens.bos_id;
        memcpy(*ids + 1, text_ids, n_text * sizeof **ids);
    }
    free(text_ids);
    return st;
}

typedef struct {
    double plain_mean, plain_sd, draft_mean, draft_sd;
    int same;
    g4_speculative_stats stats; /* of the last drafted run */
} draft_measure;

/* reps alternated runs of plain and drafted decoding of tg tokens (forced >=
 * 0: that many drafts kept a round), after a short warm-up of both. */
static g4_status measure(g4_session *s, const g4_assistant *a, int draft_max, int forced, const int32_t *ids, int P,
                         int tg, int reps, draft_measure *m) {
    int32_t *plain = malloc((size_t)tg * sizeof *plain), *drafted = malloc((size_t)tg * sizeof *drafted);
    double *plain_tps = calloc((size_t)reps, sizeof(double)), *draft_tps = calloc((size_t)reps, sizeof(double));
    g4_status st = plain && drafted && plain_tps && draft_tps ? G4_OK : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    double secs;
    m->same = 1;
    const int warm = tg < 8 ? tg : 8;
    if (st == G4_OK) st = plain_run(s, ids, P, warm, plain, &secs);
    if (st == G4_OK) st = drafted_run(s, a, draft_max, forced, ids, P, warm, drafted, &secs, &m->stats);
    for (int r = 0; st == G4_OK && r < reps; r++) {
        st = plain_run(s, ids, P, tg, plain, &secs);
        plain_tps[r] = tg / secs;
        if (st == G4_OK) st = drafted_run(s, a, draft_max, forced, ids, P, tg, drafted, &secs, &m->stats);
        draft_tps[r] = tg / secs;
        m->same &= !memcmp(plain, drafted, (size_t)tg * sizeof *plain);
    }
    if (st == G4_OK) {
        mean_sd(plain_tps, reps, &m->plain_mean, &m->plain_sd);
        mean_sd(draft_tps, reps, &m->draft_mean, &m->draft_sd);
    }
    free(plain);
    free(drafted);
    free(plain_tps);
    free(draft_tps);
    return st;
}

static double per_round(const g4_speculative_stats *s, double total) { return s->rounds ? total / s->rounds : 0; }

/* The forced-acceptance table: speed at each acceptance length (random
 * weights: the drafts are never the model's choice, so the verification is
 * told what to keep; the tokens are not the model's). */
static g4_status bench_forced(const bench_draft_options *o, g4_session *s, const g4_model *model,
                              const g4_assistant *a, const int32_t *ids, int P) {
    int32_t *levels = NULL;
    int n_levels = 0;
    if (cli_parse_ids(o->force_accept, &levels, &n_levels) != 0 || n_levels == 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "--force-accept wants a list of draft counts, e.g. 0,1,2,3");
    const int k = o->draft->draft_max;
    g4_status st = G4_OK;
    if (!o->json)
        printf("\n| model | drafter | test | accepted a round (forced) | tokens a target pass | plain t/s | drafted t/s "
               "| speedup | draft ms a round | verify ms a round |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int l = 0; st == G4_OK && l < n_levels; l++) {
        if (levels[l] < 0 || levels[l] > k) {
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "--force-accept %d outside 0..--draft-max %d", levels[l], k);
            break;
        }
        draft_measure m;
        st = measure(s, a, k, levels[l], ids, P, o->tg, o->reps, &m);
        if (st != G4_OK) break;
        const double tokens_per_pass =
            m.stats.rounds ? (double)(m.stats.accepted + m.stats.rounds) / m.stats.rounds : 0.0;
        const double draft_ms = 1e3 * per_round(&m.stats, m.stats.draft_seconds),
                     verify_ms = 1e3 * per_round(&m.stats, m.stats.verify_seconds);
        if (o->json)
            printf("{\"model\":\"%s\",\"drafter\":\"%s\",\"draft_max\":%d,\"forced_accept\":%d,\"tg\":%d,"
                   "\"tokens_per_target_pass\":%.4f,\"plain_tps\":%.3f,\"plain_sd\":%.3f,\"draft_tps\":%.3f,"
                   "\"draft_sd\":%.3f,\"speedup\":%.3f,\"draft_ms_per_round\":%.4f,\"verify_ms_per_round\":%.4f}\n",
                   model->path, a->model->path, k, levels[l], o->tg, tokens_per_pass, m.plain_mean, m.plain_sd,
                   m.draft_mean, m.draft_sd, m.draft_mean / m.plain_mean, draft_ms, verify_ms);
        else
            printf("| %s | %s | tg%d, draft %d | %d (forced) | %.2f | %.2f ± %.2f | %.2f ± %.2f | %.2fx | %.3f | %.3f "
                   "|\n",
                   model->path, a->model->path, o->tg, k, levels[l], tokens_per_pass, m.plain_mean, m.plain_sd,
                   m.draft_mean, m.draft_sd, m.draft_mean / m.plain_mean, draft_ms, verify_ms);
    }
    free(levels);
    return st;
}

int bench_draft(g4_model *model, const bench_draft_options *o) {
    const int tg = o->tg;
    if (tg < 2) {
        fprintf(stderr, "gemma4 bench --draft: -n must be at least 2\n");
        return 2;
    }
    g4_assistant *a = NULL;
    if (open_drafter(o, model, &a) != 0) return 1;
    int32_t *ids = NULL;
    int P = 0;
    g4_status st = prompt_ids(model, o->prompt, &ids, &P);
    g4_session *s = NULL;
    if (st == G4_OK) {
        g4_session_options opt = {.n_ctx = P + tg + G4_DRAFT_MAX + 8};
        st = g4_session_create(model, &opt, &s);
    }
    int rc = 1;
    if (st == G4_OK && o->force_accept) {
        st = bench_forced(o, s, model, a, ids, P);
        rc = st == G4_OK ? 0 : 1;
    } else if (st == G4_OK) {
        draft_measure m;
        const int k = o->draft->draft_max;
        st = measure(s, a, k, -1, ids, P, tg, o->reps, &m);
        if (st == G4_OK) {
            const g4_speculative_stats *stats = &m.stats;
            char line[256];
            cli_format_draft_stats(stats, k, line, sizeof line);
            if (o->json) {
                printf("{\"model\":\"%s\",\"drafter\":\"%s\",\"draft_max\":%d,\"prompt_tokens\":%d,\"tg\":%d,"
                       "\"plain_tps\":%.3f,\"plain_sd\":%.3f,\"draft_tps\":%.3f,\"draft_sd\":%.3f,\"speedup\":%.3f,"
                       "\"accepted_per_round\":%.4f,\"tokens_per_target_pass\":%.4f,\"same_ids\":%s,\"acceptance\":[",
                       model->path, a->model->path, k, P, tg, m.plain_mean, m.plain_sd, m.draft_mean, m.draft_sd,
                       m.draft_mean / m.plain_mean, stats->rounds ? (double)stats->accepted / stats->rounds : 0.0,
                       stats->rounds ? (double)(stats->accepted + stats->rounds) / stats->rounds : 0.0,
                       m.same ? "true" : "false");
                for (int i = 0; i < k; i++)
                    printf("%s%.4f", i ? "," : "",
                           stats->drafted_at[i] ? (double)stats->accepted_at[i] / stats->drafted_at[i] : 0.0);
                printf("]}\n");
            } else {
                printf("\n| model | drafter | test | plain t/s | drafted t/s | speedup | same ids |\n"
                       "|---|---|---|---|---|---|---|\n"
                       "| %s | %s | tg%d greedy, draft %d | %.2f ± %.2f | %.2f ± %.2f | %.2fx | %s |\n"
                       "drafting (last run, %d prompt tokens)%s\n",
                       model->path, a->model->path, tg, k, m.plain_mean, m.plain_sd, m.draft_mean, m.draft_sd,
                       m.draft_mean / m.plain_mean, m.same ? "yes" : "NO", P, line);
            }
            rc = m.same ? 0 : 1;
            if (!m.same) fprintf(stderr, "gemma4 bench --draft: drafted greedy ids differ from plain greedy ids\n");
        }
    }
    if (st != G4_OK) cli_report_error("bench --draft", st);
    g4_session_destroy(s);
    free(ids);
    g4_assistant_release(a);
    return rc;
}
