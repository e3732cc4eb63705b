/* The JSON parser (Debian's libcjson) is not built with sanitizers, so ASan
 * cannot see it read past the end of the input. Fuzz targets therefore hand
 * the parser a copy that ends exactly where an inaccessible page begins: any
 * read past the end faults, and libFuzzer reports the input. */
#ifndef G4_FUZZ_GUARDED_INPUT_H
#define G4_FUZZ_GUARDED_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static inline const uint8_t *guarded_copy(const uint8_t *data, size_t size) {
    static uint8_t *region;
    static size_t usable; /* bytes before the guard page */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!region || size > usable) {
        if (region) munmap(region, usable + page);
        usable = (size + page - 1) / page * page;
        if (usable == 0) usable = page;
        region = mmap(NULL, usable + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) __builtin_trap();
        if (mprotect(region + usable, page, PROT_NONE) != 0) __builtin_trap();
    }
    uint8_t *copy = region + usable - size;
    if (size) memcpy(copy, data, size);
    return copy;
}

#endif
