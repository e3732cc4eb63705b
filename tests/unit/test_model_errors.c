/* Bad checkpoints and bad inputs give clear errors, never a crash:
 * missing tensors (all of them listed in one message), wrong shapes and
 * dtypes, broken quantisation metadata, ids outside the vocabulary, empty
 * prompts, an overfull context. Bad checkpoints are written from a real
 * fixture with tensors dropped or altered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "model/assistant.h"
#include "model/model.h"
#include "runtime/session.h"
#include "test_util.h"

typedef int (*tensor_edit)(const char *name, g4_st_write_item *item, void *scratch);

/* Copies fixture `src` to tmp dir `name` (config.json and one rewritten
 * model.safetensors); `edit` may drop (return 0) or alter each tensor. */
static const char *make_variant(const char *src, const char *name, tensor_edit edit, const char *config_patch_from,
                                const char *config_patch_to) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(name));
    mkdir(dir, 0755);
    g4_st_set *set;
    if (g4_st_open(src, &set) != G4_OK) return NULL;
    size_t n = g4_st_count(set);
    g4_st_write_item *items = calloc(n, sizeof *items);
    void **scratch = calloc(n, sizeof *scratch);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const g4_st_tensor *t = g4_st_at(set, i);
        g4_st_write_item it = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(it.shape, t->shape, sizeof it.shape);
        if (edit && !edit(t->name, &it, &scratch[i])) continue;
        items[k++] = it;
    }
    char *path = g4_path_join(dir, "model.safetensors");
    g4_status st = g4_st_write(path, items, k);
    free(path);
    for (size_t i = 0; i < n; i++) free(scratch[i]);
    free(scratch);
    free(items);
    g4_st_close(set);
    if (st != G4_OK) return NULL;
    char *cfg_src = g4_path_join(src, "config.json"), *cfg_dst = g4_path_join(dir, "config.json");
    char *text;
    size_t len;
    if (g4_read_file(cfg_src, 1 << 20, &text, &len) == G4_OK) {
        if (config_patch_from) {
            char *hit = strstr(text, config_patch_from);
            if (hit) {
                size_t a = (size_t)(hit - text), fl = strlen(config_patch_from), tl = strlen(config_patch_to);
                char *patched = malloc(len - fl + tl + 1);
                memcpy(patched, text, a);
                memcpy(patched + a, config_patch_to, tl);
                memcpy(patched + a + tl, hit + fl, len - a - fl + 1);
                free(text);
                text = patched;
                len = len - fl + tl;
            }
        }
        g4_write_file(cfg_dst, text, len);
        free(text);
    }
    free(cfg_src);
    free(cfg_dst);
    return dir;
}

static int drop_three(const char *name, g4_st_write_item *item, void *scratch) {
    (void)item;
    (void)scratch;
    return !(strstr(name, "layers.1.mlp.up_proj.weight") || strstr(name, "layers.3.self_attn.q_norm.weight") ||
             strstr(name, "language_model.norm.weight"));
}

static int wrong_shape(const char *name, g4_st_write_item *item, void *scratch) {
    (void)scratch;
    if (strstr(name, "layers.2.self_attn.o_proj.weight")) { /* [128, 256] -> [256, 128] */
        int64_t r = item->shape[0];
        item->shape[0] = item->shape[1];
        item->shape[1] = r;
    }
    return 1;
}

static int int_weights(const char *name, g4_st_write_item *item, void *scratch) {
    (void)scratch;
    if (strstr(name, "layers.0.mlp.gate_proj.weight")) item->dtype = G4_DTYPE_I16;
    return 1;
}

static int drop_biases(const char *name, g4_st_write_item *item, void *scratch) {
    (void)item;
    (void)scratch;
    return strstr(name, "layers.0.self_attn.q_proj.biases") == NULL;
}

static int bad_scales(const char *name, g4_st_write_item *item, void *scratch) {
    (void)scratch;
    if (strstr(name, "layers.0.mlp.gate_proj.scales") || strstr(name, "layers.0.mlp.gate_proj.biases"))
        item->shape[1] = item->shape[1] / 2; /* half the groups; data prefix stays valid */
    return 1;
}

static g4_status try_load(const char *dir, g4_model **m) {
    g4_backend *be;
    g4_status st = g4_backend_cpu_create(0, &be);
    *m = NULL;
    if (st == G4_OK) st = g4_model_load_dir(dir, be, m);
    if (st == G4_OK) {
        g4_model_release(*m);
        *m = NULL;
    }
    g4_backend_destroy(be);
    return st;
}

