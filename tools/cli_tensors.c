/* cli_args.h's safetensors files and error messages, on the library's
 * reader and writer (io/safetensors.h, base/status.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/status.h"
#include "cli_args.h"
#include "io/safetensors.h"

g4_status cli_fail(g4_status code, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return g4_fail(code, "%s", text);
}

g4_status cli_write_tensors(const char *path, const cli_tensor *t, int n) {
    g4_st_write_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof *items);
    if (!items) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < n; k++) {
        items[k] = (g4_st_write_item){.name = t[k].name,
                                      .dtype = t[k].dtype == CLI_I32 ? G4_DTYPE_I32 : G4_DTYPE_F32,
                                      .ndim = t[k].ndim,
                                      .data = t[k].data};
        for (int d = 0; d < t[k].ndim && d < 2; d++) items[k].shape[d] = t[k].shape[d];
    }
    g4_status st = g4_st_write(path, items, (size_t)n);
    free(items);
    return st;
}

struct cli_tensor_file {
    g4_st_set *set;
};

g4_status cli_open_tensors(const char *path, cli_tensor_file **out) {
    *out = NULL;
    cli_tensor_file *f = calloc(1, sizeof *f);
    if (!f) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    g4_status st = g4_st_open(path, &f->set);
    if (st != G4_OK) {
        free(f);
        return st;
    }
    *out = f;
    return G4_OK;
}

int cli_find_tensor(const cli_tensor_file *f, const char *name, cli_tensor *t) {
    const g4_st_tensor *s = g4_st_find(f->set, name);
    if (!s) return 0;
    *t = (cli_tensor){.name = s->name,
                      .dtype = s->dtype == G4_DTYPE_F32 ? CLI_F32 : s->dtype == G4_DTYPE_I32 ? CLI_I32 : CLI_OTHER_TYPE,
                      .ndim = s->ndim,
                      .data = s->data,
                      .nbytes = (size_t)s->nbytes};
    for (int d = 0; d < s->ndim && d < 2; d++) t->shape[d] = s->shape[d];
    return 1;
}

void cli_close_tensors(cli_tensor_file *f) {
    if (!f) return;
    g4_st_close(f->set);
    free(f);
}
