/* Server metrics in the Prometheus text format (version 0.0.4):
 *   gemma4_requests_total{endpoint, code}          counter
 *   gemma4_prompt_tokens_total, gemma4_generation_tokens_total
 *   gemma4_client_disconnects_total
 *   gemma4_time_to_first_token_seconds              histogram (request arrival -> first token)
 *   gemma4_time_per_output_token_seconds            histogram (between consecutive tokens)
 *   gemma4_request_duration_seconds                 histogram (generation requests)
 *   gemma4_requests_running, gemma4_requests_waiting  gauges (engine)
 *   gemma4_kv_cache_blocks_used / _total, gemma4_kv_cache_usage_ratio
 *   gemma4_engine_steps_total, gemma4_engine_prefill_tokens_total
 *   gemma4_prefix_cache_{hits,misses,reused_tokens,evicted_blocks,snapshots_taken,snapshots_evicted}_total,
 *   gemma4_prefix_cache_{enabled,blocks,idle_blocks,snapshots,bytes}   (the engine's prefix cache)
 * Thread-safe. */
#ifndef G4_SERVER_METRICS_H
#define G4_SERVER_METRICS_H

#include <stddef.h>

#include "runtime/engine.h"

typedef struct g4_metrics g4_metrics;

g4_metrics *g4_metrics_create(void);
void g4_metrics_free(g4_metrics *m);

void g4_metrics_request(g4_metrics *m, const char *endpoint, int status);
void g4_metrics_tokens(g4_metrics *m, long prompt, long generated);
void g4_metrics_first_token(g4_metrics *m, double seconds);
void g4_metrics_token_gap(g4_metrics *m, double seconds);
void g4_metrics_duration(g4_metrics *m, double seconds);
void g4_metrics_disconnect(g4_metrics *m);

/* The exposition text (heap, NUL-terminated) or NULL when out of memory. */
char *g4_metrics_render(g4_metrics *m, const g4_engine_stats *engine, size_t *len);

#endif
