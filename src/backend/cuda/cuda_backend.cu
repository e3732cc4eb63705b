/* The CUDA backend: device memory, the stream, weight upload, the op table
 * and the probes of machine limits. Kernels live in the sibling files. */
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* environ */

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

extern "C" {
#include "base/log.h"
}

/* ---- errors ---- */

static void record_failure(cuda_ctx *c, const char *msg) {
    if (c->failed != G4_OK) return;
    g4_log(G4_LOG_ERROR, "cuda: %s", msg);
    c->failed = G4_ERR_INTERNAL;
    snprintf(c->failure, sizeof c->failure, "%s", msg);
}

/* The op table's status: the first failure since creation, as an error. */
static g4_status cuda_status_op(g4_backend *be) {
    const cuda_ctx *c = cuda_of(be);
    if (c->failed == G4_OK) return G4_OK;
    return g4_fail(c->failed, "CUDA: %s", c->failure);
}

int cuda_check(cuda_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    char msg[512];
    snprintf(msg, sizeof msg, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    record_failure(c, msg);
    return 0;
}

int cuda_check_blas(cuda_ctx *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    char msg[512];
    snprintf(msg, sizeof msg, "%s failed: cuBLAS status %d", what, (int)s);
    record_failure(c, msg);
    return 0;
}

void cuda_fail_op(cuda_ctx *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    record_failure(c, msg);
}

void *cuda_scratch(cuda_ctx *c, int slot, size_t bytes) {
    if (bytes <= c->scratch_bytes[slot]) return c->scratch[slot];
    if (c->capturing) {
        /* no synchronising while recording: the caller drops this recording
         * and runs eagerly, which grows the buffer */
        c->capture_spoiled = 1;
        return NULL;
    }
    c->generation++;
    /* grow with headroom; the stream may still use the old buffer */
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (c->scratch[slot]) cudaFree(c->scratch[slot]);
    c->scratch[slot] = NULL;
    c->scratch_bytes[slot] = 0;
    size_t want = bytes + bytes / 4 + 256;
    if (!cuda_check(c, cudaMalloc(&c->scratch[slot], want), "cudaMalloc (scratch)")) return NULL;
    c->scratch_bytes[slot] = want;
    return c->scratch[slot];
}

/* ---- memory ---- */

/* One allocation: the backend first (freeing a g4_backend * frees both), and
 * its op table, cuda_ops completed with the defaults. */
typedef struct {
    g4_backend base;
    g4_backend_ops ops;
} cuda_backend;

static void cuda_destroy(g4_backend *be) {
    cuda_ctx *c = cuda_of(be);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cuda_recorder_free(c);
    for (size_t i = 0; i < c->n_uploads; i++) cudaFree(c->uploads[i].dev);
    free(c->uploads);
    for (int i = 0; i < SCRATCH_COUNT; i++)
        if (c->scratch[i]) cudaFree(c->scratch[i]);
    for (int i = 0; i < 2; i++) {
        if (c->pinned[i]) cudaFreeHost(c->pinned[i]);
        if (c->pinned_free[i]) cudaEventDestroy(c->pinned_free[i]);
    }
    if (c->blas_workspace) cudaFree(c->blas_workspace);
    if (c->gemv_counters) cudaFree(c->gemv_counters);
    if (c->blas) c->blas_api->destroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

static void *cuda_alloc(g4_backend *be, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    void *p = NULL;
    /* 256-byte rounding keeps every buffer aligned for 16-byte vector loads */
    if (cudaMalloc(&p, bytes ? (bytes + 255) & ~(size_t)255 : 256) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to report */
        return NULL;
    }
    (void)c;
    return p;
}

static void cuda_release(g4_backend *be, void *ptr) {
    cuda_ctx *c = cuda_of(be);
    if (!ptr) return;
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    cuda_check(c, cudaFree(ptr), "cudaFree");
}

static void cuda_to_device(g4_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    /* from pageable memory the copy is staged before this returns, so the
     * caller may reuse src at once */
    if (bytes) cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "copy to device");
}

static void cuda_to_host(g4_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    if (!bytes) return;
    cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copy to host");
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (c->failed != G4_OK) memset(dst, 0xff, bytes); /* NaN: never pass off garbage as results */
}

static void cuda_copy(g4_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = cuda_of(be);
    if (bytes && dst != src)
        cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "device copy");
}

