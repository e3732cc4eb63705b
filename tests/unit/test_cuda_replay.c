/* run_step on CUDA: every step shape the backend records, run eagerly (a
 * key's first run), recorded (its second) and replayed (its third), must give
 * bit-identical logits and candidates, since a replay must run exactly the
 * kernels the eager run did. Shapes: decode steps of 1..G4_CUDA_RECORD_MAX_TOKENS
 * sequences (every row's logits, with and without top-k candidates) and
 * chunks of 1..G4_CUDA_RECORD_MAX_TOKENS tokens of one sequence (the last
 * row's logits, every row's); one step more than the largest recorded must
 * run directly. Fixtures: the bf16 MoE (at 64 tokens its experts reached
 * cuBLAS eagerly but not while captured: the defect this guards), the dense
 * and E2B ones, and MLX 4-bit MoE. Exits 77 (skipped) without a usable GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/text_decoder.h"
#include "support/cuda_device.h"
#include "test_util.h"

/* TABLE_W: the CUDA backend's block_table_width for these short tables, as
 * the batch builder lays them (g4_text_forward uploads tables as given) */
enum { MAX_T = G4_CUDA_RECORD_MAX_TOKENS + 1, PREFIX = 9, TABLE_W = 16, K = 40 };

static g4_backend *gpu;

typedef struct {
    const g4_model *m;
    g4_kv_pool *kv;
    g4_text_scratch *scratch;
    g4_kv_seq seqs[MAX_T + 1]; /* MAX_T decoding sequences, then the chunked one */
    int len[MAX_T + 1];        /* positions each holds before the steps */
    int ok;
} rig;

/* One batch: rows of sequences first..first+n_seqs-1 (one token each) or, with
 * chunk, n tokens of the last sequence. */
typedef struct {
    int n, chunk, all_rows, k;
} shape;

typedef struct {
    float *logits;
    int32_t *ids;
    float *values;
    double *lse;
} outputs;

static int32_t id_at(const g4_model *m, int seq, int pos) {
    return (int32_t)((1 + 7919u * (unsigned)seq + 104729u * (unsigned)pos) % (unsigned)(m->config.text.vocab_size - 1));
}

static g4_status run_batch(rig *r, const shape *sh, outputs *o) {
    const g4_model *m = r->m;
    const int n = sh->n, S = sh->chunk ? 1 : n;
    int32_t ids[MAX_T], pos[MAX_T], seq[MAX_T], ranges[4 * MAX_T], rows[MAX_T];
    int32_t full[(MAX_T + 1) * TABLE_W];
    const int ring = r->kv->ring_blocks;
    int32_t *sliding = malloc((size_t)(MAX_T + 1) * ring * sizeof *sliding);
    for (int t = 0; t < n; t++) {
        const int s = sh->chunk ? MAX_T : t;
        pos[t] = sh->chunk ? r->len[s] + t : r->len[s];
        ids[t] = id_at(m, s, pos[t]);
        seq[t] = sh->chunk ? 0 : t;
        g4_text_kv_ranges(m, &pos[t], NULL, NULL, 1, 0, &ranges[4 * t]);
    }
    for (int b = 0; b < S; b++) {
        const g4_kv_seq *q = &r->seqs[sh->chunk ? MAX_T : b];
        memset(full + b * TABLE_W, 0, TABLE_W * sizeof *full);
        memcpy(full + b * TABLE_W, q->full_blocks, (size_t)q->n_full * sizeof *full);
        memcpy(sliding + b * ring, q->ring, (size_t)ring * sizeof *sliding);
    }
    const int n_rows = sh->all_rows ? n : 1;
    for (int i = 0; i < n_rows; i++) rows[i] = sh->all_rows ? i : n - 1;
    const g4_text_batch b = {
        .n_tokens = n, .ids = ids, .pos = pos, .seq = seq, .kv_range = ranges,
        .n_seqs = S, .full_tables = full, .full_table_stride = TABLE_W, .sliding_tables = sliding,
        .n_logit_rows = n_rows, .logit_rows = rows, .logits = o->logits,
        .n_candidates = sh->k, .cand_ids = o->ids, .cand_values = o->values, .cand_lse = o->lse,
    };
    g4_status st = g4_text_forward(m, r->kv, r->scratch, &b);
    free(sliding);
    return st;
}

