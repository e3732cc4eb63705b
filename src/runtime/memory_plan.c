#include "runtime/memory_plan.h"

#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "model/kv_cache.h"
#include "model/text_decoder.h"
#include "runtime/prefix_cache.h"

/* bytes of the largest weight matrix as bf16 (what a CUDA prefill GEMM dequantises into) */
static uint64_t largest_matrix_bf16(const g4_model *m) {
    uint64_t best = 0;
    const g4_text_config *tc = &m->config.text;
    for (int i = 0; m->text.layers && i < tc->n_layers; i++) {
        const g4_text_layer *w = &m->text.layers[i];
        const g4_matrix *mats[] = {&w->q, &w->k, &w->v, &w->o, &w->gate, &w->up, &w->down, &w->qkv};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
            const uint64_t b = (uint64_t)mats[k]->rows * (uint64_t)mats[k]->cols * 2;
            if (b > best) best = b;
        }
    }
    return best;
}

void g4_memory_plan_make(const g4_model *m, g4_kv_type type, int block_size, int chunk, int max_seqs,
                         g4_memory_plan *out) {
    memset(out, 0, sizeof *out);
    const g4_text_config *tc = &m->config.text;
    if (type == G4_KV_AUTO) type = G4_KV_F32;
    out->kv_type = type;
    out->block_size = block_size > 0 ? block_size : 16;
    out->chunk = chunk > 0 ? chunk : 512;
    out->max_seqs = max_seqs > 0 ? max_seqs : 1;
    out->full_bytes_per_token = g4_kv_bytes_per_position(m, type, G4_LAYER_FULL);
    out->sliding_bytes_per_token = g4_kv_bytes_per_position(m, type, G4_LAYER_SLIDING);
    out->ring_tokens = g4_kv_ring_blocks(tc->sliding_window, out->chunk, out->block_size) * out->block_size;
    out->ring_bytes = (uint64_t)out->ring_tokens * out->sliding_bytes_per_token;
    out->snapshot_bytes =
        (uint64_t)g4_prefix_snapshot_blocks(m, block_size) * block_size * out->sliding_bytes_per_token;
    for (int f = 0; f < 5; f++) out->weight_bytes += m->weight_bytes_by_format[f];
    out->scratch_bytes = g4_text_scratch_bytes_for(m, out->chunk, out->max_seqs);
    if (m->backend && !strcmp(m->backend->ops->name, "cuda"))
        out->reserve_bytes = largest_matrix_bf16(m) + ((uint64_t)256 << 20);
}

uint64_t g4_memory_plan_seq_bytes(const g4_memory_plan *p, int n_ctx) {
    const uint64_t bs = (uint64_t)p->block_size;
    const uint64_t positions = ((uint64_t)n_ctx + bs - 1) / bs * bs;
    const uint64_t ring = positions < (uint64_t)p->ring_tokens ? positions : (uint64_t)p->ring_tokens;
    return positions * p->full_bytes_per_token + ring * p->sliding_bytes_per_token;
}

static uint64_t fixed_bytes(const g4_memory_plan *p) { return p->weight_bytes + p->scratch_bytes + p->reserve_bytes; }

int64_t g4_memory_plan_full_blocks(const g4_memory_plan *p, uint64_t budget, int n_seqs) {
    if (n_seqs <= 0) n_seqs = 1;
    const uint64_t fixed = fixed_bytes(p) + (uint64_t)n_seqs * p->ring_bytes;
    if (budget <= fixed) return 0;
    const uint64_t block = (uint64_t)p->block_size * p->full_bytes_per_token;
    if (!block) return INT32_MAX; /* no full layer holds a cache */
    const uint64_t blocks = (budget - fixed) / block;
    return blocks > INT32_MAX ? INT32_MAX : (int64_t)blocks;
}

int g4_memory_plan_max_ctx(const g4_memory_plan *p, uint64_t budget, int n_seqs, int max_position) {
    if (n_seqs <= 0) n_seqs = 1;
    /* the largest n (whole blocks) with n_seqs * seq_bytes(n) within what the fixed costs leave */
    const uint64_t fixed = fixed_bytes(p);
    if (budget <= fixed) return 0;
    const uint64_t per_seq = (budget - fixed) / (uint64_t)n_seqs;
    int lo = 0, hi = (max_position + p->block_size - 1) / p->block_size; /* in blocks */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (g4_memory_plan_seq_bytes(p, mid * p->block_size) <= per_seq)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t ctx = (int64_t)lo * p->block_size;
    return (int)(ctx < max_position ? ctx : max_position);
}

uint64_t g4_memory_budget(const g4_memory_plan *p, g4_backend *be, double fraction) {
    size_t free_b = 0, total_b = 0;
    if (g4_cuda_memory_info(be, &free_b, &total_b)) {
        const double used_other = (double)(total_b - free_b) - (double)p->weight_bytes;
        const double budget = (double)total_b * fraction - (used_other > 0 ? used_other : 0);
        return budget > 0 ? (uint64_t)budget : 0;
    }
    const uint64_t avail = g4_memory_available();
    return avail ? (uint64_t)((double)avail * fraction) + p->weight_bytes : 0;
}

g4_status g4_memory_check_kv(const g4_model *m, g4_kv_type type, int block_size, int64_t full_blocks,
                             int64_t sliding_blocks, int n_ctx) {
    if (!m->backend || strcmp(m->backend->ops->name, "cpu")) return G4_OK;
    if (type == G4_KV_AUTO) type = G4_KV_F32;
    const uint64_t need = (uint64_t)full_blocks * block_size * g4_kv_bytes_per_position(m, type, G4_LAYER_FULL) +
                          (uint64_t)sliding_blocks * block_size * g4_kv_bytes_per_position(m, type, G4_LAYER_SLIDING);
    const uint64_t avail = g4_memory_available();
    if (!avail || need <= avail) return G4_OK;
    return g4_fail(G4_ERR_LIMIT,
                   "a %s KV cache for %d positions needs %.2f GiB and %.2f GiB of memory is available; lower the "
                   "context (--ctx) or the sequences, or use --kv-type %s",
                   g4_kv_type_name(type), n_ctx, (double)need / (1 << 30), (double)avail / (1 << 30),
                   type == G4_KV_FP8 ? "fp8 with a shorter context" : "fp8");
}

uint64_t g4_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024;
}
