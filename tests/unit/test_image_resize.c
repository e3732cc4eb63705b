/* Bicubic resize against PIL.Image.resize(BICUBIC) (and torchvision's uint8
 * antialiased bicubic when its references exist) over many sizes: up and
 * down, odd sizes, one axis only, extreme aspect ratios. */
#include <string.h>

#include "image_test_util.h"
#include "media/image.h"
#include "media/image_resize.h"
#include "test_util.h"

typedef struct {
    int cases, exact, stored, checksummed;
    int max_diff;
    size_t differing;
} tally;

static void run_cases(const char *list_name, const char *blob_name, g4_image_backend backend, const char *label,
                      tally *t) {
    size_t n = 0, blob_size = 0;
    char *list = (char *)image_read_file(image_data_path(list_name), &n);
    uint8_t *blob = image_read_file(image_data_path(blob_name), &blob_size);
    CHECK(list != NULL, "%s missing", list_name);
    if (!list) return;
    list = realloc(list, n + 1);
    list[n] = 0;
    char *save = NULL;
    for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char src_name[256], crc_text[32];
        int w, h;
        long offset;
        if (sscanf(line, "%255s %d %d %ld %31s", src_name, &w, &h, &offset, crc_text) != 5) {
            CHECK(0, "bad line %s", line);
            continue;
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", image_data_path("resize"), src_name);
        g4_image src, out;
        if (g4_image_decode_file(path, NULL, &src) != G4_OK) {
            CHECK(0, "%s: %s", path, g4_error_message());
            continue;
        }
        g4_status st = g4_image_resize_bicubic(&src, w, h, backend, &out);
        CHECK(st == G4_OK, "%s -> %dx%d: %s", src_name, w, h, g4_error_message());
        if (st == G4_OK) {
            const size_t len = (size_t)w * h * 3;
            int same;
            if (offset >= 0) {
                CHECK(blob && (size_t)offset + len <= blob_size, "%s: reference past the end of %s", line, blob_name);
                if (!blob || (size_t)offset + len > blob_size) {
                    g4_image_free(&out);
                    g4_image_free(&src);
                    continue;
                }
                const uint8_t *ref = blob + offset;
                size_t differ = 0;
                for (size_t i = 0; i < len; i++) {
                    int d = abs((int)out.rgb[i] - (int)ref[i]);
                    differ += d != 0;
                    if (d > t->max_diff) t->max_diff = d;
                }
                t->differing += differ;
                same = differ == 0;
                t->stored++;
            } else {
                same = image_crc32(out.rgb, len) == (uint32_t)strtoul(crc_text, NULL, 16);
                t->checksummed++;
                if (!same && t->max_diff == 0) t->max_diff = -1; /* unknown size of difference */
            }
            CHECK(same, "%s %s -> %dx%d differs from %s", label, src_name, w, h, label);
            t->exact += same;
            g4_image_free(&out);
        }
        g4_image_free(&src);
        t->cases++;
    }
    free(list);
    free(blob);
}

/* Both backends against each other on the PIL cases: how far apart they are. */
static void cross_backend(void) {
    const int sizes[][4] = {{200, 150, 432, 336}, {200, 150, 96, 48}, {100, 75, 432, 336}, {64, 48, 17, 31},
                            {37, 29, 111, 61}, {255, 3, 4032, 48}, {2, 500, 48, 13440}};
    size_t total = 0, differ = 0;
    int max_diff = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/src_%dx%d.png", image_data_path("resize"), sizes[k][0], sizes[k][1]);
        g4_image src, a, b;
        if (g4_image_decode_file(path, NULL, &src) != G4_OK) {
            CHECK(0, "%s: %s", path, g4_error_message());
            continue;
        }
        CHECK(g4_image_resize_bicubic(&src, sizes[k][2], sizes[k][3], G4_IMAGE_BACKEND_PIL, &a) == G4_OK, "pil");
        CHECK(g4_image_resize_bicubic(&src, sizes[k][2], sizes[k][3], G4_IMAGE_BACKEND_TORCHVISION, &b) == G4_OK,
              "torchvision");
        if (a.rgb && b.rgb) {
            size_t len = (size_t)a.width * a.height * 3;
            for (size_t i = 0; i < len; i++) {
                int d = abs((int)a.rgb[i] - (int)b.rgb[i]);
                differ += d != 0;
                if (d > max_diff) max_diff = d;
            }
            total += len;
        }
        g4_image_free(&a);
        g4_image_free(&b);
        g4_image_free(&src);
    }
    printf("PIL vs torchvision backends: max |diff| %d/255, %zu of %zu values differ (%.3f%%)\n", max_diff, differ,
           total, 100.0 * differ / (total ? total : 1));
    CHECK(max_diff <= 2, "the two backends differ by %d levels", max_diff);
}

