#include "model/weight_loader.h"

#include "model/synth_weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

g4_status g4_loader_init(g4_weight_loader *L, g4_model *m) {
    memset(L, 0, sizeof *L);
    L->model = m;
    L->synthetic = m->synthetic;
    L->record = m->synth_record;
    L->rng = 0x9e3779b97f4a7c15ull;
    if (!m->tensor_used) {
        m->tensor_used = calloc((m->tensors ? g4_st_count(m->tensors) : 0) + 1, 1);
        if (!m->tensor_used) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    return G4_OK;
}

void g4_loader_free(g4_weight_loader *L) {
    free(L->problems);
    memset(L, 0, sizeof *L);
}

void g4_loader_problem(g4_weight_loader *L, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    size_t len = strlen(line);
    if (L->problems_len + len + 4 > L->problems_cap) {
        size_t cap = L->problems_cap ? L->problems_cap * 2 : 4096;
        while (cap < L->problems_len + len + 4) cap *= 2;
        char *grown = realloc(L->problems, cap);
        if (!grown) return;
        L->problems = grown;
        L->problems_cap = cap;
    }
    memcpy(L->problems + L->problems_len, "\n  ", 3);
    memcpy(L->problems + L->problems_len + 3, line, len + 1);
    L->problems_len += len + 3;
    L->n_problems++;
}

const g4_st_tensor *g4_loader_find(g4_weight_loader *L, const char *name) {
    if (L->synthetic) return NULL;
    const g4_st_tensor *t = g4_st_find(L->model->tensors, name);
    if (t) L->model->tensor_used[t - g4_st_at(L->model->tensors, 0)] = 1;
    return t;
}

int g4_loader_has_module(g4_weight_loader *L, const char *module) {
    if (L->synthetic) return 1;
    char name[512];
    snprintf(name, sizeof name, "%s.weight", module);
    if (g4_st_find(L->model->tensors, name)) return 1;
    return g4_st_find(L->model->tensors, module) != NULL;
}

static int is_float_dtype(g4_dtype t) { return t == G4_DTYPE_BF16 || t == G4_DTYPE_F16 || t == G4_DTYPE_F32; }

static void format_shape(const g4_st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static void format_expected(int64_t lead, int64_t rows, int64_t cols, char *buf, size_t n) {
    if (lead > 0)
        snprintf(buf, n, "[%lld, %lld, %lld]", (long long)lead, (long long)rows, (long long)cols);
    else
        snprintf(buf, n, "[%lld, %lld]", (long long)rows, (long long)cols);
}

/* Does t have shape [lead?, rows, cols]? */
static int has_shape(const g4_st_tensor *t, int64_t lead, int64_t rows, int64_t cols) {
    if (lead > 0) return t->ndim == 3 && t->shape[0] == lead && t->shape[1] == rows && t->shape[2] == cols;
    return t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

/* MLX module path of a tensor name: the name without ".weight". */
static void quant_params_for(g4_weight_loader *L, const char *module, const g4_st_tensor *scales,
                             const g4_st_tensor *biases, int64_t cols, const g4_st_tensor *w, g4_quant_params *p) {
    const g4_config *c = &L->model->config;
    *p = g4_config_quant_for(c, module);
    if (p->mode == G4_QUANT_NONE) {
        /* Scales present but the config has no quantization block: infer the
         * format from the tensors themselves. */
        int64_t packed = w->shape[w->ndim - 1], groups = scales->shape[scales->ndim - 1];
        p->mode = (scales->dtype == G4_DTYPE_U8 && !biases) ? G4_QUANT_MXFP4 : G4_QUANT_AFFINE;
        p->bits = cols > 0 ? (int)(packed * 32 / cols) : 0;
        p->group_size = groups > 0 ? (int)(cols / groups) : 0;
    }
}

/* ---- synthetic weights ----------------------------------------------------- */

static void *synthetic_alloc(g4_weight_loader *L, size_t bytes) {
    g4_model *m = L->model;
    if (m->n_host_allocs == m->cap_host_allocs) {
        size_t cap = m->cap_host_allocs ? m->cap_host_allocs * 2 : 256;
        void **grown = realloc(m->host_allocs, cap * sizeof *grown);
        if (!grown) return NULL;
        m->host_allocs = grown;
        m->cap_host_allocs = cap;
    }
    size_t padded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, padded ? padded : 64);
    if (p) m->host_allocs[m->n_host_allocs++] = p;
    return p;
}

/* One synthetic tensor [lead?, rows, cols] stored as `name`: recorded on a dry
 * run (NULL, no problem), else made in memory. */
static void *synthetic_tensor(g4_weight_loader *L, const char *name, g4_dtype dtype, int64_t n_lead, int64_t rows,
                              int64_t cols, g4_synth_fill fill, uint64_t seed, g4_quant_params quant) {
    const int64_t shape3[3] = {n_lead, rows, cols};
    const int lead = n_lead > 0;
    if (L->record) {
        g4_synth_record_add(L->record, name, dtype, 2 + lead, shape3 + !lead, fill, seed, quant);
        return NULL;
    }
    size_t bytes = (size_t)(lead ? n_lead : 1) * (size_t)rows * (size_t)cols * g4_dtype_size(dtype);
    void *p = synthetic_alloc(L, bytes);
    if (!p) {
        g4_loader_problem(L, "out of memory for synthetic %s", name);
        return NULL;
    }
    g4_synth_fill_bytes(fill, seed, 0, p, bytes);
    return p;
}

/* Made-up weights in the format config.json's quantization gives the module,
 * under the names a checkpoint of the model's layout would use. */
static void synthetic_matrix(g4_weight_loader *L, const char *module, int weight_suffix, int64_t n_lead,
                             int64_t rows, int64_t cols, g4_matrix *out) {
    int64_t total = (n_lead > 0 ? n_lead : 1) * rows;
    g4_quant_params p = g4_config_quant_for(&L->model->config, module);
    size_t mlen = strlen(module);
    if (p.mode != G4_QUANT_NONE && mlen >= 11 && !strcmp(module + mlen - 11, "router.proj"))
        p = (g4_quant_params){G4_QUANT_AFFINE, 8, 64}; /* MLX keeps routers at 8 bits */
    if (p.mode != G4_QUANT_NONE && (cols % p.group_size || (cols * p.bits) % 32))
        p.mode = G4_QUANT_NONE; /* MLX leaves such modules unquantised too */
    L->rng = L->rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t seed = L->rng;
    const g4_quant_params none = {G4_QUANT_NONE, 0, 0};
    char wname[512], sname[512], bname[512];
    snprintf(wname, sizeof wname, weight_suffix || p.mode != G4_QUANT_NONE ? "%s.weight" : "%s", module);
    snprintf(sname, sizeof sname, "%s.scales", module);
    snprintf(bname, sizeof bname, "%s.biases", module);
    out->rows = total;
    out->cols = cols;
    if (p.mode == G4_QUANT_NONE) {
        out->format = G4_WEIGHT_BF16;
        out->data = synthetic_tensor(L, wname, G4_DTYPE_BF16, n_lead, rows, cols, G4_SYNTH_WEIGHTS, seed, none);
        out->row_bytes = (size_t)cols * 2;
        return;
    }
    int64_t groups = cols / p.group_size;
    out->data = synthetic_tensor(L, wname, G4_DTYPE_U32, n_lead, rows, cols * p.bits / 32, G4_SYNTH_CODES, seed, p);
    out->row_bytes = (size_t)(cols * p.bits / 8);
    out->bits = p.bits;
    out->group_size = p.group_size;
    if (p.mode == G4_QUANT_MXFP4) {
        out->format = G4_WEIGHT_MXFP4;
        out->scales = synthetic_tensor(L, sname, G4_DTYPE_U8, n_lead, rows, groups, G4_SYNTH_E8M0, seed + 1, none);
        out->scale_dtype = G4_DTYPE_U8;
        out->scale_row_bytes = (size_t)groups;
        return;
    }
    out->format = G4_WEIGHT_AFFINE;
    out->scales = synthetic_tensor(L, sname, G4_DTYPE_BF16, n_lead, rows, groups, G4_SYNTH_SCALES, seed + 1, none);
    out->biases = synthetic_tensor(L, bname, G4_DTYPE_BF16, n_lead, rows, groups, G4_SYNTH_BIASES, seed + 2, none);
    out->scale_dtype = G4_DTYPE_BF16;
    out->scale_row_bytes = (size_t)groups * 2;
}

void g4_loader_matrix(g4_weight_loader *L, const char *module, int weight_suffix, int64_t n_lead, int64_t rows,
                      int64_t cols, g4_matrix *out) {
    memset(out, 0, sizeof *out);
    if (L->synthetic) {
        synthetic_matrix(L, module, weight_suffix, n_lead, rows, cols, out);
        return;
    }
    char wname[512], sname[512], bname[512], expected[96], got[96];
    snprintf(wname, sizeof wname, weight_suffix ? "%s.weight" : "%s", module);
    snprintf(sname, sizeof sname, "%s.scales", module);
    snprintf(bname, sizeof bname, "%s.biases", module);
    format_expected(n_lead, rows, cols, expected, sizeof expected);
    const g4_st_tensor *w = g4_loader_find(L, wname);
    const g4_st_tensor *scales = g4_loader_find(L, sname);
    const g4_st_tensor *biases = g4_loader_find(L, bname);
    if (!w && !scales && !weight_suffix) {
        /* MLX stores expert tensors as modules with .weight */
        snprintf(wname, sizeof wname, "%s.weight", module);
        w = g4_loader_find(L, wname);
    }
    if (!w) {
        g4_loader_problem(L, "missing tensor %s (expected %s)", wname, expected);
        return;
    }
    int64_t total_rows = (n_lead > 0 ? n_lead : 1) * rows;
    out->rows = total_rows;
    out->cols = cols;
    out->data = w->data;
    if (!scales) {
        if (biases) {
            g4_loader_problem(L, "%s has .biases but no .scales", module);
            return;
        }
        if (!is_float_dtype(w->dtype)) {
            g4_loader_problem(L, "tensor %s has dtype %s; expected BF16, F16 or F32 (or a quantised module)", wname,
                              g4_dtype_name(w->dtype));
            return;
        }
        if (!has_shape(w, n_lead, rows, cols)) {
            format_shape(w, got, sizeof got);
            g4_loader_problem(L, "tensor %s has shape %s but the config needs %s", wname, got, expected);
            return;
        }
        out->format = w->dtype == G4_DTYPE_BF16 ? G4_WEIGHT_BF16 : w->dtype == G4_DTYPE_F16 ? G4_WEIGHT_F16 : G4_WEIGHT_F32;
        out->row_bytes = (size_t)cols * g4_dtype_size(w->dtype);
        return;
    }
    /* quantised module */
    g4_quant_params p;
    quant_params_for(L, module, scales, biases, cols, w, &p);
    if (w->dtype != G4_DTYPE_U32 && w->dtype != G4_DTYPE_I32) {
        g4_loader_problem(L, "quantised %s has dtype %s; expected U32 packed codes", wname, g4_dtype_name(w->dtype));
        return;
    }
    if (p.mode == G4_QUANT_NONE) {
        g4_loader_problem(L, "%s has .scales but config.json's quantization marks it unquantised", module);
        return;
    }
    if (p.group_size <= 0 || cols % p.group_size != 0 || (p.bits != 2 && p.bits != 3 && p.bits != 4 &&
                                                          p.bits != 5 && p.bits != 6 && p.bits != 8)) {
        g4_loader_problem(L, "%s: %d-bit group-%d quantisation does not fit %lld columns", module, p.bits, p.group_size,
                          (long long)cols);
        return;
    }
    if (((int64_t)cols * p.bits) % 32 != 0) {
        g4_loader_problem(L, "%s: %lld columns of %d bits do not fill whole uint32 words", module, (long long)cols,
                          p.bits);
        return;
    }
    int64_t packed_cols = cols * p.bits / 32, groups = cols / p.group_size;
    if (!has_shape(w, n_lead, rows, packed_cols)) {
        char want[96];
        format_shape(w, got, sizeof got);
        format_expected(n_lead, rows, packed_cols, want, sizeof want);
        g4_loader_problem(L,
                          "quantised %s has shape %s but %d-bit codes for the config's %s need %s (packed width "
                          "does not match the bits in config.json)",
                          wname, got, p.bits, expected, want);
        return;
    }
    if (!has_shape(scales, n_lead, rows, groups)) {
        char want[96];
        format_shape(scales, got, sizeof got);
        format_expected(n_lead, rows, groups, want, sizeof want);
        g4_loader_problem(L, "%s has shape %s; group size %d needs %s", sname, got, p.group_size, want);
        return;
    }
    out->bits = p.bits;
    out->group_size = p.group_size;
    out->row_bytes = (size_t)packed_cols * 4;
    out->scales = scales->data;
    out->scale_row_bytes = (size_t)groups * g4_dtype_size(scales->dtype);
    out->scale_dtype = scales->dtype;
    if (p.mode == G4_QUANT_MXFP4) {
        if (p.bits != 4 || p.group_size != 32) {
            g4_loader_problem(L, "%s: mxfp4 needs 4 bits and group 32 (config says %d bits, group %d)", module, p.bits,
                              p.group_size);
            return;
        }
        if (scales->dtype != G4_DTYPE_U8) {
            g4_loader_problem(L, "%s has dtype %s; mxfp4 scales are U8 (E8M0)", sname, g4_dtype_name(scales->dtype));
            return;
        }
        if (biases) {
            g4_loader_problem(L, "%s: mxfp4 modules have no .biases", module);
            return;
        }
        out->format = G4_WEIGHT_MXFP4;
        return;
    }
    if (!is_float_dtype(scales->dtype)) {
        g4_loader_problem(L, "%s has dtype %s; affine scales are BF16, F16 or F32", sname, g4_dtype_name(scales->dtype));
        return;
    }
    if (!biases) {
        g4_loader_problem(L, "missing tensor %s (affine quantisation needs biases)", bname);
        return;
    }
    if (biases->dtype != scales->dtype || !has_shape(biases, n_lead, rows, groups)) {
        format_shape(biases, got, sizeof got);
        g4_loader_problem(L, "%s (%s %s) does not match its scales", bname, g4_dtype_name(biases->dtype), got);
        return;
    }
    out->biases = biases->data;
    out->format = G4_WEIGHT_AFFINE;
}

float *g4_model_upload_floats(g4_model *m, const float *host, size_t n) {
    g4_backend *be = m->backend;
    float *dev = be->ops->alloc(be, n * sizeof(float));
    if (!dev) return NULL;
    be->ops->to_device(be, dev, host, n * sizeof(float));
    if (m->n_device_allocs == m->cap_device_allocs) {
        size_t cap = m->cap_device_allocs ? m->cap_device_allocs * 2 : 64;
        void **grown = realloc(m->device_allocs, cap * sizeof *grown);
        if (!grown) {
            be->ops->release(be, dev);
            return NULL;
        }
        m->device_allocs = grown;
        m->cap_device_allocs = cap;
    }
    m->device_allocs[m->n_device_allocs++] = dev;
    return dev;
}

static int read_floats(const g4_st_tensor *t, float *dst, int64_t n) {
    if (!is_float_dtype(t->dtype)) return 0;
    for (int64_t i = 0; i < n; i++) dst[i] = g4_load_as_f32(t->data, t->dtype, (size_t)i);
    return 1;
}

/* Synthetic norms and scalars are ones, stored as bf16 like real ones. */
static void record_ones(g4_weight_loader *L, const char *name, int64_t n) {
    const int64_t shape[1] = {n};
    g4_synth_record_add(L->record, name, G4_DTYPE_BF16, 1, shape, G4_SYNTH_ONES, 0,
                        (g4_quant_params){G4_QUANT_NONE, 0, 0});
}

float *g4_loader_vector(g4_weight_loader *L, const char *name, int64_t n) {
    return g4_loader_vector_scaled(L, name, n, 1.0f);
}

float *g4_loader_vector_scaled(g4_weight_loader *L, const char *name, int64_t n, float factor) {
    const g4_st_tensor *t = NULL;
    if (L->synthetic && L->record) {
        record_ones(L, name, n);
        return NULL;
    }
    if (!L->synthetic) {
        t = g4_loader_find(L, name);
        if (!t) {
            g4_loader_problem(L, "missing tensor %s (expected [%lld])", name, (long long)n);
            return NULL;
        }
        int64_t elements = 1;
        for (int d = 0; d < t->ndim; d++) elements *= t->shape[d];
        int shape_ok = (t->ndim == 1 && t->shape[0] == n) || (n == 1 && elements == 1);
        if (!shape_ok || !is_float_dtype(t->dtype)) {
            char got[96];
            format_shape(t, got, sizeof got);
            g4_loader_problem(L, "tensor %s is %s %s; expected a float vector [%lld]", name, g4_dtype_name(t->dtype),
                              got, (long long)n);
            return NULL;
        }
    }
    float *host = malloc((size_t)n * sizeof *host);
    if (!host) {
        g4_loader_problem(L, "out of memory loading %s", name);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) host[i] = (t ? g4_load_as_f32(t->data, t->dtype, (size_t)i) : 1.0f) * factor;
    float *dev = g4_model_upload_floats(L->model, host, (size_t)n);
    free(host);
    if (!dev) g4_loader_problem(L, "out of backend memory loading %s", name);
    L->model->n_params += (uint64_t)n;
    return dev;
}

float g4_loader_scalar(g4_weight_loader *L, const char *name) {
    if (L->synthetic) {
        if (L->record) record_ones(L, name, 1);
        L->model->n_params += 1;
        return 1.0f;
    }
    const g4_st_tensor *t = g4_loader_find(L, name);
    if (!t) {
        g4_loader_problem(L, "missing tensor %s (expected a scalar)", name);
        return 0.0f;
    }
    int64_t elements = 1;
    for (int d = 0; d < t->ndim; d++) elements *= t->shape[d];
    float v = 0.0f;
    if (elements != 1 || !read_floats(t, &v, 1)) {
        g4_loader_problem(L, "tensor %s must be one float value", name);
        return 0.0f;
    }
    L->model->n_params += 1;
    return v;
}

g4_status g4_loader_finish(g4_weight_loader *L, const char *what) {
    if (L->n_problems == 0) return G4_OK;
    return g4_fail(G4_ERR_FORMAT, "%s: %d problem%s with the checkpoint's tensors:%s", what, L->n_problems,
                   L->n_problems == 1 ? "" : "s", L->problems ? L->problems : "");
}

g4_status g4_loader_prepare_matrix(g4_weight_loader *L, g4_matrix *m) {
    if (!m->data) return G4_OK;
    g4_model *model = L->model;
    model->weight_bytes_by_format[m->format] += g4_matrix_bytes(m);
    model->n_params += (uint64_t)m->rows * (uint64_t)m->cols;
    return model->backend->ops->prepare_matrix(model->backend, m);
}

/* Same storage layout row for row, so that the rows can follow each other. */
static int stackable(const g4_matrix *a, const g4_matrix *b) {
    return a->data && b->data && a->format == b->format && a->cols == b->cols && a->row_bytes == b->row_bytes &&
           a->bits == b->bits && a->group_size == b->group_size && a->scale_dtype == b->scale_dtype &&
           a->scale_row_bytes == b->scale_row_bytes && !a->scales == !b->scales && !a->biases == !b->biases;
}

int g4_loader_prepare_stacked(g4_weight_loader *L, g4_matrix *const *parts, int n, g4_matrix *stacked,
                              g4_status *st) {
    g4_model *model = L->model;
    g4_backend *be = model->backend;
    memset(stacked, 0, sizeof *stacked);
    int ok = n > 1;
    for (int i = 1; ok && i < n; i++) ok = stackable(parts[0], parts[i]);
    if (ok) {
        *st = be->ops->prepare_stacked(be, parts, n, stacked);
        if (*st == G4_OK) {
            for (int i = 0; i < n; i++) {
                model->weight_bytes_by_format[parts[i]->format] += g4_matrix_bytes(parts[i]);
                model->n_params += (uint64_t)parts[i]->rows * (uint64_t)parts[i]->cols;
            }
            return 1;
        }
        if (*st != G4_ERR_UNSUPPORTED) return 0;
        g4_error_clear(); /* kept apart (the backend's choice, or alignment): one by one */
        memset(stacked, 0, sizeof *stacked);
    }
    *st = G4_OK;
    for (int i = 0; *st == G4_OK && i < n; i++) *st = g4_loader_prepare_matrix(L, parts[i]);
    return 0;
}
