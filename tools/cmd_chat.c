/* gemma4 chat: an interactive conversation. The sequence and its KV cache
 * are kept between turns: each turn re-renders the conversation with the
 * chat template and g4_sequence_generate evaluates only the part after what
 * the sequence can keep. Ctrl-C stops a reply, not the program.
 *
 * On the public API alone (gemma4.h through cli_args.h / cli_generate.h).
 */
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_generate.h"

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
    const char *model_path = NULL, *system = NULL, *device = NULL, *threads_text = NULL, *ctx_text = NULL,
               *kv_type = NULL;
    int think = 0, exact = 0;
    cli_generate_options go = {.max_tokens = 1024, .show_reasoning = 1};
    g4_params_default(&go.sampling);
    cli_draft_options draft = {.draft_max = CLI_DRAFT_MAX_DEFAULT};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "-m", &model_path)) || (r = cli_option(argc, argv, &i, "--system", &system)) ||
            (r = cli_option(argc, argv, &i, "--device", &device)) ||
            (r = cli_exact_option(argc, argv, &i, &exact)) || (r = cli_kv_type_name_option(argc, argv, &i, &kv_type)) ||
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
    g4_handle *h;
    g4_open_options oo = {.device = device, .threads = (int)threads, .exact = exact, .kv_type = kv_type,
                          .sequences_only = 1, .draft = draft.dir, .draft_max = draft.draft_max};
    if (cli_open_with_tokenizer(model_path, &oo, &h) != G4_OK) {
        fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
        return 1;
    }
    cli_report_auto_drafter(&draft, h);
    cli_sampling_resolve(&go, h);
    const cli_constraint no_constraint = {0};
    g4_sequence *s;
    g4_sequence_options so = {.n_ctx = (int)n_ctx};
    if (g4_sequence_open(h, &so, &s) != G4_OK) {
        fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
        g4_close(h);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "gemma4 chat: %s — type /help for commands\n", model_path);

    cJSON *messages = cJSON_CreateArray();
    cli_media_files pending = {0}, all_media = {0}; /* media of the next message / of the conversation */
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
            cli_media_files_free(&pending);
            cli_media_files_free(&all_media);
            g4_sequence_truncate(s, 0);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (!strncmp(line, "/think", 6)) {
            think = strstr(line, "off") == NULL;
            fprintf(stderr, "(thinking %s)\n", think ? "on" : "off");
        } else if (!strncmp(line, "/image ", 7) || !strncmp(line, "/audio ", 7)) {
            char *args[] = {line[1] == 'i' ? "--image" : "--audio", line + 7};
            int i = 0;
            if (cli_media_files_option(2, args, &i, &pending) > 0) fprintf(stderr, "(attached %s)\n", line + 7);
        } else if (*line) {
            /* the system message goes first, once */
            if (system && cJSON_GetArraySize(messages) == 0) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "system");
                cJSON_AddStringToObject(m, "content", system);
                cJSON_AddItemToArray(messages, m);
            }
            cli_add_user_message(messages, pending.files, pending.n, line);
            for (int k = 0; k < pending.n && all_media.n < CLI_MAX_MEDIA; k++) {
                all_media.files[all_media.n] = pending.files[k];
                all_media.buffers[all_media.n++] = pending.buffers[k];
            }
            pending.n = 0;
            g4_input *in = NULL;
            char *json = cJSON_PrintUnformatted(messages);
            g4_status st = json ? g4_input_chat(h, json, NULL, think, all_media.files, all_media.n, &in)
                                : cli_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
            free(json);
            cli_generate_result res = {0};
            g4_input_info info = {0};
            if (st == G4_OK) {
                g4_input_get_info(in, &info);
                if (info.n_ids + 1 >= n_ctx)
                    st = cli_fail(G4_ERR_LIMIT, "the conversation (%d tokens) fills the context of %ld; /reset",
                                  info.n_ids, n_ctx);
                else /* the sequence keeps the KV cache the conversation repeats */
                    st = cli_generate(h, s, in, &go, &no_constraint, &interrupted, &res);
            }
            if (st == G4_OK) {
                cli_print_stats(&res);
                /* what the model said joins the conversation */
                char *content = NULL;
                if (g4_reply_content(h, res.ids, (size_t)res.n_ids, info.starts_in_reasoning, &content) == G4_OK) {
                    cJSON *a = cJSON_CreateObject();
                    cJSON_AddStringToObject(a, "role", "assistant");
                    cJSON_AddStringToObject(a, "content", content);
                    cJSON_AddItemToArray(messages, a);
                }
                g4_free(content);
            } else {
                fprintf(stderr, "gemma4 chat: %s\n", g4_error_message());
                cJSON_DeleteItemFromArray(messages, cJSON_GetArraySize(messages) - 1); /* forget the failed turn */
                g4_sequence_truncate(s, 0);
            }
            free(res.ids);
            g4_input_free(in);
        }
        free(line);
    }
    cJSON_Delete(messages);
    cli_media_files_free(&pending);
    cli_media_files_free(&all_media);
    g4_sequence_close(s);
    g4_close(h);
    return rc;
}
