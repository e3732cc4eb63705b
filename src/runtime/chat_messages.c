#include "runtime/chat_messages.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base64.h"
#include "base/file.h"

static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v; /* null means "not given", as in the OpenAI API */
}

/* An error about messages[i] (field: "role", "content", ... or NULL), named in where[0..size). */
static g4_status message_fail(char *where, size_t size, int i, const char *field, const char *fmt, const char *detail) {
    if (field) snprintf(where, size, "messages[%d].%s", i, field);
    else snprintf(where, size, "messages[%d]", i);
    return g4_fail(G4_ERR_INVALID_ARGUMENT, fmt, i, detail);
}

/* One message as the OpenAI API accepts it: a known role; content a string
 * or a list of parts (the parts themselves are checked with the media),
 * null or absent only for an assistant (with tool calls, or a prefill). */
static g4_status check_message(const cJSON *m, int i, char *where, size_t size) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    if (!cJSON_IsObject(m)) return message_fail(where, size, i, NULL, "messages[%d] must be an object%s", "");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    if (!role) return message_fail(where, size, i, "role", "messages[%d].role is required%s", "");
    if (!cJSON_IsString(role)) return message_fail(where, size, i, "role", "messages[%d].role must be a string%s", "");
    int known = 0;
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= !strcmp(role->valuestring, roles[k]);
    if (!known)
        return message_fail(where, size, i, "role",
                            "messages[%d].role '%.40s' is not one of 'system', 'developer', 'user', 'assistant', "
                            "'tool'",
                            role->valuestring);
    int assistant = !strcmp(role->valuestring, "assistant");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!content || cJSON_IsNull(content)) {
        if (!assistant) return message_fail(where, size, i, "content", "messages[%d].content is required for role '%s'",
                                            role->valuestring);
    } else if (!cJSON_IsString(content) && !cJSON_IsArray(content)) {
        return message_fail(where, size, i, "content", "messages[%d].content must be a string or a list of parts%s", "");
    }
    const cJSON *calls = field(m, "tool_calls");
    if (calls && (!assistant || !cJSON_IsArray(calls)))
        return message_fail(where, size, i, "tool_calls", "messages[%d].tool_calls must be a list, on an assistant message%s",
                            "");
    const cJSON *name = field(m, "name");
    if (name && !cJSON_IsString(name)) return message_fail(where, size, i, "name", "messages[%d].name must be a string%s", "");
    return G4_OK;
}

g4_status g4_chat_check_messages(const cJSON *messages, char *where, size_t size) {
    snprintf(where, size, "messages");
    if (!messages) return g4_fail(G4_ERR_INVALID_ARGUMENT, "'messages' is required");
    if (!cJSON_IsArray(messages)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "'messages' must be a list");
    if (cJSON_GetArraySize(messages) == 0) return g4_fail(G4_ERR_INVALID_ARGUMENT, "'messages' must not be empty");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, messages) {
        if (check_message(m, i, where, size) != G4_OK) return G4_ERR_INVALID_ARGUMENT;
        i++;
    }
    return G4_OK;
}


