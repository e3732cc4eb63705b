/* Where one decode token's products spend their time, on a real checkpoint's
 * weights where they lie (the memory map), in the order a token reads them.
 *
 *   decode_gemv_bench DIR [--tokens N] [--isa LEVEL] [--precision exact|fast]
 *
 * Each "token" runs every layer's q, k, v, o, gate, up, down, ple_gate and
 * ple_proj, then the per-layer-embedding projection and the LM head (the
 * tied embedding, all its rows), each as cpu_matmul_with on one token, and
 * times each call. Printed per kind: calls, weight bytes a token, the
 * kind's share of the products' time, and its GB/s (weight bytes / time),
 * beside the bandwidth that cpu_probe's streaming read measures. The
 * activations are random: speed does not depend on their values. The
 * OpenMP threads are OMP_NUM_THREADS (default: all cores). */
#include <omp.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_probe.h"
#include "base/file.h"
#include "model/model.h"

enum { KIND_Q, KIND_K, KIND_V, KIND_O, KIND_GATE, KIND_UP, KIND_DOWN, KIND_PLE_GATE, KIND_PLE_PROJ,
       KIND_PLE_MODEL, KIND_LM_HEAD, N_KINDS };
static const char *kind_names[N_KINDS] = {"q",        "k",        "v",         "o",         "gate",   "up",
                                          "down",     "ple_gate", "ple_proj", "ple_model", "lm_head"};

typedef struct {
    double seconds, cpu_seconds, bytes;
    long calls;
} kind_total;

