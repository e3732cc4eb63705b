/* gemma4 synth: writes a full-size checkpoint with random weights to disk, to
 * measure loading real-size files without downloading one.
 *
 * Internal headers remain (model/synth_checkpoint.h): a developer tool that writes checkpoints.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/file.h"
#include "cli_common.h"
#include "model/synth_checkpoint.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 synth (--preset NAME | --config FILE) [--format bf16|mlx4|mlx8|mxfp4] -o DIR\n"
            "  --preset NAME   a compiled-in release config: %s\n"
            "  --config FILE   any config.json instead\n"
            "  --format F      bf16 (Hugging Face names; default), mlx4 (the mlx-community recipe where one\n"
            "                  exists), mlx8 or mxfp4 (MLX names and quantization block)\n"
            "  -o DIR          writes DIR/model.safetensors and DIR/config.json (text decoder only)\n"
            "The weights are the synthetic model's (`gemma4 bench --synthetic`): loading DIR gives it bit for bit.\n",
            g4_model_preset_names());
}

typedef struct {
    double start, last;
} progress_state;

static void report_progress(void *user, uint64_t written, uint64_t total) {
    progress_state *p = user;
    double now = g4_now_seconds();
    if (now - p->last < 5.0) return;
    p->last = now;
    fprintf(stderr, "gemma4 synth: %.2f of %.2f GB written (%.0f MB/s)\n", written / 1e9, total / 1e9,
            written / 1e6 / (now - p->start > 1e-3 ? now - p->start : 1e-3));
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *config_path = NULL, *format = "bf16", *out_dir = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "--preset", &preset)) ||
            (r = cli_option(argc, argv, &i, "--config", &config_path)) ||
            (r = cli_option(argc, argv, &i, "--format", &format)) || (r = cli_option(argc, argv, &i, "-o", &out_dir))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 synth: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!!preset == !!config_path || !out_dir) {
        usage(stderr);
        return 2;
    }
    const char *json = NULL;
    char *owned = NULL;
    size_t len = 0;
    g4_status st = preset ? g4_model_preset_config(preset, format, &json, &len)
                          : g4_read_file(config_path, (size_t)64 << 20, &owned, &len);
    if (owned) json = owned;
    progress_state progress = {g4_now_seconds(), g4_now_seconds()};
    g4_synth_checkpoint_options opt = {report_progress, &progress};
    g4_synth_checkpoint_info info;
    if (st == G4_OK)
        st = g4_synth_checkpoint_write(json, len, preset ? preset : config_path, format, out_dir, &opt, &info);
    free(owned);
    if (st != G4_OK) {
        cli_report_error("synth", st);
        return 1;
    }
    double seconds = g4_now_seconds() - progress.start;
    printf("wrote %s/model.safetensors: %zu tensors, %llu bytes of tensors (%.2f GB) in %.1f s; config.json beside it\n",
           out_dir, info.n_tensors, (unsigned long long)info.tensor_bytes, info.tensor_bytes / 1e9, seconds);
    return 0;
}
