#include "runtime/stop_strings.h"

#include <stdlib.h>
#include <string.h>

struct g4_stop_matcher {
    char **stops;
    size_t *lens;
    size_t n;
    char *held; /* text fed but not yet emitted */
    size_t held_len, held_cap;
    char *out; /* what the last call handed out */
    size_t out_cap;
    size_t emitted; /* bytes of the stream emitted before `held` */
    int stopped;
};

g4_status g4_stop_matcher_create(const char *const *stops, size_t n, g4_stop_matcher **out) {
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!stops[i] || !stops[i][0]) return g4_fail(G4_ERR_INVALID_ARGUMENT, "stop string %zu is empty", i);
    g4_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    m->n = n;
    m->stops = n ? calloc(n, sizeof *m->stops) : NULL;
    m->lens = n ? calloc(n, sizeof *m->lens) : NULL;
    if (n && (!m->stops || !m->lens)) {
        g4_stop_matcher_free(m);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        m->lens[i] = strlen(stops[i]);
        m->stops[i] = malloc(m->lens[i] + 1);
        if (!m->stops[i]) {
            g4_stop_matcher_free(m);
            return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(m->stops[i], stops[i], m->lens[i] + 1);
    }
    *out = m;
    return G4_OK;
}

void g4_stop_matcher_free(g4_stop_matcher *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n && m->stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->held);
    free(m->out);
    free(m);
}

void g4_stop_matcher_reset(g4_stop_matcher *m) {
    m->held_len = 0;
    m->emitted = 0;
    m->stopped = 0;
}

static int grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return 0;
    *buf = p;
    *cap = c;
    return 1;
}

/* Moves held[0..n) to the output buffer and drops it from held. */
static g4_status hand_out(g4_stop_matcher *m, size_t n, g4_stop_result *r) {
    if (!grow(&m->out, &m->out_cap, n + 1)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    if (n) memcpy(m->out, m->held, n); /* held is NULL before the first feed */
    m->out[n] = 0;
    if (m->held_len > n) memmove(m->held, m->held + n, m->held_len - n);
    m->held_len -= n;
    m->emitted += n;
    r->emit = m->out;
    r->emit_len = n;
    return G4_OK;
}

static const char *find(const char *h, size_t hn, const char *s, size_t sn) {
    if (sn > hn) return NULL;
    for (size_t i = 0; i + sn <= hn; i++)
        if (h[i] == s[0] && memcmp(h + i, s, sn) == 0) return h + i;
    return NULL;
}

/* Bytes at the end of t[0..n) that start an unfinished UTF-8 sequence. */
static size_t unfinished_utf8(const char *t, size_t n) {
    const unsigned char *u = (const unsigned char *)t;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = u[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

g4_status g4_stop_matcher_feed(g4_stop_matcher *m, const char *text, size_t len, g4_stop_result *r) {
    memset(r, 0, sizeof *r);
    r->stop_index = -1;
    r->emit = "";
    if (m->stopped) return g4_fail(G4_ERR_INVALID_ARGUMENT, "stop matcher: text fed after a stop string matched");
    if (!grow(&m->held, &m->held_cap, m->held_len + len + 1)) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(m->held + m->held_len, text, len);
    m->held_len += len;
    /* the match that ends first (ties: starts first) */
    size_t best_end = (size_t)-1, best_start = 0;
    int best = -1;
    for (size_t i = 0; i < m->n; i++) {
        const char *at = find(m->held, m->held_len, m->stops[i], m->lens[i]);
        if (!at) continue;
        size_t start = (size_t)(at - m->held), end = start + m->lens[i];
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = (int)i;
        }
    }
    if (best >= 0) {
        m->stopped = 1;
        r->stopped = 1;
        r->stop_index = best;
        r->stop_offset = m->emitted + best_start;
        g4_status st = hand_out(m, best_start, r);
        m->held_len = 0;
        return st;
    }
    /* hold back the longest tail that is a proper prefix of a stop string */
    size_t hold = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t max = m->lens[i] - 1 < m->held_len ? m->lens[i] - 1 : m->held_len;
        for (size_t k = max; k > hold; k--)
            if (memcmp(m->held + m->held_len - k, m->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    size_t partial = unfinished_utf8(m->held, m->held_len);
    if (partial > hold) hold = partial;
    return hand_out(m, m->held_len - hold, r);
}

g4_status g4_stop_matcher_flush(g4_stop_matcher *m, g4_stop_result *r) {
    memset(r, 0, sizeof *r);
    r->stop_index = -1;
    r->emit = "";
    if (m->stopped) return G4_OK;
    return hand_out(m, m->held_len, r);
}
