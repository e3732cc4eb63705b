#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/strbuf.h"

#define MAX_SERIES 64
#define N_BUCKETS 14

typedef struct {
    double le[N_BUCKETS];
    unsigned long long counts[N_BUCKETS + 1]; /* the last is +Inf */
    double sum;
    unsigned long long n;
} histogram;

typedef struct {
    char endpoint[24];
    int code;
    unsigned long long n;
} series;

struct g4_metrics {
    pthread_mutex_t lock;
    series requests[MAX_SERIES];
    int n_series;
    unsigned long long prompt_tokens, generated_tokens, disconnects;
    histogram ttft, tpot, duration;
};

static void init_histogram(histogram *h, const double *le) { memcpy(h->le, le, sizeof h->le); }

g4_metrics *g4_metrics_create(void) {
    g4_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->lock, NULL);
    static const double ttft[N_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160};
    static const double tpot[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5, 10};
    static const double dur[N_BUCKETS] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300, 600, 1200};
    init_histogram(&m->ttft, ttft);
    init_histogram(&m->tpot, tpot);
    init_histogram(&m->duration, dur);
    return m;
}

void g4_metrics_free(g4_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void g4_metrics_request(g4_metrics *m, const char *endpoint, int status) {
    pthread_mutex_lock(&m->lock);
    int i = 0;
    while (i < m->n_series && (m->requests[i].code != status || strcmp(m->requests[i].endpoint, endpoint) != 0)) i++;
    if (i == m->n_series && m->n_series < MAX_SERIES) {
        snprintf(m->requests[i].endpoint, sizeof m->requests[i].endpoint, "%s", endpoint);
        m->requests[i].code = status;
        m->n_series++;
    }
    if (i < m->n_series) m->requests[i].n++;
    pthread_mutex_unlock(&m->lock);
}

void g4_metrics_tokens(g4_metrics *m, long prompt, long generated) {
    pthread_mutex_lock(&m->lock);
    m->prompt_tokens += (unsigned long long)prompt;
    m->generated_tokens += (unsigned long long)generated;
    pthread_mutex_unlock(&m->lock);
}

static void observe(g4_metrics *m, histogram *h, double v) {
    pthread_mutex_lock(&m->lock);
    int b = 0;
    while (b < N_BUCKETS && v > h->le[b]) b++;
    h->counts[b]++;
    h->sum += v;
    h->n++;
    pthread_mutex_unlock(&m->lock);
}

void g4_metrics_first_token(g4_metrics *m, double s) { observe(m, &m->ttft, s); }
void g4_metrics_token_gap(g4_metrics *m, double s) { observe(m, &m->tpot, s); }
void g4_metrics_duration(g4_metrics *m, double s) { observe(m, &m->duration, s); }

void g4_metrics_disconnect(g4_metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->disconnects++;
    pthread_mutex_unlock(&m->lock);
}

static int out(g4_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int out(g4_strbuf *b, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    return g4_strbuf_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static int render_histogram(g4_strbuf *b, const char *name, const char *help, const histogram *h) {
    int ok = out(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        cum += h->counts[i];
        ok &= out(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], cum);
    }
    cum += h->counts[N_BUCKETS];
    ok &= out(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, cum, name, h->sum, name, h->n);
    return ok;
}

static int counter(g4_strbuf *b, const char *name, const char *help, unsigned long long v) {
    return out(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static int gauge(g4_strbuf *b, const char *name, const char *help, double v) {
    return out(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.9g\n", name, help, name, name, v);
}

/* Speculative decoding (serve --draft): rounds, drafts proposed and kept,
 * by position in their round, and the mean accepted length (tokens a
 * verification pass emits: kept drafts + the target's own). */
static int render_speculative(g4_strbuf *b, const g4_engine_stats *e) {
    int ok = gauge(b, "gemma4_spec_decode_draft_max", "Drafts a round at most (serve --draft-max).", e->draft_max);
    ok &= counter(b, "gemma4_spec_decode_rounds_total", "Decode rows that carried drafts (verification passes).",
                  e->draft_rounds);
    ok &= counter(b, "gemma4_spec_decode_draft_tokens_total", "Draft tokens proposed.", e->drafts_proposed);
    ok &= counter(b, "gemma4_spec_decode_accepted_tokens_total", "Draft tokens kept by verification.",
                  e->drafts_accepted);
    ok &= out(b, "# HELP gemma4_spec_decode_draft_tokens_by_position_total Drafts proposed at each position of a round.\n"
                 "# TYPE gemma4_spec_decode_draft_tokens_by_position_total counter\n");
    for (int i = 0; i < e->draft_max && i < G4_DRAFT_MAX; i++)
        ok &= out(b, "gemma4_spec_decode_draft_tokens_by_position_total{position=\"%d\"} %llu\n", i,
                  (unsigned long long)e->drafted_at[i]);
    ok &= out(b, "# HELP gemma4_spec_decode_accepted_tokens_by_position_total Drafts kept at each position of a round.\n"
                 "# TYPE gemma4_spec_decode_accepted_tokens_by_position_total counter\n");
    for (int i = 0; i < e->draft_max && i < G4_DRAFT_MAX; i++)
        ok &= out(b, "gemma4_spec_decode_accepted_tokens_by_position_total{position=\"%d\"} %llu\n", i,
                  (unsigned long long)e->accepted_at[i]);
    ok &= out(b, "# HELP gemma4_spec_decode_acceptance_rate Kept / proposed drafts at each position of a round.\n"
                 "# TYPE gemma4_spec_decode_acceptance_rate gauge\n");
    for (int i = 0; i < e->draft_max && i < G4_DRAFT_MAX; i++)
        ok &= out(b, "gemma4_spec_decode_acceptance_rate{position=\"%d\"} %.9g\n", i,
                  e->drafted_at[i] ? (double)e->accepted_at[i] / (double)e->drafted_at[i] : 0.0);
    ok &= gauge(b, "gemma4_spec_decode_mean_accepted_length",
                "Tokens a verification pass emits on average: (kept drafts + rounds) / rounds.",
                e->draft_rounds ? (double)(e->drafts_accepted + e->draft_rounds) / (double)e->draft_rounds : 0.0);
    ok &= gauge(b, "gemma4_spec_decode_draft_seconds_total", "Seconds the drafter ran.", e->draft_seconds);
    return ok;
}

char *g4_metrics_render(g4_metrics *m, const g4_engine_stats *e, size_t *len) {
    g4_strbuf b = {0};
    pthread_mutex_lock(&m->lock);
    int ok = out(&b, "# HELP gemma4_requests_total HTTP requests answered, by endpoint and status code.\n"
                     "# TYPE gemma4_requests_total counter\n");
    for (int i = 0; i < m->n_series; i++)
        ok &= out(&b, "gemma4_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n", m->requests[i].endpoint,
                  m->requests[i].code, m->requests[i].n);
    ok &= counter(&b, "gemma4_prompt_tokens_total", "Prompt tokens of generation requests (soft tokens included).",
                  m->prompt_tokens);
    ok &= counter(&b, "gemma4_generation_tokens_total", "Tokens generated.", m->generated_tokens);
    ok &= counter(&b, "gemma4_client_disconnects_total", "Generation requests whose client went away before the end.",
                  m->disconnects);
    ok &= render_histogram(&b, "gemma4_time_to_first_token_seconds",
                           "From the request's arrival to its first generated token.", &m->ttft);
    ok &= render_histogram(&b, "gemma4_time_per_output_token_seconds", "Time between consecutive generated tokens.",
                           &m->tpot);
    ok &= render_histogram(&b, "gemma4_request_duration_seconds", "From arrival to the last token of a generation request.",
                           &m->duration);
    pthread_mutex_unlock(&m->lock);
    if (e) {
        double ratio = e->kv_blocks_total > 0 ? (double)e->kv_blocks_used / e->kv_blocks_total : 0;
        ok &= gauge(&b, "gemma4_requests_running", "Sequences in the running batch.", e->running);
        ok &= gauge(&b, "gemma4_requests_waiting", "Requests queued for admission (KV cache or batch full).", e->waiting);
        ok &= gauge(&b, "gemma4_kv_cache_blocks_used", "KV cache blocks reserved by admitted sequences.", e->kv_blocks_used);
        ok &= gauge(&b, "gemma4_kv_cache_blocks_total", "KV cache blocks in the pool.", e->kv_blocks_total);
        ok &= gauge(&b, "gemma4_kv_cache_usage_ratio", "Fraction of the KV cache pool in use.", ratio);
        ok &= gauge(&b, "gemma4_kv_cache_bytes", "Bytes of the KV cache pool (K and V, full and sliding layers).",
                    (double)e->kv_bytes);
        ok &= gauge(&b, "gemma4_kv_cache_block_size", "Positions per KV cache block.", e->kv_block_size);
        ok &= gauge(&b, "gemma4_kv_cache_full_bytes_per_token",
                    "KV bytes one position takes over the full-attention layers.", (double)e->kv_full_bytes_per_token);
        ok &= gauge(&b, "gemma4_kv_cache_sliding_bytes_per_token",
                    "KV bytes one position takes over the sliding-window layers (within a sequence's ring).",
                    (double)e->kv_sliding_bytes_per_token);
        ok &= gauge(&b, "gemma4_kv_cache_element_bits", "Bits per stored K or V value (32 f32, 16 bf16, 8 fp8).",
                    e->kv_type == G4_KV_BF16 ? 16 : e->kv_type == G4_KV_FP8 ? 8 : 32);
        ok &= counter(&b, "gemma4_engine_steps_total", "Batched forward passes.", e->steps);
        ok &= counter(&b, "gemma4_engine_prefill_tokens_total", "Prompt tokens run through the model.", e->tokens_prefilled);
        ok &= gauge(&b, "gemma4_prefix_cache_enabled", "1 when prompts reuse cached KV (serve --no-prefix-cache: 0).",
                    e->prefix_cache);
        ok &= counter(&b, "gemma4_prefix_cache_hits_total", "Admitted requests that reused cached KV.", e->prefix_hits);
        ok &= counter(&b, "gemma4_prefix_cache_misses_total", "Admitted requests that reused nothing.", e->prefix_misses);
        ok &= counter(&b, "gemma4_prefix_cache_reused_tokens_total", "Prompt tokens whose KV came from the cache.",
                      e->prefix_tokens_reused);
        ok &= counter(&b, "gemma4_prefix_cache_evicted_blocks_total", "Cached KV blocks taken back for new requests.",
                      e->prefix_blocks_evicted);
        ok &= counter(&b, "gemma4_prefix_cache_snapshots_taken_total", "Sliding-window snapshots saved.",
                      e->prefix_snapshots_taken);
        ok &= counter(&b, "gemma4_prefix_cache_snapshots_evicted_total", "Sliding-window snapshots dropped for room.",
                      e->prefix_snapshots_evicted);
        ok &= gauge(&b, "gemma4_prefix_cache_blocks", "Full-attention KV blocks in the cache (held or idle).",
                    e->prefix_cached_blocks);
        ok &= gauge(&b, "gemma4_prefix_cache_idle_blocks", "Cached blocks no request holds (evictable).",
                    e->prefix_idle_blocks);
        ok &= gauge(&b, "gemma4_prefix_cache_snapshots", "Sliding-window snapshots kept.", e->prefix_snapshots);
        ok &= gauge(&b, "gemma4_prefix_cache_bytes", "KV bytes of the cached blocks and snapshots.",
                    (double)e->prefix_cached_bytes);
        ok &= gauge(&b, "gemma4_prefix_cache_host_budget_bytes", "Host RAM the cache may keep KV in (serve --cache-ram).",
                    (double)e->prefix_host_budget);
        ok &= gauge(&b, "gemma4_prefix_cache_host_bytes", "KV bytes kept in host RAM.", (double)e->prefix_host_bytes);
        ok &= counter(&b, "gemma4_prefix_cache_host_saved_blocks_total", "Evicted KV blocks copied to host RAM.",
                      e->prefix_host_blocks_saved);
        ok &= counter(&b, "gemma4_prefix_cache_host_restored_blocks_total", "KV blocks copied back from host RAM.",
                      e->prefix_host_blocks_restored);
        ok &= counter(&b, "gemma4_prefix_cache_host_saved_snapshots_total", "Dropped snapshots copied to host RAM.",
                      e->prefix_host_windows_saved);
        ok &= counter(&b, "gemma4_prefix_cache_host_restored_snapshots_total", "Snapshots copied back from host RAM.",
                      e->prefix_host_windows_restored);
        ok &= counter(&b, "gemma4_prefix_cache_host_evicted_total", "Host RAM entries dropped for room.",
                      e->prefix_host_evicted);
    }
    if (e && e->draft_max > 0) ok &= render_speculative(&b, e);
    if (!ok) {
        g4_strbuf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}
