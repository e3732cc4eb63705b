/* gemma4 run: one answer to one prompt, streamed to stdout.
 *
 * On the public API alone (gemma4.h through cli_args.h / cli_generate.h):
 * g4_open, g4_input_chat / g4_input_text, g4_sequence_generate.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_generate.h"

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 run -m MODEL -p \"prompt\" [options]\n"
               "  -m MODEL          a model folder, or ORG/NAME fetched with `gemma4 pull`\n"
               "  -p TEXT           the user's message (or the raw prompt with --raw)\n"
               "  --system TEXT     a system message\n"
               "  --think           let the model reason first (printed to stderr)\n"
               "  --raw             no chat template: TEXT is the whole prompt (special tokens recognised)\n"
               "  --image FILE      an image (PNG, JPEG, WebP), repeatable, in prompt order\n"
               "  --audio FILE      an audio clip (WAV, FLAC, MP3, Ogg; E2B/E4B), repeatable\n"
               "  --image-tokens N  soft tokens per image: 70, 140, 280, 560 or 1120\n"
               "  --ctx N           context length (default 4096)\n"
               "  --device cpu|cuda --threads N\n");
    fputs(cli_precision_help, f);
    fputs(cli_kv_type_help, f);
    cli_sampling_usage(f);
    cli_constraint_usage(f);
    cli_draft_usage(f);
}

void cli_no_model_hint(void) {
    fprintf(stderr,
            "gemma4: no model given (-m). Get one from the Hugging Face hub, e.g.\n"
            "  gemma4 pull google/gemma-4-E2B-it           (bf16, 10 GB)\n"
            "  gemma4 pull mlx-community/gemma-4-e2b-it-4bit   (4-bit MLX, 3.6 GB)\n"
            "then: gemma4 run -m google/gemma-4-E2B-it -p \"Hello\".\n"
            "A small model trained on the King James Bible is built into build/models/tiny.\n");
}

int cmd_run(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *system = NULL, *device = NULL, *threads_text = NULL,
               *ctx_text = NULL, *kv_type = NULL;
    int think = 0, raw = 0, exact = 0;
    cli_generate_options go = {.max_tokens = 512, .show_reasoning = 1};
    g4_params_default(&go.sampling);
    cli_media_files media = {0};
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    cli_constraint constraint = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "-p", &prompt)) ||
            (r = cli_option(argc, argv, &i, "--system", &system)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_exact_option(argc, argv, &i, &exact)) || (r = cli_kv_type_name_option(argc, argv, &i, &kv_type)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--ctx", &ctx_text)) || (r = cli_media_files_option(argc, argv, &i, &media))) {
            if (r < 0) goto usage_error;
        } else if ((r = cli_sampling_option(argc, argv, &i, &go)) || (r = cli_draft_option(argc, argv, &i, &draft)) ||
                   (r = cli_constraint_option(argc, argv, &i, &constraint))) {
            if (r < 0) goto usage_error;
        } else if (cli_flag(argv, i, "--think")) {
            think = 1;
        } else if (cli_flag(argv, i, "--raw")) {
            raw = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            cli_media_files_free(&media);
            cli_constraint_free(&constraint);
            return 0;
        } else {
            fprintf(stderr, "gemma4 run: unknown argument '%s'\n", argv[i]);
            goto usage_error;
        }
    }
    if (!model_path) {
        cli_no_model_hint();
        cli_media_files_free(&media);
        cli_constraint_free(&constraint);
        return 2;
    }
    if (!prompt) {
        fprintf(stderr, "gemma4 run: -p \"prompt\" is required (or use `gemma4 chat`)\n");
        goto usage_error;
    }
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    long n_ctx = ctx_text ? cli_parse_count(ctx_text, "--ctx") : 4096;
    if (threads < 0 || n_ctx <= 0) goto usage_error;

    g4_handle *h;
    g4_open_options oo = {.device = device, .threads = (int)threads, .exact = exact, .kv_type = kv_type,
                          .sequences_only = 1, .draft = draft.dir, .draft_max = draft.draft_max};
    g4_status st = cli_open_with_tokenizer(model_path, &oo, &h);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4 run: %s\n", g4_error_message());
        cli_media_files_free(&media);
        cli_constraint_free(&constraint);
        return 1;
    }
    cli_report_auto_drafter(&draft, h);
    cli_sampling_resolve(&go, h);
    if (draft.dir && cli_constraint_given(&constraint)) fprintf(stderr, "gemma4: drafting is off for a constrained reply\n");
    g4_input *in = NULL;
    if (raw) {
        size_t len = strlen(prompt);
        char *text = malloc(len + 8);
        snprintf(text, len + 8, "%s%s", strncmp(prompt, "<bos>", 5) ? "<bos>" : "", prompt);
        st = g4_input_text(h, text, strlen(text), media.files, media.n, &in);
        free(text);
    } else {
        cJSON *messages = cJSON_CreateArray();
        if (system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", system);
            cJSON_AddItemToArray(messages, m);
        }
        cli_add_user_message(messages, media.files, media.n, prompt);
        char *json = cJSON_PrintUnformatted(messages);
        st = json ? g4_input_chat(h, json, NULL, think, media.files, media.n, &in)
                  : cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        free(json);
        cJSON_Delete(messages);
    }
    g4_input_info info = {0};
    if (st == G4_OK) g4_input_get_info(in, &info);
    if (st == G4_OK && info.audio_truncated) fprintf(stderr, "gemma4: audio longer than 30 s was cut to 30 s\n");
    g4_sequence *s = NULL;
    cli_generate_result res = {0};
    if (st == G4_OK) {
        g4_sequence_options so = {.n_ctx = (int)n_ctx};
        if (info.n_ids + 1 > so.n_ctx) so.n_ctx = info.n_ids + 1;
        st = g4_sequence_open(h, &so, &s);
    }
    if (st == G4_OK) st = cli_generate(h, s, in, &go, &constraint, NULL, &res);
    int rc = 0;
    if (st == G4_OK) {
        cli_print_stats(&res);
    } else {
        fprintf(stderr, "gemma4 run: %s\n", g4_error_message());
        rc = 1;
    }
    free(res.ids);
    cli_constraint_free(&constraint);
    g4_sequence_close(s);
    g4_input_free(in);
    g4_close(h);
    cli_media_files_free(&media);
    return rc;
usage_error:
    usage(stderr);
    cli_media_files_free(&media);
    cli_constraint_free(&constraint);
    return 2;
}