static void cuda_synchronize(g4_backend *be) {
    cuda_ctx *c = cuda_of(be);
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
}

/* Device memory for weights, owned by the backend until destroy. */
static g4_status weight_alloc(cuda_ctx *c, const void *host, size_t bytes, void **out) {
    *out = NULL;
    if (c->n_uploads == c->cap_uploads) {
        size_t cap = c->cap_uploads ? c->cap_uploads * 2 : 256;
        cuda_upload *grown = (cuda_upload *)realloc(c->uploads, cap * sizeof *grown);
        if (!grown) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        c->uploads = grown;
        c->cap_uploads = cap;
    }
    void *dev = NULL;
    cudaError_t e = cudaMalloc(&dev, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of GPU memory uploading a weight of %zu bytes (%zu of %zu MiB free)",
                       bytes, free_b >> 20, total_b >> 20);
    }
    c->uploads[c->n_uploads].host = host;
    c->uploads[c->n_uploads].dev = dev;
    c->uploads[c->n_uploads].bytes = bytes;
    c->n_uploads++;
    *out = dev;
    return G4_OK;
}

/* Copies host bytes to device memory through two pinned staging buffers,
 * the host copy of one chunk overlapping the DMA of the other. */
static g4_status copy_staged(cuda_ctx *c, void *dev, const void *host, size_t bytes) {
    const unsigned char *src = (const unsigned char *)host;
    for (size_t off = 0, k = 0; off < bytes; off += c->pinned_bytes, k ^= 1) {
        size_t n = bytes - off < c->pinned_bytes ? bytes - off : c->pinned_bytes;
        if (!cuda_check(c, cudaEventSynchronize(c->pinned_free[k]), "cudaEventSynchronize")) break;
        /* parallel copy: one core cannot keep up with the DMA engine */
        unsigned char *stage = (unsigned char *)c->pinned[k];
        const size_t piece = 1u << 20;
#pragma omp parallel for schedule(static) if (n > 4 * piece)
        for (size_t p = 0; p < (n + piece - 1) / piece; p++) {
            size_t len = n - p * piece < piece ? n - p * piece : piece;
            memcpy(stage + p * piece, src + off + p * piece, len);
        }
        if (!cuda_check(c, cudaMemcpyAsync((unsigned char *)dev + off, stage, n, cudaMemcpyHostToDevice, c->stream),
                        "weight upload"))
            break;
        cuda_check(c, cudaEventRecord(c->pinned_free[k], c->stream), "cudaEventRecord");
    }
    if (c->failed != G4_OK) return g4_fail(G4_ERR_INTERNAL, "CUDA failure while uploading weights");
    return G4_OK;
}

static g4_status upload(cuda_ctx *c, const void *host, size_t bytes, void **out) {
    g4_status st = weight_alloc(c, host, bytes, out);
    if (st == G4_OK) st = copy_staged(c, *out, host, bytes);
    return st;
}

static g4_status cuda_prepare_matrix(g4_backend *be, g4_matrix *m) {
    cuda_ctx *c = cuda_of(be);
    if (!m->data) return G4_OK;
    const size_t rows = (size_t)m->rows;
    void *dev = NULL;
    g4_status st = upload(c, m->data, rows * m->row_bytes, &dev);
    if (st != G4_OK) return st;
    m->data = dev;
    if (m->scales) {
        st = upload(c, m->scales, rows * m->scale_row_bytes, &dev);
        if (st != G4_OK) return st;
        m->scales = dev;
    }
    if (m->biases) {
        st = upload(c, m->biases, rows * m->scale_row_bytes, &dev);
        if (st != G4_OK) return st;
        m->biases = dev;
    }
    return G4_OK;
}

