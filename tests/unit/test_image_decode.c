/* Decoding against transformers' load_image (PIL open + exif_transpose +
 * convert("RGB")) on every PNG/JPEG/WebP flavour in tests/data/image/decode,
 * and clear failures on broken, truncated, huge or unsupported inputs. */
#include <string.h>

#include "image_test_util.h"
#include "media/image.h"
#include "test_util.h"

static int n_exact, n_failed_as_expected;

static void check_case(const char *name, int width, int height, const char *expect) {
    const char *path = image_data_path("decode");
    char file[1200];
    snprintf(file, sizeof file, "%s/%s", path, name);
    g4_image img;
    g4_status st = g4_image_decode_file(file, NULL, &img);
    if (!strcmp(expect, "FAIL") || !strcmp(expect, "UNSUPPORTED")) {
        CHECK(st != G4_OK, "%s: decoded although PIL refuses it", name);
        CHECK(img.rgb == NULL && img.width == 0, "%s: output not cleared on failure", name);
        CHECK(strlen(g4_error_message()) > 10, "%s: no error message", name);
        if (!strcmp(expect, "UNSUPPORTED")) CHECK(st == G4_ERR_UNSUPPORTED, "%s: status %s", name, g4_status_name(st));
        if (strstr(name, "bomb")) CHECK(st == G4_ERR_LIMIT, "%s: status %s (%s)", name, g4_status_name(st), g4_error_message());
        if (st != G4_OK) n_failed_as_expected++;
        if (getenv("G4_VERBOSE")) printf("%-32s -> %s\n", name, g4_error_message());
        g4_image_free(&img);
        return;
    }
    CHECK(st == G4_OK, "%s: %s", name, g4_error_message());
    if (st != G4_OK) return;
    char ref_name[1300];
    snprintf(ref_name, sizeof ref_name, "%s.rgb", file);
    size_t n = 0;
    uint8_t *ref = image_read_file(ref_name, &n);
    CHECK(ref != NULL, "%s missing", ref_name);
    CHECK(img.width == width && img.height == height, "%s: %dx%d, PIL %dx%d", name, img.width, img.height, width,
          height);
    if (ref && img.width == width && img.height == height && n == (size_t)width * height * 3) {
        size_t differ = 0;
        int max_diff = 0;
        for (size_t i = 0; i < n; i++) {
            int d = abs((int)img.rgb[i] - (int)ref[i]);
            differ += d != 0;
            if (d > max_diff) max_diff = d;
        }
        CHECK(differ == 0, "%s: %zu of %zu bytes differ from PIL (max %d)", name, differ, n, max_diff);
        CHECK(image_crc32(ref, n) == strtoul(expect, NULL, 16), "%s: reference file does not match its checksum",
              name);
        n_exact += differ == 0;
    }
    free(ref);
    g4_image_free(&img);
}

