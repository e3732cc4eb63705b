/* gemma4 grammar: compile a constraint, check texts against it, and time
 * token masks over a real vocabulary.
 *
 * Internal headers remain (constrain/constrain.h, token_mask.h, text/tokenizer.h): a diagnostic of the grammar compiler and
 * token masks themselves.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "cli_common.h"
#include "commands.h"
#include "constrain/constrain.h"
#include "constrain/token_mask.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: gemma4 grammar CONSTRAINT [--check FILE] [--dump]\n"
            "       gemma4 grammar CONSTRAINT -m TOKENIZER --bench N [--budget T] [--seed S]\n"
            "\n"
            "CONSTRAINT is one of\n"
            "  --json-schema FILE    a JSON Schema (the subset of docs/ARCHITECTURE.md)\n"
            "  --json-object         any JSON object\n"
            "  --grammar FILE        a GBNF grammar\n"
            "  --regex TEXT          a regular expression the whole text matches\n"
            "  --tools FILE          a JSON list of {name, parameters}: Gemma tool calls (one or more)\n"
            "\n"
            "  --check FILE   each line of FILE ('-': stdin) is hex bytes; prints per line\n"
            "                 'accept' (complete), 'prefix' (may go on) or 'reject'\n"
            "  --dump         print the compiled rules\n"
            "  -m TOKENIZER   a tokenizer.json or a folder holding one\n"
            "  --bench N      N random walks from start to end over the vocabulary's tokens\n"
            "                 (each step draws uniformly among the allowed tokens), timing\n"
            "                 every mask (thread CPU time): mean, p50, p99, max (µs), cold (first\n"
            "                 visit) and all;\n"
            "                 each walk has T tokens (default 256), closed in time as max_tokens is;\n"
            "                 N,M: then M more walks on the same grammar (warm), their times (µs, one\n"
            "                 a line) to --times FILE\n");
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int check_lines(g4_grammar *g, const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "gemma4 grammar: cannot open %s\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned char *bytes = NULL;
    size_t bcap = 0;
    int32_t start = g4_grammar_start(g);
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if ((size_t)len / 2 + 1 > bcap) {
            bcap = (size_t)len / 2 + 1;
            bytes = realloc(bytes, bcap);
        }
        size_t n = 0;
        for (ssize_t i = 0; i + 1 < len; i += 2) bytes[n++] = (unsigned char)(hexval(line[i]) * 16 + hexval(line[i + 1]));
        int32_t s = g4_grammar_run(g, start, bytes, n);
        if (g4_grammar_overflowed(g)) {
            fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
            return 1;
        }
        puts(s < 0 ? "reject" : g4_grammar_accepts(g, s) ? "accept" : "prefix");
    }
    free(line);
    free(bytes);
    if (f != stdin) fclose(f);
    return 0;
}

/* This thread's CPU time: on a shared machine the time other processes take
 * the core away is not the mask's. */
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random walks: at each step one of the allowed tokens drawn uniformly
 * (past 40 steps the end, when allowed, half of the time), the budget of T
 * tokens steering the text to its end in time. */
static int bench(g4_grammar *g, const g4_token_trie *trie, double t_trie, int walks, int budget, uint64_t seed,
                 FILE *times_out) {
    const int V = g4_token_trie_vocab(trie);
    const int32_t stop = 1; /* <eos> */

    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    size_t cap = 1 << 16, n_t = 0;
    double *times = malloc(cap * sizeof *times);
    double *cold = malloc(cap * sizeof *cold);
    size_t n_cold = 0;
    long steps = 0, done = 0;
    g4_token_matcher_options o = {.stop_ids = &stop, .n_stop = stop >= 0};
    for (int w = 0; w < walks; w++) {
        g4_token_matcher *m;
        if (g4_token_matcher_create(g, trie, &o, &m) != G4_OK) {
            fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
            return 1;
        }
        for (int step = 0; step < budget; step++) {
            int states_before = g4_grammar_n_states(g);
            g4_token_matcher_set_budget(m, budget - step);
            double a = now_us();
            const uint32_t *mask;
            int r = g4_token_matcher_mask(m, &mask);
            double dt = now_us() - a;
            if (r < 0) {
                fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
                return 1;
            }
            if (n_t == cap) {
                cap *= 2;
                times = realloc(times, cap * sizeof *times);
                cold = realloc(cold, cap * sizeof *cold);
            }
            times[n_t++] = dt;
            if (g4_grammar_n_states(g) != states_before) cold[n_cold++] = dt;
            int n = 0;
            for (int i = 0; i < V; i++)
                if (g4_mask_has(mask, i)) allowed[n++] = i;
            if (n == 0) break;
            int32_t pick = allowed[rng_next(&seed) % (uint64_t)n];
            /* past 40 steps, take the end when it is allowed, half of the time */
            if (step > 40 && stop >= 0 && g4_mask_has(mask, stop) && (rng_next(&seed) & 1)) pick = stop;
            steps++;
            if (pick == stop) {
                done++;
                break;
            }
            if (g4_token_matcher_accept(m, pick) != G4_OK) {
                fprintf(stderr, "gemma4 grammar: sampled token refused: %s\n", g4_error_message());
                return 1;
            }
        }
        g4_token_matcher_free(m);
    }
    if (times_out)
        for (size_t i = 0; i < n_t; i++) fprintf(times_out, "%.3f\n", times[i]);
    double sum = 0, cold_sum = 0;
    for (size_t i = 0; i < n_t; i++) sum += times[i];
    for (size_t i = 0; i < n_cold; i++) cold_sum += cold[i];
    qsort(times, n_t, sizeof *times, cmp_double);
    qsort(cold, n_cold, sizeof *cold, cmp_double);
    printf("{\"vocab\": %d, \"trie_nodes\": %d, \"trie_build_ms\": %.1f, \"walks\": %d, \"finished\": %ld, "
           "\"masks\": %zu, \"mean_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f, \"max_us\": %.1f, "
           "\"cold_masks\": %zu, \"cold_mean_us\": %.1f, \"states\": %d}\n",
           V, g4_token_trie_nodes(trie), t_trie / 1e3, walks, done, n_t, n_t ? sum / (double)n_t : 0,
           n_t ? times[n_t / 2] : 0, n_t ? times[(size_t)(0.99 * (double)(n_t - 1))] : 0, n_t ? times[n_t - 1] : 0,
           n_cold, n_cold ? cold_sum / (double)n_cold : 0,
           g4_grammar_n_states(g));
    (void)steps;
    free(allowed);
    free(times);
    free(cold);
    return 0;
}

