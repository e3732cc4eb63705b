#include "runtime/engine.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "model/kv_cache.h"
#include "model/text_decoder.h"
#include "runtime/batch.h"
#include "runtime/memory_plan.h"
#include "runtime/prefix_cache.h"

typedef struct {
    uint64_t id;
    int32_t *prompt;
    int n_prompt;
    g4_request_media media;
    g4_sampler *sampler;
    int max_tokens;
    int32_t *stop_ids;
    int n_stop;
    g4_token_callback on_token;
    void *user;
    g4_kv_seq kv;
    int prefilled;      /* prompt tokens already run */
    int n_generated;
    int32_t last_token; /* fed at the next decode step */
    int cancelled;
    double t_admitted;
    double prompt_seconds;
    g4_token_matcher *matcher; /* NULL: unconstrained */
    const uint32_t *mask;      /* the next token's allowed set (the matcher's buffer) */
    int top_logprobs;          /* of its sampling parameters */
    int mask_result;           /* of g4_token_matcher_mask for this step: 1 masked, 0 free, -1 failed */
    /* prefix cache */
    int32_t *generated;         /* [max_tokens] sampled ids: the reply's block hashes */
    g4_block_hash *hashes;      /* chain hashes of the prompt's full blocks (and the reply's at the end) */
    int n_hashes;
    g4_block_hash *media_keys;  /* [media.n] */
    int hashed;                 /* hashes computed (at the first admission attempt) */
    int n_cached;               /* prompt positions whose KV came from the cache */
    int registered;             /* leading blocks registered in the cache */
    int branch;                 /* block depth where the prompt leaves a cached chain (0: none) */
    /* speculative decoding */
    int drafting;               /* may draft (a drafter, not opted out, unconstrained; see g4_engine_options) */
    float *hidden;              /* [hidden]: the final-normed state of the row that chose last_token */
    int have_hidden;
    int32_t verify[G4_DRAFT_MAX + 1]; /* this step's decode row: last_token, then n_drafts drafts */
    int n_drafts;
    g4_draft_length draft_len;
    int n_rounds, n_drafted, n_accepted;
} sequence;

struct g4_engine {
    const g4_model *model;
    g4_engine_options opt;
    int bidir_mode;
    g4_kv_pool *kv;
    g4_prefix_cache *cache; /* NULL: no_prefix_cache */
    g4_text_scratch *scratch;
    g4_batch_builder batch; /* max_batch_tokens rows of max_seqs sequences */
    float *logits;          /* host [max_seqs][vocab] */
    float *row_logits;      /* host [vocab]: one row fetched at a time (steps with more logit rows than max_seqs) */
    /* the largest logits of each logit row, where its sampler can choose from them */
    int32_t *cand_ids;
    float *cand_values;
    double *cand_lse;
    int *cand_needed; /* per logit row: g4_sampler_candidates_needed, 0 = the full row, -k: a masked row's k */
    /* speculative decoding (opt.drafter) */
    g4_drafter_scratch *draft_scratch; /* draft_rows rows: one drafter forward for every drafting sequence */
    int draft_rows;
    g4_draft_row *draft_row;  /* [draft_rows]: this step's drafting sequences */
    sequence **draft_seqs;    /* [draft_rows] */
    float *draft_logits;      /* host [draft_rows][vocab]: a drafter step's logits (for draft_min_p) */
    float *hidden;            /* host [logit_rows][hidden]: the step's final-normed states */
    int32_t *keep_ids;        /* host [vocab]: g4_draft_keep's scratch */
    double *keep_probs;       /* host [vocab] */
    int32_t *draft_cands;     /* host [draft_rows][top_k * K]: a centroid head's candidates (for draft_min_p) */
    /* this step's drafting counters, added to the stats under the lock */
    uint64_t step_forwards, step_rounds, step_proposed, step_kept, step_drafted_at[G4_DRAFT_MAX], step_kept_at[G4_DRAFT_MAX];
    double step_draft_seconds;
    sequence **batch_seqs;
    /* a step's cancelled and finished sequences, max_seqs each */
    sequence **step_done, **step_finished;
    g4_finish_reason *step_reasons;
    /* token masks of constrained sequences: computed by mask_thread while
     * the forward pass runs on a GPU (inline on the CPU backend, whose
     * threads the forward pass already uses) */
    sequence **mask_jobs;
    int n_mask_jobs, mask_pending, mask_thread_started, mask_thread_stop;
    pthread_t mask_thread;
    pthread_mutex_t mask_lock;
    pthread_cond_t mask_wake, mask_done;
    /* the backend's copies of token masks (its top_logits_masked reads
     * them): slots keyed by g4_mask_key, the least recently used replaced,
     * so a grammar state that many sequences meet crosses once */
    uint32_t *mask_dev;      /* backend [mask_slots][mask_words], NULL: not made yet */
    int32_t *mask_slot_dev;  /* backend [max_seqs]: each logit row's slot, -1 none */
    int32_t *mask_slot_host; /* [logit_rows] */
    int32_t *mask_slot_sent; /* [logit_rows]: what mask_slot_dev holds, for mask_slot_sent_n rows (-1: unknown) */
    int mask_slot_sent_n;
    g4_mask_key *slot_key;   /* [mask_slots] */
    uint64_t *slot_used;     /* [mask_slots]: the upload round of its last use, 0: empty */
    uint32_t *mask_stage;    /* [mask_words]: a mask narrower than the logits, padded */
    int mask_slots, mask_words, mask_failed, step_logit_rows;
    uint64_t mask_round, step_uploads, step_masked, step_on_host;
    double step_mask_seconds, step_mask_wait; /* the mask thread writes the first while it runs */

    pthread_mutex_t lock;
    pthread_cond_t wake;
    sequence **waiting;
    int n_waiting;
    sequence **running;
    int n_running;
    uint64_t next_id;
    g4_engine_stats stats;
    pthread_t thread;
    int thread_started, stop_requested, cancel_on_stop;
};

static int is_vision(const g4_token_ids *tk, int32_t id) { return id == tk->image_id || id == tk->video_id; }

/* The drafter options filled in and checked against the model. */
static g4_status check_drafter(g4_engine *e) {
    const g4_assistant *a = e->opt.drafter;
    if (!a) return G4_OK;
    if (e->opt.draft_max <= 0) e->opt.draft_max = 1;
    if (e->opt.draft_max > G4_DRAFT_MAX)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "draft length %d outside 1..%d", e->opt.draft_max, G4_DRAFT_MAX);
    if (!(e->opt.draft_min_p >= 0 && e->opt.draft_min_p <= 1))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "draft min-p %g outside [0, 1]", (double)e->opt.draft_min_p);
    if (e->opt.draft_max_batch <= 0) {
        const char *be = e->model->backend->ops->name;
        e->opt.draft_max_batch = be && !strcmp(be, "cuda") ? G4_ENGINE_DRAFT_MAX_BATCH_CUDA : G4_ENGINE_DRAFT_MAX_BATCH;
    }
    if (a->target_layer[0] < 0 || a->target_layer[1] < 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "drafter %s is not attached to a target", a->model->path);
    if (a->model->backend != e->model->backend)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "the drafter and its target must run on one backend");
    if (a->model->config.text.vocab_size != e->model->config.text.vocab_size)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "the drafter's vocabulary (%d) is not the model's (%d)",
                       a->model->config.text.vocab_size, e->model->config.text.vocab_size);
    if (e->opt.max_batch_tokens < e->opt.draft_max + 1)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "a batch of %d tokens is shorter than a verification of %d drafts",
                       e->opt.max_batch_tokens, e->opt.draft_max);
    return G4_OK;
}

