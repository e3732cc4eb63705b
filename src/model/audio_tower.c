#include "model/audio_tower.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/weight_loader.h"

/* The feature extractor's mel bins; the subsampling's flatten width
 * (transformers: subsampling_conv_channels[0] // 4 * channels[1]) assumes it. */
#define AUDIO_N_MEL 128
#define SUBSAMPLE_KERNEL 3
#define SUBSAMPLE_STRIDE 2
#define SUBSAMPLE_PAD 1

int g4_audio_subsampled_frames(int n_frames) {
    int t = n_frames;
    for (int i = 0; i < 2; i++) t = t > 0 ? (t - 1) / 2 + 1 : 0;
    return t;
}

/* ---- loading --------------------------------------------------------------- */

typedef struct {
    g4_weight_loader *L;
    const char *prefix; /* "model.audio_tower." or "audio_tower." */
    char name[512];
} audio_names;

static const char *aname(audio_names *n, const char *fmt, int layer, const char *suffix) {
    char mid[256];
    snprintf(mid, sizeof mid, fmt, layer);
    snprintf(n->name, sizeof n->name, "%s%s%s", n->prefix, mid, suffix ? suffix : "");
    return n->name;
}

static int is_float_dtype(g4_dtype t) { return t == G4_DTYPE_BF16 || t == G4_DTYPE_F16 || t == G4_DTYPE_F32; }

/* A float tensor of exactly `ndim` dims `shape` read into host floats; records a problem otherwise. */
static const g4_st_tensor *find_float_tensor(g4_weight_loader *L, const char *name, int ndim, const int64_t *shape,
                                             const char *expected) {
    const g4_st_tensor *t = g4_loader_find(L, name);
    if (!t) {
        g4_loader_problem(L, "missing tensor %s (expected %s)", name, expected);
        return NULL;
    }
    int ok = is_float_dtype(t->dtype) && t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == shape[d];
    if (!ok) {
        char got[96];
        size_t k = (size_t)snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->ndim && k < sizeof got; d++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (k < sizeof got) snprintf(got + k, sizeof got - k, "]");
        g4_loader_problem(L, "tensor %s is %s %s; expected a float tensor %s", name, g4_dtype_name(t->dtype), got,
                          expected);
        return NULL;
    }
    return t;
}

