/* Candidates of rows through token masks (constrained decoding, issue 31):
 *  - the CPU top_logits_masked op against a plain sort of the row with its
 *    disallowed logits set to -inf: the same ids (-1 for -inf slots) and
 *    value bits, and bit for bit the lse top_logits gives for that row;
 *    masks from empty to full, widths that end inside a word or before the
 *    vocabulary does, rows without a mask, NaN inside and outside the mask;
 *  - g4_sampler_sample_complete on the op's list of a sparse mask against
 *    g4_sampler_sample on the masked full row, for parameter sets with and
 *    without top-k (those the candidates alone could never decide): the
 *    same tokens, log-probabilities (bits) and random stream; a list
 *    shorter than top_logprobs decides once padded with the row's -inf
 *    tokens (lowest ids), as the engine pads it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "constrain/token_mask.h"
#include "runtime/sampler.h"
#include "support/candidates.h"
#include "test_util.h"

static g4_backend *cpu;

/* rows rows of vocab logits, row r masked by slot r % 3 (slot -1 for every
 * fourth row) of three masks of mask_words words */
static void check_op(int rows, int vocab, int k, int mask_words, const double density[3], int ties, int nan_at) {
    float *x = malloc((size_t)rows * vocab * sizeof *x), *row = malloc((size_t)vocab * sizeof *row);
    for (size_t i = 0; i < (size_t)rows * vocab; i++) {
        float v = (float)((uniform01() * 2 - 1) * 20);
        x[i] = ties ? roundf(v * 2) / 2 : v;
    }
    uint32_t *masks = malloc((size_t)3 * mask_words * sizeof *masks);
    for (int m = 0; m < 3; m++) random_mask(masks + (size_t)m * mask_words, mask_words, density[m]);
    int32_t *slot = malloc((size_t)rows * sizeof *slot);
    for (int r = 0; r < rows; r++) slot[r] = r % 4 == 3 ? -1 : r % 3;
    if (nan_at >= 0) x[nan_at] = NAN;
    int32_t *ids = malloc((size_t)rows * k * sizeof *ids), *plain_ids = malloc((size_t)k * sizeof *plain_ids);
    float *values = malloc((size_t)rows * k * sizeof *values), *plain_v = malloc((size_t)k * sizeof *plain_v);
    double *lse = malloc((size_t)rows * sizeof *lse), plain_lse;
    cpu->ops->top_logits_masked(cpu, ids, values, lse, x, rows, vocab, k, masks, mask_words, slot);
    rank_pair *sorted = malloc((size_t)vocab * sizeof *sorted);
    int bad_order = 0, bad_lse = 0, bad_nan = 0;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * vocab;
        if (slot[r] >= 0) masked_row(row, xr, vocab, masks + (size_t)slot[r] * mask_words, mask_words);
        else memcpy(row, xr, (size_t)vocab * sizeof *row);
        /* the lse and values are top_logits' for the masked row, bit for bit */
        cpu->ops->top_logits(cpu, plain_ids, plain_v, &plain_lse, row, 1, vocab, k);
        int has_nan = 0;
        for (int i = 0; i < vocab; i++) has_nan |= isnan(row[i]);
        if (has_nan) {
            bad_nan += !isnan(lse[r]);
            continue;
        }
        bad_lse += memcmp(&plain_lse, &lse[r], sizeof plain_lse) != 0;
        rank_row(row, vocab, sorted);
        for (int j = 0; j < k; j++) {
            int32_t want_id = j < vocab ? sorted[j].id : -1;
            const float want_v = j < vocab ? sorted[j].v : -INFINITY;
            if (slot[r] >= 0 && want_v == -INFINITY) want_id = -1;
            bad_order += ids[(size_t)r * k + j] != want_id ||
                         memcmp(&values[(size_t)r * k + j], &want_v, sizeof want_v) != 0;
        }
    }
    CHECK(bad_order == 0 && bad_lse == 0 && bad_nan == 0,
          "masked top_logits %d x %d k=%d words %d (densities %g %g %g): %d entries differ from the sort, %d lse "
          "differ from top_logits of the masked row, %d NaN rows without NaN",
          rows, vocab, k, mask_words, density[0], density[1], density[2], bad_order, bad_lse, bad_nan);
    free(x), free(row), free(masks), free(slot), free(ids), free(plain_ids), free(values), free(plain_v), free(lse);
    free(sorted);
}

