#include "server/openai_media.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base64.h"
#include "base/file.h"

static int add_item(g4_media_list *l, g4_media_kind kind, unsigned char *data, size_t size, int max_soft_tokens,
                    int index, g4_oai_error *err) {
    g4_media_input *grown = realloc(l->items, (size_t)(l->n + 1) * sizeof *grown);
    char *label = malloc(32);
    if (!grown || !label) {
        if (grown) l->items = grown;
        free(label);
        free(data);
        return g4_oai_fail(err, 503, "messages", "out of memory");
    }
    l->items = grown;
    snprintf(label, 32, "%s %d", kind == G4_MEDIA_IMAGE ? "image" : "audio", index);
    l->items[l->n++] = (g4_media_input){.kind = kind, .data = data, .size = size, .label = label,
                                        .max_soft_tokens = max_soft_tokens};
    return 0;
}

/* A data: URI -> its decoded bytes. */
static int from_data_uri(const char *url, size_t max_bytes, const char *what, unsigned char **data, size_t *size,
                         g4_oai_error *err) {
    const char *comma = strchr(url, ',');
    if (!comma) return g4_oai_fail(err, 400, "messages", "%s: malformed data: URI (no ',')", what);
    size_t head = (size_t)(comma - url);
    if (head < 12 || memcmp(comma - 7, ";base64", 7) != 0)
        return g4_oai_fail(err, 400, "messages", "%s: only base64 data: URIs are supported", what);
    g4_status st = g4_base64_decode(comma + 1, strlen(comma + 1), max_bytes, what, data, size);
    if (st != G4_OK) return g4_oai_fail(err, st == G4_ERR_OUT_OF_MEMORY ? 503 : 400, "messages", "%s", g4_error_message());
    return 0;
}

/* A local file inside the allowed folder (symbolic links resolved first). */
static int from_file(const char *path, const g4_media_limits *lim, const char *what, unsigned char **data,
                     size_t *size, g4_oai_error *err) {
    if (!lim->allowed_dir)
        return g4_oai_fail(err, 400, "messages",
                           "%s: local files are not allowed (start the server with --allowed-media-dir); send a "
                           "data: URI instead",
                           what);
    char real[PATH_MAX], root[PATH_MAX];
    if (!realpath(lim->allowed_dir, root)) return g4_oai_fail(err, 500, "messages", "the media folder is missing");
    if (!realpath(path, real)) return g4_oai_fail(err, 400, "messages", "%s: no such file", what);
    size_t rl = strlen(root);
    if (strncmp(real, root, rl) != 0 || (real[rl] != '/' && !(rl == 1 && root[0] == '/'))) {
        g4_oai_fail(err, 403, "messages", "%s: the file is outside the allowed media folder", what);
        err->type = "permission_error";
        return -1;
    }
    char *buf = NULL;
    size_t len = 0;
    g4_status st = g4_read_file(real, lim->max_bytes, &buf, &len);
    if (st != G4_OK) return g4_oai_fail(err, 400, "messages", "%s: %s", what, g4_error_message());
    *data = (unsigned char *)buf;
    *size = len;
    return 0;
}

