/* Element types of stored tensors and scalar conversions between them. */
#ifndef G4_TENSOR_DTYPE_H
#define G4_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    G4_DTYPE_INVALID = 0,
    G4_DTYPE_F64,
    G4_DTYPE_F32,
    G4_DTYPE_F16,
    G4_DTYPE_BF16,
    G4_DTYPE_I64,
    G4_DTYPE_I32,
    G4_DTYPE_I16,
    G4_DTYPE_I8,
    G4_DTYPE_U64,
    G4_DTYPE_U32,
    G4_DTYPE_U16,
    G4_DTYPE_U8,
    G4_DTYPE_BOOL,
} g4_dtype;

/* Bytes per element (0 for G4_DTYPE_INVALID). */
size_t g4_dtype_size(g4_dtype t);
/* safetensors spelling: "F32", "BF16", ... */
const char *g4_dtype_name(g4_dtype t);
/* Parses the safetensors spelling; G4_DTYPE_INVALID when unknown. */
g4_dtype g4_dtype_from_name(const char *name);

static inline float g4_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as PyTorch does; NaN stays NaN. */
static inline uint16_t g4_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* float -> bf16 -> float, the rounding a bf16 tensor applies. */
static inline float g4_round_bf16(float f) { return g4_bf16_to_f32(g4_f32_to_bf16(f)); }

float g4_f16_to_f32(uint16_t h);
uint16_t g4_f32_to_f16(float f);

/* Reads element i of a buffer of type t as float (integers converted). */
float g4_load_as_f32(const void *data, g4_dtype t, size_t i);

#endif
