/* libFuzzer target: g4_st_parse on arbitrary bytes. Besides crashes and
 * sanitizer reports, a parse that succeeds must describe tensors lying
 * inside the data section with the byte size their shape and dtype imply,
 * none overlapping another; every byte of every tensor is read so the
 * sanitizers and the guard page check the ranges. */
#include <stddef.h>
#include <stdint.h>

#include "guarded_input.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_st_tensor *t = NULL;
    size_t n = 0;
    data = guarded_copy(data, size);
    if (g4_st_parse(data, size, "fuzz", &t, &n) != G4_OK) {
        if (t || n) __builtin_trap(); /* failure must return nothing */
        return 0;
    }
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = g4_dtype_size(t[i].dtype);
        if (!t[i].name || bytes == 0 || t[i].ndim < 0 || t[i].ndim > G4_ST_MAX_DIMS) __builtin_trap();
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) __builtin_trap();
            bytes *= (uint64_t)t[i].shape[d];
        }
        if (bytes != t[i].nbytes) __builtin_trap();
        if (t[i].nbytes && (t[i].data < data + 8 || t[i].nbytes > (uint64_t)(data + size - t[i].data)))
            __builtin_trap();
        for (uint64_t b = 0; b < t[i].nbytes; b++) sum += t[i].data[b];
        /* No two non-empty tensors share a byte (quadratic, but fuzz inputs are small). */
        for (size_t j = 0; j < i && t[i].nbytes; j++)
            if (t[j].nbytes && t[i].data < t[j].data + t[j].nbytes && t[j].data < t[i].data + t[i].nbytes)
                __builtin_trap();
    }
    g4_st_free_tensors(t, n);
    return (int)(sum & 0); /* keep the reads */
}
