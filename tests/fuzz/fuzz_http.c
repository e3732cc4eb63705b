/* libFuzzer target: the server's HTTP request path, whole. One in-process
 * server (the dense fixture with the tiny tokenizer, an API key, a small
 * body limit) answers every input: the input's bytes go to it over a
 * loopback connection as they are (request line, headers, body, and
 * whatever follows: pipelined requests, chunked framing, garbage), the
 * write side is closed, and the answer is read until the server closes.
 * So libmicrohttpd's parsing, our header checks (NUL bytes, framing, key),
 * body limits, the strict JSON check, request validation, prompt building
 * and short generations all run under ASan/UBSan with coverage feedback.
 * A server that neither answers nor closes within 20 s is a finding (so is
 * any input slower than libFuzzer's -timeout), and so is one that stops
 * accepting connections. (Its request and idle timeouts are 2 s: a hang of
 * the connection would end there; the margin is for a loaded machine.) */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "runtime/context.h"
#include "runtime/engine.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int port;
static g4_context *ctx;
static g4_engine *engine;
static g4_server *srv;

/* At exit (libFuzzer ends with exit()): stop the server and the engine
 * thread before the OpenMP runtime goes away under them. */
static void stop_all(void) {
    g4_server_stop(srv);
    g4_engine_stop(engine, 1);
    g4_engine_destroy(engine);
    g4_context_close(ctx);
}

static void link_file(const char *from_dir, const char *name, const char *to_dir, const char *as) {
    char from[4096], to[4096], real[4096];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, as ? as : name);
    if (!realpath(from, real) || symlink(real, to) != 0) {
        fprintf(stderr, "fuzz_http: cannot link %s\n", from);
        exit(1);
    }
}

/* The dense fixture as a model folder, as tests/scripts/test_server_openai.py builds it. */
static void make_model_dir(char *dir) {
    const char *fixtures = getenv("G4_FIXTURES") ? getenv("G4_FIXTURES") : G4_FIXTURE_DIR;
    const char *data = getenv("G4_TEST_DATA") ? getenv("G4_TEST_DATA") : G4_SOURCE_DIR "/tests/data";
    char src[4096], tok[4096], tmpl[4096];
    snprintf(src, sizeof src, "%s/dense", fixtures);
    snprintf(tok, sizeof tok, "%s/tiny_tokenizer", data);
    snprintf(tmpl, sizeof tmpl, "%s/chat/templates", data);
    if (!mkdtemp(dir)) exit(1);
    link_file(src, "config.json", dir, NULL);
    link_file(src, "model.safetensors", dir, NULL);
    link_file(src, "generation_config.json", dir, NULL);
    link_file(tok, "tokenizer.json", dir, NULL);
    link_file(tmpl, "gemma-4-31B-it.chat_template.jinja", dir, "chat_template.jinja");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static char dir[] = "/tmp/fuzz_http.XXXXXX";
    make_model_dir(dir);
    g4_context_options co = {.device = "cpu", .threads = 1, .require_tokenizer = 1};
    g4_engine_options eo = {.max_seqs = 4, .n_ctx = 256, .max_batch_tokens = 64, .max_queue = 8, .threads = 1};
    g4_server_options so = {.port = 0, .api_key = "k", .model_name = "dense", .max_body = 64 * 1024,
                            .max_tokens = 2, .request_timeout_s = 2, .idle_timeout_s = 2, .max_connections = 64,
                            .threads = 1};
    if (g4_context_open(dir, &co, &ctx) != G4_OK || g4_engine_create(ctx->model, &eo, &engine) != G4_OK ||
        g4_engine_start(engine) != G4_OK || g4_server_start(ctx, engine, &so, &srv) != G4_OK) {
        fprintf(stderr, "fuzz_http: cannot start the server: %s\n", g4_error_message());
        exit(1);
    }
    port = g4_server_port(srv);
    signal(SIGPIPE, SIG_IGN);
    atexit(stop_all);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    /* each connection from the next of 250 loopback addresses: the server's
     * side of a closed connection waits in TIME_WAIT for a minute, and at a
     * thousand connections a second one address would run out of ports */
    static unsigned next_source;
    struct sockaddr_in from = {.sin_family = AF_INET};
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + next_source++ % 250);
    bind(fd, (struct sockaddr *)&from, sizeof from);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        /* the server stopped listening (a finding), or no local port is free (not one) */
        int e = errno;
        close(fd);
        if (e == ECONNREFUSED) {
            fprintf(stderr, "fuzz_http: the server refuses connections\n");
            __builtin_trap();
        }
        usleep(1000);
        return 0;
    }
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t sent = 0;
    while (sent < size) {
        ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n <= 0) break; /* the server answered and closed early (413, 400...) */
        sent += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    char buf[65536];
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            fprintf(stderr, "fuzz_http: no close 20 s after the input (%zu of %zu bytes sent, %zu received)\n", sent,
                    size, got);
            __builtin_trap();
        }
        break;
    }
    close(fd);
    return 0;
}