static int same_shape(const g4_st_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

/* Conv2d weight as float32 [c_out][k][k][c_in]. transformers stores OIHW
 * [c_out, c_in, k, k]; MLX conversions store channels last [c_out, k, k, c_in].
 * The shape tells them apart; only when c_in == k are both readings possible,
 * and then the checkpoint's layout decides. */
static float *load_conv2d(g4_weight_loader *L, const char *name, int c_out, int c_in, int k) {
    const int64_t oihw[4] = {c_out, c_in, k, k}, ohwi[4] = {c_out, k, k, c_in};
    const g4_st_tensor *t = g4_loader_find(L, name);
    char expected[128];
    snprintf(expected, sizeof expected, "[%d, %d, %d, %d] (HF) or [%d, %d, %d, %d] (MLX)", c_out, c_in, k, k, c_out, k,
             k, c_in);
    if (!t) {
        g4_loader_problem(L, "missing tensor %s (expected %s)", name, expected);
        return NULL;
    }
    int hf = same_shape(t, 4, oihw), mlx = same_shape(t, 4, ohwi);
    if (hf && mlx) hf = L->model->layout == G4_LAYOUT_HF;
    if (!(hf || mlx) || !is_float_dtype(t->dtype)) {
        find_float_tensor(L, name, 4, oihw, expected); /* records the problem */
        return NULL;
    }
    size_t n = (size_t)c_out * c_in * k * k;
    float *host = malloc(n * sizeof *host);
    if (!host) {
        g4_loader_problem(L, "out of memory loading %s", name);
        return NULL;
    }
    for (int o = 0; o < c_out; o++)
        for (int a = 0; a < k; a++)
            for (int b = 0; b < k; b++)
                for (int c = 0; c < c_in; c++) {
                    size_t src = hf ? (((size_t)o * c_in + c) * k + a) * k + b : (((size_t)o * k + a) * k + b) * c_in + c;
                    host[(((size_t)o * k + a) * k + b) * c_in + c] = g4_load_as_f32(t->data, t->dtype, src);
                }
    float *dev = g4_model_upload_floats(L->model, host, n);
    free(host);
    if (!dev) g4_loader_problem(L, "out of backend memory loading %s", name);
    L->model->n_params += (uint64_t)n;
    return dev;
}

/* Depthwise Conv1d weight [C][K]: transformers [C, 1, K], MLX [C, K, 1]
 * (the same memory order). */
static float *load_depthwise(g4_weight_loader *L, const char *name, int C, int K) {
    const int64_t hf[3] = {C, 1, K}, mlx[3] = {C, K, 1};
    const g4_st_tensor *t = g4_loader_find(L, name);
    char expected[96];
    snprintf(expected, sizeof expected, "[%d, 1, %d] (HF) or [%d, %d, 1] (MLX)", C, K, C, K);
    if (!t) {
        g4_loader_problem(L, "missing tensor %s (expected %s)", name, expected);
        return NULL;
    }
    if (!(same_shape(t, 3, hf) || same_shape(t, 3, mlx)) || !is_float_dtype(t->dtype)) {
        find_float_tensor(L, name, 3, hf, expected);
        return NULL;
    }
    size_t n = (size_t)C * K;
    float *host = malloc(n * sizeof *host);
    if (!host) {
        g4_loader_problem(L, "out of memory loading %s", name);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) host[i] = g4_load_as_f32(t->data, t->dtype, i);
    float *dev = g4_model_upload_floats(L->model, host, n);
    free(host);
    if (!dev) g4_loader_problem(L, "out of backend memory loading %s", name);
    L->model->n_params += (uint64_t)n;
    return dev;
}

/* <module>.linear.weight plus, with clipped linears, its four clip scalars. */
static void load_clipped(g4_weight_loader *L, const char *module, int clipped, int64_t rows, int64_t cols,
                         g4_clipped_linear *out) {
    char name[512];
    snprintf(name, sizeof name, "%s.linear", module);
    g4_loader_matrix(L, name, 1, 0, rows, cols, &out->w);
    out->in_min = out->out_min = -INFINITY;
    out->in_max = out->out_max = INFINITY;
    if (!clipped) return;
    const char *bounds[4] = {"input_min", "input_max", "output_min", "output_max"};
    float *dst[4] = {&out->in_min, &out->in_max, &out->out_min, &out->out_max};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s.%s", module, bounds[i]);
        *dst[i] = g4_loader_scalar(L, name);
    }
}

static void load_ffn(audio_names *n, int i, const char *which, g4_audio_ffn *f, const g4_audio_weights *aw,
                     int clipped) {
    g4_weight_loader *L = n->L;
    char fmt[64];
    snprintf(fmt, sizeof fmt, "layers.%%d.%s.", which);
    f->pre_norm = g4_loader_vector(L, aname(n, fmt, i, "pre_layer_norm.weight"), aw->hidden);
    f->post_norm = g4_loader_vector(L, aname(n, fmt, i, "post_layer_norm.weight"), aw->hidden);
    load_clipped(L, aname(n, fmt, i, "ffw_layer_1"), clipped, aw->ffn_width, aw->hidden, &f->up);
    load_clipped(L, aname(n, fmt, i, "ffw_layer_2"), clipped, aw->hidden, aw->ffn_width, &f->down);
}

/* softplus(per_dim_scale) * head_dim^-0.5 / ln 2, repeated for every head. */
static float *load_query_scale(audio_names *n, int i, const g4_audio_weights *aw) {
    g4_weight_loader *L = n->L;
    const int64_t shape[1] = {aw->head_dim};
    char expected[32];
    snprintf(expected, sizeof expected, "[%d]", aw->head_dim);
    const g4_st_tensor *t = find_float_tensor(L, aname(n, "layers.%d.self_attn.per_dim_scale", i, NULL), 1, shape,
                                              expected);
    if (!t) return NULL;
    float *host = malloc((size_t)aw->hidden * sizeof *host);
    if (!host) {
        g4_loader_problem(L, "out of memory loading %s", n->name);
        return NULL;
    }
    /* transformers multiplies by the float32 constant, then by softplus */
    const float q_scale = (float)(pow((double)aw->head_dim, -0.5) / log(2.0));
    for (int d = 0; d < aw->head_dim; d++) {
        double x = g4_load_as_f32(t->data, t->dtype, (size_t)d);
        float sp = (float)(x > 20.0 ? x : log1p(exp(x))); /* torch softplus, threshold 20 */
        for (int h = 0; h < aw->n_heads; h++) host[h * aw->head_dim + d] = q_scale * sp;
    }
    float *dev = g4_model_upload_floats(L->model, host, (size_t)aw->hidden);
    free(host);
    L->model->n_params += (uint64_t)aw->head_dim;
    return dev;
}