g4_status g4_engine_create(const g4_model *m, const g4_engine_options *opt, g4_engine **out) {
    *out = NULL;
    const g4_text_config *tc = &m->config.text;
    g4_engine *e = calloc(1, sizeof *e);
    if (!e) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    e->model = m;
    if (opt) e->opt = *opt;
    if (e->opt.max_seqs <= 0) e->opt.max_seqs = 32;
    if (e->opt.n_ctx <= 0) e->opt.n_ctx = tc->max_position < 4096 ? tc->max_position : 4096;
    if (e->opt.n_ctx > tc->max_position) e->opt.n_ctx = tc->max_position;
    if (e->opt.block_size <= 0) e->opt.block_size = 16;
    if (e->opt.max_batch_tokens <= 0) e->opt.max_batch_tokens = 512;
    if (e->opt.max_batch_tokens < e->opt.max_seqs) e->opt.max_batch_tokens = e->opt.max_seqs;
    if (e->opt.max_queue <= 0) e->opt.max_queue = 256;
    int bs = e->opt.block_size;
    int per_seq = (e->opt.n_ctx + bs - 1) / bs;
    if (e->opt.kv_blocks <= 0) e->opt.kv_blocks = e->opt.max_seqs * per_seq;
    e->bidir_mode = g4_batch_bidir_mode(m, e->opt.vision_mask);
    g4_status st = check_drafter(e);
    if (st != G4_OK) {
        free(e);
        return st;
    }
    /* the ring also holds what the drafter's sliding layers see (its window
     * and the position drafted at) beside a chunk: a verification never
     * overwrites a slot still visible after it is rolled back */
    int window = tc->sliding_window;
    if (e->opt.drafter && e->opt.drafter->model->config.text.sliding_window + 1 > window)
        window = e->opt.drafter->model->config.text.sliding_window + 1;
    int ring = g4_kv_ring_blocks(window, e->opt.max_batch_tokens, bs);
    /* without the cache's snapshots, a context shorter than window + chunk
     * fits its ring whole: no slot is reused */
    if (e->opt.no_prefix_cache && ring > per_seq) ring = per_seq;
    const int N = e->opt.max_batch_tokens, S = e->opt.max_seqs;
    if (e->opt.logit_rows < S) e->opt.logit_rows = S;
    /* a verification brings back the rows of the token and its drafts (at
     * most draft_max_batch sequences draft in a step) */
    if (e->opt.drafter) {
        const int drafting = e->opt.draft_max_batch < S ? e->opt.draft_max_batch : S;
        if (e->opt.logit_rows < S + drafting * e->opt.draft_max) e->opt.logit_rows = S + drafting * e->opt.draft_max;
    }
    if (e->opt.logit_rows > N) e->opt.logit_rows = N;
    /* sliding blocks beyond the rings hold the prefix cache's window snapshots */
    int snap = e->opt.no_prefix_cache ? 0 : g4_prefix_snapshot_blocks(m, bs);
    if (e->opt.cache_snapshots <= 0) e->opt.cache_snapshots = 2 * S;
    const int64_t sliding_blocks = (int64_t)ring * S + (int64_t)snap * e->opt.cache_snapshots;
    st = g4_memory_check_kv(m, e->opt.kv_type, bs, e->opt.kv_blocks, sliding_blocks, e->opt.n_ctx);
    if (st == G4_OK) st = g4_kv_pool_create(m, bs, e->opt.kv_blocks, (int)sliding_blocks, ring, e->opt.kv_type, &e->kv);
    if (st == G4_OK && !e->opt.no_prefix_cache) st = g4_prefix_cache_create(m, e->kv, &e->cache);
    if (st == G4_OK && e->cache) st = g4_prefix_cache_set_host_ram(e->cache, e->opt.cache_ram_bytes);
    if (st == G4_OK) st = g4_text_scratch_create(m, N, e->opt.logit_rows, &e->scratch);
    if (st == G4_OK) st = g4_batch_builder_init(&e->batch, m, e->bidir_mode, N, S, e->opt.logit_rows, ring, per_seq);
    if (st == G4_OK && e->opt.drafter) {
        const size_t V = (size_t)tc->vocab_size;
        e->draft_rows = e->opt.draft_max_batch < S ? e->opt.draft_max_batch : S;
        const size_t R = (size_t)e->draft_rows;
        st = g4_drafter_scratch_create_rows(e->opt.drafter, e->draft_rows, &e->draft_scratch);
        e->draft_row = calloc(R, sizeof *e->draft_row);
        e->draft_seqs = calloc(R, sizeof *e->draft_seqs);
        e->draft_logits = malloc((e->opt.draft_min_p > 0 ? R : 1) * V * sizeof *e->draft_logits);
        e->hidden = malloc((size_t)e->opt.logit_rows * tc->hidden_size * sizeof *e->hidden);
        e->keep_ids = malloc(V * sizeof *e->keep_ids);
        e->keep_probs = malloc(V * sizeof *e->keep_probs);
        const g4_assistant *a = e->opt.drafter;
        e->draft_cands = malloc(R * (size_t)(a->ordered ? a->centroid_top_k * a->tokens_per_centroid : 1) *
                                sizeof *e->draft_cands);
        if (st == G4_OK && (!e->draft_logits || !e->hidden || !e->keep_ids || !e->keep_probs || !e->draft_cands ||
                            !e->draft_row || !e->draft_seqs))
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for speculative decoding");
    }
    if (st == G4_OK) {
        const size_t R = (size_t)e->opt.logit_rows;
        e->logits = malloc((size_t)S * tc->vocab_size * sizeof *e->logits);
        e->row_logits = malloc((size_t)tc->vocab_size * sizeof *e->row_logits);
        e->cand_ids = malloc(R * G4_SAMPLER_MAX_CANDIDATES * sizeof *e->cand_ids);
        e->cand_values = malloc(R * G4_SAMPLER_MAX_CANDIDATES * sizeof *e->cand_values);
        e->cand_lse = malloc(R * sizeof *e->cand_lse);
        e->cand_needed = malloc(R * sizeof *e->cand_needed);
        e->batch_seqs = malloc((size_t)S * sizeof *e->batch_seqs);
        e->step_done = malloc((size_t)S * sizeof *e->step_done);
        e->step_finished = malloc((size_t)S * sizeof *e->step_finished);
        e->step_reasons = malloc((size_t)S * sizeof *e->step_reasons);
        e->mask_jobs = malloc((size_t)S * sizeof *e->mask_jobs);
        e->waiting = malloc((size_t)e->opt.max_queue * sizeof *e->waiting);
        e->running = malloc((size_t)S * sizeof *e->running);
        if (!e->logits || !e->row_logits || !e->cand_ids || !e->cand_values || !e->cand_lse || !e->cand_needed ||
            !e->batch_seqs || !e->step_done || !e->step_finished || !e->step_reasons || !e->mask_jobs || !e->waiting || !e->running)
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the engine");
    }
    if (st != G4_OK) {
        g4_engine_destroy(e);
        return st;
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_mutex_init(&e->mask_lock, NULL);
    pthread_cond_init(&e->mask_wake, NULL);
    pthread_cond_init(&e->mask_done, NULL);
    e->next_id = 1;
    e->stats.kv_blocks_total = e->opt.kv_blocks;
    e->stats.prefix_cache = e->cache != NULL;
    if (e->cache && snap)
        g4_log(G4_LOG_INFO, "prefix cache: on, room for %d sliding-window snapshots of %d positions beyond the rings "
               "(%.1f MiB)", e->opt.cache_snapshots, snap * bs,
               (double)g4_prefix_snapshot_bytes(e->cache) * e->opt.cache_snapshots / (1024.0 * 1024.0));
    e->stats.kv_block_size = bs;
    e->stats.draft_max = e->opt.drafter ? e->opt.draft_max : 0;
    e->stats.kv_type = e->kv->type;
    e->stats.kv_bytes = g4_kv_pool_bytes(e->kv, m);
    e->stats.kv_full_bytes_per_token = g4_kv_bytes_per_position(m, e->kv->type, G4_LAYER_FULL);
    e->stats.kv_sliding_bytes_per_token = g4_kv_bytes_per_position(m, e->kv->type, G4_LAYER_SLIDING);
    *out = e;
    return G4_OK;
}

static void release_kv(g4_engine *e, g4_kv_seq *kv) {
    if (!kv->ring) return;
    if (e->cache) g4_prefix_release(e->cache, kv);
    else g4_kv_seq_release(e->kv, kv);
}

static void free_sequence(g4_engine *e, sequence *s) {
    if (!s) return;
    g4_backend *be = e->model->backend;
    release_kv(e, &s->kv);
    free(s->generated);
    free(s->hashes);
    free(s->media_keys);
    free(s->hidden);
    if (s->media.embeds) be->ops->release(be, s->media.embeds);
    free(s->media.rows);
    g4_sampler_free(s->sampler);
    g4_token_matcher_free(s->matcher);
    free(s->prompt);
    free(s->stop_ids);
    free(s);
}

/* Registers the reply's full blocks and snapshots the window at its end:
 * where the next turn's prompt, which repeats prompt + reply, resumes. */
static void remember_reply(g4_engine *e, sequence *s) {
    const int bs = e->kv->block_size;
    const int length = s->n_prompt + s->n_generated - 1; /* the last sampled token was never run */
    const int from = s->n_hashes, to = length / bs;
    if (!s->hashes) return;
    if (to <= from) { /* the reply did not complete a block: the window where it ends is the prompt's */
        g4_prefix_snapshot(e->cache, &s->kv, length, s->hashes, to);
        return;
    }
    int32_t *ids = malloc((size_t)length * sizeof *ids);
    g4_block_hash *grown = realloc(s->hashes, (size_t)to * sizeof *grown);
    if (grown) s->hashes = grown;
    if (ids && grown) {
        memcpy(ids, s->prompt, (size_t)s->n_prompt * sizeof *ids);
        memcpy(ids + s->n_prompt, s->generated, (size_t)(length - s->n_prompt) * sizeof *ids);
        g4_prefix_hash_blocks(e->cache, ids, s->media.rows, s->media_keys, s->media.n, from, to, s->hashes);
        s->n_hashes = to;
        g4_prefix_register(e->cache, &s->kv, s->hashes, from, to);
        g4_prefix_snapshot(e->cache, &s->kv, length, s->hashes, to);
    }
    free(ids);
}

static void finish(g4_engine *e, sequence *s, g4_finish_reason why, const char *message) {
    if (e->cache && s->kv.ring && (why == G4_FINISH_STOP || why == G4_FINISH_LENGTH)) remember_reply(e, s);
    g4_token_event ev = {.request_id = s->id, .n_prompt = s->n_prompt, .n_generated = s->n_generated,
                         .n_cached = s->n_cached, .prompt_seconds = s->prompt_seconds, .finish = why,
                         .n_drafted = s->n_drafted, .n_accepted = s->n_accepted, .n_rounds = s->n_rounds,
                         .message = message};
    if (s->on_token) s->on_token(s->user, &ev);
    free_sequence(e, s);
}

static void *mask_thread_main(void *arg) {
    g4_engine *e = arg;
    pthread_mutex_lock(&e->mask_lock);
    for (;;) {
        while (!e->mask_pending && !e->mask_thread_stop) pthread_cond_wait(&e->mask_wake, &e->mask_lock);
        if (e->mask_thread_stop) break;
        pthread_mutex_unlock(&e->mask_lock);
        const double t0 = g4_now_seconds();
        for (int i = 0; i < e->n_mask_jobs; i++)
            e->mask_jobs[i]->mask_result = g4_token_matcher_mask(e->mask_jobs[i]->matcher, &e->mask_jobs[i]->mask);
        e->step_mask_seconds += g4_now_seconds() - t0;
        pthread_mutex_lock(&e->mask_lock);
        e->mask_pending = 0;
        pthread_cond_signal(&e->mask_done);
    }
    pthread_mutex_unlock(&e->mask_lock);
    return NULL;
}

/* Starts the masks of this step's constrained rows: on the mask thread when
 * the backend is not the CPU (so they overlap the forward pass), else now. */
static void masks_begin(g4_engine *e) {
    if (e->n_mask_jobs == 0) return;
    int overlap = strcmp(e->model->backend->ops->name, "cpu") != 0;
    if (overlap && !e->mask_thread_started) {
        e->mask_thread_stop = 0;
        if (pthread_create(&e->mask_thread, NULL, mask_thread_main, e) == 0) e->mask_thread_started = 1;
    }
    if (!overlap || !e->mask_thread_started) {
        const double t0 = g4_now_seconds();
        for (int i = 0; i < e->n_mask_jobs; i++)
            e->mask_jobs[i]->mask_result = g4_token_matcher_mask(e->mask_jobs[i]->matcher, &e->mask_jobs[i]->mask);
        e->step_mask_seconds += g4_now_seconds() - t0;
        e->step_mask_wait += g4_now_seconds() - t0;
        return;
    }
    pthread_mutex_lock(&e->mask_lock);
    e->mask_pending = 1;
    pthread_cond_signal(&e->mask_wake);
    pthread_mutex_unlock(&e->mask_lock);
}

static void masks_wait(g4_engine *e) {
    if (!e->mask_thread_started) return;
    const double t0 = g4_now_seconds();
    pthread_mutex_lock(&e->mask_lock);
    while (e->mask_pending) pthread_cond_wait(&e->mask_done, &e->mask_lock);
    pthread_mutex_unlock(&e->mask_lock);
    e->step_mask_wait += g4_now_seconds() - t0;
}

/* The backend's mask slots, made at the first constrained step (2 per
 * sequence: a step's masks never evict one another). 0 when the backend has
 * no masked op or no memory: constrained rows then take the full row. */
static int device_masks(g4_engine *e) {
    g4_backend *be = e->model->backend;
    if (e->mask_dev) return 1;
    if (e->mask_failed || !be->ops->top_logits_masked) return 0;
    const int S = e->opt.max_seqs;
    e->mask_slots = 2 * S;
    e->mask_words = (int)g4_mask_words(e->model->config.text.vocab_size);
    e->mask_dev = be->ops->alloc(be, (size_t)e->mask_slots * e->mask_words * sizeof(uint32_t));
    const int R = e->opt.logit_rows;
    e->mask_slot_dev = be->ops->alloc(be, (size_t)R * sizeof(int32_t));
    e->mask_slot_host = malloc((size_t)R * sizeof *e->mask_slot_host);
    e->mask_slot_sent = malloc((size_t)R * sizeof *e->mask_slot_sent);
    e->mask_slot_sent_n = -1;
    e->slot_key = calloc((size_t)e->mask_slots, sizeof *e->slot_key);
    e->slot_used = calloc((size_t)e->mask_slots, sizeof *e->slot_used);
    e->mask_stage = malloc((size_t)e->mask_words * sizeof *e->mask_stage);
    if (e->mask_dev && e->mask_slot_dev && e->mask_slot_host && e->mask_slot_sent && e->slot_key && e->slot_used &&
        e->mask_stage)
        return 1;
    g4_log(G4_LOG_WARN, "engine: no memory for token masks on the backend; constrained rows take the full row");
    if (e->mask_dev) be->ops->release(be, e->mask_dev);
    if (e->mask_slot_dev) be->ops->release(be, e->mask_slot_dev);
    free(e->mask_slot_host), free(e->mask_slot_sent), free(e->slot_key), free(e->slot_used), free(e->mask_stage);
    e->mask_dev = NULL, e->mask_slot_dev = NULL, e->mask_slot_host = NULL, e->mask_slot_sent = NULL, e->slot_key = NULL;
    e->slot_used = NULL, e->mask_stage = NULL;
    e->mask_failed = 1;
    return 0;
}

/* The slot holding s's current mask: found by its key, or the least
 * recently used slot (none of this round's) takes an upload of it. */
static int mask_slot_of(g4_engine *e, const sequence *s) {
    g4_backend *be = e->model->backend;
    const g4_mask_key *key = g4_token_matcher_mask_key(s->matcher);
    int victim = 0;
    for (int i = 0; i < e->mask_slots; i++) {
        if (e->slot_used[i] && g4_mask_key_equal(&e->slot_key[i], key)) {
            e->slot_used[i] = e->mask_round;
            return i;
        }
        if (e->slot_used[i] < e->slot_used[victim]) victim = i;
    }
    const int W = e->mask_words, mv = g4_token_matcher_vocab(s->matcher);
    const uint32_t *bits = s->mask;
    if ((int64_t)mv < (int64_t)W * 32) { /* ids past the mask's vocabulary are not allowed */
        const int have = (int)g4_mask_words(mv);
        memcpy(e->mask_stage, s->mask, (size_t)have * sizeof *e->mask_stage);
        memset(e->mask_stage + have, 0, (size_t)(W - have) * sizeof *e->mask_stage);
        if (mv & 31) e->mask_stage[have - 1] &= (1u << (mv & 31)) - 1u;
        bits = e->mask_stage;
    }
    be->ops->to_device(be, e->mask_dev + (size_t)victim * W, bits, (size_t)W * sizeof *bits);
    e->slot_key[victim] = *key;
    e->slot_used[victim] = e->mask_round;
    e->step_uploads++;
    return victim;
}

/* g4_text_batch.masks_ready: once the forward pass is queued, this step's
 * masks (done meanwhile) and every logit row's slot go to the backend. */
static void masks_to_device(void *arg) {
    g4_engine *e = arg;
    g4_backend *be = e->model->backend;
    masks_wait(e);
    e->mask_round++;
    for (int r = 0; r < e->step_logit_rows; r++) {
        const sequence *s = e->batch_seqs[e->batch.logit_owner[r]];
        e->mask_slot_host[r] = e->cand_needed[r] < 0 && s->mask_result > 0 ? mask_slot_of(e, s) : -1;
    }
    /* the slots cross only when they changed (a sequence that stays in one
     * state, as inside a string, then costs no copy at all) */
    const size_t bytes = (size_t)e->step_logit_rows * sizeof(int32_t);
    if (e->mask_slot_sent_n != e->step_logit_rows || memcmp(e->mask_slot_sent, e->mask_slot_host, bytes)) {
        be->ops->to_device(be, e->mask_slot_dev, e->mask_slot_host, bytes);
        memcpy(e->mask_slot_sent, e->mask_slot_host, bytes);
        e->mask_slot_sent_n = e->step_logit_rows;
    }
}

/* How a constrained row takes its candidates: -k, k of its masked row on
 * the backend (its sampler's need, or the most candidates where it needs
 * the full row: a mask that leaves fewer decides exactly), or 0: the full
 * row (logit bias, penalties or suppressed tokens move logits anywhere;
 * no masks on this backend). */
static int masked_candidates(g4_engine *e, const sequence *s) {
    if (!g4_sampler_takes_candidates(s->sampler) || !device_masks(e)) return 0;
    int k = g4_sampler_candidates_needed(s->sampler);
    if (k <= 0) k = G4_SAMPLER_MAX_CANDIDATES;
    if (k > G4_TOP_LOGITS_MAX_K) k = G4_TOP_LOGITS_MAX_K;
    const int V = e->model->config.text.vocab_size;
    return -(k < V ? k : V);
}

/* A complete list of n allowed candidates padded to `want` entries as the
 * masked full row goes on: its -inf tokens, the disallowed, lowest id first
 * (what its top log-probabilities list after the allowed ones). */
static int pad_disallowed(const sequence *s, int32_t *ids, float *values, int n, int want, int vocab) {
    const int mv = g4_token_matcher_vocab(s->matcher);
    for (int32_t id = 0; id < vocab && n < want; id++)
        if (id >= mv || !g4_mask_has(s->mask, id)) ids[n] = id, values[n++] = -INFINITY;
    return n;
}

/* A constrained row from its candidates (cand_needed < 0): the token, or
 * *need_full when only the full row can decide, or *none when the mask
 * allows no token. */
static g4_status sample_masked(g4_engine *e, sequence *s, int row, int k, g4_sample *sample, int *need_full,
                               int *none) {
    int32_t *ci = e->cand_ids + (size_t)row * k;
    float *cv = e->cand_values + (size_t)row * k;
    const double lse = e->cand_lse[row];
    const int need = g4_sampler_candidates_needed(s->sampler);
    *need_full = 0, *none = 0;
    if (s->mask_result <= 0) { /* unmasked after all (a thought channel): the plain candidates */
        if (need > 0) return g4_sampler_sample_top(s->sampler, ci, cv, k, lse, sample, need_full);
        *need_full = 1;
        return G4_OK;
    }
    e->step_masked++;
    int n_finite = 0; /* the op puts -inf (id -1) last */
    while (n_finite < k && cv[n_finite] > -INFINITY) n_finite++;
    if (n_finite == 0 && !isnan(lse)) {
        *none = 1;
        return G4_OK;
    }
    if (n_finite < k) {
        const int want = s->top_logprobs < k ? s->top_logprobs : k;
        const int n = n_finite < want ? pad_disallowed(s, ci, cv, n_finite, want, e->model->config.text.vocab_size)
                                      : n_finite;
        return g4_sampler_sample_complete(s->sampler, ci, cv, n, lse, sample, need_full);
    }
    if (need > 0) return g4_sampler_sample_top(s->sampler, ci, cv, k, lse, sample, need_full);
    *need_full = 1; /* more allowed than candidates, and the sampler may draw any */
    return G4_OK;
}

void g4_engine_destroy(g4_engine *e) {
    if (!e) return;
    if (e->mask_thread_started) {
        pthread_mutex_lock(&e->mask_lock);
        e->mask_thread_stop = 1;
        pthread_cond_signal(&e->mask_wake);
        pthread_mutex_unlock(&e->mask_lock);
        pthread_join(e->mask_thread, NULL);
    }
    for (int i = 0; i < e->n_running; i++) finish(e, e->running[i], G4_FINISH_CANCELLED, NULL);
    for (int i = 0; i < e->n_waiting; i++) finish(e, e->waiting[i], G4_FINISH_CANCELLED, NULL);
    if (e->waiting) {
        pthread_mutex_destroy(&e->lock), pthread_cond_destroy(&e->wake);
        pthread_mutex_destroy(&e->mask_lock), pthread_cond_destroy(&e->mask_wake), pthread_cond_destroy(&e->mask_done);
    }
    g4_text_scratch_free(e->scratch);
    g4_prefix_cache_free(e->cache);
    g4_kv_pool_free(e->kv);
    g4_batch_builder_free(&e->batch);
    free(e->logits), free(e->row_logits);
    g4_drafter_scratch_free(e->draft_scratch);
    free(e->draft_logits), free(e->hidden), free(e->keep_ids), free(e->keep_probs), free(e->draft_cands);
    free(e->draft_row), free(e->draft_seqs);
    free(e->cand_ids), free(e->cand_values), free(e->cand_lse), free(e->cand_needed);
    g4_backend *be = e->model->backend;
    if (e->mask_dev) be->ops->release(be, e->mask_dev);
    if (e->mask_slot_dev) be->ops->release(be, e->mask_slot_dev);
    free(e->mask_slot_host), free(e->mask_slot_sent), free(e->slot_key), free(e->slot_used), free(e->mask_stage);
    free(e->batch_seqs), free(e->waiting), free(e->running);
    free(e->step_done), free(e->step_finished), free(e->step_reasons), free(e->mask_jobs);
    free(e);
}

g4_status g4_engine_submit(g4_engine *e, const g4_request *req, uint64_t *request_id) {
    const g4_text_config *tc = &e->model->config.text;
    if (!req || req->n_prompt <= 0 || !req->prompt)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "empty prompt: nothing to generate from");
    if (req->max_tokens <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "max_tokens must be at least 1");
    for (int i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= tc->vocab_size)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "prompt token %d (position %d) is outside the vocabulary [0, %d)",
                           req->prompt[i], i, tc->vocab_size);
    if (req->n_prompt + req->max_tokens > e->opt.n_ctx)
        return g4_fail(G4_ERR_LIMIT, "prompt of %d tokens + max_tokens %d exceed the context of %d", req->n_prompt,
                       req->max_tokens, e->opt.n_ctx);
    if (g4_kv_blocks_for(e->kv, req->n_prompt + req->max_tokens) > e->opt.kv_blocks)
        return g4_fail(G4_ERR_LIMIT, "request needs more KV cache than the engine has");
    if (e->bidir_mode) {
        const g4_token_ids *tk = &e->model->config.tokens;
        for (int i = 0; i < req->n_prompt;) {
            int j = i;
            while (j < req->n_prompt && is_vision(tk, req->prompt[j])) j++;
            if (j - i > e->opt.max_batch_tokens)
                return g4_fail(G4_ERR_LIMIT, "an image of %d soft tokens exceeds the %d-token batch of the engine",
                               j - i, e->opt.max_batch_tokens);
            i = j > i ? j : i + 1;
        }
    }
    for (int i = 0; i < req->media.n; i++)
        if (req->media.rows[i] < 0 || req->media.rows[i] >= req->n_prompt ||
            (i > 0 && req->media.rows[i] <= req->media.rows[i - 1]))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "media rows must be increasing prompt positions");
    sequence *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->prompt = malloc((size_t)req->n_prompt * sizeof *s->prompt);
    s->stop_ids = malloc((size_t)(req->n_stop + 1) * sizeof *s->stop_ids);
    if (e->cache) s->generated = malloc((size_t)req->max_tokens * sizeof *s->generated);
    g4_status st = (s->prompt && s->stop_ids && (!e->cache || s->generated))
                       ? G4_OK
                       : g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) st = g4_sampler_create(tc->vocab_size, &req->sampling, &s->sampler);
    if (st == G4_OK) st = g4_sampler_add_prompt(s->sampler, req->prompt, (size_t)req->n_prompt);
    if (st != G4_OK) {
        free_sequence(e, s);
        return st;
    }
    memcpy(s->prompt, req->prompt, (size_t)req->n_prompt * sizeof *s->prompt);
    if (req->n_stop) memcpy(s->stop_ids, req->stop_ids, (size_t)req->n_stop * sizeof *s->stop_ids);
    s->n_prompt = req->n_prompt;
    s->n_stop = req->n_stop;
    s->max_tokens = req->max_tokens;
    s->top_logprobs = req->sampling.top_logprobs;
    /* drafting: unconstrained requests that do not opt out; sampled ones
     * only without log-probabilities (a kept draft's are not computed) */
    s->drafting = e->opt.drafter && !req->no_speculative && !req->constraint &&
                  (g4_sampler_is_greedy(s->sampler) || !g4_sampler_wants_logprobs(s->sampler));
    if (s->drafting) {
        s->hidden = malloc((size_t)tc->hidden_size * sizeof *s->hidden);
        if (!s->hidden) {
            free_sequence(e, s);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        g4_draft_length_init(&s->draft_len, e->opt.draft_max);
    }
    s->on_token = req->on_token;
    s->user = req->user;
    pthread_mutex_lock(&e->lock);
    if (e->n_waiting >= e->opt.max_queue) {
        pthread_mutex_unlock(&e->lock);
        free_sequence(e, s);
        return g4_fail(G4_ERR_LIMIT, "the request queue is full (%d waiting)", e->opt.max_queue);
    }
    s->media = req->media; /* ownership passes only on success */
    s->matcher = req->constraint;
    s->id = e->next_id++;
    e->waiting[e->n_waiting++] = s;
    e->stats.waiting = e->n_waiting;
    if (request_id) *request_id = s->id;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    return G4_OK;
}