static void expect_load_error(const char *what, const char *dir, const char *must_contain[], int n_must) {
    g4_model *m;
    g4_status st = dir ? try_load(dir, &m) : G4_ERR_INTERNAL;
    CHECK(st != G4_OK, "%s: loading should fail", what);
    const char *msg = g4_error_message();
    printf("  %s -> %s\n", what, msg);
    for (int i = 0; i < n_must; i++)
        CHECK(strstr(msg, must_contain[i]) != NULL, "%s: message should mention '%s': %s", what, must_contain[i], msg);
}

static int drop_drafter_two(const char *name, g4_st_write_item *item, void *scratch) {
    (void)item;
    (void)scratch;
    return strcmp(name, "pre_projection.weight") && strcmp(name, "model.layers.2.self_attn.q_norm.weight");
}

static int drafter_wrong_shapes(const char *name, g4_st_write_item *item, void *scratch) {
    (void)scratch;
    if (!strcmp(name, "masked_embedding.centroids.weight")) item->shape[0] /= 2; /* [32, 64] -> [16, 64] */
    return strcmp(name, "masked_embedding.token_ordering") != 0;
}

/* A drafter load (and, with a target directory, the attach) must fail
 * naming every item of must_contain. */
static void expect_drafter_error(const char *what, const char *dir, const char *target_dir,
                                 const char *must_contain[], int n_must) {
    g4_backend *be;
    g4_status st = g4_backend_cpu_create(0, &be);
    g4_assistant *a = NULL;
    g4_model *target = NULL;
    if (st == G4_OK && target_dir) st = g4_model_load_dir(target_dir, be, &target);
    CHECK(st == G4_OK, "%s: setup: %s", what, g4_error_message());
    if (st == G4_OK) st = dir ? g4_assistant_load_dir(dir, be, &a) : G4_ERR_INTERNAL;
    if (st == G4_OK && target) st = g4_assistant_attach(a, target);
    CHECK(st != G4_OK, "%s: should fail", what);
    const char *msg = g4_error_message();
    printf("  %s -> %s\n", what, msg);
    for (int i = 0; i < n_must; i++)
        CHECK(strstr(msg, must_contain[i]) != NULL, "%s: message should mention '%s': %s", what, must_contain[i], msg);
    g4_assistant_release(a);
    g4_model_release(target);
    g4_backend_destroy(be);
}

static void drafter_errors(void) {
    char dense_a[1024], e2b_a[1024]; /* test_fixture's buffers are reused */
    snprintf(dense_a, sizeof dense_a, "%s", test_fixture("dense-assistant"));
    snprintf(e2b_a, sizeof e2b_a, "%s", test_fixture("e2b-assistant"));
    const char *missing[] = {"2 problems", "pre_projection.weight", "[64, 256]", "model.layers.2.self_attn.q_norm.weight"};
    expect_drafter_error("drafter without two tensors", make_variant(dense_a, "drafter-missing", drop_drafter_two, NULL, NULL),
                         NULL, missing, 4);
    const char *centroid[] = {"2 problems", "masked_embedding.centroids.weight", "[32, 64]",
                              "masked_embedding.token_ordering"};
    expect_drafter_error("centroid head without its ordering, centroids halved",
                         make_variant(e2b_a, "drafter-centroids", drafter_wrong_shapes, NULL, NULL), NULL, centroid, 4);
    const char *shared[] = {"num_kv_shared_layers=3", "must equal"};
    expect_drafter_error("drafter with a layer of its own K/V",
                         make_variant(dense_a, "drafter-shared", NULL, "\"num_kv_shared_layers\": 4",
                                      "\"num_kv_shared_layers\": 3"),
                         NULL, shared, 2);
    const char *mismatch[] = {"does not fit", "layer 3 (full): 1 KV heads, the target's layer 2 has 2"};
    expect_drafter_error("dense drafter on the e2b target", dense_a, test_fixture("e2b"), mismatch, 2);
    const char *backbone[] = {"backbone_hidden_size 128, the target's hidden_size"};
    expect_drafter_error("dense drafter on the realdims target", dense_a, test_fixture("realdims"), backbone, 1);
    const char *target_only[] = {"not a drafter", "gemma4"};
    expect_drafter_error("a target loaded as a drafter", test_fixture("dense"), NULL, target_only, 2);
    /* and a drafter is no model of its own */
    const char *as_model[] = {"MTP drafter", "--draft"};
    expect_load_error("a drafter loaded as a model", dense_a, as_model, 2);
}

