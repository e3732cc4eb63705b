/* Helpers shared by the subcommands that still reach the internals
 * (backend, model, session): model opening, internal option types. The
 * public-API ones (option values, id lists, errors) are cli_args.h's. */
#ifndef G4_TOOLS_CLI_COMMON_H
#define G4_TOOLS_CLI_COMMON_H

#include <stdint.h>

#include "backend/backend.h"
#include "cli_args.h"
#include "model/model.h"
#include "runtime/session.h"

/* Creates the backend named by `device`: "cpu", "cuda" (device 0), "cuda:N",
 * or NULL/"auto" for CUDA when a GPU is usable and the CPU otherwise.
 * `threads` sizes the CPU backend. Prints the error and returns nonzero on
 * failure. */
int cli_create_backend(const char *device, int threads, g4_backend **be);
/* Opens the backend (auto device) and loads the model at `path`. Prints the
 * error and returns nonzero on failure. */
int cli_open_model(const char *path, int threads, g4_backend **be, g4_model **model);
/* The same on a chosen device (see cli_create_backend). */
int cli_open_model_on(const char *path, const char *device, int threads, g4_backend **be, g4_model **model);
void cli_close_model(g4_backend *be, g4_model *model);

/* --precision exact|fast (see g4_precision): returns 1 and sets *precision
 * when argv[*i] is that option, -1 after an error message, 0 otherwise. */
int cli_precision_option(int argc, char **argv, int *i, g4_precision *precision);
/* --kv-type f32|bf16|fp8|auto (see g4_kv_type): as cli_precision_option.
 * AUTO is resolved with the precision (g4_kv_type_resolve). */
int cli_kv_type_option(int argc, char **argv, int *i, g4_kv_type *type);

#endif