void g4_engine_cancel(g4_engine *e, uint64_t request_id) {
    pthread_mutex_lock(&e->lock);
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == request_id) e->running[i]->cancelled = 1;
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == request_id) e->waiting[i]->cancelled = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
}

int g4_engine_n_ctx(const g4_engine *e) { return e->opt.n_ctx; }

int g4_engine_draft_max_batch(const g4_engine *e) { return e->opt.draft_max_batch; }

void g4_engine_get_stats(g4_engine *e, g4_engine_stats *out) {
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    if (!e->cache) out->kv_blocks_used = e->opt.kv_blocks - e->kv->n_free_full;
    pthread_mutex_unlock(&e->lock);
}

/* The step's drafting counters into the stats (lock held). */
static void publish_draft_stats(g4_engine *e) {
    g4_engine_stats *st = &e->stats;
    st->draft_rounds += e->step_rounds;
    st->drafts_proposed += e->step_proposed;
    st->drafts_accepted += e->step_kept;
    for (int i = 0; i < G4_DRAFT_MAX; i++) {
        st->drafted_at[i] += e->step_drafted_at[i];
        st->accepted_at[i] += e->step_kept_at[i];
        e->step_drafted_at[i] = e->step_kept_at[i] = 0;
    }
    st->draft_seconds += e->step_draft_seconds;
    st->draft_forwards += e->step_forwards;
    e->step_forwards = e->step_rounds = e->step_proposed = e->step_kept = 0;
    e->step_draft_seconds = 0;
}

