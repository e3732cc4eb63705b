/* Image preprocessing against transformers' own outputs in the vendored
 * fixtures: image.png through our decoder, resize and patchify must give
 * the processors' pixel_values and position ids. */
#include "io/safetensors.h"
#include "media/image.h"
#include "media/image_patches.h"
#include "test_util.h"

typedef struct {
    double max_abs;
    size_t differing, total;
} diff_stats;

static diff_stats compare(const float *a, const float *b, size_t n) {
    diff_stats s = {0, 0, n};
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > s.max_abs) s.max_abs = d;
        if (d > 1e-6) s.differing++; /* a different 8-bit level, not a rounding of v/255 */
    }
    return s;
}

static const g4_st_tensor *need(g4_st_set *set, const char *name, g4_dtype dtype, int64_t rows, int64_t cols) {
    const g4_st_tensor *t = g4_st_find(set, name);
    CHECK(t != NULL, "%s missing", name);
    if (!t) return NULL;
    CHECK(t->dtype == dtype && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols,
          "%s: unexpected dtype/shape [%lld, %lld]", name, (long long)t->shape[0], (long long)t->shape[1]);
    return t->dtype == dtype && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols ? t : NULL;
}

/* One fixture: `pixels_name` was made by `backend`'s processor at budget 70. */
static void check_fixture(const char *fixture, int unified, const char *pixels_name, g4_image_backend backend,
                          int expect_exact) {
    char png[1100], ref[1100];
    snprintf(png, sizeof png, "%s/image.png", test_fixture(fixture));
    snprintf(ref, sizeof ref, "%s/ref.safetensors", test_fixture(fixture));
    g4_image img;
    g4_status st = g4_image_decode_file(png, NULL, &img);
    CHECK(st == G4_OK, "%s: %s", png, g4_error_message());
    if (st != G4_OK) return;
    CHECK(img.width == 100 && img.height == 75, "%s decoded as %dx%d", png, img.width, img.height);
    g4_st_set *set = NULL;
    st = g4_st_open(ref, &set);
    CHECK(st == G4_OK, "%s: %s", ref, g4_error_message());
    if (st != G4_OK) {
        g4_image_free(&img);
        return;
    }
    g4_image_patches p;
    st = unified ? g4_image_preprocess_unified(&img, 70, backend, &p) : g4_image_preprocess_gemma4(&img, 70, backend, &p);
    CHECK(st == G4_OK, "preprocess: %s", g4_error_message());
    if (st == G4_OK) {
        CHECK(p.n_soft_tokens == 63 && p.width == 432 && p.height == 336, "%s: %d tokens, %dx%d", fixture,
              p.n_soft_tokens, p.width, p.height);
        const g4_st_tensor *pv = need(set, pixels_name, G4_DTYPE_F32, p.rows, p.row_len);
        const g4_st_tensor *pos = need(set, "image.position_ids", G4_DTYPE_I32, p.rows, 2);
        if (pv) {
            diff_stats s = compare(p.pixel_values, (const float *)pv->data, (size_t)p.rows * p.row_len);
            printf("%s %s (%s backend): max |diff| %.3g (= %.2f/255), %zu of %zu values at another 8-bit level\n", fixture,
                   pixels_name, backend == G4_IMAGE_BACKEND_TORCHVISION ? "torchvision" : backend == G4_IMAGE_BACKEND_PIL ? "PIL" : "Pillow 12", s.max_abs, s.max_abs * 255,
                   s.differing, s.total);
            if (expect_exact) {
                CHECK(s.max_abs == 0, "%s %s: max |diff| %g", fixture, pixels_name, s.max_abs);
                CHECK(s.differing == 0, "%s %s: %zu values differ", fixture, pixels_name, s.differing);
            } else {
                CHECK(s.max_abs <= 1.0 / 255 + 1e-7 && s.differing * 1000 <= s.total, "%s %s: max %g, %zu differ",
                      fixture, pixels_name, s.max_abs, s.differing);
            }
        }
        if (pos) {
            const int32_t *r = (const int32_t *)pos->data;
            size_t bad = 0;
            for (int i = 0; i < p.rows * 2; i++) bad += r[i] != p.positions[i];
            CHECK(bad == 0, "%s: %zu position ids differ", fixture, bad);
        }
        g4_image_patches_free(&p);
    }
    g4_st_close(set);
    g4_image_free(&img);
}

int main(void) {
    /* Gemma 4 (PIL backend: the fixtures' image.pixel_values). */
    check_fixture("dense", 0, "image.pixel_values", G4_IMAGE_BACKEND_PIL, 1);
    check_fixture("e2b", 0, "image.pixel_values", G4_IMAGE_BACKEND_PIL, 1);
    check_fixture("moe", 0, "image.pixel_values", G4_IMAGE_BACKEND_PIL, 1);
    /* The fixtures were written with Pillow 12.3 (same pass order here). */
    check_fixture("dense", 0, "image.pixel_values", G4_IMAGE_BACKEND_PIL12, 1);
    /* The torchvision backend's output kept in the dense fixture. */
    check_fixture("dense", 0, "image.pixel_values_torchvision", G4_IMAGE_BACKEND_TORCHVISION, 1);
    /* The unified processor only has the torchvision backend. */
    check_fixture("unified", 1, "image.pixel_values", G4_IMAGE_BACKEND_TORCHVISION, 1);
    /* Cross-backend distance, for the record: PIL resize vs torchvision's. */
    check_fixture("dense", 0, "image.pixel_values_torchvision", G4_IMAGE_BACKEND_PIL, 0);
    return test_finish();
}
