#include "tensor/fp8.h"

#include <math.h>

uint8_t g4_f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (isnan(f)) return sign | 0x7f;
    const float a = fabsf(f);
    if (a >= G4_E4M3_MAX) return sign | 0x7e;
    if (a < 0.015625f) /* below 2^-6: subnormals, steps of 2^-9 (8 steps is the smallest normal, 0x08) */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;        /* a in [2^e, 2^(e+1)), e in [-6, 8] */
    int q = (int)nearbyintf(ldexpf(a, 3 - e)); /* 8..16: 1.mmm in eighths */
    if (q == 16) q = 8, e++;
    if (e > 8 || (e == 8 && q > 14)) return sign | 0x7e;
    return sign | (uint8_t)((e + 7) << 3) | (uint8_t)(q - 8);
}