static void load_layer(audio_names *n, int i, g4_audio_layer *w, const g4_audio_weights *aw, int clipped) {
    g4_weight_loader *L = n->L;
    const int h = aw->hidden;
    load_ffn(n, i, "feed_forward1", &w->ffn1, aw, clipped);
    load_ffn(n, i, "feed_forward2", &w->ffn2, aw, clipped);
    w->norm_pre_attn = g4_loader_vector(L, aname(n, "layers.%d.norm_pre_attn.weight", i, NULL), h);
    w->norm_post_attn = g4_loader_vector(L, aname(n, "layers.%d.norm_post_attn.weight", i, NULL), h);
    w->norm_out = g4_loader_vector(L, aname(n, "layers.%d.norm_out.weight", i, NULL), h);
    load_clipped(L, aname(n, "layers.%d.self_attn.q_proj", i, NULL), clipped, h, h, &w->q);
    load_clipped(L, aname(n, "layers.%d.self_attn.k_proj", i, NULL), clipped, h, h, &w->k);
    load_clipped(L, aname(n, "layers.%d.self_attn.v_proj", i, NULL), clipped, h, h, &w->v);
    load_clipped(L, aname(n, "layers.%d.self_attn.post", i, NULL), clipped, h, h, &w->post);
    g4_loader_matrix(L, aname(n, "layers.%d.self_attn.relative_k_proj", i, NULL), 1, 0, h, h, &w->rel_k);
    w->q_scale = load_query_scale(n, i, aw);
    w->lconv_norm = g4_loader_vector(L, aname(n, "layers.%d.lconv1d.pre_layer_norm.weight", i, NULL), h);
    w->conv_norm = g4_loader_vector(L, aname(n, "layers.%d.lconv1d.conv_norm.weight", i, NULL), h);
    load_clipped(L, aname(n, "layers.%d.lconv1d.linear_start", i, NULL), clipped, 2 * h, h, &w->lin_start);
    load_clipped(L, aname(n, "layers.%d.lconv1d.linear_end", i, NULL), clipped, h, h, &w->lin_end);
    w->dw_conv = load_depthwise(L, aname(n, "layers.%d.lconv1d.depthwise_conv1d.weight", i, NULL), h,
                                aw->conv_kernel);
}

/* transformers' Gemma4AudioRelPositionalEncoding: rows at positions
 * n_rel-1 .. 0, [sin(p * inv_ts), cos(p * inv_ts)], computed in float32. */
static float *relative_position_table(g4_model *m, int n_rel, int hidden) {
    const int half = hidden / 2;
    const float increment = (float)(log(10000.0) / (half - 1 > 1 ? half - 1 : 1));
    float *host = malloc((size_t)n_rel * hidden * sizeof *host);
    if (!host) return NULL;
    for (int r = 0; r < n_rel; r++) {
        const float pos = (float)(n_rel - 1 - r);
        for (int i = 0; i < half; i++) {
            float inv_ts = expf((float)i * -increment);
            float angle = pos * inv_ts;
            host[(size_t)r * hidden + i] = (float)sin((double)angle);
            host[(size_t)r * hidden + half + i] = (float)cos((double)angle);
        }
    }
    float *dev = g4_model_upload_floats(m, host, (size_t)n_rel * hidden);
    free(host);
    return dev;
}

