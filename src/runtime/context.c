#include "runtime/context.h"

#include "runtime/constraints.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "io/hub.h"

g4_status g4_backend_open(const char *device, int threads, g4_backend **out) {
    *out = NULL;
    if (!device || !strcmp(device, "auto")) {
        /* prefer the GPU when one is present and usable */
        g4_status st = g4_backend_cuda_create(0, out);
        if (st == G4_OK) return G4_OK;
        if (st != G4_ERR_UNSUPPORTED)
            g4_log(G4_LOG_WARN, "CUDA unusable, running on the CPU: %s", g4_error_message());
        return g4_backend_cpu_create(threads, out);
    }
    if (!strcmp(device, "cpu")) return g4_backend_cpu_create(threads, out);
    if (!strncmp(device, "cuda", 4) && (device[4] == '\0' || device[4] == ':')) {
        char *end = NULL;
        long index = device[4] == ':' ? strtol(device + 5, &end, 10) : 0;
        if (device[4] == ':' && (end == device + 5 || *end || index < 0 || index > 1024))
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "bad device '%s' (cuda:N with N a GPU index)", device);
        return g4_backend_cuda_create((int)index, out);
    }
    return g4_fail(G4_ERR_INVALID_ARGUMENT, "unknown device '%s' (cpu, cuda, cuda:N or auto)", device);
}

/* processor_config.json: image_seq_length and audio_seq_length. */
static void read_processor_config(g4_context *c) {
    c->image_tokens = 280;
    c->audio_tokens_max = 750;
    char *path = g4_path_join(c->dir, "processor_config.json");
    char *text = NULL;
    size_t len;
    if (path && g4_file_exists(path) && g4_read_file(path, 1 << 20, &text, &len) == G4_OK) {
        cJSON *root = cJSON_ParseWithLength(text, len);
        const cJSON *img = cJSON_GetObjectItemCaseSensitive(root, "image_seq_length");
        const cJSON *aud = cJSON_GetObjectItemCaseSensitive(root, "audio_seq_length");
        if (cJSON_IsNumber(img) && img->valuedouble > 0 && img->valuedouble <= 4096)
            c->image_tokens = (int)img->valuedouble;
        if (cJSON_IsNumber(aud) && aud->valuedouble > 0) c->audio_tokens_max = (int)aud->valuedouble;
        cJSON_Delete(root);
    }
    free(text);
    free(path);
}

static int32_t lookup_token(void *ctx, const char *token) { return g4_tokenizer_token_id(ctx, token); }

g4_status g4_context_open(const char *path, const g4_context_options *opt, g4_context **out) {
    *out = NULL;
    g4_context_options o = {0};
    if (opt) o = *opt;
    g4_context *c = calloc(1, sizeof *c);
    if (!c) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status st = g4_resolve_model_path(path, &c->dir);
    if (st == G4_OK) st = g4_backend_open(o.device, o.threads, &c->backend);
    if (st == G4_OK) c->backend->ops->set_precision(c->backend, o.precision);
    if (st == G4_OK) st = g4_model_load_dir(c->dir, c->backend, &c->model);
    if (st == G4_OK) {
        char *tok_path = g4_path_join(c->dir, "tokenizer.json");
        if (tok_path && g4_file_exists(tok_path))
            st = g4_tokenizer_load(tok_path, &c->tokenizer);
        else if (o.require_tokenizer)
            st = g4_fail(G4_ERR_NOT_FOUND,
                         "%s has no tokenizer.json (get the full model with `gemma4 pull ORG/NAME`)", c->dir);
        free(tok_path);
    }
    if (st == G4_OK && c->tokenizer && g4_tokenizer_vocab_size(c->tokenizer) > c->model->config.text.vocab_size)
        st = g4_fail(G4_ERR_FORMAT, "%s: tokenizer.json has %d tokens but the model only %d", c->dir,
                     g4_tokenizer_vocab_size(c->tokenizer), c->model->config.text.vocab_size);
    if (st == G4_OK) st = g4_generation_config_load(c->dir, &c->generation);
    if (st == G4_OK && g4_chat_variant_for_model(c->dir, &c->chat) != G4_OK) {
        /* no usable template: decide from the architecture, as the chat code does */
        c->chat.variant = c->model->config.text.ple_dim > 0 ? G4_CHAT_SMALL : G4_CHAT_LARGE;
        c->chat.source = G4_CHAT_FROM_CONFIG;
        g4_error_clear();
    }
    if (st == G4_OK) {
        if (c->tokenizer) {
            c->n_stop = (int)g4_chat_stop_ids(&c->generation, lookup_token, c->tokenizer, c->stop_ids,
                                              G4_MAX_STOP_IDS);
            st = g4_constraints_create(c->tokenizer, &c->constraints);
        } else {
            const g4_token_ids *tk = &c->model->config.tokens;
            for (int i = 0; i < tk->n_eos && c->n_stop < G4_MAX_STOP_IDS; i++) c->stop_ids[c->n_stop++] = tk->eos_ids[i];
        }
        read_processor_config(c);
        /* transformers 5.17 with Pillow 12 made the references */
        c->image_backend = G4_IMAGE_BACKEND_PIL12;
    }
    if (st != G4_OK) {
        g4_context_close(c);
        return st;
    }
    *out = c;
    return G4_OK;
}

void g4_context_close(g4_context *c) {
    if (!c) return;
    g4_constraints_free(c->constraints);
    g4_tokenizer_free(c->tokenizer);
    g4_model_release(c->model);
    g4_backend_destroy(c->backend);
    free(c->dir);
    free(c);
}