/* A hook makes a step direct (never recorded): the prefixes below must not
 * leave recordings that the checked shapes would find (a 1-token prefix has
 * the key of a 1-token decode step). */
static void ignore_hidden(void *ctx, const char *name, const float *data, int rows, int dim) {
    (void)ctx, (void)name, (void)data, (void)rows, (void)dim;
}

static int rig_open(rig *r, const g4_model *m) {
    memset(r, 0, sizeof *r);
    r->m = m;
    const int bs = 16, ring = g4_kv_ring_blocks(m->config.text.sliding_window, MAX_T, bs);
    const int n_seqs = MAX_T + 1;
    g4_backend *be = m->backend;
    CHECK(be->ops->block_table_width(be, (PREFIX + MAX_T + 1 + bs - 1) / bs) == TABLE_W,
          "the backend's table width is %d", be->ops->block_table_width(be, 1));
    g4_status st = g4_kv_pool_create(m, bs, n_seqs * TABLE_W, n_seqs * ring, ring, G4_KV_F32, &r->kv);
    if (st == G4_OK) st = g4_text_scratch_create(m, MAX_T, MAX_T, &r->scratch);
    CHECK(st == G4_OK, "KV pool / scratch: %s", g4_error_message());
    if (st != G4_OK) return 0;
    /* each sequence's prefix, run once and directly (its hook) */
    for (int s = 0; s < n_seqs && st == G4_OK; s++) {
        r->len[s] = s == MAX_T ? PREFIX : 1 + s % PREFIX;
        st = g4_kv_seq_init(r->kv, &r->seqs[s]);
        if (st == G4_OK) st = g4_kv_seq_reserve(r->kv, &r->seqs[s], PREFIX + MAX_T + 1);
        int32_t ids[PREFIX], pos[PREFIX], ranges[4 * PREFIX], full[TABLE_W] = {0}, row = r->len[s] - 1;
        if (st != G4_OK) break;
        for (int t = 0; t < r->len[s]; t++) ids[t] = id_at(m, s, t), pos[t] = t;
        g4_text_kv_ranges(m, pos, NULL, NULL, r->len[s], 0, ranges);
        memcpy(full, r->seqs[s].full_blocks, (size_t)r->seqs[s].n_full * sizeof *full);
        float *logits = malloc((size_t)m->config.text.vocab_size * sizeof *logits);
        const g4_text_batch b = {.n_tokens = r->len[s], .ids = ids, .pos = pos, .kv_range = ranges, .n_seqs = 1,
                                 .full_tables = full, .full_table_stride = TABLE_W,
                                 .sliding_tables = r->seqs[s].ring, .n_logit_rows = 1, .logit_rows = &row,
                                 .logits = logits, .hook = ignore_hidden};
        st = g4_text_forward(m, r->kv, r->scratch, &b);
        free(logits);
    }
    CHECK(st == G4_OK, "prefixes: %s", g4_error_message());
    return st == G4_OK;
}

static void rig_close(rig *r) {
    for (int s = 0; s <= MAX_T; s++)
        if (r->seqs[s].ring) g4_kv_seq_release(r->kv, &r->seqs[s]);
    g4_text_scratch_free(r->scratch);
    g4_kv_pool_free(r->kv);
}

static void outputs_alloc(outputs *o, int V) {
    o->logits = malloc((size_t)MAX_T * V * sizeof *o->logits);
    o->ids = malloc((size_t)MAX_T * K * sizeof *o->ids);
    o->values = malloc((size_t)MAX_T * K * sizeof *o->values);
    o->lse = malloc((size_t)MAX_T * sizeof *o->lse);
}

