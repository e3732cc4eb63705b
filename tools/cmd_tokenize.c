/* gemma4 tokenize: prints the token ids of a text as a JSON array. On the
 * public API alone (gemma4.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 tokenize -m DIR|FILE (--text TEXT | --file FILE) [--plain] [--add-special]\n"
            "\n"
            "Prints the token ids of TEXT as a JSON array; with --file, one array per\n"
            "line of FILE (the newline itself is not encoded; '-' reads stdin).\n"
            "\n"
            "  -m, --model DIR|FILE  a tokenizer.json, or a folder holding one\n"
            "  --text TEXT           the text to encode\n"
            "  --file FILE           encode each line of FILE\n"
            "  --plain               treat special tokens in the text as plain text\n"
            "  --add-special         add the post-processor's tokens (Gemma: <bos>)\n");
}

static int print_ids(const g4_tokenizer *t, const char *text, size_t len, int flags) {
    int32_t *ids;
    size_t n;
    if (g4_tokenize(t, text, len, flags, &ids, &n)) {
        fprintf(stderr, "gemma4 tokenize: %s\n", g4_error_message());
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    g4_free(ids);
    return 0;
}

static int tokenize_file(const g4_tokenizer *t, const char *path, int flags) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "gemma4 tokenize: cannot open %s\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') len--;
        rc = print_ids(t, line, (size_t)len, flags);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) {
            model = argv[++i];
        } else if (!strcmp(a, "--text") && has_value) {
            text = argv[++i];
        } else if (!strcmp(a, "--file") && has_value) {
            file = argv[++i];
        } else if (!strcmp(a, "--plain")) {
            flags |= G4_TOKENIZE_PLAIN_TEXT;
        } else if (!strcmp(a, "--add-special")) {
            flags |= G4_TOKENIZE_ADD_SPECIAL;
        } else {
            fprintf(stderr, "gemma4 tokenize: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text) == (!file)) {
        usage(stderr);
        return 2;
    }
    g4_tokenizer *t;
    if (g4_tokenizer_open(model, &t)) {
        fprintf(stderr, "gemma4 tokenize: %s\n", g4_error_message());
        return 1;
    }
    int rc = text ? print_ids(t, text, strlen(text), flags) : tokenize_file(t, file, flags);
    g4_tokenizer_close(t);
    return rc;
}
