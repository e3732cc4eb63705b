/* Everything needed to talk to a model: the weights on a backend, the
 * tokenizer, the chat template variant, generation defaults and stop tokens.
 * Shared by the CLI commands, the server and the public API. */
#ifndef G4_RUNTIME_CONTEXT_H
#define G4_RUNTIME_CONTEXT_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"
#include "media/image.h"
#include "media/image_resize.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define G4_MAX_STOP_IDS 16

typedef struct {
    const char *device;       /* "cpu", "cuda" or NULL (cuda when present, else cpu) */
    int threads;              /* CPU threads (0: all) */
    int require_tokenizer;    /* fail when the folder has no tokenizer.json */
    g4_precision precision;   /* the backend's products (0: EXACT) */
} g4_context_options;

typedef struct g4_context {
    char *dir;
    g4_backend *backend;
    g4_model *model;
    g4_tokenizer *tokenizer;  /* NULL when the folder has none (ids-only use) */
    g4_chat_variant_info chat;
    g4_generation_config generation;
    int32_t stop_ids[G4_MAX_STOP_IDS];
    int n_stop;
    int image_tokens;         /* soft tokens per image by default (processor_config image_seq_length, else 280) */
    int audio_tokens_max;     /* processor_config audio_seq_length, else 750 */
    g4_image_backend image_backend; /* the resize whose pixels the references used */
    struct g4_constraints *constraints; /* constrained decoding against the tokenizer (NULL without one) */
} g4_context;

/* `path` is a model directory or an ORG/NAME[@rev] already in the hub cache. */
g4_status g4_context_open(const char *path, const g4_context_options *opt, g4_context **out);
void g4_context_close(g4_context *c);

/* Creates the backend named by `device` (see g4_context_options). */
g4_status g4_backend_open(const char *device, int threads, g4_backend **out);

#endif