/* Same storage layout row for row: format, width, row sizes, parameters. */
static int same_layout(const g4_matrix *a, const g4_matrix *b) {
    return a->format == b->format && a->cols == b->cols && a->row_bytes == b->row_bytes && a->bits == b->bits &&
           a->group_size == b->group_size && a->scale_dtype == b->scale_dtype &&
           a->scale_row_bytes == b->scale_row_bytes && !a->scales == !b->scales && !a->biases == !b->biases;
}

/* Uploads one array of the parts (which: 0 data, 1 scales, 2 biases) into
 * one allocation, each part at the running offset; returns the base. */
static g4_status upload_stacked(cuda_ctx *c, g4_matrix *const *parts, int n, int which, size_t row_bytes,
                                uint8_t **base) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)parts[i]->rows * row_bytes;
    const void *first = which == 0 ? parts[0]->data : which == 1 ? parts[0]->scales : parts[0]->biases;
    void *dev = NULL;
    g4_status st = weight_alloc(c, first, total, &dev);
    size_t off = 0;
    for (int i = 0; st == G4_OK && i < n; i++) {
        const void *host = which == 0 ? parts[i]->data : which == 1 ? parts[i]->scales : parts[i]->biases;
        const size_t bytes = (size_t)parts[i]->rows * row_bytes;
        st = copy_staged(c, (uint8_t *)dev + off, host, bytes);
        off += bytes;
    }
    *base = (uint8_t *)dev;
    return st;
}

static g4_status cuda_prepare_stacked(g4_backend *be, g4_matrix *const *parts, int n, g4_matrix *stacked) {
    cuda_ctx *c = cuda_of(be);
    if (n <= 0 || !parts[0]->data) return g4_fail(G4_ERR_UNSUPPORTED, "nothing to stack");
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (!parts[i]->data || !same_layout(parts[0], parts[i]))
            return g4_fail(G4_ERR_UNSUPPORTED, "matrices of different layouts cannot be stacked");
        /* each part's view starts 16-byte aligned: the fast kernels load
         * 16 bytes at a time (they check, but would fall back to slow ones) */
        if (i + 1 < n && ((size_t)parts[i]->rows * parts[i]->row_bytes % 16 ||
                          (size_t)parts[i]->rows * parts[i]->scale_row_bytes % 16))
            return g4_fail(G4_ERR_UNSUPPORTED, "a stacked part would start unaligned");
        rows += parts[i]->rows;
    }
    g4_matrix s = *parts[0];
    s.rows = rows;
    uint8_t *data = NULL, *scales = NULL, *biases = NULL;
    g4_status st = upload_stacked(c, parts, n, 0, s.row_bytes, &data);
    if (st == G4_OK && s.scales) st = upload_stacked(c, parts, n, 1, s.scale_row_bytes, &scales);
    if (st == G4_OK && s.biases) st = upload_stacked(c, parts, n, 2, s.scale_row_bytes, &biases);
    if (st != G4_OK) return st; /* the allocations are the backend's, freed at destroy */
    s.data = data;
    s.scales = scales;
    s.biases = biases;
    *stacked = s;
    int64_t first = 0;
    for (int i = 0; i < n; i++) {
        const int64_t r = parts[i]->rows;
        *parts[i] = g4_matrix_rows(&s, first, r);
        first += r;
    }
    return G4_OK;
}

/* ---- the op table ---- */

static void cuda_set_precision(g4_backend *be, g4_precision precision) {
    ((cuda_ctx *)be->impl)->prefill_split = precision == G4_PRECISION_EXACT;
}

/* Powers of two from 16: a decode step keeps its key (and its recording)
 * while its sequences grow. */
static int cuda_block_table_width(g4_backend *be, int width) {
    (void)be;
    int w = 16;
    while (w < width) w *= 2;
    return w;
}

/* What CUDA does itself; g4_backend_fill_defaults adds the rest (the layer
 * inputs attention_input and matmul_gate_up, composed of the ops below). */
