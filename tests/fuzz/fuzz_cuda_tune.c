/* libFuzzer target: g4_cuda_tuning_parse on arbitrary text (made a C string
 * at its first NUL). A spec that parses must leave every field in its range
 * and print back (g4_cuda_tuning_format) to text that parses to the same
 * settings; one that fails must leave the settings untouched and say why.
 * The planner then takes the settings for a few shapes without crashing. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_plan.h"
#include "backend/cuda_tuning.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ranges(const g4_cuda_tuning *t) {
    if (t->graphs < 0 || t->graphs > 1 || t->pdl < 0 || t->pdl > 1 || t->i8_min8 < 0) __builtin_trap();
    if (t->gemv_copies < 1 || t->gemv_copies > 64 || t->gemv_split < -1 || t->gemv_split > 1) __builtin_trap();
    if (t->attn_min_split < 0 || t->attn_tc_split < -1 || t->moe_cublas < 0) __builtin_trap();
    if (t->q_chunk < 1 || t->q_chunk > 1024 || t->wgmma < 0 || t->wgmma > 2) __builtin_trap();
    if (t->gemv < G4_CUDA_GEMV_AUTO || t->gemv > G4_CUDA_GEMV_FP16 || t->attn < G4_CUDA_ATTN_AUTO ||
        t->attn > G4_CUDA_ATTN_TC || t->moe < G4_CUDA_MOE_AUTO || t->moe > G4_CUDA_MOE_MMA)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    const g4_cuda_caps caps = {132, 9, 0, 232448, 1};
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&caps);
    const g4_cuda_tuning before = t;
    char err[256];
    if (!g4_cuda_tuning_parse(&t, spec, err, sizeof err)) {
        if (memcmp(&t, &before, sizeof t) != 0 || err[0] == '\0' || strlen(err) >= sizeof err) __builtin_trap();
        free(spec);
        return 0;
    }
    check_ranges(&t);
    char text[512];
    const int n = g4_cuda_tuning_format(&t, text, sizeof text);
    if (n <= 0 || (size_t)n >= sizeof text) __builtin_trap();
    g4_cuda_tuning back = g4_cuda_tuning_defaults(&caps);
    if (!g4_cuda_tuning_parse(&back, text, err, sizeof err) || memcmp(&back, &t, sizeof t) != 0) __builtin_trap();
    static const g4_weight_format formats[] = {G4_WEIGHT_BF16, G4_WEIGHT_AFFINE, G4_WEIGHT_MXFP4};
    for (int f = 0; f < 3; f++)
        for (int tokens = 1; tokens <= 9; tokens += 4) {
            g4_matrix w;
            memset(&w, 0, sizeof w);
            w.format = formats[f];
            w.rows = 4096;
            w.cols = 2048;
            w.bits = f == 0 ? 0 : f == 1 ? 8 : 4;
            w.group_size = f == 0 ? 0 : f == 1 ? 64 : 32;
            w.row_bytes = f == 0 ? 4096 : f == 1 ? 2048 : 1024;
            w.data = (const void *)(uintptr_t)0x10000;
            const g4_gemv_shape s = {&w, tokens, 0, 1, 1, 1, 0, 0, 0};
            const g4_gemv_plan p = g4_plan_gemv(&caps, &t, &s);
            if (p.kernel <= G4_KERNEL_SKIP || p.kernel >= G4_KERNEL_COUNT || p.parts < 1 || p.copies < 1 ||
                p.copies > 64)
                __builtin_trap();
        }
    free(spec);
    return 0;
}
