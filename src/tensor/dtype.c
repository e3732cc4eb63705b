#include "tensor/dtype.h"

#include <math.h>

static const struct {
    g4_dtype type;
    const char *name;
    size_t size;
} dtype_table[] = {
    {G4_DTYPE_F64, "F64", 8}, {G4_DTYPE_F32, "F32", 4}, {G4_DTYPE_F16, "F16", 2},
    {G4_DTYPE_BF16, "BF16", 2}, {G4_DTYPE_I64, "I64", 8}, {G4_DTYPE_I32, "I32", 4},
    {G4_DTYPE_I16, "I16", 2}, {G4_DTYPE_I8, "I8", 1}, {G4_DTYPE_U64, "U64", 8},
    {G4_DTYPE_U32, "U32", 4}, {G4_DTYPE_U16, "U16", 2}, {G4_DTYPE_U8, "U8", 1},
    {G4_DTYPE_BOOL, "BOOL", 1},
};

size_t g4_dtype_size(g4_dtype t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].type == t) return dtype_table[i].size;
    return 0;
}

const char *g4_dtype_name(g4_dtype t) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].type == t) return dtype_table[i].name;
    return "INVALID";
}

g4_dtype g4_dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (!strcmp(dtype_table[i].name, name)) return dtype_table[i].type;
    return G4_DTYPE_INVALID;
}

float g4_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: value = mant * 2^-24 */
            float f = ldexpf((float)mant, -24);
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t g4_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00; /* overflow to inf */
    if (a < 6.103515625e-05f) {              /* subnormal range: round(a * 2^24) */
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    memcpy(&u, &a, 4);
    uint32_t exp = (u >> 23) - 112, mant = u & 0x7fffff;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

float g4_load_as_f32(const void *data, g4_dtype t, size_t i) {
    const unsigned char *p = data;
    switch (t) {
    case G4_DTYPE_F64: { double v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    case G4_DTYPE_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    case G4_DTYPE_F16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return g4_f16_to_f32(v); }
    case G4_DTYPE_BF16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return g4_bf16_to_f32(v); }
    case G4_DTYPE_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    case G4_DTYPE_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return (float)v; }
    case G4_DTYPE_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return (float)v; }
    case G4_DTYPE_I8: return (float)((const int8_t *)data)[i];
    case G4_DTYPE_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (float)v; }
    case G4_DTYPE_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return (float)v; }
    case G4_DTYPE_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return (float)v; }
    case G4_DTYPE_U8:
    case G4_DTYPE_BOOL: return (float)p[i];
    default: return NAN;
    }
}