static g4_status check_config(const g4_audio_config *ac) {
    if (ac->hidden_size <= 0 || ac->n_heads <= 0 || ac->hidden_size % ac->n_heads || ac->hidden_size % 2)
        return g4_fail(G4_ERR_FORMAT, "audio_config: hidden_size %d does not split into %d heads", ac->hidden_size,
                       ac->n_heads);
    if (ac->n_layers < 0 || ac->conv_channels[0] <= 0 || ac->conv_channels[1] <= 0 || ac->conv_kernel <= 0 ||
        ac->output_proj_dims <= 0)
        return g4_fail(G4_ERR_FORMAT, "audio_config: non-positive sizes");
    if (ac->chunk_size <= 0 || ac->context_left < 2 || ac->context_right < 0)
        return g4_fail(G4_ERR_FORMAT,
                       "audio_config: attention_chunk_size %d / attention_context_left %d / right %d unsupported",
                       ac->chunk_size, ac->context_left, ac->context_right);
    /* our relative term equals transformers' _rel_shift only while the
     * position table fits beside the past and future context */
    const int past = ac->context_left - 1, future = ac->context_right;
    const int n_rel = (ac->chunk_size + past + future) / 2 + 1;
    if (n_rel > past + future + 2)
        return g4_fail(G4_ERR_UNSUPPORTED,
                       "audio_config: chunk %d with context %d/%d makes transformers' relative shift wrap rows; "
                       "not supported",
                       ac->chunk_size, ac->context_left, ac->context_right);
    return G4_OK;
}

static void prepare_all(g4_weight_loader *L, g4_audio_weights *aw, int n_layers, g4_status *st) {
    g4_matrix *top[] = {&aw->input_proj, &aw->output_proj, &aw->embed_proj};
    for (size_t k = 0; k < 3 && *st == G4_OK; k++) *st = g4_loader_prepare_matrix(L, top[k]);
    for (int i = 0; i < n_layers && *st == G4_OK; i++) {
        g4_audio_layer *w = &aw->layers[i];
        g4_matrix *mats[] = {&w->ffn1.up.w, &w->ffn1.down.w, &w->ffn2.up.w, &w->ffn2.down.w, &w->q.w,
                             &w->k.w,       &w->v.w,         &w->post.w,    &w->rel_k,       &w->lin_start.w,
                             &w->lin_end.w};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0] && *st == G4_OK; k++)
            *st = g4_loader_prepare_matrix(L, mats[k]);
    }
}

g4_status g4_audio_tower_load(g4_model *m) {
    const g4_audio_config *ac = &m->config.audio;
    g4_status st = check_config(ac);
    if (st != G4_OK) return st;
    g4_audio_weights *aw = calloc(1, sizeof *aw);
    if (!aw) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    aw->layers = calloc((size_t)(ac->n_layers > 0 ? ac->n_layers : 1), sizeof *aw->layers);
    m->audio = aw;
    if (!aw->layers) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    aw->n_mel = AUDIO_N_MEL;
    aw->hidden = ac->hidden_size;
    aw->n_heads = ac->n_heads;
    aw->head_dim = ac->hidden_size / ac->n_heads;
    aw->ffn_width = 4 * ac->hidden_size;
    aw->conv_kernel = ac->conv_kernel;
    aw->out_dims = ac->output_proj_dims;
    aw->n_rel = (ac->chunk_size + ac->context_left - 1 + ac->context_right) / 2 + 1;

    /* the loader counts into the model's totals, which describe the text
     * decoder: keep the tower's own counts apart */
    const uint64_t text_params = m->n_params;
    uint64_t text_bytes[5];
    memcpy(text_bytes, m->weight_bytes_by_format, sizeof text_bytes);
    g4_weight_loader L;
    st = g4_loader_init(&L, m);
    if (st != G4_OK) return st;
    /* HF: model.audio_tower.* / model.embed_audio.*; mlx-vlm strips "model." */
    int hf_names = g4_st_find(m->tensors, "model.audio_tower.subsample_conv_projection.layer0.conv.weight") != NULL ||
                   g4_st_find(m->tensors, "audio_tower.subsample_conv_projection.layer0.conv.weight") == NULL;
    audio_names n = {.L = &L, .prefix = hf_names ? "model.audio_tower." : "audio_tower."};
    const int c0 = ac->conv_channels[0], c1 = ac->conv_channels[1];
    const int freq = g4_audio_subsampled_frames(AUDIO_N_MEL);
    const int clipped = ac->clipped_linears;

    aw->conv0 = load_conv2d(&L, aname(&n, "subsample_conv_projection.layer0.conv.weight", 0, NULL), c0, 1,
                            SUBSAMPLE_KERNEL);
    aw->norm0 = g4_loader_vector(&L, aname(&n, "subsample_conv_projection.layer0.norm.weight", 0, NULL), c0);
    aw->conv1 = load_conv2d(&L, aname(&n, "subsample_conv_projection.layer1.conv.weight", 0, NULL), c1, c0,
                            SUBSAMPLE_KERNEL);
    aw->norm1 = g4_loader_vector(&L, aname(&n, "subsample_conv_projection.layer1.norm.weight", 0, NULL), c1);
    g4_loader_matrix(&L, aname(&n, "subsample_conv_projection.input_proj_linear", 0, NULL), 1, 0, aw->hidden,
                     (int64_t)freq * c1, &aw->input_proj);
    for (int i = 0; i < ac->n_layers; i++) load_layer(&n, i, &aw->layers[i], aw, clipped);
    g4_loader_matrix(&L, aname(&n, "output_proj", 0, NULL), 1, 0, aw->out_dims, aw->hidden, &aw->output_proj);
    aw->output_bias = g4_loader_vector(&L, aname(&n, "output_proj.bias", 0, NULL), aw->out_dims);
    g4_loader_matrix(&L, hf_names ? "model.embed_audio.embedding_projection" : "embed_audio.embedding_projection", 1,
                     0, m->config.text.hidden_size, aw->out_dims, &aw->embed_proj);
    aw->rel_pos = relative_position_table(m, aw->n_rel, aw->hidden);
    if (!aw->rel_pos) g4_loader_problem(&L, "out of memory for the audio position table");

    char what[600];
    snprintf(what, sizeof what, "%s (audio tower)", m->path);
    st = g4_loader_finish(&L, what);
    if (st == G4_OK) prepare_all(&L, aw, ac->n_layers, &st);
    g4_loader_free(&L);
    aw->n_params = m->n_params - text_params;
    for (int f = 0; f < 5; f++) aw->weight_bytes += m->weight_bytes_by_format[f] - text_bytes[f];
    m->n_params = text_params;
    memcpy(m->weight_bytes_by_format, text_bytes, sizeof text_bytes);
    return st;
}