int main(void) {
    const char *dense = test_fixture("dense"), *mlx = test_fixture("dense-mlx8");

    const char *missing[] = {"3 problems", "layers.1.mlp.up_proj.weight", "layers.3.self_attn.q_norm.weight",
                             "model.language_model.norm.weight", "expected [256, 128]"};
    expect_load_error("three tensors removed", make_variant(dense, "missing", drop_three, NULL, NULL), missing, 5);

    const char *shape[] = {"layers.2.self_attn.o_proj.weight", "[256, 128]", "[128, 256]"};
    expect_load_error("transposed o_proj", make_variant(dense, "shape", wrong_shape, NULL, NULL), shape, 3);

    const char *dtype[] = {"layers.0.mlp.gate_proj.weight", "I16"};
    expect_load_error("integer weights", make_variant(dense, "dtype", int_weights, NULL, NULL), dtype, 2);

    const char *width[] = {"intermediate", "512"};
    (void)width;
    const char *wider[] = {"mlp.gate_proj.weight", "[512, 128]"};
    expect_load_error("config says a wider MLP",
                      make_variant(dense, "wider", NULL, "\"intermediate_size\": 256", "\"intermediate_size\": 512"),
                      wider, 2);

    const char *biases[] = {"layers.0.self_attn.q_proj.biases", "affine"};
    expect_load_error("affine module without biases", make_variant(mlx, "nobias", drop_biases, NULL, NULL), biases, 2);

    const char *scales[] = {"layers.0.mlp.gate_proj.scales", "group size 64"};
    expect_load_error("scales of the wrong shape", make_variant(mlx, "scales", bad_scales, NULL, NULL), scales, 2);

    const char *bits[] = {"packed width", "4-bit"};
    expect_load_error("bits in config.json disagree with the packed width",
                      make_variant(mlx, "bits", NULL, "\"bits\": 8", "\"bits\": 4"), bits, 2);

    const char *bits9[] = {"9 bits"};
    expect_load_error("bits not supported", make_variant(mlx, "bits9", NULL, "\"bits\": 8", "\"bits\": 9"), bits9, 1);

    drafter_errors();

    const char *nodir[] = {"not a model directory"};
    expect_load_error("missing directory", test_tmp_path("does-not-exist"), nodir, 1);

    /* inputs */
    g4_backend *be;
    g4_model *m;
    g4_status st = g4_backend_cpu_create(0, &be);
    if (st == G4_OK) st = g4_model_load_dir(dense, be, &m);
    CHECK(st == G4_OK, "dense loads: %s", g4_error_message());
    if (st == G4_OK) {
        g4_session_options opt = {.n_ctx = 8};
        g4_session *s;
        st = g4_session_create(m, &opt, &s);
        CHECK(st == G4_OK, "session: %s", g4_error_message());
        float *logits = malloc(1024 * sizeof *logits);
        int32_t bad[] = {2, 5, 1024};
        st = g4_session_eval(s, bad, 3, NULL, G4_LOGITS_LAST, logits);
        CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "1024") &&
                  strstr(g4_error_message(), "vocabulary"),
              "id 1024 >= vocab: %s", g4_error_message());
        printf("  id out of range -> %s\n", g4_error_message());
        int32_t neg[] = {-1};
        st = g4_session_eval(s, neg, 1, NULL, G4_LOGITS_LAST, logits);
        CHECK(st == G4_ERR_INVALID_ARGUMENT, "negative id: %s", g4_error_message());
        st = g4_session_eval(s, bad, 0, NULL, G4_LOGITS_LAST, logits);
        CHECK(st == G4_ERR_INVALID_ARGUMENT && strstr(g4_error_message(), "empty"), "empty prompt: %s",
              g4_error_message());
        printf("  empty prompt -> %s\n", g4_error_message());
        CHECK(g4_session_length(s) == 0, "failed evals leave the sequence empty (length %d)", g4_session_length(s));
        int32_t many[9] = {2, 3, 4, 5, 6, 7, 8, 9, 10};
        st = g4_session_eval(s, many, 9, NULL, G4_LOGITS_LAST, logits);
        CHECK(st == G4_ERR_LIMIT && strstr(g4_error_message(), "context"), "context overflow: %s",
              g4_error_message());
        printf("  context overflow -> %s\n", g4_error_message());
        /* the session still works after the errors */
        st = g4_session_eval(s, many, 8, NULL, G4_LOGITS_LAST, logits);
        CHECK(st == G4_OK, "session usable after errors: %s", g4_error_message());
        free(logits);
        g4_session_destroy(s);
        g4_model_release(m);
    }
    g4_backend_destroy(be);
    return test_finish();
}
