/* gemma4 chat: an interactive conversation. The session's sequence and KV
 * cache are kept between turns: each turn re-renders the conversation with
 * the chat template and only the part after what the cache can keep
 * (g4_session_reuse) is evaluated. Ctrl-C stops a reply, not the program.
 *
 * Internal headers remain (cli_common.h, cli_generate.h, cli_draft.h, cli_media.h,
 * text/reply_decode.h): a session kept between turns with sampling, drafting and the reply splitter,
 * which gemma4.h's g4_sequence does not offer yet (left while drafting changes in the engine).
 */
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_draft.h"
#include "cli_generate.h"
#include "cli_media.h"
#include "text/reply_decode.h"

void cli_no_model_hint(void);

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4 chat -m MODEL [--system TEXT] [--think] [--ctx N] [--device cpu|cuda] [options]\n"
               "In the chat: /image FILE and /audio FILE attach media to your next message, /think on|off,\n"
               "/reset starts over, /exit (or end of input) quits; Ctrl-C stops a reply.\n");
    fputs(cli_precision_help, f);
    fputs(cli_kv_type_help, f);
    cli_sampling_usage(f);
    cli_draft_usage(f);
}

static char *read_line(int tty) {
    if (tty) return readline("> ");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n = getline(&buf, &cap, stdin);
    if (n < 0) {
        free(buf);
        return NULL;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
    return buf;
}

int cmd_chat(int argc, char **argv) {
    const char *model_path = NULL, *system = NULL, *device = NULL, *threads_text = NULL, *ctx_text = NULL;
    int think = 0;
    g4_precision precision = G4_PRECISION_FAST;
    g4_kv_type kv_type = G4_KV_AUTO;
    cli_generate_options go = {.max_tokens = 1024, .show_reasoning = 1};
    g4_sampler_params_default(&go.sampling);
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--system", &system)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_precision_option(argc, argv, &i, &precision)) || (r = cli_kv_type_option(argc, argv, &i, &kv_type)) ||
            (r = cli_option(argc, argv, &i, "--threads", &threads_text)) ||
            (r = cli_option(argc, argv, &i, "--ctx", &ctx_text))) {
            if (r < 0) return 2;
        } else if ((r = cli_sampling_option(argc, argv, &i, &go)) || (r = cli_draft_option(argc, argv, &i, &draft))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--think")) {
            think = 1;
        } else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 chat: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path) {
        cli_no_model_hint();
        return 2;
    }
    long threads = threads_text ? cli_parse_count(threads_text, "--threads") : 0;
    long n_ctx = ctx_text ? cli_parse_count(ctx_text, "--ctx") : 4096;
    if (threads < 0 || n_ctx <= 0) return 2;
    g4_context *c;
    g4_context_options co = {.device = device, .threads = (int)threads, .require_tokenizer = 1,
                             .precision = precision};
    if (g4_context_open(model_path, &co, &c) != G4_OK) {
        fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
        return 1;
    }
    cli_sampling_resolve(&go, &c->generation);
    g4_assistant *drafter = NULL;
    if (draft.dir && cli_open_draft(&draft, c->model, &drafter) != 0) {
        g4_context_close(c);
        return 1;
    }
    go.draft = drafter;
    go.draft_max = draft.draft_max;
    g4_session *s;
    g4_session_options so = {.n_ctx = (int)n_ctx, .kv_type = g4_kv_type_resolve(kv_type, precision, c->model)};
    if (g4_session_create(c->model, &so, &s) != G4_OK) {
        fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
        g4_assistant_release(drafter);
        g4_context_close(c);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "gemma4 chat: %s — type /help for commands\n", c->dir);

    cJSON *messages = cJSON_CreateArray();
    cli_media pending = {0}, all_media = {0}; /* media of the next message / of the conversation */
    int rc = 0;
    for (;;) {
        interrupted = 0;
        char *line = read_line(tty);
        if (!line) break;
        if (tty && *line) add_history(line);
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/help")) {
            usage(stderr);
        } else if (!strcmp(line, "/reset")) {
            cJSON_Delete(messages);
            messages = cJSON_CreateArray();
            cli_media_free(&pending);
            cli_media_free(&all_media);
            g4_session_reset(s);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (!strncmp(line, "/think", 6)) {
            think = strstr(line, "off") == NULL;
            fprintf(stderr, "(thinking %s)\n", think ? "on" : "off");
        } else if (!strncmp(line, "/image ", 7) || !strncmp(line, "/audio ", 7)) {
            char *args[] = {line[1] == 'i' ? "--image" : "--audio", line + 7};
            int i = 0;
            if (cli_media_option(2, args, &i, &pending) > 0) fprintf(stderr, "(attached %s)\n", line + 7);
        } else if (*line) {
            /* the system message goes first, once */
            if (system && cJSON_GetArraySize(messages) == 0) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "system");
                cJSON_AddStringToObject(m, "content", system);
                cJSON_AddItemToArray(messages, m);
            }
            cli_media_add_user_message(&pending, messages, line);
            for (int k = 0; k < pending.n && all_media.n < CLI_MAX_MEDIA; k++) {
                all_media.items[all_media.n] = pending.items[k];
                all_media.buffers[all_media.n++] = pending.buffers[k];
            }
            pending.n = 0;
            g4_prompt p = {0};
            g4_prompt_options po = {.chat = {.add_generation_prompt = 1, .enable_thinking = think}};
            g4_status st = g4_prompt_from_messages(c, messages, NULL, &po, all_media.items, all_media.n, &p);
            cli_generate_result res = {0};
            int from = 0;
            if (st == G4_OK) {
                if (p.n_ids + 1 >= s->opt.n_ctx)
                    st = g4_fail(G4_ERR_LIMIT, "the conversation (%d tokens) fills the context of %d; /reset",
                                 p.n_ids, s->opt.n_ctx);
                else {
                    from = g4_session_reuse(s, p.ids, p.n_ids); /* the KV cache the conversation repeats */
                    st = cli_generate(c, s, &p, from, &go, &interrupted, &res);
                }
            }
            if (st == G4_OK) {
                cli_print_stats(&res);
                /* what the model said joins the conversation */
                char *said = NULL;
                size_t said_len = 0;
                g4_chat_reply reply = {0};
                if (g4_decode_reply(c->tokenizer, res.ids, (size_t)res.n_generated, &said, &said_len) == G4_OK &&
                    g4_chat_parse_reply(said, said_len, p.starts_in_reasoning, &reply) == G4_OK) {
                    cJSON *a = cJSON_CreateObject();
                    cJSON_AddStringToObject(a, "role", "assistant");
                    cJSON_AddStringToObject(a, "content", reply.content ? reply.content : "");
                    cJSON_AddItemToArray(messages, a);
                }
                g4_chat_reply_free(&reply);
                free(said);
            } else {
                fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
                cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1); /* forget the failed turn */
                g4_session_reset(s);
            }
            free(res.ids);
            g4_prompt_free(c, &p);
        }
        free(line);
    }
    cJSON_Delete(messages);
    cli_media_free(&pending);
    cli_media_free(&all_media);
    g4_session_destroy(s);
    g4_assistant_release(drafter);
    g4_context_close(c);
    return rc;
}
