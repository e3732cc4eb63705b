#include "media/image_patches.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int g4_image_soft_tokens_supported(int max_soft_tokens) {
    return max_soft_tokens == 70 || max_soft_tokens == 140 || max_soft_tokens == 280 || max_soft_tokens == 560 ||
           max_soft_tokens == 1120;
}

g4_status g4_image_target_size(int height, int width, int patch, int pool, int max_soft_tokens,
                               int *target_height, int *target_width) {
    if (height <= 0 || width <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image size %dx%d (width x height) is empty", width, height);
    if (patch <= 0 || pool <= 0 || max_soft_tokens <= 0 || max_soft_tokens > (1 << 20))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image target size: invalid patch %d, pooling %d or budget %d", patch,
                       pool, max_soft_tokens);
    /* Same double arithmetic as the Python (exact integer products,
     * correctly rounded division and sqrt), so the floors agree. */
    const int64_t max_patches = (int64_t)max_soft_tokens * pool * pool;
    const int64_t target_px = max_patches * patch * patch;
    const double factor = sqrt((double)target_px / (double)((int64_t)height * width));
    const int64_t side = (int64_t)patch * pool;
    int64_t th = (int64_t)floor(factor * height / side) * side;
    int64_t tw = (int64_t)floor(factor * width / side) * side;
    if (th == 0 && tw == 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image %dx%d would resize to 0x0 (budget %d soft tokens)", width,
                       height, max_soft_tokens);
    const int64_t max_side = (max_patches / ((int64_t)pool * pool)) * side;
    if (th == 0) {
        th = side;
        tw = (int64_t)floor((double)width / height) * side;
        if (tw > max_side) tw = max_side;
    } else if (tw == 0) {
        tw = side;
        th = (int64_t)floor((double)height / width) * side;
        if (th > max_side) th = max_side;
    }
    if (th * tw > target_px)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image %dx%d resized to %lldx%lld exceeds %lld patches of %d px",
                       width, height, (long long)tw, (long long)th, (long long)max_patches, patch);
    if (th > INT32_MAX || tw > INT32_MAX)
        return g4_fail(G4_ERR_LIMIT, "image target size %lldx%lld is too large", (long long)tw, (long long)th);
    *target_height = (int)th;
    *target_width = (int)tw;
    return G4_OK;
}

g4_status g4_image_soft_token_count(int height, int width, int max_soft_tokens, int *count) {
    if (!g4_image_soft_tokens_supported(max_soft_tokens))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "max_soft_tokens must be one of 70, 140, 280, 560, 1120 (got %d)",
                       max_soft_tokens);
    int th, tw;
    g4_status st = g4_image_target_size(height, width, G4_IMAGE_PATCH_SIZE, G4_IMAGE_POOLING, max_soft_tokens, &th, &tw);
    if (st != G4_OK) return st;
    const int side = G4_IMAGE_PATCH_SIZE * G4_IMAGE_POOLING;
    *count = (th / side) * (tw / side);
    return G4_OK;
}

