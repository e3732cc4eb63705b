#include "cli_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

int cli_option(int argc, char **argv, int *i, const char *name, const char **value) {
    if (strcmp(argv[*i], name) != 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "gemma4: option %s needs a value\n", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_flag(char **argv, int i, const char *name) { return strcmp(argv[i], name) == 0; }

int cli_parse_ids(const char *text, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16, count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return -1;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "gemma4: bad token id near '%.20s' (ids are non-negative integers separated by commas)\n",
                    p);
            free(out);
            return -1;
        }
        if (count == cap) {
            cap *= 2;
            int32_t *grown = realloc(out, cap * sizeof *grown);
            if (!grown) {
                free(out);
                return -1;
            }
            out = grown;
        }
        out[count++] = (int32_t)v;
        p = end;
    }
    *ids = out;
    *n = (int)count;
    return 0;
}

long cli_parse_count(const char *text, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < 0) {
        fprintf(stderr, "gemma4: %s must be a non-negative integer, got '%s'\n", what, text);
        return -1;
    }
    return v;
}

const char *const cli_precision_help =
    "  --precision fast|exact  fast (the default of run, chat, serve, bench, perplexity): products in the\n"
    "                          precision measured sufficient (README, Precision); exact: float32-accurate\n"
    "                          (the default of logits and generate, the verification interfaces)\n";

int cli_exact_option(int argc, char **argv, int *i, int *exact) {
    const char *value = NULL;
    const int r = cli_option(argc, argv, i, "--precision", &value);
    if (r <= 0) return r;
    if (!strcmp(value, "exact"))
        *exact = 1;
    else if (!strcmp(value, "fast"))
        *exact = 0;
    else {
        fprintf(stderr, "gemma4: --precision must be exact or fast, got '%s'\n", value);
        return -1;
    }
    return 1;
}

const char *const cli_kv_type_help =
    "  --kv-type f32|bf16|fp8  the KV cache's element type: bf16 (the default with --precision fast, unless\n"
    "                          the weights are float32), f32 (the default with exact), fp8 (e4m3 with a scale\n"
    "                          per row: a quarter of f32's bytes)\n";

int cli_kv_type_name_option(int argc, char **argv, int *i, const char **name) {
    const char *value = NULL;
    const int r = cli_option(argc, argv, i, "--kv-type", &value);
    if (r <= 0) return r;
    /* the names g4_open_options.kv_type takes, checked before the model loads */
    static const char *const names[] = {"f32", "bf16", "fp8", "auto"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (!strcmp(value, names[k])) {
            *name = value;
            return 1;
        }
    }
    fprintf(stderr, "gemma4: --kv-type must be f32, bf16, fp8 or auto, got '%s'\n", value);
    return -1;
}

int cli_check_vision_mask(const char *text) {
    g4_vision_mask mask;
    if (g4_vision_mask_parse(text, "--vision-mask", &mask) == G4_OK) return 0;
    fprintf(stderr, "gemma4: %s\n", g4_error_message());
    return -1;
}

int cli_draft_option(int argc, char **argv, int *i, cli_draft_options *o) {
    const char *value = NULL;
    int r;
    if ((r = cli_option(argc, argv, i, "--draft", &value))) {
        if (r > 0) o->dir = value;
        return r;
    }
    if ((r = cli_option(argc, argv, i, "--draft-max", &value))) {
        if (r < 0) return r;
        long n = cli_parse_count(value, "--draft-max");
        if (n < 1 || n > G4_MAX_DRAFTS) {
            if (n >= 0) fprintf(stderr, "gemma4: --draft-max %ld outside 1..%d\n", n, G4_MAX_DRAFTS);
            return -1;
        }
        o->draft_max = (int)n;
        return 1;
    }
    return 0;
}

void cli_draft_usage(FILE *f) {
    fprintf(f,
            "  --draft DIR       speculative decoding with this MTP drafter (gemma4_assistant; a folder or a\n"
            "                    pulled ORG/NAME; auto: the <model>-assistant beside the model)\n"
            "  --draft-max N     drafts a round, 1..%d (default %d)\n",
            G4_MAX_DRAFTS, CLI_DRAFT_MAX_DEFAULT);
}

void cli_format_draft_stats(const g4_draft_stats *s, int draft_max, char *buf, size_t n) {
    if (s->rounds == 0) {
        snprintf(buf, n, " | draft %d: no rounds", draft_max);
        return;
    }
    size_t k = (size_t)snprintf(buf, n, " | draft %d: %.2f accepted a round, %.2f tokens a target pass, by position",
                                draft_max, (double)s->accepted / s->rounds,
                                (double)(s->accepted + s->rounds) / s->rounds);
    for (int i = 0; i < draft_max && i < G4_MAX_DRAFTS && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, " %.2f",
                              s->drafted_at[i] ? (double)s->accepted_at[i] / s->drafted_at[i] : 0.0);
    if (k < n)
        snprintf(buf + k, n - k, "; %.1f ms drafting, %.1f ms verifying a round",
                 1e3 * s->draft_seconds / s->rounds, 1e3 * s->verify_seconds / s->rounds);
}

int cli_read_file(const char *path, size_t max_bytes, char **data, size_t *len) {
    if (g4_read_file(path, max_bytes, data, len) == G4_OK) return 0;
    fprintf(stderr, "gemma4: %s\n", g4_error_message());
    return -1;
}

void cli_report_error(const char *cmd, g4_status st) {
    fprintf(stderr, "gemma4 %s: %s (%s)\n", cmd, g4_error_message(), g4_status_name(st));
}

int cli_read_media_file(int held, const char *path, char **data, size_t *len) {
    if (held == CLI_MAX_MEDIA) {
        fprintf(stderr, "gemma4: at most %d images and audio clips per prompt\n", CLI_MAX_MEDIA);
        return -1;
    }
    return cli_read_file(path, (size_t)256 << 20, data, len);
}

static int add_media_file(cli_media_files *m, const char *path, int audio) {
    char *data;
    size_t len;
    if (cli_read_media_file(m->n, path, &data, &len) != 0) return -1;
    m->buffers[m->n] = data;
    m->files[m->n] = (g4_media_file){.audio = audio, .data = data, .size = len, .label = path,
                                     .max_soft_tokens = m->image_tokens};
    m->n++;
    return 1;
}

int cli_media_files_option(int argc, char **argv, int *i, cli_media_files *m) {
    const char *v;
    int r;
    if ((r = cli_option(argc, argv, i, "--image", &v))) return r < 0 ? -1 : add_media_file(m, v, 0);
    if ((r = cli_option(argc, argv, i, "--audio", &v))) return r < 0 ? -1 : add_media_file(m, v, 1);
    if ((r = cli_option(argc, argv, i, "--image-tokens", &v))) {
        long n = r > 0 ? cli_parse_count(v, "--image-tokens") : -1;
        if (n < 0) return -1;
        m->image_tokens = (int)n;
        for (int k = 0; k < m->n; k++)
            if (!m->files[k].audio) m->files[k].max_soft_tokens = (int)n;
        return 1;
    }
    return 0;
}

void cli_media_files_free(cli_media_files *m) {
    for (int k = 0; k < m->n; k++) free(m->buffers[k]);
    m->n = 0;
}

void cli_report_auto_drafter(const cli_draft_options *o, const g4_handle *h) {
    if (o->dir && !strcmp(o->dir, "auto") && g4_draft_dir(h)) fprintf(stderr, "gemma4: drafter %s\n", g4_draft_dir(h));
}