void g4_audio_tower_free(g4_model *m) {
    if (!m->audio) return;
    free(m->audio->layers); /* backend arrays belong to the model's device list */
    free(m->audio);
    m->audio = NULL;
}

/* ---- encoding -------------------------------------------------------------- */

/* Backend buffers of one encode call. */
typedef struct {
    g4_backend *be;
    void *bufs[32];
    int n, ok;
} audio_scratch;

static void *scratch(audio_scratch *s, size_t bytes) {
    void *p = s->be->ops->alloc(s->be, bytes ? bytes : 4);
    if (!p || s->n == (int)(sizeof s->bufs / sizeof s->bufs[0])) {
        if (p) s->be->ops->release(s->be, p);
        s->ok = 0;
        return NULL;
    }
    s->bufs[s->n++] = p;
    return p;
}

static void scratch_free(audio_scratch *s) {
    for (int i = 0; i < s->n; i++) s->be->ops->release(s->be, s->bufs[i]);
    s->n = 0;
}

/* Activations of the conformer stack, [T][...] each. */
typedef struct {
    int T;
    float *h, *a, *t1, *q, *k, *v, *attn, *wide, *clip, *rel;
    int32_t *valid;
    g4_chunked_attn_params attn_params;
    float grad_clip;
} conformer_state;

static int unbounded(float lo, float hi) { return isinf(lo) && lo < 0 && isinf(hi) && hi > 0; }

/* out[T][rows] = clipped linear of x[T][cols]; x is left untouched. */
static void clipped_linear(g4_backend *be, float *out, const float *x, int T, const g4_clipped_linear *cl,
                           float *tmp) {
    const size_t in_n = (size_t)T * cl->w.cols, out_n = (size_t)T * cl->w.rows;
    if (!unbounded(cl->in_min, cl->in_max)) {
        be->ops->clamp(be, tmp, x, cl->in_min, cl->in_max, in_n);
        x = tmp;
    }
    be->ops->matmul(be, out, x, T, &cl->w);
    if (!unbounded(cl->out_min, cl->out_max)) be->ops->clamp(be, out, out, cl->out_min, cl->out_max, out_n);
}