/* The cache's counters into the stats (lock held; the cache itself is the
 * engine thread's alone). */
static void publish_cache_stats(g4_engine *e) {
    if (!e->cache) return;
    g4_prefix_stats ps;
    g4_prefix_get_stats(e->cache, &ps);
    g4_engine_stats *st = &e->stats;
    st->kv_blocks_used = g4_prefix_blocks_held(e->cache);
    st->prefix_hits = ps.hits;
    st->prefix_misses = ps.misses;
    st->prefix_tokens_reused = ps.tokens_reused;
    st->prefix_blocks_evicted = ps.blocks_evicted;
    st->prefix_snapshots_taken = ps.snapshots_taken;
    st->prefix_snapshots_evicted = ps.snapshots_evicted;
    st->prefix_cached_blocks = ps.cached_blocks;
    st->prefix_idle_blocks = ps.idle_blocks;
    st->prefix_snapshots = ps.snapshots;
    st->prefix_cached_bytes = ps.cached_bytes;
    st->prefix_host_budget = ps.host_budget;
    st->prefix_host_bytes = ps.host_bytes;
    st->prefix_host_blocks_saved = ps.host_blocks_saved;
    st->prefix_host_blocks_restored = ps.host_blocks_restored;
    st->prefix_host_windows_saved = ps.host_windows_saved;
    st->prefix_host_windows_restored = ps.host_windows_restored;
    st->prefix_host_evicted = ps.host_evicted;
}

