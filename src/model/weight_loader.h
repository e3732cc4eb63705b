/* Finding and checking the tensors a config requires.
 *
 * A loader walks the required tensors of a model, looks each up by name,
 * checks dtype and shape, and records every problem instead of stopping at
 * the first, so one error can list all that is missing or wrong. Quantised
 * MLX modules (`<module>.weight` packed uint32 + `.scales` [+ `.biases`]) and
 * plain float weights load through the same call. */
#ifndef G4_MODEL_WEIGHT_LOADER_H
#define G4_MODEL_WEIGHT_LOADER_H

#include <stdint.h>

#include "model/model.h"

typedef struct {
    g4_model *model;
    char *problems;      /* newline-separated list */
    size_t problems_len, problems_cap;
    int n_problems;
    /* Synthetic models (benchmarks): every requested tensor is made up with
     * random values in the format config.json's quantization asks for,
     * instead of being read. Never used for real checkpoints. */
    int synthetic;
    uint64_t rng;
    struct g4_synth_record *record; /* dry run: record requests, allocate nothing */
} g4_weight_loader;

g4_status g4_loader_init(g4_weight_loader *L, g4_model *m);
void g4_loader_free(g4_weight_loader *L);

void g4_loader_problem(g4_weight_loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Looks a tensor up and marks it used; NULL when absent. */
const g4_st_tensor *g4_loader_find(g4_weight_loader *L, const char *name);
/* True when a tensor or quantised module of this name exists. */
int g4_loader_has_module(g4_weight_loader *L, const char *module);

/* Loads the matrix stored as `module` (".weight" appended when `weight_suffix`;
 * HF expert tensors have none) with logical shape [n_lead * rows][cols]; a 3-D
 * tensor [n_lead, rows, cols] when n_lead > 0, 2-D [rows, cols] when
 * n_lead == 0. Records a problem and leaves *out zeroed on any mismatch. */
void g4_loader_matrix(g4_weight_loader *L, const char *module, int weight_suffix, int64_t n_lead, int64_t rows,
                      int64_t cols, g4_matrix *out);

/* A float vector of n elements (shape [n], or [] / [1] when n == 1) as a
 * float32 backend array owned by the model. */
float *g4_loader_vector(g4_weight_loader *L, const char *name, int64_t n);
/* The same, every element multiplied by `factor` in float32 once at load. */
float *g4_loader_vector_scaled(g4_weight_loader *L, const char *name, int64_t n, float factor);
/* A scalar tensor read on the host (0 and a problem if absent). */
float g4_loader_scalar(g4_weight_loader *L, const char *name);

/* Uploads host floats into a backend array owned by the model. */
float *g4_model_upload_floats(g4_model *m, const float *host, size_t n);

/* Fails with the whole problem list (G4_OK when there is none). */
g4_status g4_loader_finish(g4_weight_loader *L, const char *what);

/* Makes every loaded matrix usable by the backend and counts bytes/params. */
g4_status g4_loader_prepare_matrix(g4_weight_loader *L, g4_matrix *m);

/* Prepares parts[0..n) for the backend, stacked into *stacked (their rows
 * in order, the parts views of it) when they share one layout and the
 * backend chooses to (prepare_stacked); else one by one, *stacked zeroed. Returns
 * whether it stacked; *st is the status. */
int g4_loader_prepare_stacked(g4_weight_loader *L, g4_matrix *const *parts, int n, g4_matrix *stacked,
                              g4_status *st);

#endif
