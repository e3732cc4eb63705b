/* fp8 e4m3 (the OCP "E4M3FN" of NVIDIA's FP8 and PyTorch's float8_e4m3fn):
 * 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, the
 * largest finite value 448, subnormals down to 2^-9, 0x7f / 0xff NaN. */
#ifndef G4_TENSOR_FP8_H
#define G4_TENSOR_FP8_H

#include <stdint.h>
#include <string.h>

#define G4_E4M3_MAX 448.0f

/* Round to nearest even, saturating to +-448 (as CUDA's __NV_SATFINITE);
 * NaN stays NaN (0x7f with the sign). */
uint8_t g4_f32_to_e4m3(float f);

static inline float g4_e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
    float f;
    if ((b & 0x7f) == 0x7f) {
        const uint32_t nan = sign | 0x7fc00000u;
        memcpy(&f, &nan, 4);
    } else if (e == 0) {
        f = (float)m * (1.0f / 512.0f);
        if (sign) f = -f;
    } else {
        const uint32_t u = sign | ((e + 120) << 23) | (m << 20);
        memcpy(&f, &u, 4);
    }
    return f;
}

#endif
