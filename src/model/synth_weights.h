/* Random weights for synthetic models, and the record of what a synthetic
 * load asked for.
 *
 * Every synthetic tensor's bytes are a pure function of (fill, seed, byte
 * offset), so a tensor can be made whole in memory (synthetic models for
 * benchmarks) or piece by piece while it is written to a checkpoint file
 * (`gemma4 synth`), and both give the same bytes. */
#ifndef G4_MODEL_SYNTH_WEIGHTS_H
#define G4_MODEL_SYNTH_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "io/config.h"
#include "tensor/dtype.h"

typedef enum {
    G4_SYNTH_WEIGHTS = 0, /* bf16 in about [-0.06, 0.06] */
    G4_SYNTH_SCALES,      /* small positive bf16 (~0.004) */
    G4_SYNTH_BIASES,      /* small negative bf16 */
    G4_SYNTH_CODES,       /* random bytes: packed quantised codes */
    G4_SYNTH_E8M0,        /* mxfp4 scales near 2^-8 */
    G4_SYNTH_ONES,        /* bf16 1.0: norms and scalars */
} g4_synth_fill;

/* Pieces made by g4_synth_fill_bytes must start at a multiple of this. */
#define G4_SYNTH_BLOCK_BYTES ((size_t)65536)

/* Bytes [offset, offset + n) of a tensor filled by `fill` from `seed`.
 * offset is a multiple of G4_SYNTH_BLOCK_BYTES; bf16 fills need n even. */
void g4_synth_fill_bytes(g4_synth_fill fill, uint64_t seed, uint64_t offset, void *dst, size_t n);

/* One tensor a synthetic load asked for, named and shaped as a checkpoint of
 * the model's layout stores it. */
typedef struct {
    char *name;
    g4_dtype dtype;
    int ndim;
    int64_t shape[3];
    g4_synth_fill fill;
    uint64_t seed;
    /* On the packed codes of a quantised module: how it is quantised (what
     * config.json's "quantization" must say for it). Mode NONE otherwise. */
    g4_quant_params quant;
} g4_synth_tensor;

typedef struct g4_synth_record {
    g4_synth_tensor *tensors;
    size_t n, cap;
    int out_of_memory;
} g4_synth_record;

/* Appends a tensor (name copied); sets out_of_memory on failure. */
void g4_synth_record_add(g4_synth_record *r, const char *name, g4_dtype dtype, int ndim, const int64_t *shape,
                         g4_synth_fill fill, uint64_t seed, g4_quant_params quant);
uint64_t g4_synth_tensor_bytes(const g4_synth_tensor *t);
void g4_synth_record_free(g4_synth_record *r);

#endif