/* The chain hashes of s's full prompt blocks, once; the soft tokens' content
 * keys from their embeddings (what the model actually sees). On failure s
 * simply matches nothing. */
static void hash_prompt(g4_engine *e, sequence *s) {
    s->hashed = 1;
    const int n_blocks = s->n_prompt / e->kv->block_size, d = e->model->config.text.hidden_size;
    g4_backend *be = e->model->backend;
    s->hashes = malloc((size_t)(n_blocks + 1) * sizeof *s->hashes);
    if (!s->hashes) return;
    if (s->media.n > 0) {
        float *host = malloc((size_t)s->media.n * d * sizeof *host);
        s->media_keys = malloc((size_t)s->media.n * sizeof *s->media_keys);
        if (!host || !s->media_keys) {
            free(host);
            free(s->hashes);
            s->hashes = NULL;
            return;
        }
        be->ops->to_host(be, host, s->media.embeds, (size_t)s->media.n * d * sizeof *host);
        g4_prefix_media_keys(s->media.rows, host, s->media.n, d, s->media_keys);
        free(host);
    }
    g4_prefix_hash_blocks(e->cache, s->prompt, s->media.rows, s->media_keys, s->media.n, 0, n_blocks, s->hashes);
    s->n_hashes = n_blocks;
}

/* Admits s through the prefix cache: 1 when it fits (reusing what it can). */
static int admit_cached(g4_engine *e, sequence *s, int need) {
    const int bs = e->kv->block_size;
    if (!s->hashed) hash_prompt(e, s);
    /* at least the prompt's last token is run, for its logits */
    int reusable = s->hashes ? (s->n_prompt - 1) / bs : 0;
    g4_prefix_match mt = g4_prefix_lookup(e->cache, s->hashes, reusable);
    if (!g4_prefix_can_admit(e->cache, &mt, need) || g4_prefix_admit(e->cache, &mt, need, &s->kv) != G4_OK) return 0;
    s->prefilled = s->n_cached = mt.resume * bs;
    s->registered = mt.resume;
    s->branch = mt.matched > mt.resume ? mt.matched : 0;
    g4_prefix_count(e->cache, s->n_cached);
    return 1;
}

/* After a prefill chunk of s ending at s->prefilled (from `before`): its
 * completed blocks join the cache, and the sliding window is saved where
 * the prompt leaves a cached chain and where it ends. */
static void cache_prefilled(g4_engine *e, sequence *s, int before) {
    const int bs = e->kv->block_size;
    int done = s->prefilled / bs < s->n_hashes ? s->prefilled / bs : s->n_hashes;
    if (done > s->registered) {
        g4_prefix_register(e->cache, &s->kv, s->hashes, s->registered, done);
        s->registered = done;
    }
    if (s->branch && before < s->branch * bs && s->branch * bs <= s->prefilled)
        g4_prefix_snapshot(e->cache, &s->kv, s->prefilled, s->hashes, s->branch);
    if (s->prefilled == s->n_prompt) g4_prefix_snapshot(e->cache, &s->kv, s->prefilled, s->hashes, s->n_hashes);
}

/* Drops cancelled requests and admits waiting ones while sequences and KV
 * blocks allow. Called with the lock held; returns removed sequences through
 * `done` so their callbacks run outside the lock. */
static int admit(g4_engine *e, sequence **done, int max_done) {
    int n_done = 0;
    for (int i = 0; i < e->n_running;) {
        if (e->running[i]->cancelled && n_done < max_done) {
            done[n_done++] = e->running[i];
            release_kv(e, &e->running[i]->kv); /* room for the waiting ones below */
            e->running[i] = e->running[--e->n_running];
        } else {
            i++;
        }
    }
    int w = 0, blocked = 0;
    for (int i = 0; i < e->n_waiting; i++) {
        sequence *s = e->waiting[i];
        if (s->cancelled && n_done < max_done) {
            done[n_done++] = s;
            continue;
        }
        int admitted = 0;
        /* strict arrival order: a request that does not fit holds back the
         * ones behind it, so large requests are not starved */
        if (!blocked && e->n_running < e->opt.max_seqs && e->cache) {
            if (admit_cached(e, s, g4_kv_blocks_for(e->kv, s->n_prompt + s->max_tokens))) {
                s->t_admitted = g4_now_seconds();
                e->running[e->n_running++] = s;
                admitted = 1;
            }
        } else if (!blocked && e->n_running < e->opt.max_seqs) {
            int need = g4_kv_blocks_for(e->kv, s->n_prompt + s->max_tokens);
            if (need <= e->kv->n_free_full && e->kv->n_free_sliding >= e->kv->ring_blocks &&
                g4_kv_seq_init(e->kv, &s->kv) == G4_OK) {
                if (g4_kv_seq_reserve(e->kv, &s->kv, s->n_prompt + s->max_tokens) == G4_OK) {
                    s->t_admitted = g4_now_seconds();
                    e->running[e->n_running++] = s;
                    admitted = 1;
                } else {
                    g4_kv_seq_release(e->kv, &s->kv);
                }
            }
        }
        if (!admitted) {
            e->waiting[w++] = s;
            blocked = 1;
        }
    }
    e->n_waiting = w;
    e->stats.waiting = e->n_waiting;
    e->stats.running = e->n_running;
    publish_cache_stats(e);
    return n_done;
}

static int is_stop(const sequence *s, int32_t token) {
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop_ids[i] == token) return 1;
    return 0;
}

