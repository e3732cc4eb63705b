#include "cli_memory.h"

#include "backend/cuda/cuda_backend.h"
#include "model/kv_cache.h"

static double mib(uint64_t b) { return (double)b / (1 << 20); }
static double gib(uint64_t b) { return (double)b / (1 << 30); }

void cli_print_memory(FILE *f, const g4_model *m, g4_kv_type chosen, int chunk, double fraction) {
    const g4_text_config *tc = &m->config.text;
    int n_full = 0, n_sliding = 0;
    for (int i = 0; i < tc->n_layers; i++)
        if (tc->layers[i].kv_donor < 0) *(tc->layers[i].kind == G4_LAYER_FULL ? &n_full : &n_sliding) += 1;
    const int seqs[2] = {1, 16};
    g4_memory_plan p16;
    g4_memory_plan_make(m, chosen, 16, chunk, 16, &p16);
    const uint64_t budget = g4_memory_budget(&p16, m->backend, fraction);
    fprintf(f, "memory plan  weights %.2f GiB; working memory %.1f MiB (a %d-token chunk, 16 sequences)%s\n",
            gib(p16.weight_bytes), mib(p16.scratch_bytes), p16.chunk,
            p16.reserve_bytes ? "; backend work buffers" : "");
    if (p16.reserve_bytes) fprintf(f, "             (an estimate: %.1f MiB)\n", mib(p16.reserve_bytes));
    for (int t = G4_KV_F32; t <= G4_KV_FP8; t++) {
        g4_memory_plan p[2];
        for (int k = 0; k < 2; k++) g4_memory_plan_make(m, (g4_kv_type)t, 16, chunk, seqs[k], &p[k]);
        fprintf(f, "kv %-4s %s  %llu B/token on %d full layers, %llu B/token on %d sliding layers; rings of %d "
                   "positions: %.2f MiB fixed per sequence\n",
                g4_kv_type_name((g4_kv_type)t), t == (int)chosen ? "*" : " ",
                (unsigned long long)p[0].full_bytes_per_token, n_full, (unsigned long long)p[0].sliding_bytes_per_token,
                n_sliding, p[0].ring_tokens, mib(p[0].ring_bytes));
        if (!budget) {
            fprintf(f, "             (no memory budget known here)\n");
            continue;
        }
        const int c1 = g4_memory_plan_max_ctx(&p[0], budget, 1, tc->max_position);
        const int c16 = g4_memory_plan_max_ctx(&p[1], budget, 16, tc->max_position);
        fprintf(f, "             within %.1f GiB: 1 sequence of up to %d tokens (%.2f GiB of KV), 16 of up to %d "
                   "each (%.2f GiB)\n",
                gib(budget), c1, gib(g4_memory_plan_seq_bytes(&p[0], c1)), c16,
                gib(16 * g4_memory_plan_seq_bytes(&p[1], c16)));
    }
    fprintf(f, "             (model window %d positions; budget: %s)\n", tc->max_position,
            g4_backend_is_cuda(m->backend) ? "--gpu-memory of the device, less other allocations"
                                                  : "memory available now, plus the mapped weights");
}
