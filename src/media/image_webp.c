/* WebP through libwebp's animation decoder, as PIL opens every WebP file:
 * the first frame drawn on a canvas (transparent black where the frame does
 * not cover it), RGBA not premultiplied; `.convert("RGB")` drops alpha. */
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

#include "media/image_codec.h"
#include "media/image_orientation.h"

/* EXIF and XMP come from the first "EXIF" / "XMP " chunks, as in PIL. */
static int webp_orientation(const WebPDemuxer *demux) {
    WebPChunkIterator it;
    int exif = 0, xmp = 0;
    if (WebPDemuxGetChunk(demux, "EXIF", 1, &it)) {
        exif = g4_exif_orientation(it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    if (!exif && WebPDemuxGetChunk(demux, "XMP ", 1, &it)) {
        xmp = g4_xmp_orientation(it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    return exif ? exif : xmp;
}

g4_status g4_webp_decode(const uint8_t *data, size_t size, uint64_t max_pixels, g4_image *out, int *orientation) {
    WebPData webp = {data, size};
    WebPDemuxState state;
    WebPDemuxer *demux = WebPDemuxInternal(&webp, 0, &state, WEBP_DEMUX_ABI_VERSION);
    if (!demux) {
        /* The RIFF header states the file size: a shorter buffer was cut. */
        const uint32_t riff = size >= 8 ? (uint32_t)data[4] | (uint32_t)data[5] << 8 | (uint32_t)data[6] << 16 |
                                              (uint32_t)data[7] << 24
                                        : 0;
        const int truncated = state == WEBP_DEMUX_PARSED_HEADER || state == WEBP_DEMUX_PARSING_HEADER ||
                              (uint64_t)riff + 8 > size;
        return g4_fail(G4_ERR_FORMAT, "WebP image: %s", truncated ? "file is truncated" : "malformed container");
    }
    uint32_t w = WebPDemuxGetI(demux, WEBP_FF_CANVAS_WIDTH), h = WebPDemuxGetI(demux, WEBP_FF_CANVAS_HEIGHT);
    g4_status st = g4_image_check_size("WebP", w, h, max_pixels);
    if (st != G4_OK) {
        WebPDemuxDelete(demux);
        return st;
    }
    *orientation = webp_orientation(demux);
    WebPDemuxDelete(demux);

    WebPAnimDecoderOptions opts;
    if (!WebPAnimDecoderOptionsInit(&opts)) return g4_fail(G4_ERR_INTERNAL, "WebP image: libwebp version mismatch");
    opts.color_mode = MODE_RGBA;
    opts.use_threads = 0;
    WebPAnimDecoder *dec = WebPAnimDecoderNew(&webp, &opts);
    if (!dec) return g4_fail(G4_ERR_FORMAT, "WebP image: cannot decode (corrupt or truncated data)");
    uint8_t *rgba = NULL;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(dec, &rgba, &timestamp) || !rgba) {
        WebPAnimDecoderDelete(dec);
        return g4_fail(G4_ERR_FORMAT, "WebP image: cannot decode the first frame (corrupt or truncated data)");
    }
    if ((st = g4_image_alloc(out, (int)w, (int)h)) == G4_OK) {
        const size_t n = (size_t)w * h;
        for (size_t i = 0; i < n; i++) memcpy(out->rgb + 3 * i, rgba + 4 * i, 3);
    }
    WebPAnimDecoderDelete(dec);
    return st;
}
