/* Release configs compiled into the binary (the JSON files in src/model/presets), for
 * synthetic full-size models in benchmarks. */
#ifndef G4_MODEL_PRESETS_H
#define G4_MODEL_PRESETS_H

#include <stddef.h>

typedef struct {
    const char *name; /* file stem: "e2b", "26b-a4b-mlx4", ... */
    const char *json;
    size_t len;
} g4_preset;

/* Terminated by an entry with name NULL. */
extern const g4_preset g4_presets[];

#endif
