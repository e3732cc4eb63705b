#include "cli_common.h"

#include "io/hub.h"
#include "runtime/context.h"

#include <stdio.h>
#include <stdlib.h>

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

int cli_precision_option(int argc, char **argv, int *i, g4_precision *precision) {
    int exact = 0;
    const int r = cli_exact_option(argc, argv, i, &exact);
    if (r > 0) *precision = exact ? G4_PRECISION_EXACT : G4_PRECISION_FAST;
    return r;
}

int cli_kv_type_option(int argc, char **argv, int *i, g4_kv_type *type) {
    const char *name = NULL;
    const int r = cli_kv_type_name_option(argc, argv, i, &name);
    if (r > 0) *type = (g4_kv_type)g4_kv_type_parse(name);
    return r;
}