/* The process's CPU time: on one thread, the time it ran, which other
 * programs on a loaded machine change less than the wall clock's. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void timed(kind_total *k, g4_precision precision, float *out, const float *x, const g4_matrix *w) {
    if (!w->data || w->rows <= 0) return;
    const double c0 = cpu_seconds(), t0 = g4_now_seconds();
    cpu_matmul_with(precision, out, x, 1, w);
    k->seconds += g4_now_seconds() - t0;
    k->cpu_seconds += cpu_seconds() - c0;
    k->bytes += (double)g4_matrix_bytes(w);
    k->calls++;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [--tokens N] [--isa LEVEL] [--precision exact|fast]\n", argv[0]);
        return 2;
    }
    int tokens = 8;
    const char *isa = NULL;
    g4_precision precision = G4_PRECISION_FAST;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) isa = argv[++i];
        else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc)
            precision = strcmp(argv[++i], "exact") == 0 ? G4_PRECISION_EXACT : G4_PRECISION_FAST;
        else {
            fprintf(stderr, "%s: unknown argument %s\n", argv[0], argv[i]);
            return 2;
        }
    }
    if (tokens < 1) tokens = 1;
    if (isa) {
        int found = 0;
        for (int level = (int)cpu_isa_supported(); level >= CPU_ISA_SCALAR; level--)
            if (strcmp(isa, cpu_isa_level_name((cpu_isa)level)) == 0) cpu_isa_force((cpu_isa)level), found = 1;
        if (!found) {
            fprintf(stderr, "%s: level %s is not available here\n", argv[0], isa);
            return 2;
        }
    }
    g4_backend *be = NULL;
    g4_model *m = NULL;
    if (g4_backend_cpu_create(0, &be) != G4_OK || g4_model_load_dir(argv[1], be, &m) != G4_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], g4_error_message());
        return 1;
    }
    const g4_text_weights *tw = &m->text;
    const int L = m->config.text.n_layers;
    /* the widest input and output any product here has */
    int64_t max_cols = 0, max_rows = 0;
    const g4_matrix *all[2];
    for (int l = 0; l < L; l++) {
        const g4_text_layer *y = &tw->layers[l];
        const g4_matrix *ms[] = {&y->q, &y->k, &y->v, &y->o, &y->gate, &y->up, &y->down, &y->ple_gate, &y->ple_proj};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            if (ms[i]->cols > max_cols) max_cols = ms[i]->cols;
            if (ms[i]->rows > max_rows) max_rows = ms[i]->rows;
        }
    }
    all[0] = &tw->ple_model_proj;
    all[1] = &tw->embed;
    for (int i = 0; i < 2; i++) {
        if (all[i]->cols > max_cols) max_cols = all[i]->cols;
        if (all[i]->rows > max_rows) max_rows = all[i]->rows;
    }
    float *x = malloc((size_t)max_cols * sizeof *x), *out = malloc((size_t)max_rows * sizeof *out);
    if (!x || !out) return 1;
    for (int64_t c = 0; c < max_cols; c++) x[c] = (float)((c * 7919) % 2001) * 1e-3f - 1.0f;
    const double bandwidth = g4_measure_memory_bandwidth();
    kind_total k[N_KINDS];
    /* one token to warm up (page faults, scratch), then the measured ones */
    for (int t = 0; t <= tokens; t++) {
        if (t == 1) memset(k, 0, sizeof k);
        for (int l = 0; l < L; l++) {
            const g4_text_layer *y = &tw->layers[l];
            timed(&k[KIND_Q], precision, out, x, &y->q);
            timed(&k[KIND_K], precision, out, x, &y->k);
            timed(&k[KIND_V], precision, out, x, &y->v);
            timed(&k[KIND_O], precision, out, x, &y->o);
            timed(&k[KIND_GATE], precision, out, x, &y->gate);
            timed(&k[KIND_UP], precision, out, x, &y->up);
            timed(&k[KIND_DOWN], precision, out, x, &y->down);
            timed(&k[KIND_PLE_GATE], precision, out, x, &y->ple_gate);
            timed(&k[KIND_PLE_PROJ], precision, out, x, &y->ple_proj);
        }
        timed(&k[KIND_PLE_MODEL], precision, out, x, &tw->ple_model_proj);
        timed(&k[KIND_LM_HEAD], precision, out, x, &tw->embed);
    }
    double total_s = 0, total_b = 0;
    for (int i = 0; i < N_KINDS; i++) total_s += k[i].seconds, total_b += k[i].bytes;
    printf("%s: %d layers, level %s, threads %d, precision %s, %d tokens; streaming read %.1f GB/s\n", argv[1], L,
           cpu_isa_name(), omp_get_max_threads(), precision == G4_PRECISION_EXACT ? "exact" : "fast", tokens,
           bandwidth);
    double total_c = 0;
    for (int i = 0; i < N_KINDS; i++) total_c += k[i].cpu_seconds;
    const int nt = omp_get_max_threads();
    printf("| product | calls a token | MB a token | ms a token | share of products | GB/s | of the read's GB/s "
           "| CPU ms a token / threads | GB/s by CPU time |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < N_KINDS; i++) {
        if (!k[i].calls) continue;
        const double gbs = k[i].bytes / k[i].seconds / 1e9, cpu_s = k[i].cpu_seconds / nt;
        printf("| %s | %ld | %.1f | %.2f | %.1f%% | %.1f | %.0f%% | %.2f | %.1f |\n", kind_names[i],
               k[i].calls / tokens, k[i].bytes / tokens / 1e6, 1e3 * k[i].seconds / tokens,
               100 * k[i].seconds / total_s, gbs, 100 * gbs / bandwidth, 1e3 * cpu_s / tokens,
               k[i].bytes / cpu_s / 1e9);
    }
    const double gbs = total_b / total_s / 1e9;
    printf("| all products | | %.1f | %.2f | 100%% | %.1f | %.0f%% | %.2f | %.1f |\n", total_b / tokens / 1e6,
           1e3 * total_s / tokens, gbs, 100 * gbs / bandwidth, 1e3 * total_c / nt / tokens,
           total_b / (total_c / nt) / 1e9);
    free(x);
    free(out);
    g4_model_release(m);
    g4_backend_destroy(be);
    return 0;
}