/* How logit row r's token will be chosen, decided before the forward pass:
 * the candidates its sampler needs (0: the full row), or -k for a masked
 * row, whose mask is queued for masks_begin. */
static int plan_row(g4_engine *e, sequence *s, int tokens_left) {
    s->mask_result = 0;
    if (!s->matcher || !g4_token_matcher_constrained(s->matcher)) return g4_sampler_candidates_needed(s->sampler);
    g4_token_matcher_set_budget(s->matcher, tokens_left);
    e->mask_jobs[e->n_mask_jobs++] = s;
    /* A masked row's candidates are the largest logits its mask allows,
     * chosen on the backend once the mask is there (the top_logits of the
     * masked row: exact) */
    return masked_candidates(e, s);
}

/* Row `row`'s token for s after the forward pass, which brought back k_max
 * candidates of each row (k_max 0: the rows themselves, into `logits`):
 * from the candidates where they decide, else from the full row (fetched
 * into `logits`, host [vocab]). *complete = 1 (nothing sampled) when s's
 * mask allows no token. The sampler does not accept the token here. */
static g4_status choose_token(g4_engine *e, sequence *s, int row, int k_max, float *logits, g4_sample *sample,
                              int *complete) {
    const int V = e->model->config.text.vocab_size;
    *complete = 0;
    g4_status ss = G4_OK;
    int need_full = k_max > 0 && e->cand_needed[row] == 0;
    if (k_max > 0 && e->cand_needed[row] > 0)
        ss = g4_sampler_sample_top(s->sampler, e->cand_ids + (size_t)row * k_max,
                                   e->cand_values + (size_t)row * k_max, k_max, e->cand_lse[row], sample,
                                   &need_full);
    int sampled = k_max > 0 && e->cand_needed[row] > 0 && !need_full;
    int none = 0; /* the mask allows no token */
    if (ss == G4_OK && k_max > 0 && e->cand_needed[row] < 0) {
        ss = sample_masked(e, s, row, k_max, sample, &need_full, &none);
        sampled = ss == G4_OK && !need_full && !none;
    }
    if (ss == G4_OK && need_full) ss = g4_text_scratch_logits(e->scratch, row, logits);
    if (s->mask_result < 0) ss = G4_ERR_LIMIT;
    if (ss == G4_OK && s->mask_result > 0 && !sampled) {
        if (!none) e->step_on_host++;
        if (none || g4_mask_apply(s->mask, g4_token_matcher_vocab(s->matcher), logits, V) == 0) {
            *complete = 1;
            return G4_OK;
        }
    }
    if (ss == G4_OK && !sampled && (k_max == 0 || need_full)) ss = g4_sampler_sample(s->sampler, logits, sample);
    return ss;
}

/* How many drafts s, a decoding sequence, asks for after its last token
 * (at most `room`): its adaptive length, within its max_tokens and the
 * context; 0 when it cannot draft. Its row of the batched round: every step
 * sees the target keys 0..p-1 and sits at p, the last token's position (the
 * clean algorithm, as g4_speculative_step). */
static int plan_drafts(g4_engine *e, sequence *s, int room, g4_draft_row *row) {
    const int p = s->n_prompt + s->n_generated - 1;
    int k = s->draft_len.len;
    const int budget = s->max_tokens - s->n_generated - 1; /* a round emits up to k + 1 tokens */
    const int ctx = e->opt.n_ctx - s->n_prompt - s->n_generated; /* positions p + 1..p + k exist */
    if (k > budget) k = budget;
    if (k > ctx) k = ctx;
    if (k > room) k = room;
    if (k <= 0 || p <= 0) return 0;
    *row = (g4_draft_row){.kv = {.kv = e->kv, .full_table = s->kv.full_blocks, .full_table_stride = s->kv.cap_full,
                                 .ring = s->kv.ring},
                          .pos = p, .token = s->last_token, .hidden = s->hidden, .k = k, .drafts = s->verify + 1};
    g4_drafter_kv_window(e->opt.drafter, p, &row->kv);
    return k;
}

/* The planned rows' drafts, one drafter forward per draft position for all
 * of them (fewer where the drafter's confidence falls below draft_min_p, none
 * after an end-of-sequence id), into each sequence's verify[1..]. */
static void draft_planned(g4_engine *e, int n) {
    int forwards = 0;
    const g4_status st = g4_draft_rounds(e->opt.drafter, e->draft_scratch, e->model, e->draft_row, n,
                                         e->opt.draft_min_p, e->draft_logits, e->draft_cands, &forwards);
    e->step_forwards += (uint64_t)forwards;
    for (int i = 0; i < n; i++) {
        sequence *s = e->draft_seqs[i];
        s->n_drafts = st == G4_OK ? e->draft_row[i].n : 0;
        if (st != G4_OK) { /* the replies go on without drafts */
            g4_log(G4_LOG_WARN, "engine: request %llu stops drafting: %s", (unsigned long long)s->id,
                   g4_error_message());
            s->drafting = 0;
        }
    }
}

/* Accepts s's chosen token and reports it: the finish reason it brings
 * (NONE: more follow; ERROR: the sampler or the matcher refused it). */
static g4_finish_reason emit_token(g4_engine *e, sequence *s, const g4_sample *sample) {
    g4_status ss = g4_sampler_accept(s->sampler, sample->token);
    if (ss == G4_OK && s->matcher) ss = g4_token_matcher_accept(s->matcher, sample->token);
    if (ss != G4_OK) return G4_FINISH_ERROR;
    if (s->n_generated == 0) s->prompt_seconds = g4_now_seconds() - s->t_admitted;
    if (s->generated) s->generated[s->n_generated] = sample->token;
    s->n_generated++;
    s->last_token = sample->token;
    int stop = is_stop(s, sample->token);
    int full = s->n_generated >= s->max_tokens || s->n_prompt + s->n_generated >= e->opt.n_ctx;
    g4_token_event ev = {.request_id = s->id, .has_token = 1, .sample = *sample, .is_stop_token = stop,
                         .n_prompt = s->n_prompt, .n_generated = s->n_generated, .n_cached = s->n_cached,
                         .prompt_seconds = s->prompt_seconds, .n_drafted = s->n_drafted,
                         .n_accepted = s->n_accepted, .n_rounds = s->n_rounds,
                         .finish = stop ? G4_FINISH_STOP : full ? G4_FINISH_LENGTH : G4_FINISH_NONE};
    if (s->on_token) s->on_token(s->user, &ev);
    if (ev.finish != G4_FINISH_NONE) s->on_token = NULL; /* its final event was just sent */
    return ev.finish;
}

/* s's decode row carried k drafts: logit rows row0..row0+k, verified in
 * order, each with the history plain decoding would have given it (kept
 * drafts accepted by the sampler first): a draft is kept by the shared rule
 * (g4_draft_keep; greedy: it is the row's choice), the first one rejected
 * gives the row's own token instead, and after k kept drafts the last row
 * gives one more. The rejected positions need no rollback: the next step
 * writes from the last emitted token's position on, and nothing reads
 * beyond it (the prefix cache registers only positions before the last
 * token). *last_row: the row that chose the last token emitted. */
static g4_finish_reason verify_drafts(g4_engine *e, sequence *s, int row0, int k_max, int *last_row) {
    const int V = e->model->config.text.vocab_size, k = s->n_drafts;
    const int forced = e->opt.draft_force;
    int kept = 0;
    g4_finish_reason why = G4_FINISH_NONE;
    s->n_rounds++;
    s->n_drafted += k;
    e->step_rounds++;
    e->step_proposed += (uint64_t)k;
    for (int i = 0; i < k; i++) e->step_drafted_at[i]++;
    for (int i = 0; i <= k; i++) {
        const int row = row0 + i;
        float *logits = k_max > 0 ? e->row_logits : e->logits + (size_t)row * V;
        const int32_t d = i < k ? s->verify[i + 1] : -1;
        g4_sample sample = {.token = -1};
        int keep = 0;
        g4_status ss = G4_OK;
        *last_row = row;
        if (i < k && forced && i < e->opt.draft_forced_accept) {
            keep = 1, sample.token = d;
        } else if (i < k && !forced && !g4_sampler_is_greedy(s->sampler)) {
            if (k_max > 0) ss = g4_text_scratch_logits(e->scratch, row, logits);
            if (ss == G4_OK) ss = g4_draft_keep(s->sampler, logits, d, e->keep_ids, e->keep_probs, &keep, &sample.token);
        } else {
            int complete = 0;
            ss = choose_token(e, s, row, k_max, logits, &sample, &complete);
            keep = i < k && !forced && sample.token == d;
        }
        if (ss != G4_OK) return G4_FINISH_ERROR;
        if (keep) {
            s->n_accepted++;
            e->step_kept_at[kept++]++;
        }
        why = emit_token(e, s, &sample);
        if (why != G4_FINISH_NONE || !keep) break;
    }
    e->step_kept += (uint64_t)kept;
    g4_draft_length_update(&s->draft_len, k, kept);
    return why;
}