static g4_status add_item(g4_media_list *l, g4_media_kind kind, unsigned char *data, size_t size, int max_soft_tokens,
                    int index) {
    g4_media_input *grown = realloc(l->items, (size_t)(l->n + 1) * sizeof *grown);
    char *label = malloc(32);
    if (!grown || !label) {
        if (grown) l->items = grown;
        free(label);
        free(data);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    l->items = grown;
    snprintf(label, 32, "%s %d", kind == G4_MEDIA_IMAGE ? "image" : "audio", index);
    l->items[l->n++] = (g4_media_input){.kind = kind, .data = data, .size = size, .label = label,
                                        .max_soft_tokens = max_soft_tokens};
    return G4_OK;
}

/* A data: URI -> its decoded bytes. */
static g4_status from_data_uri(const char *url, size_t max_bytes, const char *what, unsigned char **data, size_t *size) {
    const char *comma = strchr(url, ',');
    if (!comma) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: malformed data: URI (no ',')", what);
    size_t head = (size_t)(comma - url);
    if (head < 12 || memcmp(comma - 7, ";base64", 7) != 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: only base64 data: URIs are supported", what);
    g4_status st = g4_base64_decode(comma + 1, strlen(comma + 1), max_bytes, what, data, size);
    if (st != G4_OK)
        return g4_fail(st == G4_ERR_OUT_OF_MEMORY ? G4_ERR_OUT_OF_MEMORY : G4_ERR_INVALID_ARGUMENT, "%s",
                       g4_error_message());
    return G4_OK;
}

/* A local file inside the allowed folder (symbolic links resolved first). */
static g4_status from_file(const char *path, const g4_media_limits *lim, const char *what, unsigned char **data,
                     size_t *size) {
    if (!lim->allowed_dir)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: local files are not allowed (start the server with --allowed-media-dir); send a "
                           "data: URI instead",
                           what);
    char real[PATH_MAX], root[PATH_MAX];
    if (!realpath(lim->allowed_dir, root)) return g4_fail(G4_ERR_INTERNAL, "the media folder is missing");
    if (!realpath(path, real)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: no such file", what);
    size_t rl = strlen(root);
    if (strncmp(real, root, rl) != 0 || (real[rl] != '/' && !(rl == 1 && root[0] == '/'))) {
        return g4_fail(G4_ERR_PERMISSION, "%s: the file is outside the allowed media folder", what);
    }
    char *buf = NULL;
    size_t len = 0;
    g4_status st = g4_read_file(real, lim->max_bytes, &buf, &len);
    if (st != G4_OK) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: %s", what, g4_error_message());
    *data = (unsigned char *)buf;
    *size = len;
    return G4_OK;
}

static g4_status image_part(const cJSON *part, const g4_media_limits *lim, g4_media_list *out, int index) {
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const cJSON *url = cJSON_IsString(iu) ? iu : cJSON_GetObjectItemCaseSensitive(iu, "url");
    char what[32];
    snprintf(what, sizeof what, "image %d", index);
    if (!cJSON_IsString(url))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: image_url must be {\"url\": \"data:...\"} or a string", what);
    int budget = 0;
    const cJSON *detail = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "detail") : NULL;
    if (detail && !cJSON_IsNull(detail)) {
        if (!cJSON_IsString(detail)) return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: detail must be a string", what);
        if (!strcmp(detail->valuestring, "low")) budget = 70;
        else if (!strcmp(detail->valuestring, "high")) budget = 1120;
        else if (strcmp(detail->valuestring, "auto") != 0)
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: detail must be \"low\", \"high\" or \"auto\"", what);
    }
    const char *u = url->valuestring;
    unsigned char *data = NULL;
    size_t size = 0;
    g4_status rc;
    if (!strncmp(u, "data:", 5))
        rc = from_data_uri(u, lim->max_bytes, what, &data, &size);
    else if (!strncmp(u, "file://", 7))
        rc = from_file(u + 7, lim, what, &data, &size);
    else if (u[0] == '/')
        rc = from_file(u, lim, what, &data, &size);
    else if (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8))
        rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: remote URLs are not fetched; send the image as a data: URI", what);
    else
        rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: the url must be a data: URI or a local file path", what);
    if (rc) return rc;
    return add_item(out, G4_MEDIA_IMAGE, data, size, budget, index);
}

static g4_status audio_part(const cJSON *part, const g4_media_limits *lim, g4_media_list *out, int index) {
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(part, "input_audio");
    const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(ia, "data");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(ia, "format");
    char what[32];
    snprintf(what, sizeof what, "audio %d", index);
    if (!cJSON_IsObject(ia) || !cJSON_IsString(b64))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: input_audio must be {\"data\": BASE64, \"format\": ...}", what);
    if (fmt && !cJSON_IsNull(fmt) && !cJSON_IsString(fmt))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: input_audio.format must be a string", what);
    unsigned char *data = NULL;
    size_t size = 0;
    const char *text = b64->valuestring;
    g4_status rc;
    if (!strncmp(text, "data:", 5)) {
        rc = from_data_uri(text, lim->max_bytes, what, &data, &size);
    } else {
        g4_status st = g4_base64_decode(text, strlen(text), lim->max_bytes, what, &data, &size);
        rc = st == G4_OK ? G4_OK : g4_fail(G4_ERR_INVALID_ARGUMENT, "%s", g4_error_message());
    }
    if (rc) return rc;
    if (size == 0) {
        free(data);
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "%s: the audio data is empty", what);
    }
    return add_item(out, G4_MEDIA_AUDIO, data, size, 0, index);
}

g4_status g4_chat_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out) {
    memset(out, 0, sizeof *out);
    int n_images = 0, n_audio = 0, mi = 0;
    g4_status rc = G4_OK;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsArray(content)) {
            mi++;
            continue;
        }
        int pi = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "messages[%d].content[%d] must be an object with a \"type\"", mi,
                                 pi);
                break;
            }
            const char *t = type->valuestring;
            if (!strcmp(t, "text")) {
                if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text")))
                    rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "messages[%d].content[%d].text must be a string", mi, pi);
            } else if (!strcmp(t, "image_url")) {
                if (++n_images > lim->max_images)
                    rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "at most %d images per request", lim->max_images);
                else
                    rc = image_part(part, lim, out, n_images);
            } else if (!strcmp(t, "input_audio")) {
                if (++n_audio > lim->max_audio)
                    rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "at most %d audio clips per request", lim->max_audio);
                else
                    rc = audio_part(part, lim, out, n_audio);
            } else {
                rc = g4_fail(G4_ERR_INVALID_ARGUMENT, "messages[%d].content[%d]: unsupported content type '%.40s' (text, image_url, "
                                 "input_audio)",
                                 mi, pi, t);
            }
            if (rc) break;
            pi++;
        }
        if (rc) break;
        mi++;
    }
    if (rc) g4_media_list_free(out);
    return rc;
}

void g4_media_list_free(g4_media_list *l) {
    for (int i = 0; i < l->n; i++) {
        free((void *)l->items[i].data);
        free((void *)l->items[i].label);
    }
    free(l->items);
    memset(l, 0, sizeof *l);
}
