/* Separable antialiased bicubic resampling (see image_resize.h). Written
 * from the behaviour of Pillow's libImaging/Resample.c and PyTorch's
 * UpSampleKernel.cpp (uint8 path), which it reproduces bit for bit. */
#include "media/image_resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One axis: output sample i reads `count[i]` inputs from `first[i]` with
 * fixed-point weights weights[i * taps + j] scaled by 2^precision. */
typedef struct {
    int taps, precision;
    int *first, *count;
    int32_t *weights;
} resample_axis;

/* Keys cubic with a = -0.5, in the evaluation order of each reference: the
 * outer branch differs (PIL: (((x-5)x+8)x-4)a, PyTorch: ((ax-5a)x+8a)x-4a),
 * which can move a weight by one unit in the last place. */
static double cubic_pil(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static double cubic_torch(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static int32_t to_fixed(double w, int precision) {
    double v = w * (double)(1 << precision);
    return v < 0 ? (int32_t)(-0.5 + v) : (int32_t)(0.5 + v);
}

/* (also after a failed axis_build, whose caller frees the axis again) */
static void axis_free(resample_axis *ax) {
    free(ax->first);
    free(ax->count);
    free(ax->weights);
    ax->first = ax->count = NULL;
    ax->weights = NULL;
}

static g4_status axis_build(resample_axis *ax, int in_size, int out_size, g4_image_backend backend) {
    const double scale = (double)in_size / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = 2.0 * filterscale; /* the cubic's support is 2 */
    const double inv = 1.0 / filterscale;
    ax->taps = (int)ceil(support) * 2 + 1;
    ax->first = malloc(sizeof(int) * (size_t)out_size);
    ax->count = malloc(sizeof(int) * (size_t)out_size);
    ax->weights = malloc(sizeof(int32_t) * (size_t)out_size * ax->taps);
    double *w = malloc(sizeof(double) * (size_t)out_size * ax->taps);
    if (!ax->first || !ax->count || !ax->weights || !w) {
        free(w);
        axis_free(ax);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "image resize: out of memory");
    }
    double w_max = 0.0;
    for (int i = 0; i < out_size; i++) {
        const double center = (i + 0.5) * scale;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int n = hi - lo;
        if (n > ax->taps) n = ax->taps;
        if (n < 0) n = 0;
        double *row = w + (size_t)i * ax->taps, total = 0.0;
        for (int j = 0; j < n; j++) {
            double t = (j + lo - center + 0.5) * inv;
            row[j] = backend == G4_IMAGE_BACKEND_TORCHVISION ? cubic_torch(t) : cubic_pil(t);
            total += row[j];
        }
        for (int j = 0; j < n; j++) {
            if (total != 0.0) row[j] /= total;
            if (total != 0.0 && row[j] > w_max) w_max = row[j];
        }
        for (int j = n; j < ax->taps; j++) row[j] = 0.0;
        ax->first[i] = lo;
        ax->count[i] = n;
    }
    if (backend != G4_IMAGE_BACKEND_TORCHVISION) {
        ax->precision = 22; /* 32 bits - 8 for the pixel - 2 of headroom */
    } else {
        /* The largest precision at which 2 * w_max still fits in int16. */
        int p = 0;
        for (; p < 22; p++)
            if ((int)(0.5 + w_max * (1 << (p + 1))) >= (1 << 15)) break;
        ax->precision = p;
    }
    for (size_t k = 0; k < (size_t)out_size * ax->taps; k++) ax->weights[k] = to_fixed(w[k], ax->precision);
    free(w);
    return G4_OK;
}

static uint8_t clip_shift(int32_t acc, int precision) {
    int32_t v = acc >> precision; /* arithmetic shift, as both references */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* in: w_in x h rows; out: w_out x h rows. */
static void pass_horizontal(const uint8_t *in, int w_in, int h, uint8_t *out, int w_out, const resample_axis *ax) {
    const int32_t half = 1 << (ax->precision - 1);
#pragma omp parallel for schedule(static) if ((long)h * w_out > 65536)
    for (int y = 0; y < h; y++) {
        const uint8_t *src = in + (size_t)y * w_in * 3;
        uint8_t *dst = out + (size_t)y * w_out * 3;
        for (int x = 0; x < w_out; x++) {
            const int32_t *k = ax->weights + (size_t)x * ax->taps;
            const uint8_t *s = src + (size_t)ax->first[x] * 3;
            int32_t r = half, g = half, b = half;
            for (int j = 0; j < ax->count[x]; j++) {
                r += s[3 * j] * k[j];
                g += s[3 * j + 1] * k[j];
                b += s[3 * j + 2] * k[j];
            }
            dst[3 * x] = clip_shift(r, ax->precision);
            dst[3 * x + 1] = clip_shift(g, ax->precision);
            dst[3 * x + 2] = clip_shift(b, ax->precision);
        }
    }
}

/* in: w x h_in rows; out: w x h_out rows. */
static g4_status pass_vertical(const uint8_t *in, int w, uint8_t *out, int h_out, const resample_axis *ax) {
    const size_t row_len = (size_t)w * 3;
    const int32_t half = 1 << (ax->precision - 1);
    int failed = 0;
#pragma omp parallel reduction(| : failed) if ((long)h_out * w > 65536)
    {
        int32_t *acc = malloc(sizeof(int32_t) * row_len);
        if (!acc) failed = 1;
#pragma omp for schedule(static)
        for (int y = 0; y < h_out; y++) {
            if (!acc) continue;
            const int32_t *k = ax->weights + (size_t)y * ax->taps;
            for (size_t i = 0; i < row_len; i++) acc[i] = half;
            for (int j = 0; j < ax->count[y]; j++) {
                const uint8_t *src = in + (size_t)(ax->first[y] + j) * row_len;
                const int32_t kj = k[j];
                for (size_t i = 0; i < row_len; i++) acc[i] += src[i] * kj;
            }
            uint8_t *dst = out + (size_t)y * row_len;
            for (size_t i = 0; i < row_len; i++) dst[i] = clip_shift(acc[i], ax->precision);
        }
        free(acc);
    }
    return failed ? g4_fail(G4_ERR_OUT_OF_MEMORY, "image resize: out of memory") : G4_OK;
}

g4_status g4_image_resize_bicubic(const g4_image *src, int width, int height, g4_image_backend backend,
                                  g4_image *out) {
    out->width = out->height = 0;
    out->rgb = NULL;
    if (!src || !src->rgb || src->width <= 0 || src->height <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image resize: empty source image");
    if (width <= 0 || height <= 0)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image resize: invalid target size %dx%d", width, height);
    if (backend != G4_IMAGE_BACKEND_PIL && backend != G4_IMAGE_BACKEND_TORCHVISION &&
        backend != G4_IMAGE_BACKEND_PIL12)
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "image resize: unknown backend %d", (int)backend);
    g4_status st = g4_image_alloc(out, width, height);
    if (st != G4_OK) return st;
    const int need_h = width != src->width, need_v = height != src->height;
    if (!need_h && !need_v) {
        memcpy(out->rgb, src->rgb, (size_t)width * height * 3);
        return G4_OK;
    }
    resample_axis hx = {0}, vy = {0};
    g4_image tmp = {0};
    if (need_h && (st = axis_build(&hx, src->width, width, backend)) != G4_OK) goto done;
    if (need_v && (st = axis_build(&vy, src->height, height, backend)) != G4_OK) goto done;
    /* Pass order, a speed choice that changes the rounding of the 8-bit
     * intermediate: Pillow 13 runs the vertical pass first when the height
     * shrinks by more than twice as many pixels as the width; Pillow 12 only
     * for images over 100 times taller than wide whose height shrinks;
     * PyTorch is always horizontal first. */
    const int dh = src->height - height, dw = src->width - width;
    int vertical_first = 0;
    if (backend == G4_IMAGE_BACKEND_PIL) vertical_first = dh > 0 && dh > dw * 2;
    if (backend == G4_IMAGE_BACKEND_PIL12) vertical_first = src->height > src->width * 100 && dh > 0;
    if (need_h && !need_v) {
        pass_horizontal(src->rgb, src->width, src->height, out->rgb, width, &hx);
    } else if (!need_h) {
        st = pass_vertical(src->rgb, width, out->rgb, height, &vy);
    } else if (vertical_first) {
        if ((st = g4_image_alloc(&tmp, src->width, height)) != G4_OK) goto done;
        if ((st = pass_vertical(src->rgb, src->width, tmp.rgb, height, &vy)) != G4_OK) goto done;
        pass_horizontal(tmp.rgb, src->width, height, out->rgb, width, &hx);
    } else {
        /* Only the input rows the vertical pass reads go through the
         * horizontal pass (PIL does the same; the values do not change). */
        const int row0 = vy.first[0];
        const int row1 = vy.first[height - 1] + vy.count[height - 1];
        if ((st = g4_image_alloc(&tmp, width, row1 - row0)) != G4_OK) goto done;
        pass_horizontal(src->rgb + (size_t)row0 * src->width * 3, src->width, row1 - row0, tmp.rgb, width, &hx);
        for (int y = 0; y < height; y++) vy.first[y] -= row0;
        st = pass_vertical(tmp.rgb, width, out->rgb, height, &vy);
    }
done:
    axis_free(&hx);
    axis_free(&vy);
    g4_image_free(&tmp);
    if (st != G4_OK) g4_image_free(out);
    return st;
}
