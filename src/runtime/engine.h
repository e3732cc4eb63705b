/* The batched generation engine: continuous batching over many sequences.
 *
 * Requests are submitted from any thread; one engine thread (or a caller
 * driving g4_engine_step) runs the scheduler. Each step is one forward pass
 * over every running sequence: one decode token per sequence that is
 * generating, plus prefill chunks of newly admitted prompts up to a token
 * budget. Finished or cancelled sequences leave at once and their KV blocks
 * return to the shared pool. Admission reserves every KV block a request can
 * need (prompt + max_tokens), so a running sequence never runs out; when the
 * pool is full, new requests wait in a bounded queue.
 *
 * Prefix cache (runtime/prefix_cache.h, on unless no_prefix_cache): a prompt
 * that starts like an earlier prompt or prompt + reply reuses that KV and
 * prefills only the rest, resuming at a block boundary where a snapshot of
 * the sliding window exists (g4_token_event.n_cached says how much). On the
 * CPU's exact path the results are bit-identical to a cold prefill. */
#ifndef G4_RUNTIME_ENGINE_H
#define G4_RUNTIME_ENGINE_H

#include <stdint.h>

#include "constrain/token_mask.h"
#include "model/assistant.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/text_decoder.h"
#include "runtime/batch.h"
#include "runtime/draft_rule.h"
#include "runtime/sampler.h"

typedef enum {
    G4_FINISH_NONE = 0,  /* more tokens follow */
    G4_FINISH_STOP,      /* a stop token (end of turn / end of sequence) */
    G4_FINISH_LENGTH,    /* max_tokens or the context limit */
    G4_FINISH_CANCELLED, /* g4_engine_cancel or engine shutdown */
    G4_FINISH_ERROR,     /* see the event's message */
} g4_finish_reason;

typedef struct {
    uint64_t request_id;
    int has_token;           /* a newly generated token comes with this event */
    g4_sample sample;        /* the token and its log-probabilities */
    int is_stop_token;       /* the token is one of the stop ids (not content) */
    int n_prompt, n_generated;
    int n_cached;            /* prompt tokens whose KV came from the prefix cache (0: all prefilled) */
    double prompt_seconds;   /* time from admission to the first token */
    int n_drafted, n_accepted; /* speculative decoding: the request's drafts so far, and those kept */
    int n_rounds;              /* its verification passes (mean accepted length: (n_accepted + n_rounds) / n_rounds) */
    g4_finish_reason finish; /* set on the last event of a request */
    const char *message;     /* with G4_FINISH_ERROR */
} g4_token_event;

/* Called on the engine thread for every generated token and once more (or
 * with the last token) when the request finishes. Keep it short. */
typedef void (*g4_token_callback)(void *user, const g4_token_event *ev);

/* Multimodal soft tokens of a request: rows index the prompt; embeds is
 * backend memory [n][hidden] that the engine takes ownership of. */
typedef struct {
    int n;
    int32_t *rows;
    float *embeds;
} g4_request_media;

typedef struct {
    const int32_t *prompt; /* copied */
    int n_prompt;
    g4_request_media media; /* optional; ownership passes to the engine */
    g4_sampler_params sampling;
    int max_tokens;
    const int32_t *stop_ids; /* copied */
    int n_stop;
    g4_token_callback on_token;
    void *user;
    /* Optional: the reply follows this matcher's grammar (tokens outside its
     * mask get -inf before the sampler sees the row; stop ids only where the
     * grammar may end; the reply stops when the grammar is complete and no
     * stop id is allowed). Ownership passes to the engine on success. */
    g4_token_matcher *constraint;
    /* 1: never drafted, even on an engine with a drafter ("speculative": false) */
    int no_speculative;
} g4_request;

