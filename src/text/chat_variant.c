/* Which chat template variant a model uses.
 *
 * Decision: the model folder's own template decides (it is what transformers
 * would render). Every Gemma 4 large-model template revision (26B/31B
 * release, 04-22, 05-06, 07-09; 12B) emits the empty thought block
 * "<|channel>thought\n<channel|>" in its generation prompt and no
 * small-model revision does, so that literal classifies the text. Without a
 * template the config decides: E2B/E4B are the models with per-layer
 * embeddings (hidden_size_per_layer_input > 0). The renderer implements the
 * current (2026-07-09) template; `canonical` tells whether the folder's
 * bytes are exactly that file, so callers can warn about older revisions. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "io/config.h"
#include "text/chat.h"

/* FNV-1a 64 and sizes of the 2026-07-09 hub templates */
#define SMALL_TEMPLATE_SIZE 18569u
#define SMALL_TEMPLATE_FNV 0xb1f582218e47f231ull
#define LARGE_TEMPLATE_SIZE 18683u
#define LARGE_TEMPLATE_FNV 0x645a5f8cd6ec0ad0ull

static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int contains(const char *text, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (text[i] == needle[0] && memcmp(text + i, needle, n) == 0) return 1;
    return 0;
}

g4_status g4_chat_variant_from_template(const char *text, size_t len, int *canonical, g4_chat_variant *out) {
    if (canonical) *canonical = 0;
    if (!contains(text, len, "<|turn>"))
        return g4_fail(G4_ERR_UNSUPPORTED, "chat template: not a Gemma 4 chat template (no \"<|turn>\")");
    /* the template source spells the newline as the two characters \n */
    g4_chat_variant v = contains(text, len, "'<|channel>thought\\n<channel|>'") ? G4_CHAT_LARGE : G4_CHAT_SMALL;
    if (canonical) {
        uint64_t h = fnv1a64(text, len);
        *canonical = v == G4_CHAT_LARGE ? (len == LARGE_TEMPLATE_SIZE && h == LARGE_TEMPLATE_FNV)
                                        : (len == SMALL_TEMPLATE_SIZE && h == SMALL_TEMPLATE_FNV);
    }
    *out = v;
    return G4_OK;
}

static g4_status from_file(const char *dir, const char *name, char **text, size_t *len, int *found) {
    *found = 0;
    char *path = g4_path_join(dir, name);
    if (!path) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status st = G4_OK;
    if (g4_file_exists(path)) {
        st = g4_read_file(path, 64u << 20, text, len);
        *found = st == G4_OK;
    }
    free(path);
    return st;
}

g4_status g4_chat_variant_for_model(const char *model_dir, g4_chat_variant_info *out) {
    memset(out, 0, sizeof *out);
    char *text = NULL;
    size_t len = 0;
    int found;
    g4_status st = from_file(model_dir, "chat_template.jinja", &text, &len, &found);
    if (st != G4_OK) return st;
    if (found) {
        st = g4_chat_variant_from_template(text, len, &out->canonical, &out->variant);
        free(text);
        out->source = G4_CHAT_FROM_TEMPLATE_FILE;
        return st != G4_OK ? g4_fail_context(st, "%s/chat_template.jinja", model_dir) : G4_OK;
    }
    st = from_file(model_dir, "tokenizer_config.json", &text, &len, &found);
    if (st != G4_OK) return st;
    if (found) {
        cJSON *root = cJSON_ParseWithLength(text, len);
        free(text);
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (cJSON_IsString(tpl)) {
            st = g4_chat_variant_from_template(tpl->valuestring, strlen(tpl->valuestring), &out->canonical,
                                               &out->variant);
            cJSON_Delete(root);
            out->source = G4_CHAT_FROM_TOKENIZER_CONFIG;
            return st != G4_OK ? g4_fail_context(st, "%s/tokenizer_config.json", model_dir) : G4_OK;
        }
        cJSON_Delete(root);
    }
    g4_config cfg;
    st = g4_config_load(model_dir, &cfg);
    if (st != G4_OK) return g4_fail_context(st, "choosing the chat template of %s", model_dir);
    out->variant = cfg.text.ple_dim > 0 ? G4_CHAT_SMALL : G4_CHAT_LARGE;
    out->source = G4_CHAT_FROM_CONFIG;
    g4_config_free(&cfg);
    return G4_OK;
}