static const g4_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .set_precision = cuda_set_precision,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .prepare_matrix = cuda_prepare_matrix,
    .prepare_stacked = cuda_prepare_stacked,
    .synchronize = cuda_synchronize,
    .status = cuda_status_op,
    .run_step = cuda_run_step,
    .block_table_width = cuda_block_table_width,
    .matmul = cuda_matmul,
    .matmul_gelu_mul = cuda_matmul_gelu_mul,
    .matmul_gated = cuda_matmul_gated,
    .matmul_precise = cuda_matmul, /* float32 accumulation already; GPU tolerance is bf16-sized */
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .rmsnorm_pair = cuda_rmsnorm_pair,
    .rope = cuda_rope,
    .rmsnorm_rope = cuda_rmsnorm_rope,
    .add_rmsnorm = cuda_add_rmsnorm,
    .add_rmsnorm_moe = cuda_add_rmsnorm_moe,
    .moe_residual = cuda_moe_residual,
    .gelu_mul = cuda_gelu_mul,
    .add = cuda_add,
    .scale = cuda_scale,
    .mul_rows = cuda_mul_rows,
    .mul = cuda_mul,
    .softcap = cuda_softcap,
    .gather_rows = cuda_gather_rows,
    .scatter_rows = cuda_scatter_rows,
    .copy_rows = cuda_copy_rows,
    .top_logits = cuda_top_logits,
    .kv_alloc = cuda_kv_alloc,
    .kv_free = cuda_kv_free,
    .kv_store = cuda_kv_store,
    .kv_read = cuda_kv_read,
    .kv_copy_blocks = cuda_kv_copy_blocks,
    .kv_save_blocks = cuda_kv_save_blocks,
    .kv_load_blocks = cuda_kv_load_blocks,
    .qkv_prepare = cuda_qkv_prepare,
    .attention = cuda_attention,
    .moe_route = cuda_moe_route,
    .moe_experts = cuda_moe_experts,
    .moe_route_experts = cuda_moe_route_experts,
    .affine = cuda_affine,
    .rope_2d = cuda_rope_2d,
    .pool_rows = cuda_pool_rows,
    .scale_rows = cuda_scale_rows,
    .add_rows = cuda_add_rows,
    .clamp = cuda_clamp,
    .relu = cuda_relu,
    .silu = cuda_silu,
    .glu = cuda_glu,
    .layer_norm = cuda_layer_norm,
    .conv2d = cuda_conv2d,
    .depthwise_conv1d_causal = cuda_depthwise_conv1d_causal,
    .chunked_attention = cuda_chunked_attention,
    /* constrained decoding (issue 31) */
    .top_logits_masked = cuda_top_logits_masked,
};

extern "C" g4_status g4_backend_cuda_create(int device, g4_backend **out) {
    return g4_backend_cuda_create_tuned(device, NULL, out);
}

