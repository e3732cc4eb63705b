/* Small pieces the Responses and Messages translators share. */
#ifndef G4_SERVER_API_COMMON_H
#define G4_SERVER_API_COMMON_H

#include <cjson/cJSON.h>

#include "server/server_internal.h"

/* Moves src.name (when present and not null) to dst under dst_name. */
void g4_api_move(cJSON *dst, const char *dst_name, cJSON *src, const char *name);
/* A field that is present and not null, or NULL. */
cJSON *g4_api_field(const cJSON *obj, const char *name);
/* A 400 naming an item: param is printed from param_fmt and i, j (e.g.
 * "input[%d].content[%d]"); the message follows fmt. Returns -1. */
int g4_api_fail_item(g4_oai_error *err, const char *param_fmt, int i, int j, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The limits of this server's chat requests. */
g4_oai_limits g4_api_limits(const g4_server *s);

#endif