static void outputs_free(outputs *o) { free(o->logits), free(o->ids), free(o->values), free(o->lse); }

static int same_outputs(const outputs *a, const outputs *b, const shape *sh, int V) {
    const size_t rows = sh->all_rows ? (size_t)sh->n : 1;
    if (memcmp(a->logits, b->logits, rows * V * sizeof *a->logits)) return 0;
    if (!sh->k) return 1;
    return !memcmp(a->ids, b->ids, rows * K * sizeof *a->ids) &&
           !memcmp(a->values, b->values, rows * K * sizeof *a->values) &&
           !memcmp(a->lse, b->lse, rows * sizeof *a->lse);
}

static void check_model(const char *name) {
    g4_model *m = NULL;
    g4_status st = g4_model_load_dir(test_fixture(name), gpu, &m);
    CHECK(st == G4_OK, "%s: load: %s", name, g4_error_message());
    if (st != G4_OK) return;
    rig r;
    if (!rig_open(&r, m)) {
        g4_model_release(m);
        return;
    }
    const int V = m->config.text.vocab_size;
    outputs run[3];
    for (int i = 0; i < 3; i++) outputs_alloc(&run[i], V);
    const shape kinds[] = {{.all_rows = 1}, {.all_rows = 1, .k = K}, {.chunk = 1}, {.chunk = 1, .all_rows = 1}};
    const char *kind_names[] = {"decode, every row", "decode, top-40 of every row", "chunk, last row",
                                "chunk, every row"};
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        int shapes = 0, identical = 0, replayed = 0;
        for (int n = 1; n <= MAX_T; n++) {
            shape sh = kinds[kd];
            sh.n = n;
            const long before = g4_cuda_graph_launches(gpu);
            for (int i = 0; i < 3 && st == G4_OK; i++) {
                memset(run[i].logits, 0xff, (size_t)MAX_T * V * sizeof *run[i].logits);
                st = run_batch(&r, &sh, &run[i]);
            }
            CHECK(st == G4_OK, "%s %s, %d tokens: %s", name, kind_names[kd], n, g4_error_message());
            if (st != G4_OK) break;
            const long launches = g4_cuda_graph_launches(gpu) - before;
            const int same = same_outputs(&run[0], &run[1], &sh, V) && same_outputs(&run[0], &run[2], &sh, V);
            shapes++;
            identical += same;
            CHECK(same, "%s %s, %d tokens: the recorded / replayed step differs from the eager one", name,
                  kind_names[kd], n);
            if (n <= G4_CUDA_RECORD_MAX_TOKENS) {
                replayed += launches == 2;
                CHECK(launches == 2, "%s %s, %d tokens: %ld replays of 3 runs, 2 expected", name, kind_names[kd], n,
                      launches);
            } else {
                CHECK(launches == 0, "%s %s, %d tokens (beyond recording): %ld replays", name, kind_names[kd], n,
                      launches);
            }
        }
        printf("  %-9s %-28s %d shapes (1..%d tokens): %d bit-identical eager / recorded / replayed, %d replayed\n",
               name, kind_names[kd], shapes, MAX_T, identical, replayed);
    }
    for (int i = 0; i < 3; i++) outputs_free(&run[i]);
    rig_close(&r);
    g4_model_release(m);
}

int main(void) {
    const int rc = cuda_device_open(&gpu);
    if (rc) return rc == 77 ? 77 : test_finish();
    const char *fixtures[] = {"moe", "dense", "e2b", "moe-mlx4"};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) check_model(fixtures[i]);
    CHECK(g4_cuda_status(gpu) == G4_OK, "no CUDA failure recorded: %s", g4_error_message());
    g4_backend_destroy(gpu);
    return test_finish();
}
