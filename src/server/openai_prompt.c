/* What the server does to chat messages and prompt text before the prompt
 * is built: the size bound that refuses text far longer than the token
 * limit before any tokenizing, and --no-special-in-content. */
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

/* The text bytes of a conversation: every string but the media payloads
 * (an image's base64 is no prompt text). */
static size_t text_bytes(const cJSON *item, int in_media) {
    size_t n = 0;
    if (cJSON_IsString(item) && !in_media) n += strlen(item->valuestring);
    const cJSON *child;
    cJSON_ArrayForEach(child, item) {
        int media = in_media || (child->string && (!strcmp(child->string, "image_url") ||
                                                   !strcmp(child->string, "input_audio")));
        n += text_bytes(child, media);
    }
    return n;
}

size_t g4_oai_messages_text_bytes(const cJSON *messages) { return text_bytes(messages, 0); }

int g4_oai_text_may_fit(const g4_server *s, size_t bytes, int max_tokens) {
    /* a token covers at most max_token_bytes of text; twice that for what
     * the normalizer may fold, and room for the chat template's own text */
    double most = (double)max_tokens * (double)s->max_token_bytes * 2.0 + 4096.0;
    return (double)bytes <= most;
}

static int escape_string(const g4_tokenizer *t, cJSON *item) {
    if (!cJSON_IsString(item)) return 0;
    char *escaped = NULL;
    size_t len = 0;
    if (g4_tokenizer_escape_special(t, item->valuestring, strlen(item->valuestring), &escaped, &len) != G4_OK)
        return -1;
    int same = !strcmp(escaped, item->valuestring);
    int ok = same || cJSON_SetValuestring(item, escaped) != NULL;
    free(escaped);
    return ok ? 0 : -1;
}

int g4_oai_escape_content(const g4_tokenizer *t, cJSON *messages, g4_oai_error *err) {
    cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int rc = escape_string(t, content);
        cJSON *part;
        if (cJSON_IsArray(content)) {
            cJSON_ArrayForEach(part, content) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                if (!rc && cJSON_IsString(type) && !strcmp(type->valuestring, "text"))
                    rc = escape_string(t, cJSON_GetObjectItemCaseSensitive(part, "text"));
            }
        }
        if (rc) return g4_oai_fail(err, 503, "messages", "out of memory");
    }
    return 0;
}
