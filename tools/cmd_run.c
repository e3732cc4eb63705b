/* gemma4 run: one answer to one prompt, streamed to stdout.
 *
 * Internal headers remain (cli_common.h, cli_generate.h, cli_draft.h, cli_media.h: runtime/session,
 * sampler, prompt, speculative, constrain): token-by-token sampling with an MTP drafter and
 * constrained decoding, which gemma4.h's g4_sequence does not offer yet (left while drafting changes
 * in the engine).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_draft.h"
#include "cli_generate.h"
#include "cli_media.h"
#include "constrain/token_mask.h"

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
               *ctx_text = NULL;
    int think = 0, raw = 0;
    g4_precision precision = G4_PRECISION_FAST;
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_generate_options go = {.max_tokens = 512, .show_reasoning = 1};
    g4_sampler_params_default(&go.sampling);
    cli_media media = {0};
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    g4_constraint_spec constraint = {0};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "-p", &prompt)) ||
            (r = cli_option(argc, argv, &i, "--system", &system)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--ctx", &ctx_text)) || (r = cli_media_option(argc, argv, &i, &media))) {
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
            cli_media_free(&media);
            return 0;
        } else {
            fprintf(stderr, "gemma4 run: unknown argument '%s'\n", argv[i]);
            goto usage_error;
        }
    }
    if (!model_path) {
        cli_no_model_hint();
        cli_media_free(&media);
        g4_constraint_spec_free(&constraint);
        return 2;
    }
    if (!prompt) {
        fprintf(stderr, "gemma4 run: -p \"prompt\" is required (or use `gemma4 chat`)\n");
        goto usage_error;
    }
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    long n_ctx = ctx_text ? cli_parse_count(ctx_text, "--ctx") : 4096;
    if (threads < 0 || n_ctx <= 0) goto usage_error;

    g4_context *c;
    g4_context_options co = {.device = device, .threads = (int)threads, .require_tokenizer = 1,
                             .precision = precision};
    g4_status st = g4_context_open(model_path, &co, &c);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4 run: %s\n", g4_error_message());
        cli_media_free(&media);
        g4_constraint_spec_free(&constraint);
        return 1;
    }
    cli_sampling_resolve(&go, &c->generation);
    g4_assistant *drafter = NULL;
    if (draft.dir && cli_open_draft(&draft, c->model, &drafter) != 0) {
        g4_context_close(c);
        cli_media_free(&media);
        g4_constraint_spec_free(&constraint);
        return 1;
    }
    go.draft = drafter;
    go.draft_max = draft.draft_max;
    g4_prompt p = {0};
    if (raw) {
        size_t len = strlen(prompt);
        char *text = malloc(len + 8);
        snprintf(text, len + 8, "%s%s", strncmp(prompt, "<bos>", 5) ? "<bos>" : "", prompt);
        st = g4_prompt_from_text(c, text, strlen(text), media.items, media.n, &p);
        free(text);
    } else {
        cJSON *messages = cJSON_CreateArray();
        if (system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", system);
            cJSON_AddItemToArray(messages, m);
        }
        cli_media_add_user_message(&media, messages, prompt);
        g4_prompt_options po = {.chat = {.add_generation_prompt = 1, .enable_thinking = think}};
        st = g4_prompt_from_messages(c, messages, NULL, &po, media.items, media.n, &p);
        cJSON_Delete(messages);
    }
    if (st == G4_OK && p.audio_truncated) fprintf(stderr, "gemma4: audio longer than 30 s was cut to 30 s\n");
    g4_session *s = NULL;
    cli_generate_result res = {0};
    if (st == G4_OK) {
        g4_session_options so = {.n_ctx = (int)n_ctx, .kv_type = g4_kv_type_resolve(kv_type, precision, c->model)};
        if (p.n_ids + 1 > so.n_ctx) so.n_ctx = p.n_ids + 1;
        st = g4_session_create(c->model, &so, &s);
    }
    if (st == G4_OK && cli_constraint_matcher(c, &constraint, think && !raw, p.starts_in_reasoning, &go.constraint))
        st = G4_ERR_INVALID_ARGUMENT;
    if (st == G4_OK) st = cli_generate(c, s, &p, 0, &go, NULL, &res);
    int rc = 0;
    if (st == G4_OK) {
        cli_print_stats(&res);
    } else {
        fprintf(stderr, "gemma4 run: %s\n", g4_error_message());
        rc = 1;
    }
    free(res.ids);
    g4_token_matcher_free(go.constraint);
    g4_constraint_spec_free(&constraint);
    g4_session_destroy(s);
    g4_prompt_free(c, &p);
    g4_assistant_release(drafter);
    g4_context_close(c);
    cli_media_free(&media);
    return rc;
usage_error:
    usage(stderr);
    cli_media_free(&media);
    g4_constraint_spec_free(&constraint);
    return 2;
}
