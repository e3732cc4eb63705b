/* libFuzzer target: g4_st_parse_index on arbitrary text (not NUL-terminated).
 * Every shard name handed to the callback must be safe to join to the
 * model folder: non-empty, no '/', no "..". */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "guarded_input.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static g4_status check_entry(void *ctx, const char *tensor, const char *shard) {
    size_t *total = ctx;
    if (!tensor || !shard || !shard[0] || strchr(shard, '/') || strstr(shard, "..")) __builtin_trap();
    *total += strlen(tensor) + strlen(shard);
    return G4_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t total = 0;
    data = guarded_copy(data, size);
    g4_st_parse_index((const char *)data, size, "fuzz", check_entry, &total);
    return 0;
}