static void check_options(void) {
    char file[1200];
    snprintf(file, sizeof file, "%s/orient6_exif.png", image_data_path("decode"));
    g4_image img;
    g4_image_decode_options keep = {0, 1};
    CHECK(g4_image_decode_file(file, &keep, &img) == G4_OK, "%s", g4_error_message());
    CHECK(img.width == 7 && img.height == 4, "keep_orientation: %dx%d", img.width, img.height);
    g4_image_free(&img);
    CHECK(g4_image_decode_file(file, NULL, &img) == G4_OK, "%s", g4_error_message());
    CHECK(img.width == 4 && img.height == 7, "orientation 6: %dx%d", img.width, img.height);
    g4_image_free(&img);

    snprintf(file, sizeof file, "%s/png_pil_rgb.png", image_data_path("decode"));
    g4_image_decode_options small = {100, 0};
    g4_status st = g4_image_decode_file(file, &small, &img);
    CHECK(st == G4_ERR_LIMIT && strstr(g4_error_message(), "limit"), "max_pixels: %s", g4_error_message());
    CHECK(g4_image_decode_file("/nonexistent/x.png", NULL, &img) == G4_ERR_IO, "missing file: %s", g4_error_message());
    CHECK(g4_image_decode_memory(NULL, 0, NULL, &img) != G4_OK, "NULL input accepted");

    /* From memory and from a data URI: the same pixels as from the file. */
    g4_image from_file, from_uri, from_mem;
    CHECK(g4_image_decode_file(file, NULL, &from_file) == G4_OK, "%s", g4_error_message());
    size_t n = 0, m = 0;
    uint8_t *bytes = image_read_file(file, &n);
    snprintf(file, sizeof file, "%s/png_pil_rgb.uri", image_data_path("decode"));
    char *uri = (char *)image_read_file(file, &m);
    CHECK(bytes && uri, "test files missing");
    if (bytes && uri && from_file.rgb) {
        CHECK(g4_image_decode_memory(bytes, n, NULL, &from_mem) == G4_OK, "%s", g4_error_message());
        CHECK(g4_image_decode_data_uri(uri, m, NULL, &from_uri) == G4_OK, "%s", g4_error_message());
        size_t len = (size_t)from_file.width * from_file.height * 3;
        CHECK(from_mem.rgb && !memcmp(from_mem.rgb, from_file.rgb, len), "memory decode differs");
        CHECK(from_uri.rgb && from_uri.width == from_file.width && !memcmp(from_uri.rgb, from_file.rgb, len),
              "data URI decode differs");
        /* Bare base64 (no "data:" prefix) is accepted like transformers does. */
        const char *comma = strchr(uri, ',');
        g4_image bare;
        CHECK(g4_image_decode_data_uri(comma + 1, m - (size_t)(comma + 1 - uri), NULL, &bare) == G4_OK, "%s",
              g4_error_message());
        g4_image_free(&bare);
        CHECK(g4_image_decode_data_uri("data:image/png;base64,@@@@", 26, NULL, &bare) == G4_ERR_FORMAT,
              "bad base64 accepted");
        CHECK(g4_image_decode_data_uri("data:image/png,abc", 18, NULL, &bare) == G4_ERR_UNSUPPORTED,
              "non-base64 URI accepted");
        CHECK(g4_image_decode_data_uri("data:image/png;base64,", 22, NULL, &bare) == G4_ERR_FORMAT,
              "empty URI accepted: %s", g4_error_message());
        g4_image_free(&from_mem);
        g4_image_free(&from_uri);
    }
    free(bytes);
    free(uri);
    g4_image_free(&from_file);

    CHECK(g4_image_detect_format("\x89PNG\r\n\x1a\n", 8) == G4_IMAGE_FORMAT_PNG, "PNG magic");
    CHECK(g4_image_detect_format("\xff\xd8\xff\xe0", 4) == G4_IMAGE_FORMAT_JPEG, "JPEG magic");
    CHECK(g4_image_detect_format("RIFF\0\0\0\0WEBPVP8 ", 16) == G4_IMAGE_FORMAT_WEBP, "WebP magic");
    CHECK(g4_image_detect_format("RIFF\0\0\0\0WAVEfmt ", 16) == G4_IMAGE_FORMAT_UNKNOWN, "WAV is not an image");
}

int main(void) {
    size_t n = 0;
    char *list = (char *)image_read_file(image_data_path("decode_cases.txt"), &n);
    CHECK(list != NULL, "%s missing", image_data_path("decode_cases.txt"));
    if (!list) return test_finish();
    list = realloc(list, n + 1);
    list[n] = 0;
    int cases = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char name[256], a[64] = "", b[64] = "", c[64] = "";
        int k = sscanf(line, "%255s %63s %63s %63s", name, a, b, c);
        if (k == 2) check_case(name, 0, 0, a);
        else if (k == 4) check_case(name, atoi(a), atoi(b), c);
        else CHECK(0, "bad line: %s", line);
        cases++;
    }
    free(list);
    CHECK(cases > 90, "only %d cases", cases);
    check_options();
    printf("decode: %d cases, %d bit-exact with PIL, %d refused as PIL refuses (or unsupported)\n", cases, n_exact,
           n_failed_as_expected);
    return test_finish();
}