typedef struct {
    int max_seqs;         /* sequences decoded together (0: 32) */
    int n_ctx;            /* positions per sequence (0: min(max_position, 4096)) */
    int kv_blocks;        /* full-layer KV blocks in the pool (0: max_seqs * n_ctx / block) */
    int block_size;       /* positions per KV block (0: 16) */
    int max_batch_tokens; /* tokens per forward pass (0: 512) */
    int max_queue;        /* waiting requests before submit refuses (0: 256) */
    int vision_mask;      /* g4_vision_mask (runtime/batch.h) */
    int threads;          /* OpenMP threads of the engine thread (0: the runtime's default) */
    g4_kv_type kv_type;   /* element type of the KV cache (AUTO: F32) */
    int no_prefix_cache;  /* 1: every prompt is prefilled whole (no reuse of cached KV) */
    int cache_snapshots;  /* sliding-window snapshots kept beyond the running sequences' rings
                             (0: 2 x max_seqs; ignored without the prefix cache) */
    int logit_rows;       /* logit rows one forward pass returns (0: max_seqs); g4_engine_eval of
                             G4_LOGITS_ALL needs max_batch_tokens */
    uint64_t cache_ram_bytes; /* the prefix cache's host-RAM tier: KV the pool gives back is kept
                                 there for reuse (0: none) */
    /* Speculative decoding (issue 29): an MTP drafter attached to the model
     * (g4_assistant_attach; the caller's, kept while the engine lives).
     * Each step every decoding sequence that may draft proposes up to
     * draft_max tokens (fewer as its acceptance falls: g4_draft_length),
     * verified in the step's one forward pass beside the other sequences'
     * rows. The drafter runs batched: draft position j of every drafting
     * sequence is one drafter forward of their rows (g4_draft_rounds), so
     * a step costs at most draft_max drafter forwards. Not drafted: constrained requests (token masks), sampled ones
     * that want log-probabilities, no_speculative ones, and every sequence
     * of a step where more than draft_max_batch decode. Greedy replies are
     * the ids of plain decoding; sampled ones keep the sampler's
     * distribution (g4_draft_keep). */
    const g4_assistant *drafter; /* NULL: no drafting */
    int draft_max;               /* drafts a round, 1..G4_DRAFT_MAX (0: 1) */
    float draft_min_p;           /* a round stops drafting at a draft the drafter gives less than this (0: off) */
    int draft_max_batch;         /* draft only while at most this many sequences decode (0: G4_ENGINE_DRAFT_MAX_BATCH,
                                    _CUDA on the CUDA backend) */
    /* benchmarks on random weights: every verification keeps exactly
     * min(draft_forced_accept, drafts) drafts whatever the target says
     * (the tokens are then not the model's); used when draft_force is 1 */
    int draft_force, draft_forced_accept;
} g4_engine_options;

/* The batch above which the engine stops drafting by default: on the CPU
 * the drafted/plain ratio is best at 1-2 decoding sequences and falls from
 * 4 on (plain decoding shares each weight read among the batch, while every
 * drafting sequence adds k verified rows; measured with the drafter still
 * run one sequence after another, before it was batched);
 * bench/RESULTS.md, "Speculative decoding in the engine". On CUDA a step's
 * cost grows little with its rows, and the drafter runs once for all
 * drafting sequences: the H200 measured drafted/plain at 1/4/8/16 streams
 * 1.96/2.07/2.14/1.24x with 3 of 3 drafts kept and 1.48/1.70/1.90/1.03x
 * with 2 of 3 (e2b bf16; bench/RESULTS.md, "Session of 2026-12-02 00:00
 * UTC"): it still pays at 16. */
#define G4_ENGINE_DRAFT_MAX_BATCH 2
#define G4_ENGINE_DRAFT_MAX_BATCH_CUDA 16

typedef struct {
    int running, waiting;
    int kv_blocks_total, kv_blocks_used; /* used: held by sequences (idle cached blocks are free room) */
    int kv_block_size;
    g4_kv_type kv_type;
    uint64_t kv_bytes;                 /* the pool's K and V storage, rings and snapshots included */
    uint64_t kv_full_bytes_per_token;  /* of the full layers */
    uint64_t kv_sliding_bytes_per_token;
    uint64_t steps, tokens_prefilled, tokens_generated;
    /* the prefix cache (all 0 without it) */
    int prefix_cache;                    /* 1 when on */
    uint64_t prefix_hits, prefix_misses; /* admitted requests that reused cached KV / did not */
    uint64_t prefix_tokens_reused;       /* prompt tokens whose KV the cache supplied */
    uint64_t prefix_blocks_evicted, prefix_snapshots_taken, prefix_snapshots_evicted;
    int prefix_cached_blocks, prefix_idle_blocks, prefix_snapshots;
    uint64_t prefix_cached_bytes;
    uint64_t prefix_host_budget, prefix_host_bytes;  /* the host-RAM tier: allowed, held */
    uint64_t prefix_host_blocks_saved, prefix_host_blocks_restored;
    uint64_t prefix_host_windows_saved, prefix_host_windows_restored, prefix_host_evicted;
    /* constrained decoding: rows that took their candidates through a token
     * mask on the backend, the masks uploaded for them (one per grammar
     * state new to the backend's copies), and constrained rows sampled from
     * their full row on the host (logit bias, penalties, suppressed tokens,
     * ties at the candidates' edge) */
    uint64_t masked_rows, mask_uploads, masked_rows_on_host;
    /* seconds spent computing the masks (on the mask thread while a GPU
     * runs the forward pass), and the part the engine thread waited for */
    double mask_seconds, mask_wait_seconds;
    /* seconds the engine thread spent after the forward passes: sampling
     * (from candidates or full rows), masks applied on the host, grammar
     * steps, token callbacks */
    double sample_seconds;
    /* speculative decoding (all 0 without a drafter): verification rounds
     * (decode rows that carried drafts), drafts proposed and kept, by
     * position in their round, and the seconds the drafter took */
    int draft_max;
    uint64_t draft_rounds, drafts_proposed, drafts_accepted;
    uint64_t drafted_at[G4_DRAFT_MAX], accepted_at[G4_DRAFT_MAX];
    double draft_seconds;
    uint64_t draft_forwards; /* drafter forwards: one per draft position of a step, for all its drafting sequences */
} g4_engine_stats;