/* h += residual_weight * post_norm(clip(down(silu(up(pre_norm(clip(h))))))) */
static void feed_forward(const g4_model *m, conformer_state *c, const g4_audio_ffn *f) {
    g4_backend *be = m->backend;
    const g4_audio_config *ac = &m->config.audio;
    const int T = c->T, D = m->audio->hidden;
    const size_t n = (size_t)T * D;
    be->ops->clamp(be, c->a, c->h, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->a, c->a, f->pre_norm, T, D, ac->rms_eps);
    clipped_linear(be, c->wide, c->a, T, &f->up, c->clip);
    be->ops->silu(be, c->wide, c->wide, (size_t)T * f->up.w.rows);
    clipped_linear(be, c->t1, c->wide, T, &f->down, c->clip);
    be->ops->clamp(be, c->t1, c->t1, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->t1, c->t1, f->post_norm, T, D, ac->rms_eps);
    be->ops->scale(be, c->t1, c->t1, ac->residual_weight, n);
    be->ops->add(be, c->h, c->h, c->t1, n);
}

/* h += post_norm(clip(post(chunked_attention(q, k, v)))) of pre_norm(clip(h)) */
static void self_attention(const g4_model *m, conformer_state *c, const g4_audio_layer *w) {
    g4_backend *be = m->backend;
    const g4_audio_config *ac = &m->config.audio;
    const int T = c->T, D = m->audio->hidden;
    const size_t n = (size_t)T * D;
    const float k_scale = (float)(log(1.0 + exp(1.0)) / log(2.0));
    be->ops->clamp(be, c->a, c->h, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->a, c->a, w->norm_pre_attn, T, D, ac->rms_eps);
    clipped_linear(be, c->q, c->a, T, &w->q, c->clip);
    clipped_linear(be, c->k, c->a, T, &w->k, c->clip);
    clipped_linear(be, c->v, c->a, T, &w->v, c->clip);
    be->ops->mul_rows(be, c->q, c->q, w->q_scale, T, D);
    be->ops->scale(be, c->k, c->k, k_scale, n);
    be->ops->matmul(be, c->rel, m->audio->rel_pos, m->audio->n_rel, &w->rel_k);
    be->ops->chunked_attention(be, c->attn, c->q, c->k, c->v, c->rel, c->valid, &c->attn_params);
    clipped_linear(be, c->t1, c->attn, T, &w->post, c->clip);
    be->ops->clamp(be, c->t1, c->t1, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->t1, c->t1, w->norm_post_attn, T, D, ac->rms_eps);
    be->ops->add(be, c->h, c->h, c->t1, n);
}

/* h += end(silu(conv_norm(clip(causal_dwconv(glu(start(pre_norm(h)))))))) */
static void light_conv(const g4_model *m, conformer_state *c, const g4_audio_layer *w) {
    g4_backend *be = m->backend;
    const g4_audio_config *ac = &m->config.audio;
    const int T = c->T, D = m->audio->hidden;
    const size_t n = (size_t)T * D;
    be->ops->rmsnorm(be, c->a, c->h, w->lconv_norm, T, D, ac->rms_eps);
    clipped_linear(be, c->wide, c->a, T, &w->lin_start, c->clip);
    be->ops->glu(be, c->a, c->wide, T, D);
    be->ops->depthwise_conv1d_causal(be, c->t1, c->a, w->dw_conv, T, D, m->audio->conv_kernel);
    be->ops->clamp(be, c->t1, c->t1, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->t1, c->t1, w->conv_norm, T, D, ac->rms_eps);
    be->ops->silu(be, c->t1, c->t1, n);
    clipped_linear(be, c->a, c->t1, T, &w->lin_end, c->clip);
    be->ops->add(be, c->h, c->h, c->a, n);
}

static void conformer_layer(const g4_model *m, conformer_state *c, const g4_audio_layer *w) {
    g4_backend *be = m->backend;
    const size_t n = (size_t)c->T * m->audio->hidden;
    feed_forward(m, c, &w->ffn1);
    self_attention(m, c, w);
    light_conv(m, c, w);
    feed_forward(m, c, &w->ffn2);
    be->ops->clamp(be, c->h, c->h, -c->grad_clip, c->grad_clip, n);
    be->ops->rmsnorm(be, c->h, c->h, w->norm_out, c->T, m->audio->hidden, m->config.audio.rms_eps);
}