static void bad_arguments(void) {
    g4_image src, out;
    CHECK(g4_image_alloc(&src, 4, 4) == G4_OK, "alloc");
    memset(src.rgb, 7, 48);
    CHECK(g4_image_resize_bicubic(&src, 0, 4, G4_IMAGE_BACKEND_PIL, &out) == G4_ERR_INVALID_ARGUMENT, "width 0");
    CHECK(g4_image_resize_bicubic(&src, 4, -1, G4_IMAGE_BACKEND_PIL, &out) == G4_ERR_INVALID_ARGUMENT, "height -1");
    CHECK(g4_image_resize_bicubic(&src, 4, 4, (g4_image_backend)9, &out) == G4_ERR_INVALID_ARGUMENT, "backend 9");
    CHECK(g4_image_resize_bicubic(&src, 4, 4, G4_IMAGE_BACKEND_PIL, &out) == G4_OK && !memcmp(out.rgb, src.rgb, 48),
          "same size copies");
    g4_image_free(&out);
    /* A flat image stays flat through any resize (weights sum to one). */
    CHECK(g4_image_resize_bicubic(&src, 13, 3, G4_IMAGE_BACKEND_TORCHVISION, &out) == G4_OK, "flat");
    int flat = 1;
    for (int i = 0; i < 13 * 3 * 3; i++) flat &= out.rgb[i] == 7;
    CHECK(flat, "flat image changed");
    g4_image_free(&out);
    g4_image_free(&src);
}

int main(void) {
    tally pil = {0}, tv = {0}, pil12 = {0};
    run_cases("resize_pil.txt", "resize_pil.bin", G4_IMAGE_BACKEND_PIL, "PIL", &pil);
    printf("PIL: %d resize cases (%d compared byte by byte, %d by CRC-32), %d bit-exact, max |diff| %d, %zu values "
           "differ\n",
           pil.cases, pil.stored, pil.checksummed, pil.exact, pil.max_diff, pil.differing);
    CHECK(pil.cases >= 150, "only %d PIL cases", pil.cases);
    /* Written on a machine with torch (torch 2.11 asserts on the 11 cases
     * that shrink an image to 1x1; they are left out as "# ERROR" lines). */
    run_cases("resize_torchvision.txt", "resize_torchvision.bin", G4_IMAGE_BACKEND_TORCHVISION, "torchvision", &tv);
    printf("torchvision: %d resize cases (%d byte by byte, %d by CRC-32), %d bit-exact, max |diff| %d, %zu values "
           "differ\n",
           tv.cases, tv.stored, tv.checksummed, tv.exact, tv.max_diff, tv.differing);
    CHECK(tv.cases >= 150, "only %d torchvision cases", tv.cases);
    run_cases("resize_pil12.txt", "resize_pil12.bin", G4_IMAGE_BACKEND_PIL12, "Pillow 12", &pil12);
    printf("Pillow 12: %d resize cases (%d byte by byte, %d by CRC-32), %d bit-exact, max |diff| %d, %zu values "
           "differ\n",
           pil12.cases, pil12.stored, pil12.checksummed, pil12.exact, pil12.max_diff, pil12.differing);
    CHECK(pil12.cases == pil.cases, "Pillow 12 cases %d vs %d", pil12.cases, pil.cases);
    cross_backend();
    bad_arguments();
    return test_finish();
}