static void test_op(void) {
    const double sparse[3] = {0.0005, 0.01, 0.3}, edge[3] = {0, 1, 0.5}, dense[3] = {0.9, 0.999, 0.05};
    const int ks[] = {1, 5, 44, 1024};
    for (int i = 0; i < 4; i++) {
        check_op(8, 4096, ks[i], 128, sparse, i % 2, -1);
        check_op(8, 4099, ks[i], 129, edge, 1, -1);   /* the vocabulary ends inside a word */
        check_op(6, 5000, ks[i], 100, dense, 0, -1);  /* tokens past the mask's 3,200 are not allowed */
    }
    check_op(2, 262144, 1, 8192, sparse, 0, -1);
    check_op(2, 262144, 64, 8193, dense, 0, -1);
    check_op(4, 1000, 40, 32, dense, 0, 3 * 1000 + 10); /* a NaN in row 3 (no mask): lse NaN */
    check_op(4, 1000, 40, 32, edge, 0, 1 * 1000 + 10);  /* row 1 allows all: NaN */
    check_op(4, 1000, 40, 32, edge, 0, 0 * 1000 + 10);  /* row 0 allows none: the NaN is masked away */
    /* no token allowed: lse -inf, every slot -1 */
    float x[40];
    for (int i = 0; i < 40; i++) x[i] = (float)i;
    uint32_t none[2] = {0, 0};
    int32_t ids[3], zero = 0;
    float values[3];
    double lse;
    cpu->ops->top_logits_masked(cpu, ids, values, &lse, x, 1, 40, 3, none, 2, &zero);
    CHECK(lse == -INFINITY && ids[0] == -1 && ids[2] == -1 && values[1] == -INFINITY,
          "an empty mask: lse %g, ids %d %d", lse, ids[0], ids[2]);
}

/* ---- the sampler on a complete list against the masked full row ---- */

