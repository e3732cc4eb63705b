#include "support/internal_reference.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "fixture_ref.h"
#include "runtime/context.h"
#include "runtime/prompt.h"
#include "runtime/session.h"

struct ref_fixture {
    fixture_ref ref;
    g4_context *ctx;
};

ref_fixture *ref_fixture_open(const char *dir) {
    ref_fixture *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    g4_context_options co = {.device = "cpu", .precision = G4_PRECISION_EXACT};
    if (fixture_ref_open(dir, &f->ref) != 0 || g4_context_open(dir, &co, &f->ctx) != G4_OK) {
        ref_fixture_close(f);
        return NULL;
    }
    return f;
}

void ref_fixture_close(ref_fixture *f) {
    if (!f) return;
    fixture_ref_close(&f->ref);
    g4_context_close(f->ctx);
    free(f);
}

int ref_fixture_vocab(const ref_fixture *f) { return f->ctx->model->config.text.vocab_size; }
int ref_fixture_hidden_size(const ref_fixture *f) { return f->ctx->model->config.text.hidden_size; }
int ref_fixture_n_layers(const ref_fixture *f) { return f->ctx->model->config.text.n_layers; }
int ref_fixture_max_position(const ref_fixture *f) { return f->ctx->model->config.text.max_position; }
int32_t ref_fixture_bos(const ref_fixture *f) { return f->ctx->model->config.tokens.bos_id; }

int32_t *ref_fixture_ids(const ref_fixture *f, const char *section, const char *key, int *n) {
    return fixture_ref_ids(&f->ref, section, key, n);
}

const float *ref_fixture_tensor(const ref_fixture *f, const char *name, size_t *n) {
    return fixture_ref_tensor(&f->ref, name, n);
}

typedef struct {
    g4_backend *be;
    float *final_norm;
} final_norm_copy;

static void copy_final_norm(void *ctx, const char *name, const float *data, int rows, int dim) {
    final_norm_copy *c = ctx;
    if (strcmp(name, "final_norm") == 0) c->be->ops->to_host(c->be, c->final_norm, data, (size_t)rows * dim * 4);
}

static g4_session *session_for(const ref_fixture *f, int n) {
    g4_session_options so = {.n_ctx = n + 1, .kv_type = G4_KV_F32};
    g4_session *s = NULL;
    return g4_session_create(f->ctx->model, &so, &s) == G4_OK ? s : NULL;
}

int ref_session_logits(const ref_fixture *f, const int32_t *ids, int n, int decode, float *logits, float *final_norm) {
    g4_session *s = session_for(f, n);
    if (!s) return -1;
    final_norm_copy copy = {f->ctx->backend, final_norm};
    if (final_norm) {
        s->hook = copy_final_norm;
        s->hook_ctx = &copy;
    }
    const int V = ref_fixture_vocab(f);
    g4_status st = G4_OK;
    if (decode)
        for (int t = 0; t < n && st == G4_OK; t++)
            st = g4_session_eval(s, ids + t, 1, NULL, G4_LOGITS_LAST, logits + (size_t)t * V);
    else
        st = g4_session_eval(s, ids, n, NULL, G4_LOGITS_ALL, logits);
    g4_session_destroy(s);
    return st == G4_OK ? 0 : -1;
}

int ref_session_truncated(const ref_fixture *f, const int32_t *ids, int n, int k, float *logits) {
    g4_session *s = session_for(f, n);
    if (!s) return -1;
    g4_status st = g4_session_eval(s, ids, n, NULL, G4_LOGITS_NONE, NULL);
    if (st == G4_OK) st = g4_session_truncate(s, k);
    if (st == G4_OK) st = g4_session_eval(s, ids + k, n - k, NULL, G4_LOGITS_ALL, logits);
    g4_session_destroy(s);
    return st == G4_OK ? 0 : -1;
}

int ref_session_image_logits(const ref_fixture *f, const int32_t *ids, int n, const void *image, size_t size,
                             float *logits) {
    const g4_media_input in = {.kind = G4_MEDIA_IMAGE, .data = image, .size = size, .label = "image"};
    g4_prompt p = {0};
    g4_status st = g4_prompt_from_ids(f->ctx, ids, n, &in, 1, &p);
    g4_session *s = st == G4_OK ? session_for(f, n) : NULL;
    if (st == G4_OK && !s) st = G4_ERR_OUT_OF_MEMORY;
    const g4_soft_tokens soft = {p.media.n, p.media.rows, p.media.embeds};
    if (st == G4_OK) st = g4_session_eval(s, ids, n, &soft, G4_LOGITS_ALL, logits);
    g4_session_destroy(s);
    g4_prompt_free(f->ctx, &p);
    return st == G4_OK ? 0 : -1;
}

static char *hex_bytes(const cJSON *item, size_t *len) {
    const char *hex = cJSON_IsString(item) ? item->valuestring : "";
    const size_t n = strlen(hex) / 2;
    char *out = malloc(n + 1);
    for (size_t i = 0; out && i < n; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    if (out) out[n] = 0;
    *len = n;
    return out;
}

static int32_t *json_ids(const cJSON *a, size_t *n) {
    *n = 0;
    int32_t *ids = malloc(((size_t)cJSON_GetArraySize(a) + 1) * sizeof *ids);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) ids[(*n)++] = (int32_t)e->valuedouble;
    return ids;
}

ref_tokenizer_case *ref_tokenizer_cases(const char *jsonl, int *n) {
    char *text;
    size_t len;
    *n = 0;
    if (g4_read_file(jsonl, 64u << 20, &text, &len) != G4_OK) return NULL;
    int cap = 1024;
    ref_tokenizer_case *cases = calloc((size_t)cap, sizeof *cases);
    for (char *line = strtok(text, "\n"); cases && line; line = strtok(NULL, "\n")) {
        cJSON *rec = cJSON_Parse(line);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(rec, "kind");
        if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "text")) {
            if (*n == cap) {
                ref_tokenizer_case *grown = realloc(cases, (size_t)(cap *= 2) * sizeof *cases);
                if (!grown) break;
                cases = grown;
            }
            ref_tokenizer_case *c = &cases[(*n)++];
            c->text = hex_bytes(cJSON_GetObjectItem(rec, "hex"), &c->len);
            c->ids = json_ids(cJSON_GetObjectItem(rec, "ids"), &c->n_ids);
            c->ids_special = json_ids(cJSON_GetObjectItem(rec, "ids_special"), &c->n_special);
            c->ids_plain = json_ids(cJSON_GetObjectItem(rec, "ids_plain"), &c->n_plain);
            c->decoded = hex_bytes(cJSON_GetObjectItem(rec, "decode_hex"), &c->decoded_len);
            c->decoded_skip = hex_bytes(cJSON_GetObjectItem(rec, "decode_skip_hex"), &c->decoded_skip_len);
        }
        cJSON_Delete(rec);
    }
    free(text);
    return cases;
}

void ref_tokenizer_cases_free(ref_tokenizer_case *c, int n) {
    for (int i = 0; c && i < n; i++) {
        free(c[i].text), free(c[i].ids), free(c[i].ids_special), free(c[i].ids_plain);
        free(c[i].decoded), free(c[i].decoded_skip);
    }
    free(c);
}
