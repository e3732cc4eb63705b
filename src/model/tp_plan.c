/* The sharded weight plan of tensor parallelism (tp_plan.h). */
#include "model/tp_plan.h"

#include <stdlib.h>
#include <string.h>

g4_range g4_tp_split(int n, int unit, int ranks, int r) {
    const long long units = n / unit;
    g4_range g = {(int)(units * r / ranks) * unit, (int)(units * (r + 1) / ranks) * unit};
    if (r == ranks - 1) g.end = n; /* (n is a multiple of unit wherever the plan uses it) */
    return g;
}

/* the KV heads that query heads q read when each KV head serves `group` query heads */
static g4_status plan_kv(const g4_layer_config *l, int n_heads, int layer, int n_ranks, g4_tp_layer *t) {
    const int kv = l->n_kv_heads;
    if (kv <= 0 || n_heads % kv)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "layer %d: %d query heads do not share %d KV heads evenly", layer,
                       n_heads, kv);
    const int group = n_heads / kv, per_rank = n_heads / n_ranks;
    /* a rank's query heads must be whole KV groups, or lie inside one */
    if (per_rank % group && group % per_rank)
        return g4_fail(G4_ERR_INVALID_ARGUMENT,
                       "layer %d: %d query heads a rank cut the groups of %d query heads a KV head serves", layer,
                       per_rank, group);
    t->kv_heads.begin = t->q_heads.begin / group;
    t->kv_heads.end = (t->q_heads.end + group - 1) / group;
    t->kv_shared = group > per_rank;
    return G4_OK;
}

g4_status g4_tp_plan(const g4_text_config *c, int n_ranks, int rank, int unit, g4_tp_shard *out) {
    memset(out, 0, sizeof *out);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks || unit < 1)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "tensor parallelism: rank %d of %d ranks, unit %d", rank, n_ranks,
                       unit);
    if (c->n_heads % n_ranks)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d query heads do not split over %d GPUs", c->n_heads, n_ranks);
    if (c->moe && c->n_experts % n_ranks)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%d experts do not split over %d GPUs", c->n_experts, n_ranks);
    out->layers = calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *out->layers);
    if (!out->layers) return g4_fail(G4_ERR_OUT_OF_MEMORY, "tensor parallel plan");
    out->n_ranks = n_ranks;
    out->rank = rank;
    out->unit = unit;
    out->n_layers = c->n_layers;
    out->vocab = g4_tp_split(c->vocab_size, 1, n_ranks, rank);
    if (c->moe) out->experts = g4_tp_split(c->n_experts, 1, n_ranks, rank);
    for (int i = 0; i < c->n_layers; i++) {
        const g4_layer_config *l = &c->layers[i];
        g4_tp_layer *t = &out->layers[i];
        t->q_heads = g4_tp_split(c->n_heads, 1, n_ranks, rank);
        g4_status st = plan_kv(l, c->n_heads, i, n_ranks, t);
        if (st == G4_OK && (l->mlp_width % unit || l->mlp_width / unit < n_ranks))
            st = g4_fail(G4_ERR_INVALID_ARGUMENT, "layer %d: an MLP of %d columns does not split into %d parts of %d-column units",
                         i, l->mlp_width, n_ranks, unit);
        if (st != G4_OK) {
            g4_tp_shard_free(out);
            return st;
        }
        t->mlp = g4_tp_split(l->mlp_width, unit, n_ranks, rank);
    }
    return G4_OK;
}

void g4_tp_shard_free(g4_tp_shard *s) {
    free(s->layers);
    memset(s, 0, sizeof *s);
}
