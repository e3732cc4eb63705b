/* Times image decode + Gemma 4 preprocessing on one file:
 *   image_bench IMAGE [max_soft_tokens] [pil|pil12|torchvision] [repeats]
 * Built by CMake as build/image_bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "media/image.h"
#include "media/image_patches.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s IMAGE [max_soft_tokens] [pil|pil12|torchvision] [repeats]\n", argv[0]);
        return 2;
    }
    const int budget = argc > 2 ? atoi(argv[2]) : 280;
    g4_image_backend backend = G4_IMAGE_BACKEND_PIL;
    if (argc > 3 && !strcmp(argv[3], "torchvision")) backend = G4_IMAGE_BACKEND_TORCHVISION;
    if (argc > 3 && !strcmp(argv[3], "pil12")) backend = G4_IMAGE_BACKEND_PIL12;
    const int repeats = argc > 4 ? atoi(argv[4]) : 5;
    double best_decode = 1e9, best_prep = 1e9;
    for (int r = 0; r < repeats; r++) {
        g4_image img;
        double t0 = g4_now_seconds();
        if (g4_image_decode_file(argv[1], NULL, &img) != G4_OK) {
            fprintf(stderr, "%s\n", g4_error_message());
            return 1;
        }
        double t1 = g4_now_seconds();
        g4_image_patches p;
        if (g4_image_preprocess_gemma4(&img, budget, backend, &p) != G4_OK) {
            fprintf(stderr, "%s\n", g4_error_message());
            return 1;
        }
        double t2 = g4_now_seconds();
        if (t1 - t0 < best_decode) best_decode = t1 - t0;
        if (t2 - t1 < best_prep) best_prep = t2 - t1;
        if (r == repeats - 1)
            printf("%dx%d -> %dx%d, %d soft tokens: decode %.1f ms, resize+patchify %.1f ms (best of %d)\n", img.width,
                   img.height, p.width, p.height, p.n_soft_tokens, best_decode * 1e3, best_prep * 1e3, repeats);
        g4_image_patches_free(&p);
        g4_image_free(&img);
    }
    return 0;
}