static void check_complete(const sampler_setup *ps, int vocab, int n_rows) {
    g4_sampler_params p;
    sampler_setup_params(ps, 99, &p);
    g4_sampler *full = NULL, *listed = NULL;
    CHECK(g4_sampler_create(vocab, &p, &full) == G4_OK && g4_sampler_create(vocab, &p, &listed) == G4_OK,
          "sampler: %s", g4_error_message());
    const int K = G4_TOP_LOGITS_MAX_K, words = (int)g4_mask_words(vocab);
    float *x = malloc((size_t)vocab * sizeof *x), *row = malloc((size_t)vocab * sizeof *row);
    float *values = malloc((size_t)K * sizeof *values);
    int32_t *ids = malloc((size_t)K * sizeof *ids), zero = 0;
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    int mismatches = 0, errors = 0, complete = 0, asked_full = 0;
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < vocab; i++) x[i] = (float)((uniform01() * 2 - 1) * (r % 2 ? 3 : 12));
        if (r % 5 == 0)
            for (int i = 0; i < vocab; i++) x[i] = roundf(x[i]); /* ties */
        /* 1 to ~900 allowed tokens: the list holds them all */
        random_mask(mask, words, r % 7 == 0 ? 0.00001 : (double)(1 + r % 4) * 0.0008);
        if (r % 7 == 0) mask[r % words] |= 1u << (r % 32); /* at least one */
        masked_row(row, x, vocab, mask, words);
        double lse;
        cpu->ops->top_logits_masked(cpu, ids, values, &lse, x, 1, vocab, K, mask, words, &zero);
        int n = 0;
        while (n < K && values[n] > -INFINITY) n++;
        if (n == K) continue; /* not complete: the engine takes the sampler's need or the full row */
        complete++;
        g4_sample a, b;
        int need_full = 0;
        g4_status sa = g4_sampler_sample(full, row, &a);
        if (ps->top_logprobs > n) {
            /* the full row's top log-probabilities go on into its -inf
             * tokens: without them the list cannot decide... */
            g4_sampler *probe = NULL;
            g4_sampler_create(vocab, &p, &probe);
            g4_status sp = g4_sampler_sample_complete(probe, ids, values, n, lse, &b, &need_full);
            CHECK(sp == G4_OK && need_full, "%s: %d listed for %d top log-probabilities decided", ps->name, n,
                  ps->top_logprobs);
            g4_sampler_free(probe);
            asked_full++;
            /* ...with them (lowest disallowed ids first, as the engine pads) it does */
            for (int32_t id = 0; id < vocab && n < ps->top_logprobs; id++)
                if (!g4_mask_has(mask, id)) ids[n] = id, values[n++] = -INFINITY;
        }
        g4_status sb = g4_sampler_sample_complete(listed, ids, values, n, lse, &b, &need_full);
        CHECK(sb != G4_OK || !need_full, "%s: a complete list asked for the full row", ps->name);
        errors += sa != G4_OK || sb != G4_OK;
        mismatches += !same_sample(&a, &b);
    }
    CHECK(complete > n_rows / 2, "%s: only %d complete lists", ps->name, complete);
    CHECK(errors == 0 && mismatches == 0, "%s (vocab %d): %d of %d rows differ, %d errors", ps->name, vocab,
          mismatches, complete, errors);
    CHECK(g4_sampler_next_u64(full) == g4_sampler_next_u64(listed), "%s: the random streams part", ps->name);
    printf("  %-44s %d complete lists equal the masked row (%d padded with -inf tokens)\n", ps->name, complete,
           asked_full);
    free(x), free(row), free(values), free(ids), free(mask);
    g4_sampler_free(full);
    g4_sampler_free(listed);
}

static void test_complete(void) {
    const sampler_setup sets[] = {
        {"greedy", 0, 0, 1, 0, 0, 0, G4_LOGPROBS_RAW},
        {"greedy raw top 5", 0, 0, 1, 0, 1, 5, G4_LOGPROBS_RAW},
        {"T 1 (no top-k: the full row's sampler)", 1.0f, 0, 1, 0, 1, 0, G4_LOGPROBS_RAW},
        {"T 0.8 top-p 0.9 raw top 3", 0.8f, 0, 0.9f, 0, 1, 3, G4_LOGPROBS_RAW},
        {"T 1.2 min-p 0.05 processed top 20", 1.2f, 0, 1, 0.05f, 1, 20, G4_LOGPROBS_PROCESSED},
        {"T 1 top-k 64 top-p 0.95 raw top 20", 1.0f, 64, 0.95f, 0, 1, 20, G4_LOGPROBS_RAW},
        {"T 0.7 top-k 5 processed", 0.7f, 5, 1, 0, 1, 0, G4_LOGPROBS_PROCESSED},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) check_complete(&sets[i], 262144, 24);
    /* penalties and logit bias move logits: a complete list is refused */
    g4_sampler_params p;
    g4_sampler_params_default(&p);
    p.repetition_penalty = 1.1f;
    g4_sampler *s;
    g4_sampler_create(100, &p, &s);
    int32_t id = 3;
    float v = 1;
    g4_sample out;
    int need_full;
    CHECK(!g4_sampler_takes_candidates(s) && g4_sampler_sample_complete(s, &id, &v, 1, 1.0, &out, &need_full) != G4_OK,
          "a penalised sampler took a complete list");
    g4_sampler_free(s);
}

int main(void) {
    g4_status st = g4_backend_cpu_create(0, &cpu);
    CHECK(st == G4_OK, "CPU backend: %s", g4_error_message());
    if (st != G4_OK) return test_finish();
    test_op();
    test_complete();
    g4_backend_destroy(cpu);
    return test_finish();
}
