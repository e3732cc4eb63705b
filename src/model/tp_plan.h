/* Tensor parallelism over the GPUs of one host (issue 33; docs/TENSOR_PARALLEL.md):
 * which part of every weight rank r of n holds, decided once from the config.
 * Plain data, no device code: the loader will upload each rank's slices, the
 * forward pass will run each rank's part and all-reduce (g4_comm), and the
 * test (tests/unit/test_tp_plan.c) checks the plan of every real config
 * without a GPU.
 *
 * Splits: attention by query heads (each rank the KV heads its query heads
 * read; a KV head shared by several ranks when a layer has fewer KV heads
 * than ranks, each computing and storing it), o_proj by the same columns;
 * the MLP by intermediate columns (gate|up rows, down columns) in units of
 * `unit` columns (a quantisation group or a tensor-core tile, so no group is
 * cut); the MoE experts by expert (expert parallelism); embeddings, the
 * per-layer embeddings and the LM head by vocabulary rows. Norms, the router
 * and the residual stream are replicated. */
#ifndef G4_MODEL_TP_PLAN_H
#define G4_MODEL_TP_PLAN_H

#include "base/status.h"
#include "io/config.h"

typedef struct {
    int begin, end; /* [begin, end) */
} g4_range;

typedef struct {
    g4_range q_heads;  /* query heads this rank computes (o_proj columns: these heads' head_dim each) */
    g4_range kv_heads; /* KV heads it computes and stores: those its query heads read */
    int kv_shared;     /* other ranks hold the same KV heads (the layer has fewer KV heads than ranks) */
    g4_range mlp;      /* intermediate columns: gate and up rows, down columns */
} g4_tp_layer;

typedef struct {
    int n_ranks, rank;
    int unit;         /* the MLP's split unit in columns */
    g4_range vocab;   /* embedding, per-layer-embedding and LM head rows */
    g4_range experts; /* MoE experts this rank holds (empty without MoE) */
    g4_tp_layer *layers; /* [n_layers] */
    int n_layers;
} g4_tp_shard;

/* Rank `rank` of `n_ranks`'s shard of the text model c, the MLP split in
 * units of `unit` columns (1 for float weights, the group size for MLX
 * quantised ones). G4_ERR_INVALID_ARGUMENT naming the layer and the count
 * that does not divide (query heads by ranks; KV heads that neither divide
 * among nor are shared evenly by the ranks' query heads; an MLP width not a
 * multiple of the unit, or with fewer units than ranks; experts by ranks). */
g4_status g4_tp_plan(const g4_text_config *c, int n_ranks, int rank, int unit, g4_tp_shard *out);
void g4_tp_shard_free(g4_tp_shard *s);

/* [r * n / ranks, (r + 1) * n / ranks) in units of `unit`: the split every range above uses. */
g4_range g4_tp_split(int n, int unit, int ranks, int r);

#endif
