/* Weights into the L2 cache ahead of the product that reads them.
 *
 * A decode step alternates bandwidth-bound GEMVs with latency-bound kernels
 * (norms, attention, the per-token glue) during which device memory is
 * idle. The decoder names the matrix that comes next; a small kernel on a
 * side stream asks the L2 for its bytes (one bulk prefetch per piece, no
 * registers or shared memory), so the GEMV then streams from L2. Nothing
 * waits for it and no value changes: it is only a hint. Inside a recorded
 * graph the side stream forks from the main one here and joins it again in
 * cuda_graph_end (cuda_prefetch_join). G4_CUDA_PREFETCH=0 turns it off. */
#include "backend/cuda/cuda_internal.cuh"

#define PREFETCH_PIECE 65536 /* bytes per thread's bulk prefetch */
#define PREFETCH_THREADS 64

struct prefetch_ranges {
    const char *p[3];
    size_t bytes[3];
};

__global__ void l2_prefetch_kernel(prefetch_ranges r) {
    const size_t piece = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t off = piece * PREFETCH_PIECE;
    for (int k = 0; k < 3; k++) {
        /* piece numbers run through the three ranges one after the other */
        const size_t n_pieces = (r.bytes[k] + PREFETCH_PIECE - 1) / PREFETCH_PIECE;
        if (off < n_pieces * PREFETCH_PIECE) {
            const size_t left = r.bytes[k] - off;
            const unsigned n = (unsigned)(left < PREFETCH_PIECE ? left : PREFETCH_PIECE);
            const char *a = r.p[k] + off;
#if __CUDA_ARCH__ >= 900
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
#else
            for (unsigned i = 0; i < n; i += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(a + i));
#endif
            return;
        }
        off -= n_pieces * PREFETCH_PIECE;
    }
}

/* [p, p + bytes) shrunk to 16-byte boundaries (the bulk prefetch's unit),
 * at most `cap` bytes from its start */
static void add_range(prefetch_ranges *r, int k, const void *p, size_t bytes, size_t cap) {
    r->p[k] = NULL;
    r->bytes[k] = 0;
    if (!p || !bytes) return;
    const uintptr_t a = (uintptr_t)p, lo = (a + 15) & ~(uintptr_t)15, hi = (a + bytes) & ~(uintptr_t)15;
    if (hi <= lo) return;
    r->p[k] = (const char *)lo;
    r->bytes[k] = (size_t)(hi - lo) < cap ? (size_t)(hi - lo) : cap;
}

void cuda_prefetch(g4_backend *be, const g4_matrix *w) {
    cuda_ctx *c = cuda_of(be);
    if (!c->prefetch || !w || !w->data || c->failed != G4_OK) return;
    /* what fits beside the data in use: a quarter of the L2 per matrix,
     * its leading rows (the GEMV's first blocks read them first) */
    const size_t total = g4_matrix_bytes(w), cap = c->l2_bytes / 4;
    if (!cap) return;
    const double share = total > cap ? (double)cap / (double)total : 1.0;
    const size_t data = (size_t)w->rows * w->row_bytes, sc = w->scales ? (size_t)w->rows * w->scale_row_bytes : 0;
    prefetch_ranges r;
    add_range(&r, 0, w->data, data, (size_t)(share * (double)data));
    add_range(&r, 1, w->scales, sc, (size_t)(share * (double)sc));
    add_range(&r, 2, w->biases, w->biases ? sc : 0, (size_t)(share * (double)sc));
    size_t pieces = 0;
    for (int k = 0; k < 3; k++) pieces += (r.bytes[k] + PREFETCH_PIECE - 1) / PREFETCH_PIECE;
    if (!pieces) return;
    /* the side stream starts after the work queued so far */
    if (!cuda_check(c, cudaEventRecord(c->prefetch_fork, c->stream), "cudaEventRecord") ||
        !cuda_check(c, cudaStreamWaitEvent(c->side_stream, c->prefetch_fork, 0), "cudaStreamWaitEvent"))
        return;
    const unsigned blocks = (unsigned)((pieces + PREFETCH_THREADS - 1) / PREFETCH_THREADS);
    l2_prefetch_kernel<<<blocks, PREFETCH_THREADS, 0, c->side_stream>>>(r);
    /* only a recording must join the side stream back (outside one,
     * nothing needs to wait for a hint) */
    if (cuda_launched(c, "l2_prefetch") && c->capturing) c->prefetch_pending = 1;
}

void cuda_prefetch_join(cuda_ctx *c) {
    if (!c->prefetch_pending) return;
    c->prefetch_pending = 0;
    cuda_check(c, cudaEventRecord(c->prefetch_join, c->side_stream), "cudaEventRecord");
    cuda_check(c, cudaStreamWaitEvent(c->stream, c->prefetch_join, 0), "cudaStreamWaitEvent");
}