extern "C" g4_status g4_backend_cuda_create_tuned(int device, const char *tune, g4_backend **out) {
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return g4_fail(G4_ERR_UNSUPPORTED, "no CUDA device available (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "no devices found");
    }
    if (device < 0 || device >= count)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist (%d present)", device, count);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return g4_fail(G4_ERR_UNSUPPORTED, "cannot use CUDA device %d", device);
    }
    if (prop.major < 8)
        return g4_fail(G4_ERR_UNSUPPORTED, "CUDA device %d (%s) has compute capability %d.%d; 8.0 or newer needed",
                       device, prop.name, prop.major, prop.minor);
    g4_cuda_caps caps;
    caps.sm_count = prop.multiProcessorCount;
    caps.major = prop.major;
    caps.minor = prop.minor;
    caps.smem_optin = prop.sharedMemPerBlockOptin;
    caps.wgmma = prop.major == 9 && prop.minor == 0 && cuda_wgmma_available();
    /* the measured defaults for this device, then the environment's override, then the caller's */
    g4_cuda_tuning tuning = g4_cuda_tuning_defaults(&caps);
    char tune_error[512];
    if (!g4_cuda_tuning_check_env(environ, tune_error, sizeof tune_error))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s", tune_error);
    if (!g4_cuda_tuning_parse(&tuning, getenv("G4_CUDA_TUNE"), tune_error, sizeof tune_error))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "G4_CUDA_TUNE: %s", tune_error);
    if (!g4_cuda_tuning_parse(&tuning, tune, tune_error, sizeof tune_error))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s", tune_error);
    if (caps.major < 9) tuning.pdl = 0; /* no programmatic dependent launch before Hopper */
    const char *blas_error = "";
    const cuda_blas_api *blas = cuda_blas(&blas_error);
    if (!blas) return g4_fail(G4_ERR_UNSUPPORTED, "CUDA device %d: %s", device, blas_error);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    cuda_backend *box = (cuda_backend *)calloc(1, sizeof *box);
    if (!c || !box) {
        free(c);
        free(box);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    g4_backend *be = &box->base;
    box->ops = cuda_ops;
    g4_backend_fill_defaults(&box->ops);
    be->ops = &box->ops;
    be->impl = c;
    c->device = device;
    c->blas_api = blas;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    c->caps = caps;
    c->tune = tuning;
    c->prefill_split = 1; /* G4_PRECISION_EXACT until set_precision says otherwise */
    c->pinned_bytes = 64u << 20;
    c->blas_workspace_bytes = 32u << 20;
    int ok = cuda_check(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    for (int i = 0; ok && i < 2; i++) {
        ok = cuda_check(c, cudaHostAlloc(&c->pinned[i], c->pinned_bytes, cudaHostAllocDefault), "cudaHostAlloc") &&
             cuda_check(c, cudaEventCreateWithFlags(&c->pinned_free[i], cudaEventDisableTiming), "cudaEventCreate") &&
             cuda_check(c, cudaEventRecord(c->pinned_free[i], c->stream), "cudaEventRecord");
    }
    ok = ok && cuda_check(c, cudaMalloc(&c->blas_workspace, c->blas_workspace_bytes), "cudaMalloc");
    /* zeroed once here (never while a graph is being recorded); each use leaves them zero */
    ok = ok && cuda_check(c, cudaMalloc(&c->gemv_counters, TC_MAX_COUNTERS * sizeof(int)), "cudaMalloc") &&
         cuda_check(c, cudaMemset(c->gemv_counters, 0, TC_MAX_COUNTERS * sizeof(int)), "cudaMemset");
    ok = ok && cuda_check_blas(c, c->blas_api->create(&c->blas), "cublasCreate") &&
         cuda_check_blas(c, c->blas_api->set_stream(c->blas, c->stream), "cublasSetStream") &&
         cuda_check_blas(c, c->blas_api->set_workspace(c->blas, c->blas_workspace, c->blas_workspace_bytes),
                         "cublasSetWorkspace") &&
         /* true float32 for float32 weights: no TF32 */
         cuda_check_blas(c, c->blas_api->set_math_mode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (!ok) {
        cuda_destroy(be);
        return g4_fail(G4_ERR_UNSUPPORTED, "cannot initialise CUDA device %d (%s)", device, prop.name);
    }
    g4_log(G4_LOG_INFO, "cuda: device %d: %s, %d SMs, %.1f GiB", device, prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1u << 30));
    char settings[512];
    g4_cuda_tuning_format(&c->tune, settings, sizeof settings);
    g4_log(G4_LOG_DEBUG, "cuda: tuning %s", settings);
    *out = be;
    return G4_OK;
}

/* ---- beside the op table ---- */

extern "C" int g4_backend_is_cuda(const g4_backend *be) { return be && be->ops->destroy == cuda_destroy; }

extern "C" const char *g4_cuda_device_name(const g4_backend *be) {
    return g4_backend_is_cuda(be) ? ((const cuda_ctx *)be->impl)->name : "";
}

extern "C" g4_status g4_cuda_status(g4_backend *be) {
    if (!g4_backend_is_cuda(be)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "not a CUDA backend");
    cuda_ctx *c = cuda_of(be);
    cuda_check(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    if (c->failed != G4_OK) return g4_fail(c->failed, "a CUDA operation failed earlier: %s", c->failure);
    return G4_OK;
}

extern "C" int g4_cuda_compute_capability(const g4_backend *be) {
    if (!g4_backend_is_cuda(be)) return 0;
    const cuda_ctx *c = (const cuda_ctx *)be->impl;
    return 10 * c->caps.major + c->caps.minor;
}

extern "C" int g4_cuda_has_wgmma(const g4_backend *be) {
    return g4_backend_is_cuda(be) ? ((const cuda_ctx *)be->impl)->caps.wgmma : 0;
}

extern "C" long g4_cuda_graph_launches(const g4_backend *be) {
    return g4_backend_is_cuda(be) ? ((const cuda_ctx *)be->impl)->graph_launches : 0;
}

extern "C" int g4_cuda_memory_info(g4_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!g4_backend_is_cuda(be)) return 0;
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        cudaGetLastError();
        *free_bytes = *total_bytes = 0;
        return 0;
    }
    return 1;
}

