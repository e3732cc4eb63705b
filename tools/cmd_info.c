/* gemma4 info: what a model directory holds and whether it loads. */
#include <stdio.h>
#include <stdlib.h>

#include "base/file.h"
#include "cli_common.h"

int cmd_info(int argc, char **argv) {
    const char *model_path = NULL, *device = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--device", &device))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            printf("usage: gemma4 info -m DIR [--device cpu|cuda|cuda:N]\n");
            return 0;
        } else {
            fprintf(stderr, "gemma4 info: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "usage: gemma4 info -m DIR [--device cpu|cuda|cuda:N]\n");
        return 2;
    }
    g4_backend *be;
    g4_model *model;
    if (cli_open_model_on(model_path, device, 0, &be, &model) != 0) return 1;
    char *text = g4_model_describe(model);
    if (text) fputs(text, stdout);
    free(text);
    size_t anon, file;
    g4_current_rss_split(&anon, &file);
    printf("memory       peak RSS %.1f MiB after loading (now %.1f MiB private, %.1f MiB mapped from files)\n",
           (double)g4_peak_rss_bytes() / (1 << 20), (double)anon / (1 << 20), (double)file / (1 << 20));
    cli_close_model(be, model);
    return 0;
}
