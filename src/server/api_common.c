#include "server/api_common.h"

#include <stdarg.h>
#include <stdio.h>

#include "server/server_internal.h"

cJSON *g4_api_field(const cJSON *obj, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v;
}

void g4_api_move(cJSON *dst, const char *dst_name, cJSON *src, const char *name) {
    if (!g4_api_field(src, name)) return;
    cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(src, name);
    cJSON_DeleteItemFromObjectCaseSensitive(dst, dst_name);
    cJSON_AddItemToObject(dst, dst_name, v);
}

int g4_api_fail_item(g4_oai_error *err, const char *param_fmt, int i, int j, const char *fmt, ...) {
    g4_oai_fail(err, 400, NULL, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    snprintf(err->param_buf, sizeof err->param_buf, param_fmt, i, j);
    err->param = err->param_buf;
    return -1;
}

g4_oai_limits g4_api_limits(const g4_server *s) {
    g4_oai_limits lim = {s->model_name, s->ctx->model->config.text.vocab_size, &s->ctx->generation,
                         s->max_json_values};
    return lim;
}
