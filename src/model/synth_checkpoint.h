/* Full-size checkpoints with random weights, written to disk (`gemma4 synth`):
 * the tensors a synthetic model of a config is made of, under the names and
 * in the layout a real checkpoint of the format has, so that loading the
 * written folder gives the synthetic model bit for bit. Used to measure
 * loading real-size files (memory maps, page cache) without downloading. */
#ifndef G4_MODEL_SYNTH_CHECKPOINT_H
#define G4_MODEL_SYNTH_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    /* called after each piece written (may be NULL) */
    void (*progress)(void *user, uint64_t written, uint64_t total);
    void *user;
} g4_synth_checkpoint_options;

typedef struct {
    size_t n_tensors;
    uint64_t tensor_bytes; /* all tensors' bytes (the file adds its header) */
} g4_synth_checkpoint_info;

/* Writes `dir`/model.safetensors and `dir`/config.json (dir is created if
 * missing) for the model config_json describes in `format` (bf16: Hugging
 * Face names; mlx4, mlx8, mxfp4: MLX names and a "quantization" block as
 * mlx-community configs carry it). Only the text decoder is written: the
 * config loses vision_config and audio_config, since synthetic models have
 * no towers. Tensors are made and written piece by piece (64 MiB), so memory
 * stays small whatever the model's size. */
g4_status g4_synth_checkpoint_write(const char *config_json, size_t len, const char *label, const char *format,
                                    const char *dir, const g4_synth_checkpoint_options *opt,
                                    g4_synth_checkpoint_info *info);

/* The config.json text g4_synth_checkpoint_write writes (malloc'd). */
g4_status g4_synth_checkpoint_config(const char *config_json, size_t len, const char *label, const char *format,
                                     char **out);

#endif
