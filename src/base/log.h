/* Minimal levelled logging to stderr. The level comes from G4_LOG
 * (error, warn, info, debug); the default is warn. */
#ifndef G4_BASE_LOG_H
#define G4_BASE_LOG_H

typedef enum { G4_LOG_ERROR = 0, G4_LOG_WARN, G4_LOG_INFO, G4_LOG_DEBUG } g4_log_level;

void g4_log(g4_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void g4_log_set_level(g4_log_level level);
int g4_log_enabled(g4_log_level level);

#endif
