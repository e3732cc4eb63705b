/* Recording op sequences as CUDA graphs and replaying them.
 *
 * A decode step is about a thousand small launches; issuing them one by one
 * costs the host several microseconds each, more than most of the kernels
 * run. Captured once into a graph, the whole step goes to the GPU in one
 * launch. The stream is captured in thread-local mode (other threads' CUDA
 * calls are unaffected); nothing runs while capturing. */
#include <stdlib.h>

#include "backend/cuda/cuda_internal.cuh"

struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned generation; /* cuda_ctx.generation when recorded */
};

int cuda_graph_begin(g4_backend *be) {
    cuda_ctx *c = cuda_of(be);
    if (!c->tune.graphs || c->failed != G4_OK || c->capturing) return 0;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    c->capturing = 1;
    c->capture_spoiled = 0;
    return 1;
}

void *cuda_graph_end(g4_backend *be) {
    cuda_ctx *c = cuda_of(be);
    if (!c->capturing) return NULL;
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
    cuda_graph *g = e == cudaSuccess ? (cuda_graph *)malloc(sizeof *g) : NULL;
    if (!g) {
        cudaGetLastError();
        if (exec) cudaGraphExecDestroy(exec);
        return NULL;
    }
    g->exec = exec;
    g->generation = c->generation;
    return g;
}

int cuda_graph_launch(g4_backend *be, void *graph) {
    cuda_ctx *c = cuda_of(be);
    cuda_graph *g = (cuda_graph *)graph;
    if (!g || g->generation != c->generation || c->capturing) return 0;
    c->graph_launches++;
    return cuda_check(c, cudaGraphLaunch(g->exec, c->stream), "cudaGraphLaunch");
}

void cuda_graph_free(g4_backend *be, void *graph) {
    cuda_ctx *c = cuda_of(be);
    cuda_graph *g = (cuda_graph *)graph;
    if (!g) return;
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    cudaGraphExecDestroy(g->exec);
    free(g);
}
