/* gemma4 info: what a model directory holds and whether it loads. The
 * model and its summary come through the public API (g4_open,
 * g4_model_summary); internal headers remain for what it lacks: the memory
 * plan (cli_memory.h: KV bytes per token, the device's memory), drafters
 * (cli_draft.h, g4_assistant_*), synthetic models (g4_model_synthesize)
 * and the folder's config (io/config.h, io/hub.h), reached through the
 * handle's context (api/api_handle.h). */
#include <stdio.h>
#include <stdlib.h>

#include "api/api_handle.h"
#include "base/file.h"
#include "cli_common.h"
#include "cli_draft.h"
#include "cli_memory.h"
#include "model/kv_cache.h"
#include "io/config.h"
#include "io/hub.h"

/* gemma4 info -m DRAFTER: a drafter alone (no target to check it against). */
static int describe_drafter_alone(const char *dir, const char *device) {
    g4_backend *be;
    if (cli_create_backend(device, 0, &be) != 0) return 1;
    g4_assistant *a = NULL;
    g4_status st = g4_assistant_load_dir(dir, be, &a);
    int rc = 0;
    if (st == G4_OK) {
        char *text = g4_assistant_describe(a);
        if (text) fputs(text, stdout);
        free(text);
        printf("  (run it with its target: gemma4 info -m TARGET --draft %s)\n", dir);
    } else {
        fprintf(stderr, "gemma4: cannot load drafter: %s\n", g4_error_message());
        rc = 1;
    }
    g4_assistant_release(a);
    g4_backend_destroy(be);
    return rc;
}

/* Whether the folder holds an MTP drafter (its config says so). */
static int is_drafter_dir(const char *path) {
    char *dir = NULL;
    g4_config c;
    int drafter = 0;
    if (g4_resolve_model_path(path, &dir) == G4_OK && g4_config_load(dir, &c) == G4_OK) {
        drafter = c.assistant.present;
        g4_config_free(&c);
    }
    free(dir);
    g4_error_clear();
    return drafter;
}

int cmd_info(int argc, char **argv) {
    const char *model_path = NULL, *device = NULL, *fraction_text = NULL, *chunk_text = NULL, *synthetic = NULL,
               *format = "bf16";
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_option(argc, argv, &i, "--synthetic", &synthetic)) ||
            (r = cli_option(argc, argv, &i, "--format", &format)) ||
            (r = cli_draft_option(argc, argv, &i, &draft)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_option(argc, argv, &i, "--gpu-memory", &fraction_text)) ||
            (r = cli_option(argc, argv, &i, "--max-batch-tokens", &chunk_text))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            printf("usage: gemma4 info (-m DIR | --synthetic NAME [--format F]) [--device cpu|cuda|cuda:N]\n"
                   "                   [--draft DRAFTER] [--kv-type f32|bf16|fp8]\n"
                   "                   [--gpu-memory FRACTION] [--max-batch-tokens N]\n"
                   "  The memory plan: KV bytes per token of the full and the sliding layers, the sliding rings'\n"
                   "  fixed cost, and the longest context of 1 and of 16 sequences at each KV type within\n"
                   "  FRACTION (default 0.9) of the device's memory (CPU: of the memory available now).\n");
            return 0;
        } else {
            fprintf(stderr, "gemma4 info: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    double fraction = 0.9;
    if (fraction_text && (sscanf(fraction_text, "%lf", &fraction) != 1 || !(fraction > 0 && fraction <= 1))) {
        fprintf(stderr, "gemma4 info: --gpu-memory must be a fraction in (0, 1], got '%s'\n", fraction_text);
        return 2;
    }
    const long chunk = chunk_text ? cli_parse_count(chunk_text, "--max-batch-tokens") : 512;
    if (chunk <= 0) return 2;
    if (synthetic && !model_path) { /* a full-size model's plan on this device, weights random (as bench's) */
        g4_backend *be;
        g4_model *model = NULL;
        if (cli_create_backend(device, 0, &be) != 0) return 1;
        g4_status st = g4_model_synthesize(synthetic, format, be, &model);
        if (st != G4_OK) {
            cli_report_error("info", st);
            g4_backend_destroy(be);
            return 1;
        }
        /* (g4_model_describe reads a checkpoint's tensor table, which a synthetic model has none of) */
        printf("model        synthetic %s (%s), %d layers, window %d, %d positions, %s backend\n", synthetic, format,
               model->config.text.n_layers, model->config.text.sliding_window, model->config.text.max_position,
               be->ops->name);
        cli_print_memory(stdout, model, g4_kv_type_resolve(kv_type, G4_PRECISION_FAST, model), (int)chunk, fraction);
        cli_close_model(be, model);
        return 0;
    }
    if (!model_path) {
        fprintf(stderr, "usage: gemma4 info -m DIR [--device cpu|cuda|cuda:N]\n");
        return 2;
    }
    if (!draft.dir && is_drafter_dir(model_path)) return describe_drafter_alone(model_path, device);
    g4_handle *h;
    g4_open_options oo = {.device = device, .sequences_only = 1};
    if (g4_open(model_path, &oo, &h) != G4_OK) {
        fprintf(stderr, "gemma4: cannot load model: %s\n", g4_error_message());
        return 1;
    }
    g4_model *model = g4_handle_context(h)->model;
    char *text = g4_model_summary(h);
    if (text) fputs(text, stdout);
    g4_free(text);
    if (draft.dir) {
        g4_assistant *a = NULL;
        if (cli_open_draft(&draft, model, &a) != 0) {
            g4_close(h);
            return 1;
        }
        text = g4_assistant_describe(a);
        if (text) fputs(text, stdout);
        free(text);
        printf("  attached: its sliding layers read the target's layer %d, its full layers layer %d\n",
               a->target_layer[G4_LAYER_SLIDING], a->target_layer[G4_LAYER_FULL]);
        g4_assistant_release(a);
    }
    /* (the fast path's default type: info describes what run, chat and serve would use) */
    cli_print_memory(stdout, model, g4_kv_type_resolve(kv_type, G4_PRECISION_FAST, model), (int)chunk, fraction);
    size_t anon, file;
    g4_current_rss_split(&anon, &file);
    printf("memory       peak RSS %.1f MiB after loading (now %.1f MiB private, %.1f MiB mapped from files)\n",
           (double)g4_peak_rss_bytes() / (1 << 20), (double)anon / (1 << 20), (double)file / (1 << 20));
    g4_close(h);
    return 0;
}
