/* tokenizer_bench: load time and encoding throughput of the tokenizer.
 *
 * usage: tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]
 *
 * Encodes the whole text file as one string (no special tokens added),
 * REPEATS times (default 5), and prints the best wall and CPU times, MB/s
 * and tokens/s, with an FNV-1a hash of the ids so the run can be checked
 * against bench/tokenizer_bench.py's Hugging Face figures. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/file.h"
#include "text/tokenizer.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tokenizer_bench TOKENIZER_JSON TEXT_FILE [REPEATS]\n");
        return 2;
    }
    int repeats = argc > 3 ? atoi(argv[3]) : 5;
    if (repeats < 1) repeats = 1;
    double load_wall = 1e9, load_cpu = 1e9;
    g4_tokenizer *t = NULL;
    for (int r = 0; r < repeats; r++) {
        g4_tokenizer_free(t);
        double w0 = g4_now_seconds(), c0 = cpu_seconds();
        if (g4_tokenizer_load(argv[1], &t)) {
            fprintf(stderr, "tokenizer_bench: %s\n", g4_error_message());
            return 1;
        }
        double w = g4_now_seconds() - w0, c = cpu_seconds() - c0;
        if (w < load_wall) load_wall = w;
        if (c < load_cpu) load_cpu = c;
    }
    char *text;
    size_t len;
    if (g4_read_file(argv[2], (size_t)1 << 31, &text, &len)) {
        fprintf(stderr, "tokenizer_bench: %s\n", g4_error_message());
        return 1;
    }
    double enc_wall = 1e9, enc_cpu = 1e9;
    size_t n = 0;
    unsigned long long h = 0;
    for (int r = 0; r < repeats; r++) {
        int32_t *ids;
        double w0 = g4_now_seconds(), c0 = cpu_seconds();
        if (g4_tokenizer_encode(t, text, len, 0, &ids, &n)) {
            fprintf(stderr, "tokenizer_bench: %s\n", g4_error_message());
            return 1;
        }
        double w = g4_now_seconds() - w0, c = cpu_seconds() - c0;
        if (w < enc_wall) enc_wall = w;
        if (c < enc_cpu) enc_cpu = c;
        h = 0xCBF29CE484222325ull;
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++) h = (h ^ (((uint32_t)ids[i] >> (8 * b)) & 255)) * 0x100000001B3ull;
        free(ids);
    }
    double mb = (double)len / 1e6;
    printf("load: best of %d: %.3f s wall, %.3f s CPU\n", repeats, load_wall, load_cpu);
    printf("encode: %zu bytes -> %zu ids (fnv %016llx); best of %d: %.3f s wall, %.3f s CPU\n", len, n, h, repeats,
           enc_wall, enc_cpu);
    printf("throughput (CPU time): %.2f MB/s, %.0f tokens/s\n", mb / enc_cpu, (double)n / enc_cpu);
    free(text);
    g4_tokenizer_free(t);
    return 0;
}