int cmd_grammar(int argc, char **argv) {
    const char *schema = NULL, *gbnf = NULL, *regex = NULL, *tools = NULL, *check = NULL, *model = NULL;
    const char *bench_n = NULL, *seed_s = NULL, *budget_s = NULL, *times_path = NULL;
    int json_object = 0, dump = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = cli_option(argc, argv, &i, "--json-schema", &schema)) ||
            (r = cli_option(argc, argv, &i, "--grammar", &gbnf)) || (r = cli_option(argc, argv, &i, "--regex", &regex)) ||
            (r = cli_option(argc, argv, &i, "--tools", &tools)) || (r = cli_option(argc, argv, &i, "--check", &check)) ||
            (r = cli_option(argc, argv, &i, "-m", &model)) || (r = cli_option(argc, argv, &i, "--bench", &bench_n)) ||
            (r = cli_option(argc, argv, &i, "--seed", &seed_s)) || (r = cli_option(argc, argv, &i, "--budget", &budget_s)) ||
            (r = cli_option(argc, argv, &i, "--times", &times_path))) {
            if (r < 0) return 2;
        } else if (cli_flag(argv, i, "--json-object")) json_object = 1;
        else if (cli_flag(argv, i, "--dump")) dump = 1;
        else if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gemma4 grammar: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    g4_constraint_spec spec = {0};
    const char *file = schema ? schema : gbnf ? gbnf : tools;
    if (schema) spec.kind = G4_CONSTRAINT_JSON_SCHEMA;
    else if (gbnf) spec.kind = G4_CONSTRAINT_GBNF;
    else if (tools) spec.kind = G4_CONSTRAINT_TOOL_CALLS;
    else if (regex) spec.kind = G4_CONSTRAINT_REGEX, spec.text = strdup(regex);
    else if (json_object) spec.kind = G4_CONSTRAINT_JSON_OBJECT;
    else {
        usage(stderr);
        return 2;
    }
    if (file) {
        size_t n;
        if (g4_read_file(file, 64u << 20, &spec.text, &n) != G4_OK) {
            fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
            return 1;
        }
    }
    g4_tokenizer *tok = NULL;
    g4_constraint_tokens tk = {-1, -1, -1};
    if (model) {
        if (g4_tokenizer_load(model, &tok) != G4_OK) {
            fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
            g4_constraint_spec_free(&spec);
            return 1;
        }
        tk.str_delim = g4_tokenizer_token_id(tok, "<|\"|>");
        tk.tool_call = g4_tokenizer_token_id(tok, "<|tool_call>");
        tk.tool_call_end = g4_tokenizer_token_id(tok, "<tool_call|>");
    } else if (tools) tk.str_delim = 52, tk.tool_call = 48, tk.tool_call_end = 49;
    g4_grammar *g;
    double t0 = now_us();
    g4_status st = g4_constraint_compile(&spec, &tk, &g);
    double t_compile = now_us() - t0;
    g4_constraint_spec_free(&spec);
    if (st != G4_OK) {
        fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
        g4_tokenizer_free(tok);
        return 1;
    }
    int rc = 0;
    if (dump) {
        char *text = g4_grammar_dump(g);
        if (text) fputs(text, stdout);
        free(text);
    }
    if (check) rc = check_lines(g, check);
    if (!rc && bench_n) {
        if (!tok) {
            fprintf(stderr, "gemma4 grammar: --bench needs -m TOKENIZER\n");
            rc = 2;
        } else {
            fprintf(stderr, "compile: %.1f ms\n", t_compile / 1e3);
            g4_token_trie *trie;
            double t0 = now_us();
            if (g4_token_trie_build(tok, &trie) != G4_OK) {
                fprintf(stderr, "gemma4 grammar: %s\n", g4_error_message());
                rc = 1;
            } else {
                double t_trie = now_us() - t0;
                FILE *tf = times_path ? fopen(times_path, "w") : NULL;
                uint64_t seed = seed_s ? strtoull(seed_s, NULL, 10) : 1;
                /* "N" or "N,M": N walks on the fresh grammar, then M more on the same one (warm caches) */
                const char *comma = strchr(bench_n, ',');
                rc = bench(g, trie, t_trie, atoi(bench_n), budget_s ? atoi(budget_s) : 256, seed, NULL);
                if (!rc && comma)
                    rc = bench(g, trie, t_trie, atoi(comma + 1), budget_s ? atoi(budget_s) : 256, seed + 1000, tf);
                if (tf) fclose(tf);
                g4_token_trie_free(trie);
            }
        }
    }
    g4_grammar_free(g);
    g4_tokenizer_free(tok);
    return rc;
}