typedef struct g4_engine g4_engine;

g4_status g4_engine_create(const g4_model *m, const g4_engine_options *opt, g4_engine **out);
/* Cancels everything still queued or running (their callbacks get
 * G4_FINISH_CANCELLED) and frees the engine; stop the thread first. */
void g4_engine_destroy(g4_engine *e);

/* Thread-safe. G4_ERR_LIMIT when the queue is full or the request can never
 * fit (prompt + max_tokens beyond the context), G4_ERR_INVALID_ARGUMENT for
 * bad ids or parameters. On failure the media stays the caller's. */
g4_status g4_engine_submit(g4_engine *e, const g4_request *req, uint64_t *request_id);
/* Thread-safe; the request finishes with G4_FINISH_CANCELLED at the next step. */
void g4_engine_cancel(g4_engine *e, uint64_t request_id);

/* Runs one scheduler step. Returns the number of running + waiting requests
 * after the step (0: idle), or -1 on an engine failure. */
int g4_engine_step(g4_engine *e);

/* A thread that steps while there is work and sleeps otherwise. */
g4_status g4_engine_start(g4_engine *e);
/* Stops the thread after its current step; with `cancel_all` the remaining
 * requests are cancelled, else it waits until they finish. */
void g4_engine_stop(g4_engine *e, int cancel_all);

void g4_engine_get_stats(g4_engine *e, g4_engine_stats *out);

/* Positions per sequence (the context every request must fit in). */
int g4_engine_n_ctx(const g4_engine *e);
/* The batch above which it stops drafting (the option, or its default for the backend). */
int g4_engine_draft_max_batch(const g4_engine *e);

/* ---- Sequences the caller drives (what g4_session wraps) ----
 *
 * Not scheduled: the caller appends tokens and reads back the rows it asks
 * for, through the step's own batch building, forward pass and token
 * choice. Prompts are prefilled in chunks of max_batch_tokens. Only on an
 * engine whose thread is not started and that runs no requests (nothing
 * else steps it at the same time). */

typedef enum {
    G4_LOGITS_NONE = 0,
    G4_LOGITS_LAST, /* logits of the last row only: [1][vocab] */
    G4_LOGITS_ALL,  /* logits of every row: [n][vocab] */
} g4_logits_mode;

/* Soft tokens to place into the evaluated ids: rows are indices into them;
 * embeds is backend memory [n][hidden] (the caller's). */
typedef struct {
    int n;
    const int32_t *rows;
    const float *embeds;
} g4_soft_tokens;

typedef struct {
    g4_logits_mode mode;
    float *logits; /* host [1 or n][vocab] (unused with k > 0) */
    float *hidden; /* optional, with LAST or ALL: the final-normed hidden states of those rows */
    /* k > 0 (with LAST): of the last row only the k (<= G4_TOP_LOGITS_MAX_K)
     * largest logits, value descending (equal values by ascending id), and
     * its log-sum-exp come back */
    int k;
    int32_t *cand_ids;
    float *cand_values;
    double *lse;
    g4_hidden_hook hook;
    void *hook_ctx;
} g4_eval_output;

g4_kv_pool *g4_engine_kv(g4_engine *e);
g4_text_scratch *g4_engine_scratch(g4_engine *e);
/* A new empty sequence (its sliding ring taken from the pool). */
g4_status g4_engine_seq_init(g4_engine *e, g4_kv_seq *seq);
void g4_engine_seq_release(g4_engine *e, g4_kv_seq *seq);

/* Appends ids[0..n) to seq, running them through the model. */
g4_status g4_engine_eval(g4_engine *e, g4_kv_seq *seq, const int32_t *ids, int n, const g4_soft_tokens *soft,
                         const g4_eval_output *out);

/* Evaluates ids and chooses the next token with `sampler` as a step
 * chooses a request's: from the last row's largest logits where they
 * decide, else from the full row (copied into `logits`, host [vocab]; its
 * contents are then unspecified). Under a constraint (matcher not NULL;
 * tokens_left: the reply's budget) tokens outside its mask are never
 * chosen, and *none = 1 (nothing sampled) when the mask allows no token.
 * Neither the sampler nor the matcher accepts the token here. */
g4_status g4_engine_eval_sample(g4_engine *e, g4_kv_seq *seq, const int32_t *ids, int n, const g4_soft_tokens *soft,
                                g4_sampler *sampler, g4_token_matcher *matcher, int tokens_left, float *logits,
                                g4_sample *out, int *none);

/* The full logits of the last row of the last g4_engine_eval (host [vocab]),
 * also after candidates. */
g4_status g4_engine_last_logits(g4_engine *e, float *logits);

#endif
