/* The arithmetic of the CPU's matrix products. */
#ifndef G4_BACKEND_PRECISION_H
#define G4_BACKEND_PRECISION_H

typedef enum {
    /* activations rounded to the weights' precision where the processor has
     * dot-product instructions for it: bf16 for bf16 weights, int8 per group
     * for 4/8-bit MLX affine weights (see backend/cpu/cpu_fast.h) */
    G4_PRECISION_FAST = 0,
    /* float32 activations and sums throughout: the fixture tests' path */
    G4_PRECISION_EXACT = 1,
} g4_precision;

#endif
