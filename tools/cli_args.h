/* The command line support that needs nothing but the public API
 * (gemma4.h): option values, id lists, errors, files, media files, the
 * --draft options. The commands built on gemma4.h alone (tokenize, logits,
 * perplexity, generate; run and chat through cli_generate.h) include only
 * this and gemma4.h; cli_common.h adds the internal helpers. */
#ifndef G4_TOOLS_CLI_ARGS_H
#define G4_TOOLS_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gemma4.h"

/* If argv[*i] is `name`, stores the next argument in *value, advances *i and
 * returns 1; prints an error and returns -1 when the value is missing. */
int cli_option(int argc, char **argv, int *i, const char *name, const char **value);
int cli_flag(char **argv, int i, const char *name);

/* "2,17,33" -> ids (malloc'd). Prints an error and returns -1 on bad input. */
int cli_parse_ids(const char *text, int32_t **ids, int *n);
/* Non-negative integer argument; -1 and an error message when malformed. */
long cli_parse_count(const char *text, const char *what);

/* --precision exact|fast as g4_open_options.exact: returns 1 and sets *exact
 * when argv[*i] is that option, -1 after an error message, 0 otherwise. */
int cli_exact_option(int argc, char **argv, int *i, int *exact);
extern const char *const cli_precision_help;
/* --kv-type f32|bf16|fp8|auto, kept by name (g4_open_options.kv_type): as
 * cli_exact_option. */
int cli_kv_type_name_option(int argc, char **argv, int *i, const char **name);
extern const char *const cli_kv_type_help;
/* --vision-mask default|all-layers|causal (g4_vision_mask_parse): 0, or -1
 * after an error message. */
int cli_check_vision_mask(const char *text);

/* Drafts a round when --draft-max is not given: the best tokens/s of 1..4 (1)
 * on the bundled model and its drafter (bench/RESULTS.md, "Speculative
 * decoding (issue 29)"). */
#define CLI_DRAFT_MAX_DEFAULT 1

/* --draft DIR (an MTP drafter, gemma4_assistant: a folder, a pulled
 * ORG/NAME or auto) and --draft-max N, shared by run, chat, generate,
 * info, bench and serve. */
typedef struct {
    const char *dir; /* NULL: no drafting */
    int draft_max;
} cli_draft_options;

/* Parses --draft / --draft-max at argv[*i]: 1 if consumed, 0 if not, -1 on a bad value. */
int cli_draft_option(int argc, char **argv, int *i, cli_draft_options *o);
void cli_draft_usage(FILE *f);
/* "gemma4: drafter DIR" to stderr when --draft auto found one (g4_draft_dir). */
void cli_report_auto_drafter(const cli_draft_options *o, const g4_handle *h);
/* " | draft 2: 1.43 accepted a round, 2.43 tokens a target pass, by position 0.81 0.62"
 * into buf. */
void cli_format_draft_stats(const g4_draft_stats *s, int draft_max, char *buf, size_t n);

/* A whole file (at most max_bytes, malloc'd, NUL-terminated): 0, or -1
 * with the library's message printed. */
int cli_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

/* Prints "gemma4 <cmd>: <message>" for the last library error. */
void cli_report_error(const char *cmd, g4_status st);
/* Makes `fmt` the error message cli_report_error prints; returns code. */
g4_status cli_fail(g4_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Tensors of a safetensors file as the commands write and read them. */
typedef enum { CLI_F32 = 0, CLI_I32, CLI_OTHER_TYPE } cli_dtype;
typedef struct {
    const char *name;
    cli_dtype dtype;
    int ndim;         /* 1 or 2 */
    int64_t shape[2];
    const void *data;
    size_t nbytes;    /* read: the stored size */
} cli_tensor;
g4_status cli_write_tensors(const char *path, const cli_tensor *t, int n);
typedef struct cli_tensor_file cli_tensor_file;
g4_status cli_open_tensors(const char *path, cli_tensor_file **out);
/* 1 and *t when the file holds `name` (CLI_OTHER_TYPE / ndim > 2: not for
 * reading as rows), else 0. */
int cli_find_tensor(const cli_tensor_file *f, const char *name, cli_tensor *t);
void cli_close_tensors(cli_tensor_file *f);

#define CLI_MAX_MEDIA 32

/* --image FILE / --audio FILE / --image-tokens N, read for g4_sequence_append_media. */
typedef struct {
    g4_media_file files[CLI_MAX_MEDIA];
    char *buffers[CLI_MAX_MEDIA];
    int n;
    int image_tokens; /* --image-tokens (0: the model's default) */
} cli_media_files;

/* The bytes of the next media file when `held` are read already (at most
 * CLI_MAX_MEDIA, 256 MiB each): 0, or -1 with the error printed. */
int cli_read_media_file(int held, const char *path, char **data, size_t *len);
/* Consumes --image/--audio/--image-tokens at argv[*i]: 1 if consumed, 0 if
 * not, -1 on error (message printed). */
int cli_media_files_option(int argc, char **argv, int *i, cli_media_files *m);
void cli_media_files_free(cli_media_files *m);

#endif
