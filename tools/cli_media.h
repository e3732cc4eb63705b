/* --image FILE / --audio FILE options: files read into prompt media inputs
 * (run, chat; tools on the public API read them with cli_media_files). */
#ifndef G4_TOOLS_CLI_MEDIA_H
#define G4_TOOLS_CLI_MEDIA_H

#include "cli_args.h"
#include "runtime/prompt.h"

typedef struct {
    g4_media_input items[CLI_MAX_MEDIA];
    char *buffers[CLI_MAX_MEDIA];
    int n;
    int image_tokens; /* --image-tokens (0: the model's default) */
} cli_media;

/* Consumes --image/--audio/--image-tokens at argv[*i]: 1 if consumed, 0 if
 * not, -1 on error (message printed). */
int cli_media_option(int argc, char **argv, int *i, cli_media *m);
void cli_media_free(cli_media *m);
/* Appends a user message {"role": "user", "content": [media parts..., text]}
 * to the cJSON array `messages` (media parts in order, then the text). */
void cli_media_add_user_message(const cli_media *m, void *messages, const char *text);

#endif
