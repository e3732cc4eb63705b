/* libFuzzer target: arbitrary bytes through the image decoders (and the
 * data-URI path when they start with "data:"); whatever decodes also goes
 * through resize and the Gemma 4 / unified patchifiers. Nothing may crash,
 * leak or read out of bounds; failures must come back as statuses. */
#include <stdint.h>
#include <string.h>

#include "media/image.h"
#include "media/image_patches.h"
#include "media/image_resize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A small pixel limit keeps each run fast; the limit logic is the same. */
    g4_image_decode_options opt = {1u << 18, 0};
    g4_image img;
    g4_status st;
    if (size >= 5 && !memcmp(data, "data:", 5))
        st = g4_image_decode_data_uri((const char *)data, size, &opt, &img);
    else
        st = g4_image_decode_memory(data, size, &opt, &img);
    if (st != G4_OK) return 0;
    const uint8_t tail = size ? data[size - 1] : 0;
    const g4_image_backend backend = (g4_image_backend)(tail % 3);
    g4_image out;
    if (g4_image_resize_bicubic(&img, 1 + tail % 61, 1 + (tail >> 2) % 37, backend, &out) == G4_OK) g4_image_free(&out);
    /* Patchifying upsamples to ~430x340 whatever the input: one input in
     * eight, so that decoding gets most of the time. */
    if ((tail & 0x70) == 0 && (uint64_t)img.width * img.height <= 1u << 16) {
        g4_image_patches p;
        if (g4_image_preprocess_gemma4(&img, 70, backend, &p) == G4_OK) g4_image_patches_free(&p);
        if (g4_image_preprocess_unified(&img, 70, backend, &p) == G4_OK) g4_image_patches_free(&p);
    }
    g4_image_free(&img);
    return 0;
}