extern "C" size_t g4_cuda_memory_used(g4_backend *be) {
    if (!g4_backend_is_cuda(be)) return 0;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b - free_b;
}

static int compare_floats(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_floats);
    return v[n / 2];
}

extern "C" double g4_cuda_probe_bandwidth(g4_backend *be) {
    if (!g4_backend_is_cuda(be)) return 0;
    cuda_ctx *c = cuda_of(be);
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t t0, t1;
    double result = 0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) goto done;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    /* non-zero contents, then warm up */
    cudaMemsetAsync(a, 0x5a, bytes, c->stream);
    for (int i = 0; i < 3; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream);
    {
        float ms[10];
        for (int i = 0; i < 10; i++) {
            cudaEventRecord(t0, c->stream);
            cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, c->stream);
            cudaEventRecord(t1, c->stream);
            cudaEventSynchronize(t1);
            cudaEventElapsedTime(&ms[i], t0, t1);
        }
        float m = median(ms, 10);
        if (cudaGetLastError() == cudaSuccess && m > 0) result = 2.0 * (double)bytes / (m * 1e-3) / 1e9;
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
done:
    cudaGetLastError();
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return result;
}

/* Random bf16 in [-1, 1) from a hash of the index: never zeros (zeros run
 * faster than real data on tensor cores). */
__global__ void fill_random_bf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        p[i] = __float2bfloat16(((float)(x >> 8) / 8388608.0f) - 1.0f);
    }
}

extern "C" double g4_cuda_probe_bf16_tflops(g4_backend *be) {
    if (!g4_backend_is_cuda(be)) return 0;
    cuda_ctx *c = cuda_of(be);
    const int N = 8192;
    const size_t elems = (size_t)N * N;
    __nv_bfloat16 *a = NULL, *b = NULL, *d = NULL;
    cudaEvent_t t0, t1;
    double result = 0;
    const float alpha = 1.0f, beta = 0.0f;
    if (cudaMalloc(&a, elems * 2) != cudaSuccess || cudaMalloc(&b, elems * 2) != cudaSuccess ||
        cudaMalloc(&d, elems * 2) != cudaSuccess)
        goto done;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    fill_random_bf16<<<1024, 256, 0, c->stream>>>(a, elems, 1u);
    fill_random_bf16<<<1024, 256, 0, c->stream>>>(b, elems, 2u);
    {
        float ms[10];
        int ok = 1;
        for (int i = 0; i < 13 && ok; i++) {
            if (i >= 3) cudaEventRecord(t0, c->stream);
            ok = c->blas_api->gemm_ex(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &alpha, a, CUDA_R_16BF, N, b, CUDA_R_16BF,
                              N, &beta, d, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                 CUBLAS_STATUS_SUCCESS;
            if (i >= 3) {
                cudaEventRecord(t1, c->stream);
                cudaEventSynchronize(t1);
                cudaEventElapsedTime(&ms[i - 3], t0, t1);
            }
        }
        if (ok && cudaGetLastError() == cudaSuccess) {
            float m = median(ms, 10);
            if (m > 0) result = 2.0 * N * (double)N * N / (m * 1e-3) / 1e12;
        }
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
done:
    cudaGetLastError();
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (d) cudaFree(d);
    return result;
}
