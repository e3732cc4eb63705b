/* The CUDA backend's run_step: decode steps recorded as CUDA graphs and
 * replayed.
 *
 * A decode step is about a thousand small launches; issuing them one by one
 * costs the host several microseconds each, more than most of the kernels
 * run. Captured once into a graph, the whole step goes to the GPU in one
 * launch. A key's first run issues the ops (it sizes every scratch buffer),
 * its second is captured and launched, later ones launch the capture; the
 * least recently used of CUDA_RECORDED_STEPS recordings makes room for a new
 * key. The stream is captured in thread-local mode (other threads' CUDA calls
 * are unaffected); nothing runs while capturing. Every op chooses its kernels
 * from shapes alone, never from whether it is being captured, so a replay
 * runs what the eager run did (test_cuda_replay). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

enum { CUDA_RECORDED_STEPS = 16 };

typedef struct {
    g4_step_key key;
    int used;       /* this slot holds a key */
    int seen;       /* run once already: every buffer has its size */
    cudaGraphExec_t exec; /* the recording, or NULL */
    unsigned generation;  /* cuda_ctx.generation when recorded */
    unsigned long last_use;
} recorded_step;

struct cuda_recorder {
    recorded_step steps[CUDA_RECORDED_STEPS];
    unsigned long uses;
};

static int capture_begin(cuda_ctx *c) {
    if (c->failed != G4_OK || c->capturing) return 0;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    c->capturing = 1;
    c->capture_spoiled = 0;
    return 1;
}

/* The instantiated capture, or NULL when it failed (nothing ran). */
static cudaGraphExec_t capture_end(cuda_ctx *c) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    c->capturing = 0;
    if (e != cudaSuccess || c->capture_spoiled || !graph) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        return NULL;
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return exec;
}

/* 0, running nothing, when the recording is stale: the backend moved one of
 * its scratch buffers since (record again). */
static int replay(cuda_ctx *c, const recorded_step *r) {
    if (r->generation != c->generation) return 0;
    c->graph_launches++;
    return cuda_check(c, cudaGraphLaunch(r->exec, c->stream), "cudaGraphLaunch");
}

static void drop_recording(cuda_ctx *c, recorded_step *r) {
    if (!r->exec) return;
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    cudaGraphExecDestroy(r->exec);
    r->exec = NULL;
}

static int same_key(const g4_step_key *a, const g4_step_key *b) {
    if (a->owner != b->owner || a->n_tokens != b->n_tokens || a->direct != b->direct) return 0;
    for (int i = 0; i < 6; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    for (int i = 0; i < 4; i++)
        if (a->buffers[i] != b->buffers[i]) return 0;
    return 1;
}

/* The slot of this key, or the least recently used one emptied for it. */
static recorded_step *slot_for(cuda_ctx *c, struct cuda_recorder *rec, const g4_step_key *key) {
    recorded_step *oldest = &rec->steps[0];
    for (int i = 0; i < CUDA_RECORDED_STEPS; i++) {
        recorded_step *r = &rec->steps[i];
        if (r->used && same_key(&r->key, key)) return r;
        if (r->last_use < oldest->last_use) oldest = r;
    }
    drop_recording(c, oldest);
    memset(oldest, 0, sizeof *oldest);
    oldest->key = *key;
    oldest->used = 1;
    return oldest;
}

g4_status cuda_run_step(g4_backend *be, const g4_step_key *key, g4_status (*issue)(void *ctx), void *ctx) {
    cuda_ctx *c = cuda_of(be);
    if (!c->tune.graphs || key->direct || key->n_tokens > G4_CUDA_RECORD_MAX_TOKENS || c->capturing)
        return issue(ctx);
    if (!c->recorder) c->recorder = (struct cuda_recorder *)calloc(1, sizeof *c->recorder);
    if (!c->recorder) return issue(ctx);
    recorded_step *r = slot_for(c, c->recorder, key);
    r->last_use = ++c->recorder->uses;
    if (r->exec) {
        if (replay(c, r)) return G4_OK;
        drop_recording(c, r); /* stale */
    }
    if (r->seen && capture_begin(c)) {
        const unsigned generation = c->generation;
        g4_status st = issue(ctx);
        r->exec = capture_end(c);
        r->generation = generation;
        if (st != G4_OK) {
            drop_recording(c, r);
            return st;
        }
        if (r->exec && replay(c, r)) return G4_OK;
        drop_recording(c, r);
    }
    r->seen = 1;
    return issue(ctx);
}

void cuda_recorder_free(cuda_ctx *c) {
    if (!c->recorder) return;
    for (int i = 0; i < CUDA_RECORDED_STEPS; i++) drop_recording(c, &c->recorder->steps[i]);
    free(c->recorder);
    c->recorder = NULL;
}