int g4_engine_step(g4_engine *e) {
    const g4_model *m = e->model;
    const int V = m->config.text.vocab_size, d = m->config.text.hidden_size;
    sequence **done = e->step_done;

    pthread_mutex_lock(&e->lock);
    int n_done = admit(e, done, e->opt.max_seqs);
    /* snapshot the running set: only this thread changes it */
    int n_run = e->n_running;
    pthread_mutex_unlock(&e->lock);
    for (int i = 0; i < n_done; i++) finish(e, done[i], G4_FINISH_CANCELLED, NULL);

    /* drafting: while few enough sequences decode, each that may draft
     * proposes its round, within the batch's tokens and logit rows */
    int n_dec = 0;
    for (int i = 0; i < n_run; i++) n_dec += e->running[i]->prefilled == e->running[i]->n_prompt;
    const int may_draft = e->opt.drafter && n_dec <= e->opt.draft_max_batch;
    int room = e->opt.max_batch_tokens - n_dec;
    if (e->opt.logit_rows - n_run < room) room = e->opt.logit_rows - n_run;
    const double t_draft = g4_now_seconds();
    int n_drafting = 0;
    for (int i = 0; i < n_run; i++) {
        sequence *s = e->running[i];
        s->n_drafts = 0;
        if (!may_draft || !s->drafting || !s->have_hidden || s->prefilled < s->n_prompt || room <= 0) continue;
        if (n_drafting >= e->draft_rows) continue;
        const int k = plan_drafts(e, s, room, &e->draft_row[n_drafting]);
        if (k <= 0) continue;
        e->draft_seqs[n_drafting++] = s;
        room -= k;
    }
    if (n_drafting > 0) {
        draft_planned(e, n_drafting);
        e->step_draft_seconds += g4_now_seconds() - t_draft;
    }

    /* build one batch: decode tokens first (with their drafts), then prefill
     * chunks (an image that does not fit the room left waits for the next
     * step; submit refused images that can never fit one) */
    g4_batch_builder *bb = &e->batch;
    g4_batch_builder_reset(bb);
    int want_hidden = 0; /* the final-normed states of drafting sequences' rows, for their next round */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_run; i++) {
            sequence *s = e->running[i];
            int decoding = s->prefilled == s->n_prompt;
            if (decoding != (pass == 0)) continue;
            g4_batch_piece piece = {.kv = &s->kv, .logits = G4_BATCH_LAST_LOGITS};
            if (decoding) {
                s->verify[0] = s->last_token;
                piece.ids = s->verify;
                piece.len = 1 + s->n_drafts;
                piece.pos = s->n_prompt + s->n_generated - 1;
                if (s->n_drafts > 0) piece.logits = G4_BATCH_ALL_LOGITS;
            } else {
                piece.len = g4_batch_chunk_len(m, e->bidir_mode, s->prompt, s->n_prompt, s->prefilled,
                                               e->opt.max_batch_tokens - bb->n_tokens);
                piece.ids = s->prompt + s->prefilled;
                piece.lookback = piece.pos = piece.media_origin = s->prefilled;
                piece.prefill = 1;
                piece.n_media = s->media.n;
                piece.media_rows = s->media.rows;
                piece.media_embeds = s->media.embeds;
                if (s->prefilled + piece.len < s->n_prompt) piece.logits = G4_BATCH_NO_LOGITS;
            }
            if (piece.len <= 0) continue;
            want_hidden |= may_draft && s->drafting && piece.logits != G4_BATCH_NO_LOGITS;
            e->batch_seqs[g4_batch_add(bb, &piece)] = s;
        }
    }
    const int n = bb->n_tokens, n_seqs = bb->n_seqs, n_logits = bb->n_logit_rows;
    if (n == 0) {
        pthread_mutex_lock(&e->lock);
        int pending = e->n_running + e->n_waiting;
        pthread_mutex_unlock(&e->lock);
        return pending;
    }
    g4_text_batch batch;
    g4_batch_finish(bb, &batch);
    batch.logits = e->logits;
    if (want_hidden) batch.hidden_out = e->hidden;
    /* Rows whose sampler can choose from the row's largest logits bring
     * back only those (the most any of them needs); the others, and rows the
     * candidates cannot decide, fetch their full row after the step. A
     * sampled sequence's rows that verify drafts take the full row (the
     * acceptance rule weighs the draft under the whole distribution). */
    int k_max = 0, any_masked = 0;
    e->n_mask_jobs = 0;
    for (int r = 0, first = 0; r < n_logits; r++) {
        sequence *s = e->batch_seqs[bb->logit_owner[r]];
        if (r > 0 && bb->logit_owner[r] != bb->logit_owner[r - 1]) first = r;
        int left = s->max_tokens - s->n_generated, ctx_left = e->opt.n_ctx - s->n_prompt - s->n_generated;
        if (r - first < s->n_drafts && !e->opt.draft_force && !g4_sampler_is_greedy(s->sampler))
            e->cand_needed[r] = 0;
        else
            e->cand_needed[r] = plan_row(e, s, left < ctx_left ? left : ctx_left);
        int k = e->cand_needed[r] < 0 ? -e->cand_needed[r] : e->cand_needed[r];
        if (k > k_max) k_max = k;
        any_masked |= e->cand_needed[r] < 0;
    }
    /* more rows than the host's logits hold: candidates, and full rows one at a time */
    if (n_logits > e->opt.max_seqs && k_max == 0) k_max = 1;
    if (k_max > 0) {
        batch.logits = NULL;
        batch.n_candidates = k_max;
        batch.cand_ids = e->cand_ids;
        batch.cand_values = e->cand_values;
        batch.cand_lse = e->cand_lse;
    }
    if (any_masked) {
        e->step_logit_rows = n_logits;
        batch.mask_bits = e->mask_dev;
        batch.mask_words = e->mask_words;
        batch.mask_slot = e->mask_slot_dev;
        batch.masks_ready = masks_to_device;
        batch.masks_ctx = e;
    }
    masks_begin(e);
    g4_status st = g4_text_forward(m, e->kv, e->scratch, &batch);
    masks_wait(e);
    const double t_sample = g4_now_seconds();

    /* advance every sequence in the batch; sample where logits came back */
    int n_prefilled = 0, n_generated = 0;
    /* at most one entry per sequence of the batch, and a batch holds at most max_seqs */
    sequence **finished = e->step_finished;
    g4_finish_reason *reasons = e->step_reasons;
    int n_finished = 0;
    int next_logit = 0;
    for (int b = 0; b < n_seqs; b++) {
        sequence *s = e->batch_seqs[b];
        int decoding = s->prefilled == s->n_prompt;
        if (!decoding) {
            int len = 0;
            for (int t = 0; t < n; t++) len += bb->seq[t] == b;
            int before = s->prefilled;
            s->prefilled += len;
            n_prefilled += len;
            if (e->cache && st == G4_OK) cache_prefilled(e, s, before);
        }
        if (next_logit >= n_logits || bb->logit_owner[next_logit] != b) continue;
        const int row = next_logit;
        while (next_logit < n_logits && bb->logit_owner[next_logit] == b) next_logit++;
        float *logits = k_max > 0 ? e->row_logits : e->logits + (size_t)row * V;
        if (st != G4_OK) {
            finished[n_finished] = s, reasons[n_finished++] = G4_FINISH_ERROR;
            continue;
        }
        const int generated_before = s->n_generated;
        int hidden_row = row;
        g4_finish_reason why = G4_FINISH_NONE;
        if (s->n_drafts > 0) {
            why = verify_drafts(e, s, row, k_max, &hidden_row);
        } else {
            g4_sample sample;
            int complete = 0;
            g4_status ss = choose_token(e, s, row, k_max, logits, &sample, &complete);
            if (ss == G4_OK && complete) {
                /* the grammar is complete and no stop token may follow (ignore_eos, or none given) */
                why = g4_token_matcher_can_end(s->matcher) ? G4_FINISH_STOP : G4_FINISH_ERROR;
                if (!g4_token_matcher_can_end(s->matcher))
                    g4_fail(G4_ERR_INVALID_ARGUMENT, "constraint: no token of the vocabulary can continue the reply");
            } else {
                why = ss == G4_OK ? emit_token(e, s, &sample) : G4_FINISH_ERROR;
            }
        }
        n_generated += s->n_generated - generated_before;
        if (s->drafting) {
            s->have_hidden = want_hidden && why == G4_FINISH_NONE;
            if (s->have_hidden) memcpy(s->hidden, e->hidden + (size_t)hidden_row * d, (size_t)d * sizeof *s->hidden);
        }
        if (why != G4_FINISH_NONE) finished[n_finished] = s, reasons[n_finished++] = why;
    }
    /* sequences whose batch failed without reaching the sampler */
    if (st != G4_OK)
        for (int b = 0; b < n_seqs; b++) {
            int listed = 0;
            for (int k = 0; k < n_finished; k++) listed |= finished[k] == e->batch_seqs[b];
            if (!listed) finished[n_finished] = e->batch_seqs[b], reasons[n_finished++] = G4_FINISH_ERROR;
        }
    const char *message = st != G4_OK ? g4_error_message() : NULL;
    const double sample_seconds = g4_now_seconds() - t_sample;
    pthread_mutex_lock(&e->lock);
    for (int k = 0; k < n_finished; k++)
        for (int i = 0; i < e->n_running; i++)
            if (e->running[i] == finished[k]) {
                e->running[i] = e->running[--e->n_running];
                break;
            }
    e->stats.steps++;
    e->stats.tokens_prefilled += (uint64_t)n_prefilled;
    e->stats.tokens_generated += (uint64_t)n_generated;
    e->stats.masked_rows += e->step_masked, e->stats.mask_uploads += e->step_uploads;
    e->stats.masked_rows_on_host += e->step_on_host;
    e->stats.mask_seconds += e->step_mask_seconds, e->stats.mask_wait_seconds += e->step_mask_wait;
    e->step_masked = e->step_uploads = e->step_on_host = 0;
    e->step_mask_seconds = e->step_mask_wait = 0;
    publish_draft_stats(e);
    e->stats.sample_seconds += sample_seconds;
    e->stats.running = e->n_running;
    pthread_mutex_unlock(&e->lock);
    for (int k = 0; k < n_finished; k++) finish(e, finished[k], reasons[k], reasons[k] == G4_FINISH_ERROR ? message : NULL);
    pthread_mutex_lock(&e->lock);
    publish_cache_stats(e);
    int pending = e->n_running + e->n_waiting;
    pthread_mutex_unlock(&e->lock);
    return st == G4_OK ? pending : -1;
}

