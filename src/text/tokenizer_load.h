/* Internal: readers of the tokenizer.json sections (tokenizer_steps.c). */
#ifndef G4_TEXT_TOKENIZER_LOAD_H
#define G4_TEXT_TOKENIZER_LOAD_H

#include <cjson/cJSON.h>

#include "text/tokenizer_internal.h"

const char *g4_json_type_name(const cJSON *obj);
int g4_json_bool(const cJSON *obj, const char *key, int dflt);

g4_status g4_read_normalizer(const char *label, const cJSON *obj, g4_steps *out);
g4_status g4_read_pre_tokenizer(const char *label, const cJSON *obj, g4_steps *out);
g4_status g4_read_decoder(const char *label, const cJSON *obj, g4_steps *out);
/* Composes the post-processor into a single-sequence template. */
g4_status g4_read_post_processor(const char *label, const cJSON *obj, g4_template_piece **pieces, int *n);

#endif
