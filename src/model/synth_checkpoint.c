#include "model/synth_checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/synth_weights.h"

#define PIECE_BYTES ((size_t)64 << 20) /* a multiple of G4_SYNTH_BLOCK_BYTES */

static cJSON *quant_entry(g4_quant_params q, int with_mode) {
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddNumberToObject(e, "group_size", q.group_size);
    cJSON_AddNumberToObject(e, "bits", q.bits);
    if (with_mode || q.mode == G4_QUANT_MXFP4)
        cJSON_AddStringToObject(e, "mode", q.mode == G4_QUANT_MXFP4 ? "mxfp4" : "affine");
    return e;
}

static int same_quant(g4_quant_params a, g4_quant_params b) {
    return a.mode == b.mode && a.bits == b.bits && a.group_size == b.group_size;
}

/* MLX's "quantization" block: the defaults, then an entry for every module
 * quantised otherwise (mlx-lm records what its predicate returned). */
static cJSON *quant_block(g4_quant_params defaults, const g4_synth_record *r) {
    cJSON *q = quant_entry(defaults, 1);
    for (size_t i = 0; q && i < r->n; i++) {
        const g4_synth_tensor *t = &r->tensors[i];
        if (t->quant.mode == G4_QUANT_NONE || same_quant(t->quant, defaults)) continue;
        size_t len = strlen(t->name);
        char *module = strndup(t->name, len > 7 ? len - 7 : len); /* less ".weight" */
        cJSON *e = quant_entry(t->quant, 0);
        if (!module || !e) {
            free(module);
            cJSON_Delete(e);
            cJSON_Delete(q);
            return NULL;
        }
        cJSON_AddItemToObject(q, module, e);
        free(module);
    }
    return q;
}

/* Fields the Gemma 4 config classes type as float. cJSON keeps numbers as
 * doubles and prints 30.0 as 30, which transformers' strict config classes
 * refuse for these fields, so integral values of them are written as 30.0. */
static const char *const float_fields[] = {"attention_dropout", "attention_invalid_logits_value", "attention_logit_cap",
                                           "final_logit_softcapping", "gradient_clipping", "initializer_range",
                                           "partial_rotary_factor", "residual_weight", "rms_norm_eps", "rope_theta"};

static int is_float_field(const char *key) {
    for (size_t i = 0; key && i < sizeof float_fields / sizeof float_fields[0]; i++)
        if (!strcmp(key, float_fields[i])) return 1;
    return 0;
}

static g4_status keep_floats(cJSON *node) {
    for (cJSON *c = node ? node->child : NULL; c; c = c->next) {
        if (cJSON_IsNumber(c) && is_float_field(c->string) && c->valuedouble == floor(c->valuedouble) &&
            fabs(c->valuedouble) < 1e15) {
            char text[48];
            snprintf(text, sizeof text, "%.1f", c->valuedouble);
            cJSON *raw = cJSON_CreateRaw(text);
            if (raw) raw->string = strdup(c->string); /* the key stays with the value (freed by cJSON_Delete) */
            if (!raw || !raw->string || !cJSON_ReplaceItemViaPointer(node, c, raw)) {
                cJSON_Delete(raw);
                return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            }
            c = raw;
        } else if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            g4_status st = keep_floats(c);
            if (st != G4_OK) return st;
        }
    }
    return G4_OK;
}

/* The config as given, less the towers synthetic models lack and any
 * quantization block, plus the block for the tensors written. */
static g4_status config_text(const char *json, size_t len, const char *label, const g4_model *m,
                             const g4_synth_record *r, char **out) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return g4_fail(G4_ERR_FORMAT, "%s: config is not valid JSON", label);
    const char *drop[] = {"vision_config", "audio_config", "quantization", "quantization_config"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) cJSON_DeleteItemFromObjectCaseSensitive(root, drop[i]);
    g4_status st = G4_OK;
    if (m->config.quant.present) {
        cJSON *q = quant_block(m->config.quant.defaults, r);
        cJSON *copy = q ? cJSON_Duplicate(q, 1) : NULL; /* MLX writes both keys */
        if (!q || !copy) {
            cJSON_Delete(q);
            cJSON_Delete(copy);
            st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        } else {
            cJSON_AddItemToObject(root, "quantization", q);
            cJSON_AddItemToObject(root, "quantization_config", copy);
        }
    }
    if (st == G4_OK) st = keep_floats(root);
    if (st == G4_OK) *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (st == G4_OK && !*out) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    return st;
}

