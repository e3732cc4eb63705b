/* Target sizes and soft-token counts against transformers'
 * get_aspect_ratio_preserving_size (20k size/budget pairs incl. 1x2000,
 * 2000x1 and sizes that round to zero), and the whole Gemma 4 preprocessing
 * against Gemma4ImageProcessorPil (CRC-32 of pixel_values and position ids),
 * plus the unified 48-px layout against the 16-px one. */
#include <string.h>

#include "image_test_util.h"
#include "media/image.h"
#include "media/image_patches.h"
#include "test_util.h"

static char *read_text(const char *name) {
    size_t n = 0;
    char *t = (char *)image_read_file(image_data_path(name), &n);
    CHECK(t != NULL, "%s missing", name);
    if (!t) return NULL;
    t = realloc(t, n + 1);
    t[n] = 0;
    return t;
}

static void target_sizes(void) {
    char *text = read_text("target_sizes.txt");
    if (!text) return;
    int cases = 0, errors = 0, per_budget[1121] = {0}, wide = 0, tall = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        int h, w, budget, th, tw;
        if (sscanf(line, "%d %d %d %d %d", &h, &w, &budget, &th, &tw) != 5) {
            CHECK(0, "bad line %s", line);
            continue;
        }
        int gh = -1, gw = -1;
        g4_status st = g4_image_target_size(h, w, 16, 3, budget, &gh, &gw);
        if (th == 0) {
            CHECK(st != G4_OK, "%dx%d @%d: transformers raises, we give %dx%d", w, h, budget, gw, gh);
            errors++;
        } else {
            CHECK(st == G4_OK && gh == th && gw == tw, "%dx%d @%d: %dx%d, transformers %dx%d (%s)", w, h, budget, gw,
                  gh, tw, th, st == G4_OK ? "" : g4_error_message());
        }
        if (g4_image_soft_tokens_supported(budget)) {
            int count = -1;
            st = g4_image_soft_token_count(h, w, budget, &count);
            CHECK(st == G4_OK && count == (th / 48) * (tw / 48), "%dx%d @%d: %d soft tokens, expected %d", w, h,
                  budget, count, (th / 48) * (tw / 48));
            CHECK(count <= budget && count > 0, "%dx%d @%d: %d tokens", w, h, budget, count);
            per_budget[budget]++;
            if (h == 1 && w >= 2000) wide++;
            if (w == 1 && h >= 2000) tall++;
        }
        cases++;
    }
    free(text);
    printf("target sizes: %d cases (%d where transformers raises); per budget 70:%d 140:%d 280:%d 560:%d 1120:%d; "
           "1-px-high %d, 1-px-wide %d\n",
           cases, errors, per_budget[70], per_budget[140], per_budget[280], per_budget[560], per_budget[1120], wide,
           tall);
    CHECK(cases > 20000 && per_budget[280] > 2000 && wide >= 5 && tall >= 5 && errors >= 1, "coverage too small");

    /* The spec's worked examples. */
    int th, tw, n;
    CHECK(g4_image_target_size(896, 896, 16, 3, 280, &th, &tw) == G4_OK && th == 768 && tw == 768, "896x896");
    CHECK(g4_image_target_size(480, 640, 16, 3, 280, &th, &tw) == G4_OK && th == 672 && tw == 912, "640x480");
    CHECK(g4_image_soft_token_count(480, 640, 280, &n) == G4_OK && n == 266, "640x480: %d tokens", n);
    CHECK(g4_image_soft_token_count(1, 2000, 280, &n) == G4_OK && n == 280, "1x2000 high: %d", n);
    CHECK(g4_image_soft_token_count(2000, 1, 280, &n) == G4_OK && n == 280, "2000x1: %d", n);
    CHECK(g4_image_soft_token_count(100, 100, 100, &n) == G4_ERR_INVALID_ARGUMENT, "budget 100 accepted");
    CHECK(g4_image_soft_token_count(0, 100, 280, &n) == G4_ERR_INVALID_ARGUMENT, "height 0 accepted");
    CHECK(g4_image_target_size(-5, 100, 16, 3, 280, &th, &tw) == G4_ERR_INVALID_ARGUMENT, "height -5 accepted");
}

static int load_rgb(const char *name, g4_image *img) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", image_data_path(""), name);
    g4_status st = g4_image_decode_file(path, NULL, img);
    CHECK(st == G4_OK, "%s: %s", path, g4_error_message());
    return st == G4_OK;
}

