#include "cli_media.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_common.h"

static int add_file(cli_media *m, const char *path, g4_media_kind kind) {
    char *data;
    size_t len;
    if (cli_read_media_file(m->n, path, &data, &len) != 0) return -1;
    m->buffers[m->n] = data;
    m->items[m->n] = (g4_media_input){.kind = kind, .data = (const unsigned char *)data, .size = len, .label = path,
                                      .max_soft_tokens = m->image_tokens};
    m->n++;
    return 1;
}

int cli_media_option(int argc, char **argv, int *i, cli_media *m) {
    const char *v;
    int r;
    if ((r = cli_option(argc, argv, i, "--image", &v))) return r < 0 ? -1 : add_file(m, v, G4_MEDIA_IMAGE);
    if ((r = cli_option(argc, argv, i, "--audio", &v))) return r < 0 ? -1 : add_file(m, v, G4_MEDIA_AUDIO);
    if ((r = cli_option(argc, argv, i, "--image-tokens", &v))) {
        long n = r > 0 ? cli_parse_count(v, "--image-tokens") : -1;
        if (n < 0) return -1;
        m->image_tokens = (int)n;
        for (int k = 0; k < m->n; k++)
            if (m->items[k].kind == G4_MEDIA_IMAGE) m->items[k].max_soft_tokens = (int)n;
        return 1;
    }
    return 0;
}

void cli_media_free(cli_media *m) {
    for (int k = 0; k < m->n; k++) free(m->buffers[k]);
    m->n = 0;
}

void cli_media_add_user_message(const cli_media *m, void *messages, const char *text) {
    cJSON *user = cJSON_CreateObject(), *content = cJSON_CreateArray();
    cJSON_AddStringToObject(user, "role", "user");
    for (int k = 0; k < m->n; k++) {
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", m->items[k].kind == G4_MEDIA_IMAGE ? "image" : "audio");
        cJSON_AddItemToArray(content, part);
    }
    cJSON *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "text");
    cJSON_AddStringToObject(part, "text", text);
    cJSON_AddItemToArray(content, part);
    cJSON_AddItemToObject(user, "content", content);
    cJSON_AddItemToArray(messages, user);
}