static void *engine_thread(void *arg) {
    g4_engine *e = arg;
    /* a new thread starts from the runtime's default, not its creator's setting */
    if (e->opt.threads > 0) omp_set_num_threads(e->opt.threads);
    for (;;) {
        pthread_mutex_lock(&e->lock);
        while (!e->stop_requested && e->n_running + e->n_waiting == 0) pthread_cond_wait(&e->wake, &e->lock);
        int stop = e->stop_requested && (e->cancel_on_stop || e->n_running + e->n_waiting == 0);
        if (stop && e->cancel_on_stop) {
            for (int i = 0; i < e->n_running; i++) e->running[i]->cancelled = 1;
            for (int i = 0; i < e->n_waiting; i++) e->waiting[i]->cancelled = 1;
        }
        pthread_mutex_unlock(&e->lock);
        if (stop) {
            g4_engine_step(e); /* delivers the cancellations */
            return NULL;
        }
        g4_engine_step(e);
    }
}

g4_status g4_engine_start(g4_engine *e) {
    if (e->thread_started) return G4_OK;
    e->stop_requested = 0;
    if (pthread_create(&e->thread, NULL, engine_thread, e) != 0)
        return g4_fail(G4_ERR_INTERNAL, "cannot start the engine thread");
    e->thread_started = 1;
    return G4_OK;
}

void g4_engine_stop(g4_engine *e, int cancel_all) {
    if (!e->thread_started) return;
    pthread_mutex_lock(&e->lock);
    e->stop_requested = 1;
    e->cancel_on_stop = cancel_all;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->thread, NULL);
    e->thread_started = 0;
}

/* ---- sequences the caller drives ---- */

g4_kv_pool *g4_engine_kv(g4_engine *e) { return e->kv; }

g4_text_scratch *g4_engine_scratch(g4_engine *e) { return e->scratch; }

g4_status g4_engine_seq_init(g4_engine *e, g4_kv_seq *seq) { return g4_kv_seq_init(e->kv, seq); }

void g4_engine_seq_release(g4_engine *e, g4_kv_seq *seq) { release_kv(e, seq); }

g4_status g4_engine_eval(g4_engine *e, g4_kv_seq *seq, const int32_t *ids, int n, const g4_soft_tokens *soft,
                         const g4_eval_output *out) {
    const g4_model *m = e->model;
    const int V = m->config.text.vocab_size, d = m->config.text.hidden_size, C = e->opt.max_batch_tokens;
    if (n <= 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "empty prompt: nothing to evaluate");
    if (seq->length + n > e->opt.n_ctx)
        return g4_fail(G4_ERR_LIMIT, "context full: %d positions used + %d new exceed the context of %d",
                       seq->length, n, e->opt.n_ctx);
    if (out->mode == G4_LOGITS_ALL && e->opt.logit_rows < C)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "every row's logits need an engine of %d logit rows", C);
    if (out->k < 0 || out->k > G4_TOP_LOGITS_MAX_K)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d candidates asked (1..%d)", out->k, G4_TOP_LOGITS_MAX_K);
    g4_batch_builder *bb = &e->batch;
    g4_status st = G4_OK;
    for (int start = 0; st == G4_OK && start < n;) {
        int len = g4_batch_chunk_len(m, e->bidir_mode, ids, n, start, C);
        if (len == 0) {
            int end = start;
            while (end < n && (ids[end] == m->config.tokens.image_id || ids[end] == m->config.tokens.video_id)) end++;
            return g4_fail(G4_ERR_LIMIT,
                           "an image of %d soft tokens does not fit the %d-token prefill chunk; raise the chunk size",
                           end - start, C);
        }
        const int base = seq->length, last = start + len == n;
        st = g4_kv_seq_reserve(e->kv, seq, base + len);
        if (st != G4_OK) break;
        g4_batch_piece piece = {.kv = seq, .ids = ids + start, .len = len, .lookback = start, .pos = base,
                                .prefill = 1, .media_origin = start,
                                .logits = out->mode == G4_LOGITS_ALL             ? G4_BATCH_ALL_LOGITS
                                          : out->mode == G4_LOGITS_LAST && last ? G4_BATCH_LAST_LOGITS
                                                                                 : G4_BATCH_NO_LOGITS};
        if (soft) piece.n_media = soft->n, piece.media_rows = soft->rows, piece.media_embeds = soft->embeds;
        g4_batch_builder_reset(bb);
        g4_batch_add(bb, &piece);
        g4_text_batch b;
        g4_batch_finish(bb, &b);
        b.hook = out->hook;
        b.hook_ctx = out->hook_ctx;
        if (piece.logits == G4_BATCH_ALL_LOGITS) {
            b.logits = out->logits + (size_t)start * V;
            if (out->hidden) b.hidden_out = out->hidden + (size_t)start * d;
        } else if (piece.logits == G4_BATCH_LAST_LOGITS) {
            b.hidden_out = out->hidden;
            if (out->k > 0) {
                b.n_candidates = out->k;
                b.cand_ids = out->cand_ids;
                b.cand_values = out->cand_values;
                b.cand_lse = out->lse;
            } else {
                b.logits = out->logits;
            }
        }
        st = g4_text_forward(m, e->kv, e->scratch, &b);
        if (st != G4_OK) break;
        seq->length = base + len;
        start += len;
    }
    return st;
}

g4_status g4_engine_eval_sample(g4_engine *e, g4_kv_seq *seq, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                g4_sampler *sampler, g4_token_matcher *matcher, int tokens_left, float *logits,
                                g4_sample *out, int *none) {
    *none = 0;
    /* the row's chooser: a sequence of one row, as the step has them */
    sequence s = {.sampler = sampler, .matcher = matcher};
    e->n_mask_jobs = 0;
    e->cand_needed[0] = plan_row(e, &s, tokens_left);
    /* one row: a masked one takes its full row and its mask on the host */
    if (e->cand_needed[0] < 0) e->cand_needed[0] = 0;
    const int k = e->cand_needed[0];
    g4_eval_output o = {.mode = G4_LOGITS_LAST, .logits = logits, .k = k, .cand_ids = e->cand_ids,
                        .cand_values = e->cand_values, .lse = e->cand_lse};
    masks_begin(e);
    g4_status st = g4_engine_eval(e, seq, ids, n, soft, &o);
    masks_wait(e);
    int complete = 0;
    if (st == G4_OK) st = choose_token(e, &s, 0, k, logits, out, &complete);
    if (st == G4_OK && complete) *none = 1;
    return st;
}

g4_status g4_engine_last_logits(g4_engine *e, float *logits) { return g4_text_scratch_logits(e->scratch, 0, logits); }
