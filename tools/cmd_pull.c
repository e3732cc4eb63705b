/* gemma4 pull: download a model from the Hugging Face hub into the local
 * cache and print its directory. Progress goes to stderr: a live bar on a
 * terminal, plain lines otherwise (logs, CI).
 *
 * Internal headers remain (io/hub.h): the hub downloader is not part of gemma4.h.
 */
#include <signal.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/file.h"
#include "io/hub.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 pull ORG/NAME[@REVISION] [options]\n"
            "\n"
            "Downloads config, tokenizer, chat template and safetensors weights of a hub model\n"
            "(resuming partial downloads, checking sizes and checksums) and prints its directory.\n"
            "\n"
            "  --revision R     branch, tag or commit (default: main)\n"
            "  --cache DIR      hub cache (default: $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub;\n"
            "                   the layout is huggingface_hub's, so both share downloads)\n"
            "  --endpoint URL   hub address (default: $HF_ENDPOINT or https://huggingface.co)\n"
            "  --verify         re-hash files that are already in the cache\n"
            "  --offline        no network: print the cached directory or fail (also HF_HUB_OFFLINE=1)\n"
            "  --retries N      retries per request after transient errors (default 5)\n"
            "  --backoff-ms N   first retry delay, doubled each time (default 1000)\n"
            "  -q, --quiet      no progress output\n"
            "\n"
            "Gated models (such as Google's Gemma) need an access token of an account that accepted the\n"
            "license: set HF_TOKEN (or log in with `hf auth login`, which writes $HF_HOME/token).\n");
}

/* ---- progress ---- */

typedef struct {
    int tty;
    double file_start;     /* when the current file started */
    uint64_t resumed_from; /* bytes the current file already had */
    double last_draw;
} progress_state;

static void human_bytes(uint64_t n, char *buf, size_t size) {
    if (n >= 1000000000ull) snprintf(buf, size, "%.2f GB", n / 1e9);
    else if (n >= 1000000ull) snprintf(buf, size, "%.1f MB", n / 1e6);
    else if (n >= 1000ull) snprintf(buf, size, "%.1f kB", n / 1e3);
    else snprintf(buf, size, "%llu B", (unsigned long long)n);
}

static double speed_mb(const progress_state *st, uint64_t done) {
    double dt = g4_now_seconds() - st->file_start;
    return dt > 0 ? (double)(done - st->resumed_from) / dt / 1e6 : 0;
}

static int terminal_columns(void) {
    struct winsize w;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col >= 20) return w.ws_col;
    return 80;
}

/* One line, redrawn in place: name, bar, percent, bytes, speed, ETA. The bar
 * gets whatever room the terminal leaves, so the line never wraps. */
static void draw_bar(progress_state *st, const g4_hub_event *e) {
    char done[32], total[32], tail[128], eta[32] = "";
    human_bytes(e->done, done, sizeof done);
    human_bytes(e->total, total, sizeof total);
    double frac = e->total ? (double)e->done / (double)e->total : 0;
    double mbs = speed_mb(st, e->done);
    if (mbs > 0 && e->total > e->done) snprintf(eta, sizeof eta, " ETA %.0fs", (e->total - e->done) / 1e6 / mbs);
    int cols = terminal_columns();
    int name_width = cols / 3 < 32 ? cols / 3 : 32;
    /* fixed widths, so the bar does not jump about */
    int tail_len = snprintf(tail, sizeof tail, " %5.1f%% %9s/%-9s %6.1f MB/s%-10s", 100 * frac, done, total, mbs, eta);
    int head_len = snprintf(NULL, 0, "[%d/%d] ", e->index, e->count) + name_width;
    int width = cols - 1 - head_len - tail_len - 3; /* " [" and "]" */
    if (width > 30) width = 30;
    char bar[40] = "";
    if (width >= 8) {
        int fill = (int)(frac * width);
        bar[0] = ' ';
        bar[1] = '[';
        for (int i = 0; i < width; i++) bar[2 + i] = i < fill ? '#' : '-';
        bar[2 + width] = ']';
        bar[3 + width] = '\0';
    }
    fprintf(stderr, "\r[%d/%d] %-*.*s%s%s\033[K", e->index, e->count, name_width, name_width, e->file, bar, tail);
}

