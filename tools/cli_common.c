#include "cli_common.h"

#include "io/hub.h"
#include "runtime/context.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_option(int argc, char **argv, int *i, const char *name, const char **value) {
    if (strcmp(argv[*i], name) != 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "gemma4: option %s needs a value\n", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_flag(char **argv, int i, const char *name) { return strcmp(argv[i], name) == 0; }

int cli_parse_ids(const char *text, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16, count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return -1;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "gemma4: bad token id near '%.20s' (ids are non-negative integers separated by commas)\n",
                    p);
            free(out);
            return -1;
        }
        if (count == cap) {
            cap *= 2;
            int32_t *grown = realloc(out, cap * sizeof *grown);
            if (!grown) {
                free(out);
                return -1;
            }
            out = grown;
        }
        out[count++] = (int32_t)v;
        p = end;
    }
    *ids = out;
    *n = (int)count;
    return 0;
}

long cli_parse_count(const char *text, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < 0) {
        fprintf(stderr, "gemma4: %s must be a non-negative integer, got '%s'\n", what, text);
        return -1;
    }
    return v;
}

void cli_report_error(const char *cmd, g4_status st) {
    fprintf(stderr, "gemma4 %s: %s (%s)\n", cmd, g4_error_message(), g4_status_name(st));
}

int cli_create_backend(const char *device, int threads, g4_backend **be) {
    g4_status st = g4_backend_open(device, threads, be);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4: cannot create the %s backend: %s\n", device ? device : "default", g4_error_message());
        return 1;
    }
    return 0;
}

int cli_open_model(const char *path, int threads, g4_backend **be, g4_model **model) {
    return cli_open_model_on(path, NULL, threads, be, model);
}

int cli_open_model_on(const char *path, const char *device, int threads, g4_backend **be, g4_model **model) {
    *be = NULL;
    *model = NULL;
    /* a local directory, or ORG/NAME[@rev] already downloaded by `gemma4 pull` */
    char *dir = NULL;
    g4_status st = g4_resolve_model_path(path, &dir);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", g4_error_message());
        return 1;
    }
    if (cli_create_backend(device, threads, be) != 0) {
        free(dir);
        return 1;
    }
    st = g4_model_load_dir(dir, *be, model);
    free(dir);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4: cannot load model: %s\n", g4_error_message());
        g4_backend_destroy(*be);
        *be = NULL;
        return 1;
    }
    return 0;
}

void cli_close_model(g4_backend *be, g4_model *model) {
    g4_model_release(model);
    g4_backend_destroy(be);
}

const char *const cli_precision_help =
    "  --precision fast|exact  fast (the default of run, chat, serve, bench, perplexity): products in the\n"
    "                          precision measured sufficient (README, Precision); exact: float32-accurate\n"
    "                          (the default of logits and generate, the verification interfaces)\n";

int cli_precision_option(int argc, char **argv, int *i, g4_precision *precision) {
    const char *value = NULL;
    const int r = cli_option(argc, argv, i, "--precision", &value);
    if (r <= 0) return r;
    if (!strcmp(value, "exact"))
        *precision = G4_PRECISION_EXACT;
    else if (!strcmp(value, "fast"))
        *precision = G4_PRECISION_FAST;
    else {
        fprintf(stderr, "gemma4: --precision must be exact or fast, got '%s'\n", value);
        return -1;
    }
    return 1;
}

const char *const cli_kv_type_help =
    "  --kv-type f32|bf16|fp8  the KV cache's element type: bf16 (the default with --precision fast, unless\n"
    "                          the weights are float32), f32 (the default with exact), fp8 (e4m3 with a scale\n"
    "                          per row: a quarter of f32's bytes)\n";

int cli_kv_type_option(int argc, char **argv, int *i, g4_kv_type *type) {
    const char *value = NULL;
    const int r = cli_option(argc, argv, i, "--kv-type", &value);
    if (r <= 0) return r;
    const int t = g4_kv_type_parse(value);
    if (t < 0) {
        fprintf(stderr, "gemma4: --kv-type must be f32, bf16, fp8 or auto, got '%s'\n", value);
        return -1;
    }
    *type = (g4_kv_type)t;
    return 1;
}

int cli_parse_vision_mask(const char *text, g4_vision_mask *mask) {
    if (!strcmp(text, "default"))
        *mask = G4_VISION_MASK_DEFAULT;
    else if (!strcmp(text, "causal"))
        *mask = G4_VISION_MASK_CAUSAL;
    else if (!strcmp(text, "all-layers"))
        *mask = G4_VISION_MASK_ALL_LAYERS;
    else {
        fprintf(stderr, "gemma4: --vision-mask must be default, all-layers or causal, got '%s'\n", text);
        return -1;
    }
    return 0;
}
