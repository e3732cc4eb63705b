#include "text/chat_pyvalue.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const cJSON *py_getitem(const cJSON *obj, const char *key) {
    if (!obj || !cJSON_IsObject(obj)) return NULL;
    const cJSON *found = NULL, *c;
    cJSON_ArrayForEach(c, obj) {
        if (c->string && strcmp(c->string, key) == 0) found = c;
    }
    return found;
}

int py_truthy(const cJSON *v) {
    if (!v) return 0;
    if (cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsTrue(v)) return 1;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0.0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 0;
}

/* Shortest digits that round-trip, as Python's repr(float) (David Gay's
 * mode 0): try 1..17 significant digits. */
static void float_repr(double d, char out[40]) {
    if (isnan(d)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(d)) {
        strcpy(out, d < 0 ? "-inf" : "inf");
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, d);
        if (strtod(sci, NULL) == d) break;
    }
    /* sci = [-]D[.DDD]e[+-]XX */
    const char *s = sci;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(s + 1);
    int decpt = exp10 + 1; /* value = 0.DIGITS x 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, nd);
            o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, nd - decpt);
            o += nd - decpt;
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, nd - 1);
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

void py_number_str(double d, char out[40]) {
    /* cJSON keeps no int/float distinction: integral values below 2^53 are
     * taken to be JSON integers (Python int), everything else a float. */
    if (d == floor(d) && fabs(d) < 9007199254740992.0) {
        snprintf(out, 40, "%lld", (long long)d);
        return;
    }
    float_repr(d, out);
}

int py_str_append(chat_strbuf *b, const cJSON *v) {
    char num[40];
    if (!v) return 1;
    if (cJSON_IsString(v)) {
        chat_strbuf_puts(b, v->valuestring ? v->valuestring : "");
    } else if (cJSON_IsNull(v)) {
        chat_strbuf_puts(b, "None");
    } else if (cJSON_IsTrue(v)) {
        chat_strbuf_puts(b, "True");
    } else if (cJSON_IsFalse(v)) {
        chat_strbuf_puts(b, "False");
    } else if (cJSON_IsNumber(v)) {
        py_number_str(v->valuedouble, num);
        chat_strbuf_puts(b, num);
    } else {
        return 0;
    }
    return 1;
}

int py_upper_append(chat_strbuf *b, const cJSON *v) {
    size_t start = b->len;
    if (!py_str_append(b, v)) return 0;
    if (b->failed) return 1;
    for (size_t i = start; i < b->len; i++) {
        unsigned char c = (unsigned char)b->data[i];
        if (c >= 0x80) return 0;
        if (c >= 'a' && c <= 'z') b->data[i] = (char)(c - 32);
    }
    return 1;
}

/* ---- UTF-8 and Unicode whitespace ---- */

static int is_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Decodes one code point at s (n bytes left); returns its length, or 0 for
 * an invalid sequence (treated as a non-space byte by the callers). */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t v = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

void py_strip(const char *s, size_t n, size_t *start, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, z = n;
    while (a < z) {
        uint32_t cp;
        size_t k = utf8_decode(u + a, z - a, &cp);
        if (k == 0 || !is_py_space(cp)) break;
        a += k;
    }
    while (z > a) {
        size_t b = z - 1;
        while (b > a && (u[b] & 0xC0) == 0x80 && z - b < 4) b--;
        uint32_t cp;
        size_t k = utf8_decode(u + b, z - b, &cp);
        if (k != z - b || !is_py_space(cp)) break;
        z = b;
    }
    *start = a;
    *len = z - a;
}

void py_strip_append(chat_strbuf *b, const char *s, size_t n) {
    size_t a, len;
    py_strip(s, n, &a, &len);
    chat_strbuf_append(b, s + a, len);
}

/* ---- dictsort ---- */

/* Python's str.lower() for the common cased scripts. */
static uint32_t py_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0xC0) return c;
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static int key_compare(const char *a, const char *b) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t nx = strlen(a), ny = strlen(b);
    while (nx && ny) {
        uint32_t cx, cy;
        size_t kx = utf8_decode(x, nx, &cx), ky = utf8_decode(y, ny, &cy);
        if (!kx) {
            cx = *x;
            kx = 1;
        }
        if (!ky) {
            cy = *y;
            ky = 1;
        }
        cx = py_lower(cx);
        cy = py_lower(cy);
        if (cx != cy) return cx < cy ? -1 : 1;
        x += kx;
        nx -= kx;
        y += ky;
        ny -= ky;
    }
    return nx ? 1 : ny ? -1 : 0;
}

const cJSON **py_dictsort(const cJSON *obj, size_t *n) {
    size_t count = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, obj) count++;
    *n = count;
    if (!count) return NULL;
    const cJSON **items = malloc(count * sizeof *items);
    if (!items) {
        *n = (size_t)-1;
        return NULL;
    }
    size_t i = 0;
    cJSON_ArrayForEach(c, obj) {
        /* stable insertion sort: objects in prompts are small */
        size_t j = i++;
        while (j > 0 && key_compare(items[j - 1]->string ? items[j - 1]->string : "", c->string ? c->string : "") > 0) {
            items[j] = items[j - 1];
            j--;
        }
        items[j] = c;
    }
    return items;
}

/* ---- equality ---- */

static int as_number(const cJSON *v, double *d) {
    if (cJSON_IsNumber(v)) *d = v->valuedouble;
    else if (cJSON_IsTrue(v)) *d = 1;
    else if (cJSON_IsFalse(v)) *d = 0;
    else return 0;
    return 1;
}

int py_equal(const cJSON *a, const cJSON *b) {
    int a_none = !a || cJSON_IsNull(a), b_none = !b || cJSON_IsNull(b);
    if (a_none || b_none) return a_none && b_none;
    double x, y;
    if (as_number(a, &x) && as_number(b, &y)) return x == y;
    if (cJSON_IsString(a) && cJSON_IsString(b)) return strcmp(a->valuestring, b->valuestring) == 0;
    if ((cJSON_IsArray(a) && cJSON_IsArray(b)) || (cJSON_IsObject(a) && cJSON_IsObject(b)))
        return cJSON_Compare(a, b, 1);
    return 0;
}