static void preprocess_pil(void) {
    char *text = read_text("preprocess_pil.txt");
    if (!text) return;
    int cases = 0, exact = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char name[256], pv_crc[32], pos_crc[32];
        int budget, n_soft, n_valid;
        if (sscanf(line, "%255s %d %d %d %31s %31s", name, &budget, &n_soft, &n_valid, pv_crc, pos_crc) != 6) {
            CHECK(0, "bad line %s", line);
            continue;
        }
        g4_image img;
        if (!load_rgb(name, &img)) continue;
        /* The reference machine's processor ran on Pillow 13 here (pip). */
        g4_image_patches p;
        g4_status st = g4_image_preprocess_gemma4(&img, budget, G4_IMAGE_BACKEND_PIL, &p);
        CHECK(st == G4_OK, "%s @%d: %s", name, budget, g4_error_message());
        if (st == G4_OK) {
            CHECK(p.rows == 9 * budget && p.row_len == 768, "%s: %dx%d", name, p.rows, p.row_len);
            CHECK(p.n_soft_tokens == n_soft && p.n_valid == n_valid, "%s @%d: %d tokens %d rows, expected %d %d", name,
                  budget, p.n_soft_tokens, p.n_valid, n_soft, n_valid);
            uint32_t a = image_crc32(p.pixel_values, sizeof(float) * (size_t)p.rows * p.row_len);
            uint32_t b = image_crc32(p.positions, sizeof(int32_t) * 2 * (size_t)p.rows);
            int ok = a == (uint32_t)strtoul(pv_crc, NULL, 16) && b == (uint32_t)strtoul(pos_crc, NULL, 16);
            CHECK(ok, "%s @%d: pixel_values/position_ids differ from Gemma4ImageProcessorPil", name, budget);
            exact += ok;
            g4_image_patches_free(&p);
        }
        g4_image_free(&img);
        cases++;
    }
    free(text);
    printf("Gemma4ImageProcessorPil end to end: %d of %d (image, budget) cases bit-exact\n", exact, cases);
    CHECK(cases >= 35, "only %d cases", cases);
}

/* The unified embedder's 48-px rows are the 16-px patches' 3x3 blocks in
 * raster order (SPEC-gemma4-unified-assistant.md §A4.1). */
static void unified_layout(void) {
    g4_image img;
    if (!load_rgb("resize/src_200x150.png", &img)) return;
    g4_image_patches small, big;
    CHECK(g4_image_preprocess_gemma4(&img, 140, G4_IMAGE_BACKEND_TORCHVISION, &small) == G4_OK, "%s",
          g4_error_message());
    CHECK(g4_image_preprocess_unified(&img, 140, G4_IMAGE_BACKEND_TORCHVISION, &big) == G4_OK, "%s",
          g4_error_message());
    if (small.pixel_values && big.pixel_values) {
        CHECK(big.rows == 140 && big.row_len == 6912 && big.n_valid == big.n_soft_tokens &&
                  big.n_soft_tokens == small.n_soft_tokens,
              "unified: %d rows of %d, %d valid, %d tokens", big.rows, big.row_len, big.n_valid, big.n_soft_tokens);
        const int pw = small.width / 16, gw = big.width / 48;
        size_t bad = 0;
        for (int r = 0; r < big.n_valid; r++) {
            const int gx = r % gw, gy = r / gw;
            bad += big.positions[2 * r] != gx || big.positions[2 * r + 1] != gy;
            for (int Y = 0; Y < 48; Y++)
                for (int X = 0; X < 48; X++)
                    for (int c = 0; c < 3; c++) {
                        const int py = gy * 3 + Y / 16, px = gx * 3 + X / 16;
                        const float want = small.pixel_values[((size_t)py * pw + px) * 768 + ((Y % 16) * 16 + X % 16) * 3 + c];
                        bad += big.pixel_values[(size_t)r * 6912 + (Y * 48 + X) * 3 + c] != want;
                    }
        }
        for (int r = big.n_valid; r < big.rows; r++) {
            bad += big.positions[2 * r] != -1 || big.positions[2 * r + 1] != -1;
            for (int i = 0; i < 6912; i++) bad += big.pixel_values[(size_t)r * 6912 + i] != 0.0f;
        }
        CHECK(bad == 0, "unified layout: %zu values differ from the 3x3 blocks of 16-px patches", bad);
    }
    g4_image_patches_free(&small);
    g4_image_patches_free(&big);

    /* to_patches refuses what does not fit. */
    float pv[768 * 2];
    int32_t pos[4];
    int n;
    CHECK(g4_image_to_patches(&img, 16, 2, G4_IMAGE_BACKEND_PIL, pv, pos, &n) != G4_OK, "200x150 not a multiple of 16");
    g4_image_free(&img);
    g4_image sq;
    CHECK(g4_image_alloc(&sq, 32, 16) == G4_OK, "alloc");
    memset(sq.rgb, 255, 32 * 16 * 3);
    CHECK(g4_image_to_patches(&sq, 16, 1, G4_IMAGE_BACKEND_PIL, pv, pos, &n) == G4_ERR_LIMIT, "2 patches in 1 row");
    CHECK(g4_image_to_patches(&sq, 16, 2, G4_IMAGE_BACKEND_PIL, pv, pos, &n) == G4_OK && n == 2 && pv[0] == 1.0f &&
              pos[2] == 1 && pos[3] == 0,
          "32x16 white: n=%d pv=%g pos=(%d,%d)", n, pv[0], pos[2], pos[3]);
    g4_image_free(&sq);
}

int main(void) {
    target_sizes();
    preprocess_pil();
    unified_layout();
    return test_finish();
}
