#include "runtime/engine.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "model/kv_cache.h"
#include "model/text_decoder.h"
#include "runtime/prefix_cache.h"
#include "runtime/memory_plan.h"
#include "runtime/session.h"

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
} sequence;

struct g4_engine {
    const g4_model *model;
    g4_engine_options opt;
    int bidir_mode;
    g4_kv_pool *kv;
    g4_prefix_cache *cache; /* NULL: no_prefix_cache */
    g4_text_scratch *scratch;
    float *media_stage;   /* backend [max_batch_tokens][hidden] */
    /* host batch arrays, sized for max_batch_tokens rows / max_seqs sequences */
    int32_t *ids, *pos, *seq, *ranges, *glo, *ghi, *mm_rows, *logit_rows, *full_tables, *sliding_tables;
    int full_stride_cap;
    float *logits;
    /* the largest logits of each logit row, where its sampler can choose from them */
    int32_t *cand_ids;
    float *cand_values;
    double *cand_lse;
    int *cand_needed; /* per logit row: g4_sampler_candidates_needed, 0 = the full row, -k: a masked row's k */
    int32_t *allowed_ids; /* a masked row's allowed candidates */
    float *allowed_values;
    sequence **batch_seqs;
    int *logit_owner;
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
    if (tc->bidirectional_vision)
        e->bidir_mode = e->opt.vision_mask == G4_VISION_MASK_CAUSAL ? 0
                        : e->opt.vision_mask == G4_VISION_MASK_ALL_LAYERS ? 2 : 1;
    int ring = g4_kv_ring_blocks(tc->sliding_window, e->opt.max_batch_tokens, bs);
    const int N = e->opt.max_batch_tokens, S = e->opt.max_seqs;
    /* sliding blocks beyond the rings hold the prefix cache's window snapshots */
    int snap = e->opt.no_prefix_cache ? 0 : g4_prefix_snapshot_blocks(m, bs);
    if (e->opt.cache_snapshots <= 0) e->opt.cache_snapshots = 2 * S;
    const int64_t sliding_blocks = (int64_t)ring * S + (int64_t)snap * e->opt.cache_snapshots;
    g4_status st = g4_memory_check_kv(m, e->opt.kv_type, bs, e->opt.kv_blocks, sliding_blocks, e->opt.n_ctx);
    if (st == G4_OK) st = g4_kv_pool_create(m, bs, e->opt.kv_blocks, (int)sliding_blocks, ring, e->opt.kv_type, &e->kv);
    if (st == G4_OK && !e->opt.no_prefix_cache) st = g4_prefix_cache_create(m, e->kv, &e->cache);
    if (st == G4_OK && e->cache) st = g4_prefix_cache_set_host_ram(e->cache, e->opt.cache_ram_bytes);
    if (st == G4_OK) st = g4_text_scratch_create(m, N, S, &e->scratch);
    if (st == G4_OK) {
        e->media_stage = m->backend->ops->alloc(m->backend, (size_t)N * tc->hidden_size * sizeof(float));
        e->ids = malloc((size_t)N * sizeof *e->ids);
        e->pos = malloc((size_t)N * sizeof *e->pos);
        e->seq = malloc((size_t)N * sizeof *e->seq);
        e->ranges = malloc((size_t)N * 4 * sizeof *e->ranges);
        e->glo = malloc((size_t)N * sizeof *e->glo);
        e->ghi = malloc((size_t)N * sizeof *e->ghi);
        e->mm_rows = malloc((size_t)N * sizeof *e->mm_rows);
        e->logit_rows = malloc((size_t)S * sizeof *e->logit_rows);
        e->logit_owner = malloc((size_t)S * sizeof *e->logit_owner);
        e->full_stride_cap = per_seq;
        e->full_tables = calloc((size_t)S * per_seq, sizeof *e->full_tables);
        e->sliding_tables = malloc((size_t)S * ring * sizeof *e->sliding_tables);
        e->logits = malloc((size_t)S * tc->vocab_size * sizeof *e->logits);
        e->cand_ids = malloc((size_t)S * G4_SAMPLER_MAX_CANDIDATES * sizeof *e->cand_ids);
        e->cand_values = malloc((size_t)S * G4_SAMPLER_MAX_CANDIDATES * sizeof *e->cand_values);
        e->cand_lse = malloc((size_t)S * sizeof *e->cand_lse);
        e->cand_needed = malloc((size_t)S * sizeof *e->cand_needed);
        e->allowed_ids = malloc(G4_SAMPLER_MAX_CANDIDATES * sizeof *e->allowed_ids);
        e->allowed_values = malloc(G4_SAMPLER_MAX_CANDIDATES * sizeof *e->allowed_values);
        e->batch_seqs = malloc((size_t)S * sizeof *e->batch_seqs);
        e->step_done = malloc((size_t)S * sizeof *e->step_done);
        e->step_finished = malloc((size_t)S * sizeof *e->step_finished);
        e->step_reasons = malloc((size_t)S * sizeof *e->step_reasons);
        e->mask_jobs = malloc((size_t)S * sizeof *e->mask_jobs);
        e->waiting = malloc((size_t)e->opt.max_queue * sizeof *e->waiting);
        e->running = malloc((size_t)S * sizeof *e->running);
        if (!e->media_stage || !e->ids || !e->pos || !e->seq || !e->ranges || !e->glo || !e->ghi || !e->mm_rows ||
            !e->logit_rows || !e->logit_owner || !e->full_tables || !e->sliding_tables || !e->logits ||
            !e->cand_ids || !e->cand_values || !e->cand_lse || !e->cand_needed || !e->allowed_ids || !e->allowed_values ||
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
        for (int i = 0; i < e->n_mask_jobs; i++)
            e->mask_jobs[i]->mask_result = g4_token_matcher_mask(e->mask_jobs[i]->matcher, &e->mask_jobs[i]->mask);
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
        for (int i = 0; i < e->n_mask_jobs; i++)
            e->mask_jobs[i]->mask_result = g4_token_matcher_mask(e->mask_jobs[i]->matcher, &e->mask_jobs[i]->mask);
        return;
    }
    pthread_mutex_lock(&e->mask_lock);
    e->mask_pending = 1;
    pthread_cond_signal(&e->mask_wake);
    pthread_mutex_unlock(&e->mask_lock);
}

static void masks_wait(g4_engine *e) {
    if (!e->mask_thread_started) return;
    pthread_mutex_lock(&e->mask_lock);
    while (e->mask_pending) pthread_cond_wait(&e->mask_done, &e->mask_lock);
    pthread_mutex_unlock(&e->mask_lock);
}

void g4_engine_destroy(g4_engine *e) {
    if (!e) return;
    g4_backend *be = e->model->backend;
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
    if (e->media_stage) be->ops->release(be, e->media_stage);
    free(e->ids), free(e->pos), free(e->seq), free(e->ranges), free(e->glo), free(e->ghi), free(e->mm_rows);
    free(e->logit_rows), free(e->logit_owner), free(e->full_tables), free(e->sliding_tables), free(e->logits);
    free(e->cand_ids), free(e->cand_values), free(e->cand_lse), free(e->cand_needed);
    free(e->allowed_ids), free(e->allowed_values);
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

void g4_engine_get_stats(g4_engine *e, g4_engine_stats *out) {
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    if (!e->cache) out->kv_blocks_used = e->opt.kv_blocks - e->kv->n_free_full;
    pthread_mutex_unlock(&e->lock);
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

/* Rows of the next prefill chunk of s, at most `budget`, not cutting an
 * image in two on models whose image tokens attend both ways (0: the image
 * waits for a step with more room; submit refused images that can never
 * fit one step). */
static int prefill_chunk(const g4_engine *e, const sequence *s, int budget) {
    int left = s->n_prompt - s->prefilled;
    int len = left < budget ? left : budget;
    if (len < left && len > 0 && e->bidir_mode) {
        const g4_token_ids *tk = &e->model->config.tokens;
        int end = s->prefilled + len;
        if (is_vision(tk, s->prompt[end]) && is_vision(tk, s->prompt[end - 1])) {
            int g = end - 1;
            while (g > s->prefilled && is_vision(tk, s->prompt[g - 1])) g--;
            len = g - s->prefilled;
        }
    }
    return len;
}

static int is_stop(const sequence *s, int32_t token) {
    for (int i = 0; i < s->n_stop; i++)
        if (s->stop_ids[i] == token) return 1;
    return 0;
}

int g4_engine_step(g4_engine *e) {
    const g4_model *m = e->model;
    const g4_text_config *tc = &m->config.text;
    const g4_token_ids *tk = &m->config.tokens;
    g4_backend *be = m->backend;
    const int V = tc->vocab_size, d = tc->hidden_size;
    sequence **done = e->step_done;

    pthread_mutex_lock(&e->lock);
    int n_done = admit(e, done, e->opt.max_seqs);
    /* snapshot the running set: only this thread changes it */
    int n_run = e->n_running;
    pthread_mutex_unlock(&e->lock);
    for (int i = 0; i < n_done; i++) finish(e, done[i], G4_FINISH_CANCELLED, NULL);

    /* build one batch: decode tokens first, then prefill chunks */
    int n = 0, n_seqs = 0, n_logits = 0, n_mm = 0, stride = 1;
    int budget = e->opt.max_batch_tokens;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_run; i++) {
            sequence *s = e->running[i];
            int decoding = s->prefilled == s->n_prompt;
            if (decoding != (pass == 0)) continue;
            int len = decoding ? 1 : prefill_chunk(e, s, budget - n);
            if (len <= 0) continue;
            int b = n_seqs++;
            e->batch_seqs[b] = s;
            if (s->kv.n_full > stride) stride = s->kv.n_full;
            int base = decoding ? s->n_prompt + s->n_generated - 1 : s->prefilled;
            for (int t = 0; t < len; t++) {
                e->ids[n + t] = decoding ? s->last_token : s->prompt[s->prefilled + t];
                e->pos[n + t] = base + t;
                e->seq[n + t] = b;
                e->glo[n + t] = e->ghi[n + t] = -1;
            }
            if (!decoding && e->bidir_mode) {
                for (int t = 0; t < len;) {
                    if (!is_vision(tk, e->ids[n + t])) {
                        t++;
                        continue;
                    }
                    int u = t;
                    while (u < len && is_vision(tk, e->ids[n + u])) u++;
                    /* a chunk that resumes from the cache inside an image:
                     * the image starts before it */
                    int lo = base + t;
                    while (t == 0 && lo > 0 && is_vision(tk, s->prompt[lo - 1])) lo--;
                    for (int k = t; k < u; k++) e->glo[n + k] = lo, e->ghi[n + k] = base + u;
                    t = u;
                }
            }
            g4_text_kv_ranges(m, e->pos + n, e->glo + n, e->ghi + n, len, decoding ? 0 : e->bidir_mode,
                              e->ranges + 4 * n);
            if (!decoding) {
                for (int k = 0; k < s->media.n; k++) {
                    int r = s->media.rows[k];
                    if (r < s->prefilled || r >= s->prefilled + len) continue;
                    be->ops->copy(be, e->media_stage + (size_t)n_mm * d, s->media.embeds + (size_t)k * d,
                                  (size_t)d * sizeof(float));
                    e->mm_rows[n_mm++] = n + (r - s->prefilled);
                }
            }
            if (decoding || s->prefilled + len == s->n_prompt) {
                e->logit_rows[n_logits] = n + len - 1;
                e->logit_owner[n_logits++] = b;
            }
            n += len;
        }
    }
    if (n == 0) {
        pthread_mutex_lock(&e->lock);
        int pending = e->n_running + e->n_waiting;
        pthread_mutex_unlock(&e->lock);
        return pending;
    }
    /* the table width in powers of two: decode steps keep one shape (and so
     * one recorded graph) while the sequences grow */
    int width = 16;
    while (width < stride) width *= 2;
    if (width > e->full_stride_cap) width = e->full_stride_cap;
    if (width > stride) stride = width;
    for (int b = 0; b < n_seqs; b++) {
        sequence *s = e->batch_seqs[b];
        memcpy(e->full_tables + (size_t)b * stride, s->kv.full_blocks, (size_t)s->kv.n_full * sizeof(int32_t));
        memcpy(e->sliding_tables + (size_t)b * e->kv->ring_blocks, s->kv.ring,
               (size_t)e->kv->ring_blocks * sizeof(int32_t));
    }
    g4_text_batch batch = {
        .n_tokens = n,
        .ids = e->ids,
        .pos = e->pos,
        .seq = e->seq,
        .kv_range = e->ranges,
        .n_seqs = n_seqs,
        .full_tables = e->full_tables,
        .full_table_stride = stride,
        .sliding_tables = e->sliding_tables,
        .n_mm = n_mm,
        .mm_rows = e->mm_rows,
        .mm_embeds = e->media_stage,
        .n_logit_rows = n_logits,
        .logit_rows = e->logit_rows,
        .logits = e->logits,
    };
    /* Rows whose sampler can choose from the row's largest logits bring
     * back only those (the most any of them needs); the others, and rows the
     * candidates cannot decide, fetch their full row after the step. */
    int k_max = 0;
    e->n_mask_jobs = 0;
    for (int r = 0; r < n_logits; r++) {
        sequence *s = e->batch_seqs[e->logit_owner[r]];
        s->mask_result = 0;
        if (s->matcher && g4_token_matcher_constrained(s->matcher)) {
            int left = s->max_tokens - s->n_generated, ctx_left = e->opt.n_ctx - s->n_prompt - s->n_generated;
            g4_token_matcher_set_budget(s->matcher, left < ctx_left ? left : ctx_left);
            e->mask_jobs[e->n_mask_jobs++] = s;
            /* A masked row draws from the largest logits the mask allows:
             * more candidates than the sampler needs come back, and when
             * enough of them are allowed they decide exactly (every token
             * outside the list is below all of them); otherwise, or with
             * log-probabilities (of the masked row), the full row. */
            int need = g4_sampler_candidates_needed(s->sampler);
            int k = need * 4 > 256 ? need * 4 : 256;
            if (k > G4_SAMPLER_MAX_CANDIDATES) k = G4_SAMPLER_MAX_CANDIDATES;
            if (k > V) k = V;
            e->cand_needed[r] = need > 0 && !g4_sampler_wants_logprobs(s->sampler) ? -k : 0;
            if (k > k_max && e->cand_needed[r] < 0) k_max = k;
            continue;
        }
        e->cand_needed[r] = g4_sampler_candidates_needed(s->sampler);
        if (e->cand_needed[r] > k_max) k_max = e->cand_needed[r];
    }
    if (k_max > 0) {
        batch.logits = NULL;
        batch.n_candidates = k_max;
        batch.cand_ids = e->cand_ids;
        batch.cand_values = e->cand_values;
        batch.cand_lse = e->cand_lse;
    }
    masks_begin(e);
    g4_status st = g4_text_forward(m, e->kv, e->scratch, &batch);
    masks_wait(e);

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
            for (int t = 0; t < n; t++) len += e->seq[t] == b;
            int before = s->prefilled;
            s->prefilled += len;
            n_prefilled += len;
            if (e->cache && st == G4_OK) cache_prefilled(e, s, before);
        }
        if (next_logit >= n_logits || e->logit_owner[next_logit] != b) continue;
        const int row = next_logit++;
        float *logits = e->logits + (size_t)row * V;
        if (st != G4_OK) {
            finished[n_finished] = s, reasons[n_finished++] = G4_FINISH_ERROR;
            continue;
        }
        g4_sample sample;
        g4_status ss = G4_OK;
        int need_full = k_max > 0 && e->cand_needed[row] == 0;
        if (k_max > 0 && e->cand_needed[row] > 0)
            ss = g4_sampler_sample_top(s->sampler, e->cand_ids + (size_t)row * k_max,
                                       e->cand_values + (size_t)row * k_max, k_max, e->cand_lse[row], &sample,
                                       &need_full);
        int sampled = k_max > 0 && e->cand_needed[row] > 0 && !need_full;
        if (ss == G4_OK && k_max > 0 && e->cand_needed[row] < 0 && s->mask_result > 0) {
            /* the allowed ones among the candidates, in their order */
            const int32_t *ci = e->cand_ids + (size_t)row * k_max;
            const float *cv = e->cand_values + (size_t)row * k_max;
            const int mv = g4_token_matcher_vocab(s->matcher);
            int n_ok = 0;
            for (int i = 0; i < k_max; i++)
                if (ci[i] >= 0 && ci[i] < mv && g4_mask_has(s->mask, ci[i])) {
                    e->allowed_ids[n_ok] = ci[i];
                    e->allowed_values[n_ok++] = cv[i];
                }
            need_full = 1;
            if (n_ok >= g4_sampler_candidates_needed(s->sampler)) {
                ss = g4_sampler_sample_top(s->sampler, e->allowed_ids, e->allowed_values, n_ok, e->cand_lse[row],
                                           &sample, &need_full);
                sampled = ss == G4_OK && !need_full;
            }
        } else if (k_max > 0 && e->cand_needed[row] < 0) {
            need_full = 1;
        }
        if (ss == G4_OK && need_full) ss = g4_text_scratch_logits(e->scratch, row, logits);
        if (s->mask_result < 0) ss = G4_ERR_LIMIT;
        if (ss == G4_OK && s->mask_result > 0 && !sampled) {
            if (g4_mask_apply(s->mask, g4_token_matcher_vocab(s->matcher), logits, V) == 0) {
                /* the grammar is complete and no stop token may follow (ignore_eos, or none given) */
                finished[n_finished] = s;
                reasons[n_finished++] = g4_token_matcher_can_end(s->matcher) ? G4_FINISH_STOP : G4_FINISH_ERROR;
                if (!g4_token_matcher_can_end(s->matcher))
                    g4_fail(G4_ERR_INVALID_ARGUMENT, "constraint: no token of the vocabulary can continue the reply");
                continue;
            }
        }
        if (ss == G4_OK && !sampled && (k_max == 0 || need_full)) ss = g4_sampler_sample(s->sampler, logits, &sample);
        if (ss == G4_OK) ss = g4_sampler_accept(s->sampler, sample.token);
        if (ss == G4_OK && s->matcher) ss = g4_token_matcher_accept(s->matcher, sample.token);
        if (ss != G4_OK) {
            finished[n_finished] = s, reasons[n_finished++] = G4_FINISH_ERROR;
            continue;
        }
        if (s->n_generated == 0) s->prompt_seconds = g4_now_seconds() - s->t_admitted;
        if (s->generated) s->generated[s->n_generated] = sample.token;
        s->n_generated++;
        n_generated++;
        s->last_token = sample.token;
        int stop = is_stop(s, sample.token);
        int full = s->n_generated >= s->max_tokens || s->n_prompt + s->n_generated >= e->opt.n_ctx;
        g4_token_event ev = {.request_id = s->id, .has_token = 1, .sample = sample, .is_stop_token = stop,
                             .n_prompt = s->n_prompt, .n_generated = s->n_generated, .n_cached = s->n_cached,
                             .prompt_seconds = s->prompt_seconds,
                             .finish = stop ? G4_FINISH_STOP : full ? G4_FINISH_LENGTH : G4_FINISH_NONE};
        if (s->on_token) s->on_token(s->user, &ev);
        if (ev.finish != G4_FINISH_NONE) {
            finished[n_finished] = s, reasons[n_finished++] = ev.finish;
            s->on_token = NULL; /* its final event was just sent */
        }
    }
    /* sequences whose batch failed without reaching the sampler */
    if (st != G4_OK)
        for (int b = 0; b < n_seqs; b++) {
            int listed = 0;
            for (int k = 0; k < n_finished; k++) listed |= finished[k] == e->batch_seqs[b];
            if (!listed) finished[n_finished] = e->batch_seqs[b], reasons[n_finished++] = G4_FINISH_ERROR;
        }
    const char *message = st != G4_OK ? g4_error_message() : NULL;
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