g4_status g4_image_to_patches(const g4_image *img, int patch, int max_rows, g4_image_backend backend,
                              float *pixel_values, int32_t *positions, int *n_valid) {
    if (!img || !img->rgb || patch <= 0 || img->width % patch || img->height % patch)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image patches: %dx%d image is not a whole number of %d-px patches",
                       img ? img->width : 0, img ? img->height : 0, patch);
    const int pw = img->width / patch, ph = img->height / patch;
    if ((int64_t)pw * ph > max_rows)
        return g4_fail(G4_ERR_LIMIT, "image patches: %d x %d patches exceed the %d rows", pw, ph, max_rows);
    /* The two processors round v/255 differently: PIL's numpy path scales in
     * double then casts, torchvision multiplies float32 by float32(1/255). */
    float table[256];
    for (int v = 0; v < 256; v++)
        table[v] = backend == G4_IMAGE_BACKEND_TORCHVISION ? (float)v * (float)(1.0 / 255.0) : (float)(v * (1.0 / 255.0));
    const size_t row_len = (size_t)patch * patch * 3;
    for (int py = 0; py < ph; py++) {
        for (int px = 0; px < pw; px++) {
            const size_t r = (size_t)py * pw + px;
            float *dst = pixel_values + r * row_len;
            for (int dy = 0; dy < patch; dy++) {
                const uint8_t *src = img->rgb + (((size_t)py * patch + dy) * img->width + (size_t)px * patch) * 3;
                for (int i = 0; i < patch * 3; i++) *dst++ = table[src[i]];
            }
            positions[2 * r] = px;
            positions[2 * r + 1] = py;
        }
    }
    const size_t n = (size_t)pw * ph;
    memset(pixel_values + n * row_len, 0, sizeof(float) * row_len * (size_t)(max_rows - n));
    for (size_t r = n; r < (size_t)max_rows; r++) positions[2 * r] = positions[2 * r + 1] = -1;
    *n_valid = (int)n;
    return G4_OK;
}

void g4_image_patches_free(g4_image_patches *p) {
    if (!p) return;
    free(p->pixel_values);
    free(p->positions);
    memset(p, 0, sizeof *p);
}

static g4_status preprocess(const g4_image *img, int max_soft_tokens, g4_image_backend backend, int patch, int rows,
                            g4_image_patches *out) {
    memset(out, 0, sizeof *out);
    if (!img || !img->rgb || img->width <= 0 || img->height <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image preprocess: empty image");
    if (!g4_image_soft_tokens_supported(max_soft_tokens))
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "max_soft_tokens must be one of 70, 140, 280, 560, 1120 (got %d)",
                       max_soft_tokens);
    int th, tw;
    g4_status st = g4_image_target_size(img->height, img->width, G4_IMAGE_PATCH_SIZE, G4_IMAGE_POOLING,
                                        max_soft_tokens, &th, &tw);
    if (st != G4_OK) return st;
    g4_image resized = {0};
    const g4_image *src = img;
    if (th != img->height || tw != img->width) { /* the references skip an unchanged size */
        if ((st = g4_image_resize_bicubic(img, tw, th, backend, &resized)) != G4_OK) return st;
        src = &resized;
    }
    out->rows = rows;
    out->row_len = patch * patch * 3;
    out->pixel_values = malloc(sizeof(float) * (size_t)rows * out->row_len);
    out->positions = malloc(sizeof(int32_t) * 2 * (size_t)rows);
    if (!out->pixel_values || !out->positions) {
        st = g4_fail(G4_ERR_OUT_OF_MEMORY, "image preprocess: out of memory for %d rows", rows);
    } else {
        st = g4_image_to_patches(src, patch, rows, backend, out->pixel_values, out->positions, &out->n_valid);
    }
    g4_image_free(&resized);
    if (st != G4_OK) {
        g4_image_patches_free(out);
        return st;
    }
    const int side = G4_IMAGE_PATCH_SIZE * G4_IMAGE_POOLING;
    out->n_soft_tokens = (th / side) * (tw / side);
    out->width = tw;
    out->height = th;
    return G4_OK;
}

g4_status g4_image_preprocess_gemma4(const g4_image *img, int max_soft_tokens, g4_image_backend backend,
                                     g4_image_patches *out) {
    return preprocess(img, max_soft_tokens, backend, G4_IMAGE_PATCH_SIZE,
                      max_soft_tokens * G4_IMAGE_POOLING * G4_IMAGE_POOLING, out);
}

g4_status g4_image_preprocess_unified(const g4_image *img, int max_soft_tokens, g4_image_backend backend,
                                      g4_image_patches *out) {
    return preprocess(img, max_soft_tokens, backend, G4_IMAGE_UNIFIED_PATCH, max_soft_tokens, out);
}
