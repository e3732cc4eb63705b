/* JPEG through the libjpeg API of libjpeg-turbo, set up as PIL's decoder is
 * (accurate integer IDCT, fancy upsampling: the library defaults). PIL reads
 * 4-component files as Adobe-inverted CMYK ("CMYK;I") and converts them to
 * RGB with its integer formula; truncated data is an error (PIL: "image file
 * is truncated"), other libjpeg warnings are not. */
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "media/image_codec.h"
#include "media/image_orientation.h"

/* Progressive files with more scans than this are refused: each scan costs a
 * pass over the coefficients, so a hostile file could otherwise take minutes. */
#define JPEG_MAX_SCANS 500

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int truncated;
    char message[JMSG_LENGTH_MAX];
} jpeg_errors;

typedef struct {
    struct jpeg_progress_mgr pub;
    int too_many_scans;
} jpeg_progress;

static void on_error(j_common_ptr cinfo) {
    jpeg_errors *e = (jpeg_errors *)cinfo->err;
    cinfo->err->format_message(cinfo, e->message);
    longjmp(e->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    jpeg_errors *e = (jpeg_errors *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = 1;
}

static void on_progress(j_common_ptr cinfo) {
    j_decompress_ptr d = (j_decompress_ptr)cinfo;
    jpeg_progress *p = (jpeg_progress *)cinfo->progress;
    if (d->input_scan_number > JPEG_MAX_SCANS && !p->too_many_scans) {
        p->too_many_scans = 1;
        snprintf(((jpeg_errors *)cinfo->err)->message, JMSG_LENGTH_MAX, "more than %d progressive scans",
                 JPEG_MAX_SCANS);
        longjmp(((jpeg_errors *)cinfo->err)->jump, 1);
    }
}

/* PIL: EXIF from the first APP1 "Exif\0\0" segment; XMP from the last APP1
 * "http://ns.adobe.com/xap/1.0/\0" segment, used only when EXIF has no
 * Orientation. */
static int jpeg_orientation(j_decompress_ptr d) {
    static const char xmp_id[] = "http://ns.adobe.com/xap/1.0/";
    int exif = 0, xmp = 0, have_exif = 0;
    for (jpeg_saved_marker_ptr m = d->marker_list; m; m = m->next) {
        if (m->marker != JPEG_APP0 + 1) continue;
        if (!have_exif && m->data_length >= 6 && !memcmp(m->data, "Exif\0\0", 6)) {
            have_exif = 1;
            exif = g4_exif_orientation(m->data, m->data_length);
        } else if (m->data_length >= sizeof xmp_id && !memcmp(m->data, xmp_id, sizeof xmp_id)) {
            xmp = g4_xmp_orientation(m->data + sizeof xmp_id, m->data_length - sizeof xmp_id);
        }
    }
    return exif ? exif : xmp;
}

/* PIL's cmyk2rgb on the inverted samples: with c', k' as stored by libjpeg,
 * PIL holds C = 255 - c', K = 255 - k', and gives R = K'' - C*K''/255 with
 * K'' = 255 - K = k' and its rounded division by 255. */
static uint8_t cmyk_channel(unsigned stored_c, unsigned stored_k) {
    unsigned c = 255 - stored_c, nk = stored_k;
    unsigned t = c * nk + 128;
    int v = (int)nk - (int)(((t >> 8) + t) >> 8);
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

g4_status g4_jpeg_decode(const uint8_t *data, size_t size, uint64_t max_pixels, g4_image *out, int *orientation) {
    struct jpeg_decompress_struct d;
    jpeg_errors err;
    jpeg_progress progress;
    memset(&err, 0, sizeof err);
    memset(&progress, 0, sizeof progress);
    /* Everything a longjmp can reach is volatile or set before setjmp. */
    uint8_t *volatile row = NULL;
    volatile int started = 0;

    d.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jump)) {
        g4_status st = g4_fail(G4_ERR_FORMAT, "JPEG image: %s", err.message);
        if (started) jpeg_abort_decompress(&d);
        jpeg_destroy_decompress(&d);
        free(row);
        g4_image_free(out);
        return st;
    }
    jpeg_create_decompress(&d);
    progress.pub.progress_monitor = on_progress;
    d.progress = &progress.pub;
    jpeg_mem_src(&d, data, (unsigned long)size);
    jpeg_save_markers(&d, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&d, TRUE);
    if (err.truncated) {
        jpeg_destroy_decompress(&d);
        return g4_fail(G4_ERR_FORMAT, "JPEG image: file is truncated (in the header)");
    }
    g4_status st = g4_image_check_size("JPEG", d.image_width, d.image_height, max_pixels);
    if (st != G4_OK) {
        jpeg_destroy_decompress(&d);
        return st;
    }
    const int cmyk = d.num_components == 4;
    if (d.num_components != 1 && d.num_components != 3 && !cmyk) {
        jpeg_destroy_decompress(&d);
        return g4_fail(G4_ERR_UNSUPPORTED, "JPEG image: %d colour components", d.num_components);
    }
    /* Saved markers live until the decompression finishes: read them now. */
    *orientation = jpeg_orientation(&d);
    d.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    d.dct_method = JDCT_ISLOW;
    d.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&d);
    started = 1;
    if ((st = g4_image_alloc(out, (int)d.output_width, (int)d.output_height)) != G4_OK) {
        jpeg_abort_decompress(&d);
        jpeg_destroy_decompress(&d);
        return st;
    }
    const size_t w = d.output_width, channels = (size_t)d.output_components;
    row = malloc(w * channels);
    if (!row) {
        jpeg_abort_decompress(&d);
        jpeg_destroy_decompress(&d);
        g4_image_free(out);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "JPEG image: out of memory");
    }
    while (d.output_scanline < d.output_height) {
        uint8_t *dst = out->rgb + (size_t)d.output_scanline * w * 3;
        JSAMPROW rows[1] = {cmyk ? row : dst};
        if (jpeg_read_scanlines(&d, rows, 1) != 1) break;
        if (cmyk)
            for (size_t x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) dst[3 * x + c] = cmyk_channel(row[4 * x + c], row[4 * x + 3]);
    }
    /* Reading on to the EOI marker, as PIL's decoder does, catches files cut
     * right after the last scan. */
    if (!err.truncated && d.output_scanline == d.output_height) jpeg_finish_decompress(&d);
    if (err.truncated || d.output_scanline < d.output_height) {
        jpeg_abort_decompress(&d);
        jpeg_destroy_decompress(&d);
        free(row);
        g4_image_free(out);
        return g4_fail(G4_ERR_FORMAT, "JPEG image: file is truncated (pixel data ends early)");
    }
    jpeg_destroy_decompress(&d);
    free(row);
    return G4_OK;
}