/* Every recorded tensor, made piece by piece into one buffer and written. */
static g4_status write_tensors(const g4_synth_record *r, const char *path, const g4_synth_checkpoint_options *opt,
                               uint64_t total_bytes) {
    g4_st_write_item *items = calloc(r->n ? r->n : 1, sizeof *items);
    unsigned char *piece = malloc(PIECE_BYTES);
    if (!items || !piece) {
        free(items);
        free(piece);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < r->n; i++) {
        const g4_synth_tensor *t = &r->tensors[i];
        items[i] = (g4_st_write_item){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++) items[i].shape[d] = t->shape[d];
    }
    g4_st_stream *s;
    g4_status st = g4_st_stream_open(path, items, r->n, &s);
    uint64_t written = 0, done = 0, total = 0;
    for (size_t i; st == G4_OK && (i = g4_st_stream_next(s, &done, &total)) < r->n;) {
        const g4_synth_tensor *t = &r->tensors[i];
        size_t n = total - done < PIECE_BYTES ? (size_t)(total - done) : PIECE_BYTES;
        g4_synth_fill_bytes(t->fill, t->seed, done, piece, n);
        st = g4_st_stream_write(s, piece, n);
        written += n;
        if (st == G4_OK && opt && opt->progress) opt->progress(opt->user, written, total_bytes);
    }
    if (st == G4_OK) {
        st = g4_st_stream_close(s);
    } else if (s) {
        (void)g4_st_stream_close(s); /* removes the partial file */
    }
    free(items);
    free(piece);
    return st;
}

g4_status g4_synth_checkpoint_config(const char *config_json, size_t len, const char *label, const char *format,
                                     char **out) {
    g4_synth_record record = {0};
    g4_model *m;
    g4_status st = g4_model_synthesize_json(config_json, len, label, format, NULL, &record, &m);
    if (st == G4_OK) {
        st = config_text(config_json, len, label, m, &record, out);
        g4_model_release(m);
    }
    g4_synth_record_free(&record);
    return st;
}

g4_status g4_synth_checkpoint_write(const char *config_json, size_t len, const char *label, const char *format,
                                    const char *dir, const g4_synth_checkpoint_options *opt,
                                    g4_synth_checkpoint_info *info) {
    memset(info, 0, sizeof *info);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return g4_fail(G4_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    if (!g4_is_directory(dir)) return g4_fail(G4_ERR_IO, "%s: not a directory", dir);
    g4_synth_record record = {0};
    g4_model *m;
    g4_status st = g4_model_synthesize_json(config_json, len, label, format, NULL, &record, &m);
    if (st != G4_OK) {
        g4_synth_record_free(&record);
        return st;
    }
    for (size_t i = 0; i < record.n; i++) info->tensor_bytes += g4_synth_tensor_bytes(&record.tensors[i]);
    info->n_tensors = record.n;
    char *st_path = g4_path_join(dir, "model.safetensors"), *cfg_path = g4_path_join(dir, "config.json");
    char *config = NULL;
    if (!st_path || !cfg_path) st = g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == G4_OK) st = config_text(config_json, len, label, m, &record, &config);
    if (st == G4_OK) st = write_tensors(&record, st_path, opt, info->tensor_bytes);
    if (st == G4_OK) st = g4_write_file(cfg_path, config, strlen(config));
    free(config);
    free(st_path);
    free(cfg_path);
    g4_model_release(m);
    g4_synth_record_free(&record);
    return st;
}