static void on_progress(const g4_hub_event *e, void *user) {
    progress_state *st = user;
    char a[32], b[32];
    double now = g4_now_seconds();
    switch (e->kind) {
    case G4_HUB_LISTED:
        human_bytes(e->total, a, sizeof a);
        fprintf(stderr, "commit %s: %d files, %s\n", e->message, e->count, a);
        break;
    case G4_HUB_FILE_CACHED:
        human_bytes(e->done, a, sizeof a);
        fprintf(stderr, "[%d/%d] %s: cached (%s)\n", e->index, e->count, e->file, a);
        break;
    case G4_HUB_FILE_START:
        st->file_start = now;
        st->resumed_from = e->done;
        st->last_draw = 0;
        human_bytes(e->total, a, sizeof a);
        human_bytes(e->done, b, sizeof b);
        if (st->tty) draw_bar(st, e);
        else if (e->done) fprintf(stderr, "[%d/%d] %s: resuming at %s of %s\n", e->index, e->count, e->file, b, a);
        else fprintf(stderr, "[%d/%d] %s: downloading %s\n", e->index, e->count, e->file, a);
        break;
    case G4_HUB_FILE_BYTES:
        if (st->tty && now - st->last_draw >= 0.1) {
            draw_bar(st, e);
            st->last_draw = now;
        } else if (!st->tty && now - st->last_draw >= 15) { /* a heartbeat for long files in logs */
            if (st->last_draw > 0) {
                human_bytes(e->done, a, sizeof a);
                fprintf(stderr, "[%d/%d] %s: %s (%.0f%%, %.1f MB/s)\n", e->index, e->count, e->file, a,
                        e->total ? 100.0 * e->done / e->total : 0, speed_mb(st, e->done));
            }
            st->last_draw = now;
        }
        break;
    case G4_HUB_FILE_DONE:
        if (st->tty) draw_bar(st, e);
        human_bytes(e->done, a, sizeof a);
        fprintf(stderr, "%s[%d/%d] %s: %s in %.1f s (%.1f MB/s), verified\n", st->tty ? "\r\033[K" : "", e->index,
                e->count, e->file, a, now - st->file_start, speed_mb(st, e->done));
        break;
    case G4_HUB_RETRY: /* the message names the file or URL */
        fprintf(stderr, "%s%s; retrying in %.3g s\n", st->tty ? "\r\033[K" : "", e->message ? e->message : "error",
                e->wait_seconds);
        break;
    case G4_HUB_RESTART:
        fprintf(stderr, "%s%s: the server cannot resume; starting the file over\n", st->tty ? "\r\033[K" : "",
                e->file);
        st->resumed_from = 0;
        break;
    case G4_HUB_WAIT_LOCK:
        fprintf(stderr, "%s: another process is downloading it; waiting\n", e->file);
        break;
    }
}

/* ---- the command ---- */

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

int cmd_pull(int argc, char **argv) {
    const char *model = NULL, *revision_opt = NULL;
    g4_hub_options opt = {0};
    int quiet = 0, offline = env_true("HF_HUB_OFFLINE");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--revision") && has_value) {
            revision_opt = argv[++i];
        } else if (!strcmp(a, "--cache") && has_value) {
            opt.cache_dir = argv[++i];
        } else if (!strcmp(a, "--endpoint") && has_value) {
            opt.endpoint = argv[++i];
        } else if (!strcmp(a, "--retries") && has_value) {
            opt.max_retries = atoi(argv[++i]);
        } else if (!strcmp(a, "--backoff-ms") && has_value) {
            opt.backoff_ms = atoi(argv[++i]);
        } else if (!strcmp(a, "--verify")) {
            opt.verify_cached = 1;
        } else if (!strcmp(a, "--offline")) {
            offline = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, "gemma4 pull: unexpected argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    char *repo_id, *revision;
    if (g4_hub_parse_ref(model, &repo_id, &revision) != G4_OK) {
        fprintf(stderr, "gemma4 pull: %s\n", g4_error_message());
        return 2;
    }
    if (revision_opt) {
        if (revision && strcmp(revision, revision_opt) != 0) {
            fprintf(stderr, "gemma4 pull: two revisions given: @%s and --revision %s\n", revision, revision_opt);
            free(repo_id);
            free(revision);
            return 2;
        }
        free(revision);
        revision = strdup(revision_opt);
    }

    progress_state st = {.tty = isatty(STDERR_FILENO)};
    if (!quiet) {
        opt.progress = on_progress;
        opt.progress_user = &st;
    }
    /* with a file size limit (ulimit -f), report the failed write instead of dying */
    signal(SIGXFSZ, SIG_IGN);

    char *dir = NULL;
    g4_status s = offline ? g4_hub_cache_lookup(opt.cache_dir, repo_id, revision, &dir)
                          : g4_hub_pull(repo_id, revision, &opt, &dir);
    if (st.tty && !quiet) fprintf(stderr, "\r\033[K");
    free(repo_id);
    free(revision);
    if (s != G4_OK) {
        fprintf(stderr, "gemma4 pull: %s\n", g4_error_message());
        return 1;
    }
    printf("%s\n", dir);
    free(dir);
    return 0;
}