/* One subsampling block: mask frames, conv 3x3 stride 2, LayerNorm over
 * channels, ReLU. x is [H][W][c_in] (modified by the mask), out [Ho][Wo][c_out]. */
static void subsample_block(g4_backend *be, float *out, float *x, const float *frame_mask, int H, int W, int c_in,
                            int c_out, const float *conv, const float *norm, float eps) {
    const int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    be->ops->scale_rows(be, x, x, frame_mask, H, W * c_in);
    be->ops->conv2d(be, out, x, conv, H, W, c_in, c_out, SUBSAMPLE_KERNEL, SUBSAMPLE_KERNEL, SUBSAMPLE_STRIDE,
                    SUBSAMPLE_PAD);
    be->ops->layer_norm(be, out, out, norm, NULL, Ho * Wo, c_out, eps);
    be->ops->relu(be, out, out, (size_t)Ho * Wo * c_out);
}

g4_status g4_audio_encode(const g4_model *m, const float *features, const uint8_t *mask, int n_frames,
                          float **soft_tokens, int *n_tokens) {
    g4_audio_options opt = {.window = G4_AUDIO_WINDOW_HF};
    return g4_audio_encode_with(m, features, mask, n_frames, &opt, soft_tokens, n_tokens);
}

g4_status g4_audio_encode_with(const g4_model *m, const float *features, const uint8_t *mask, int n_frames,
                               const g4_audio_options *opt, float **soft_tokens, int *n_tokens) {
    *soft_tokens = NULL;
    *n_tokens = 0;
    const g4_audio_weights *aw = m->audio;
    if (!aw) return g4_fail(G4_ERR_UNSUPPORTED, "%s: the model has no audio tower", m->path);
    if (!features || n_frames <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "audio: no feature frames to encode (%d)", n_frames);
    if (n_frames > (1 << 24)) return g4_fail(G4_ERR_LIMIT, "audio: %d feature frames is too long", n_frames);
    g4_backend *be = m->backend;
    const g4_audio_config *ac = &m->config.audio;
    const int F0 = aw->n_mel, C0 = ac->conv_channels[0], C1 = ac->conv_channels[1], D = aw->hidden;
    const int T0 = n_frames, T1 = (T0 - 1) / 2 + 1, T2 = (T1 - 1) / 2 + 1;
    const int F1 = (F0 - 1) / 2 + 1, F2 = (F1 - 1) / 2 + 1;
    const int d_text = m->config.text.hidden_size;

    /* frame masks, halved by each stride-2 conv (transformers keeps mask[::2]) */
    float *m0 = malloc(((size_t)T0 + T1 + T2) * sizeof *m0);
    int32_t *valid = malloc((size_t)T2 * 2 * sizeof *valid);
    if (!m0 || !valid) {
        free(m0);
        free(valid);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    float *m1 = m0 + T0, *m2 = m1 + T1;
    int32_t *rows = valid + T2;
    for (int t = 0; t < T0; t++) m0[t] = !mask || mask[t] ? 1.0f : 0.0f;
    for (int t = 0; t < T1; t++) m1[t] = m0[2 * t];
    for (int t = 0; t < T2; t++) m2[t] = m1[2 * t];
    int n_valid = 0;
    for (int t = 0; t < T2; t++) {
        valid[t] = m2[t] != 0.0f;
        if (valid[t]) rows[n_valid++] = t;
    }

    audio_scratch s = {.be = be, .ok = 1};
    float *x0 = scratch(&s, (size_t)T0 * F0 * 4), *c0 = scratch(&s, (size_t)T1 * F1 * C0 * 4);
    float *c1 = scratch(&s, (size_t)T2 * F2 * C1 * 4);
    float *dm0 = scratch(&s, (size_t)T0 * 4), *dm1 = scratch(&s, (size_t)T1 * 4);
    conformer_state c = {.T = T2};
    const size_t nd = (size_t)T2 * D;
    c.h = scratch(&s, nd * 4);
    c.a = scratch(&s, nd * 4);
    c.t1 = scratch(&s, nd * 4);
    c.q = scratch(&s, nd * 4);
    c.k = scratch(&s, nd * 4);
    c.v = scratch(&s, nd * 4);
    c.attn = scratch(&s, nd * 4);
    c.wide = scratch(&s, (size_t)T2 * aw->ffn_width * 4);
    c.clip = scratch(&s, (size_t)T2 * aw->ffn_width * 4);
    c.rel = scratch(&s, (size_t)aw->n_rel * D * 4);
    c.valid = scratch(&s, (size_t)T2 * 4);
    float *proj = scratch(&s, (size_t)T2 * aw->out_dims * 4);
    float *sel = scratch(&s, (size_t)(n_valid ? n_valid : 1) * aw->out_dims * 4);
    int32_t *drows = scratch(&s, (size_t)(n_valid ? n_valid : 1) * 4);
    float *out = be->ops->alloc(be, (size_t)(n_valid ? n_valid : 1) * d_text * 4);
    if (!s.ok || !out) {
        if (out) be->ops->release(be, out);
        scratch_free(&s);
        free(m0);
        free(valid);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory for the audio activations of %d frames", n_frames);
    }
    be->ops->to_device(be, x0, features, (size_t)T0 * F0 * 4);
    be->ops->to_device(be, dm0, m0, (size_t)T0 * 4);
    be->ops->to_device(be, dm1, m1, (size_t)T1 * 4);
    be->ops->to_device(be, c.valid, valid, (size_t)T2 * 4);
    if (n_valid) be->ops->to_device(be, drows, rows, (size_t)n_valid * 4);

    /* subsampling: [T0][128][1] -> [T1][F1][C0] -> [T2][F2][C1] = [T2][F2*C1] */
    subsample_block(be, c0, x0, dm0, T0, F0, 1, C0, aw->conv0, aw->norm0, ac->rms_eps);
    subsample_block(be, c1, c0, dm1, T1, F1, C0, C1, aw->conv1, aw->norm1, ac->rms_eps);
    be->ops->matmul(be, c.h, c1, T2, &aw->input_proj);
    if (opt && opt->hook) opt->hook(opt->hook_ctx, "subsample", c.h, T2, D);

    const int past = ac->context_left - 1, future = ac->context_right;
    c.grad_clip = ac->gradient_clipping < FLT_MAX ? ac->gradient_clipping : FLT_MAX;
    c.attn_params = (g4_chunked_attn_params){
        .n_frames = T2,
        .n_heads = aw->n_heads,
        .head_dim = aw->head_dim,
        .chunk = ac->chunk_size,
        .past = past,
        .future = future,
        .n_rel = aw->n_rel,
        /* transformers: sliding_window_mask_function((context_left - 1, context_right)),
         * dist < left and -dist < right; JAX / mlx-vlm: dist <= past */
        .max_past_dist = opt && opt->window == G4_AUDIO_WINDOW_JAX ? past : past - 1,
        .max_future_dist = opt && opt->window == G4_AUDIO_WINDOW_JAX ? future : (future > 0 ? future - 1 : 0),
        .logit_cap = ac->logit_cap,
        .invalid_logit = ac->invalid_logit,
        .invert_mask = opt && opt->hf517_eager_mask,
    };
    for (int i = 0; i < ac->n_layers; i++) {
        conformer_layer(m, &c, &aw->layers[i]);
        if (opt && opt->hook) {
            char name[32];
            snprintf(name, sizeof name, "layer%d", i);
            opt->hook(opt->hook_ctx, name, c.h, T2, D);
        }
    }

    /* output_proj, keep the valid frames, embed_audio: RMSNorm (no scale) then projection */
    be->ops->matmul(be, proj, c.h, T2, &aw->output_proj);
    be->ops->add_rows(be, proj, proj, aw->output_bias, T2, aw->out_dims);
    if (opt && opt->hook) opt->hook(opt->hook_ctx, "output_proj", proj, T2, aw->out_dims);
    if (n_valid) {
        be->ops->gather_rows(be, sel, proj, drows, n_valid, aw->out_dims);
        be->ops->rmsnorm(be, sel, sel, NULL, n_valid, aw->out_dims, ac->rms_eps);
        be->ops->matmul(be, out, sel, n_valid, &aw->embed_proj);
        *soft_tokens = out;
    } else {
        be->ops->release(be, out);
    }
    be->ops->synchronize(be);
    *n_tokens = n_valid;
    scratch_free(&s);
    free(m0);
    free(valid);
    return G4_OK;
}
