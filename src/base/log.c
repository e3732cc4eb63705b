#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int current_level = -1;

static int level_from_env(void) {
    const char *s = getenv("G4_LOG");
    if (!s) return G4_LOG_WARN;
    if (!strcmp(s, "error")) return G4_LOG_ERROR;
    if (!strcmp(s, "info")) return G4_LOG_INFO;
    if (!strcmp(s, "debug")) return G4_LOG_DEBUG;
    return G4_LOG_WARN;
}

int g4_log_enabled(g4_log_level level) {
    if (current_level < 0) current_level = level_from_env();
    return (int)level <= current_level;
}

void g4_log_set_level(g4_log_level level) { current_level = (int)level; }

void g4_log(g4_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (!g4_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gemma4: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