static int image_part(const cJSON *part, const g4_media_limits *lim, g4_media_list *out, int index,
                      g4_oai_error *err) {
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const cJSON *url = cJSON_IsString(iu) ? iu : cJSON_GetObjectItemCaseSensitive(iu, "url");
    char what[32];
    snprintf(what, sizeof what, "image %d", index);
    if (!cJSON_IsString(url))
        return g4_oai_fail(err, 400, "messages", "%s: image_url must be {\"url\": \"data:...\"} or a string", what);
    int budget = 0;
    const cJSON *detail = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "detail") : NULL;
    if (detail && !cJSON_IsNull(detail)) {
        if (!cJSON_IsString(detail)) return g4_oai_fail(err, 400, "messages", "%s: detail must be a string", what);
        if (!strcmp(detail->valuestring, "low")) budget = 70;
        else if (!strcmp(detail->valuestring, "high")) budget = 1120;
        else if (strcmp(detail->valuestring, "auto") != 0)
            return g4_oai_fail(err, 400, "messages", "%s: detail must be \"low\", \"high\" or \"auto\"", what);
    }
    const char *u = url->valuestring;
    unsigned char *data = NULL;
    size_t size = 0;
    int rc;
    if (!strncmp(u, "data:", 5))
        rc = from_data_uri(u, lim->max_bytes, what, &data, &size, err);
    else if (!strncmp(u, "file://", 7))
        rc = from_file(u + 7, lim, what, &data, &size, err);
    else if (u[0] == '/')
        rc = from_file(u, lim, what, &data, &size, err);
    else if (!strncmp(u, "http://", 7) || !strncmp(u, "https://", 8))
        rc = g4_oai_fail(err, 400, "messages", "%s: remote URLs are not fetched; send the image as a data: URI", what);
    else
        rc = g4_oai_fail(err, 400, "messages", "%s: the url must be a data: URI or a local file path", what);
    if (rc) return rc;
    return add_item(out, G4_MEDIA_IMAGE, data, size, budget, index, err);
}

static int audio_part(const cJSON *part, const g4_media_limits *lim, g4_media_list *out, int index,
                      g4_oai_error *err) {
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(part, "input_audio");
    const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(ia, "data");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(ia, "format");
    char what[32];
    snprintf(what, sizeof what, "audio %d", index);
    if (!cJSON_IsObject(ia) || !cJSON_IsString(b64))
        return g4_oai_fail(err, 400, "messages", "%s: input_audio must be {\"data\": BASE64, \"format\": ...}", what);
    if (fmt && !cJSON_IsNull(fmt) && !cJSON_IsString(fmt))
        return g4_oai_fail(err, 400, "messages", "%s: input_audio.format must be a string", what);
    unsigned char *data = NULL;
    size_t size = 0;
    const char *text = b64->valuestring;
    int rc;
    if (!strncmp(text, "data:", 5)) {
        rc = from_data_uri(text, lim->max_bytes, what, &data, &size, err);
    } else {
        g4_status st = g4_base64_decode(text, strlen(text), lim->max_bytes, what, &data, &size);
        rc = st == G4_OK ? 0 : g4_oai_fail(err, 400, "messages", "%s", g4_error_message());
    }
    if (rc) return rc;
    if (size == 0) {
        free(data);
        return g4_oai_fail(err, 400, "messages", "%s: the audio data is empty", what);
    }
    return add_item(out, G4_MEDIA_AUDIO, data, size, 0, index, err);
}

int g4_oai_collect_media(const cJSON *messages, const g4_media_limits *lim, g4_media_list *out, g4_oai_error *err) {
    memset(out, 0, sizeof *out);
    int n_images = 0, n_audio = 0, mi = 0, rc = 0;
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
                rc = g4_oai_fail(err, 400, "messages", "messages[%d].content[%d] must be an object with a \"type\"", mi,
                                 pi);
                break;
            }
            const char *t = type->valuestring;
            if (!strcmp(t, "text")) {
                if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text")))
                    rc = g4_oai_fail(err, 400, "messages", "messages[%d].content[%d].text must be a string", mi, pi);
            } else if (!strcmp(t, "image_url")) {
                if (++n_images > lim->max_images)
                    rc = g4_oai_fail(err, 400, "messages", "at most %d images per request", lim->max_images);
                else
                    rc = image_part(part, lim, out, n_images, err);
            } else if (!strcmp(t, "input_audio")) {
                if (++n_audio > lim->max_audio)
                    rc = g4_oai_fail(err, 400, "messages", "at most %d audio clips per request", lim->max_audio);
                else
                    rc = audio_part(part, lim, out, n_audio, err);
            } else {
                rc = g4_oai_fail(err, 400, "messages",
                                 "messages[%d].content[%d]: unsupported content type '%.40s' (text, image_url, "
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
