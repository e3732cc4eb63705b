/* The HTTP side of the hub client, on libcurl. Redirects are followed here,
 * not by curl, so that (1) a HEAD can stop at the hub's redirect to the CDN,
 * whose headers carry the file's checksum and size, and (2) the token is only
 * ever sent to the endpoint's own origin. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "io/hub_internal.h"

enum { MAX_REDIRECTS = 10, ERROR_BODY_MAX = 4096 };

struct hub_http {
    CURL *curl;
    char *token;
    char *origin; /* "scheme://host:port" of the endpoint */
    char *user_agent;
    char errbuf[CURL_ERROR_SIZE];
};

/* One transfer in flight: where headers and body go. */
typedef struct {
    hub_response *r;
    hub_sink *sink;           /* download: 2xx bodies go here */
    size_t max_body;          /* memory GET: body limit */
    int sink_begun;
    g4_status sink_status;    /* why the sink stopped the transfer */
    int body_too_big;
} transfer;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_code;
static void init_curl(void) { curl_init_code = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* "scheme://host:port" with the default port filled in and the host lowercased. */
static char *origin_of(const char *url) {
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *out = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        for (char *c = host; *c; c++) *c = (char)tolower((unsigned char)*c);
        out = hub_printf("%s://%s:%s", scheme, host, port);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return out;
}

/* Location resolved against the URL that sent it; only http(s) targets. */
static char *resolve_location(const char *base, const char *location) {
    CURLU *u = curl_url();
    char *joined = NULL, *scheme = NULL, *out = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, base, 0) == CURLUE_OK &&
        curl_url_set(u, CURLUPART_URL, location, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        (!strcasecmp(scheme, "http") || !strcasecmp(scheme, "https")) &&
        curl_url_get(u, CURLUPART_URL, &joined, 0) == CURLUE_OK)
        out = strdup(joined);
    curl_free(joined);
    curl_free(scheme);
    curl_url_cleanup(u);
    return out;
}

g4_status hub_http_open(hub_http **out, const char *endpoint, const char *token) {
    *out = NULL;
    pthread_once(&curl_once, init_curl);
    if (curl_init_code != CURLE_OK)
        return g4_fail(G4_ERR_INTERNAL, "libcurl: cannot initialise: %s", curl_easy_strerror(curl_init_code));
    hub_http *h = calloc(1, sizeof *h);
    if (!h) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    h->origin = origin_of(endpoint);
    if (!h->origin) {
        free(h);
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "endpoint '%s' is not an http(s) URL", endpoint);
    }
    for (const char *c = token ? token : ""; *c; c++)
        if ((unsigned char)*c < 0x21 || *c == 0x7f) { /* it goes into a header line */
            hub_http_close(h);
            return g4_fail(G4_ERR_INVALID_ARGUMENT, "the access token (HF_TOKEN) contains spaces or control characters");
        }
    h->curl = curl_easy_init();
    h->token = token && *token ? strdup(token) : NULL;
    h->user_agent = hub_printf("gemma4.c (%s)", curl_version());
    if (!h->curl || (token && *token && !h->token) || !h->user_agent) {
        hub_http_close(h);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *out = h;
    return G4_OK;
}

void hub_http_close(hub_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    if (h->token) memset(h->token, 0, strlen(h->token));
    free(h->token);
    free(h->origin);
    free(h->user_agent);
    free(h);
}

void hub_response_clear(hub_response *r) {
    free(r->url);
    free(r->location);
    free(r->etag);
    free(r->linked_etag);
    free(r->repo_commit);
    free(r->error_code);
    free(r->error_message);
    free(r->body);
    memset(r, 0, sizeof *r);
    r->content_length = r->linked_size = r->range_start = r->retry_after = -1;
}

/* Forget the previous hop's headers (a redirect, or an interim 1xx). */
static void reset_headers(hub_response *r) {
    char *keep_url = r->url;
    r->url = NULL;
    hub_response_clear(r);
    r->url = keep_url;
}

/* An ETag value without the weak marker and the quotes. */
static char *normalise_etag(const char *v) {
    if (!strncmp(v, "W/", 2)) v += 2;
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') return strndup(v + 1, n - 2);
    return strdup(v);
}

static int64_t parse_int64(const char *v) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || x < 0) return -1;
    return (int64_t)x;
}

static int header_is(const char *data, size_t name_len, const char *name) {
    return name_len == strlen(name) && !strncasecmp(data, name, name_len);
}

static size_t on_header(char *data, size_t size, size_t count, void *user) {
    transfer *t = user;
    size_t n = size * count;
    if (n >= 5 && !strncmp(data, "HTTP/", 5)) { /* a new status line: a new set of headers */
        reset_headers(t->r);
        return n;
    }
    const char *colon = memchr(data, ':', n);
    if (!colon) return n;
    size_t name_len = (size_t)(colon - data);
    const char *v = colon + 1, *end = data + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    char *value = strndup(v, (size_t)(end - v));
    if (!value) return 0; /* aborts the transfer: out of memory */
    hub_response *r = t->r;
    char **slot = NULL;
    if (header_is(data, name_len, "Location")) slot = &r->location;
    else if (header_is(data, name_len, "X-Repo-Commit")) slot = &r->repo_commit;
    else if (header_is(data, name_len, "X-Error-Code")) slot = &r->error_code;
    else if (header_is(data, name_len, "X-Error-Message")) slot = &r->error_message;
    if (slot) {
        free(*slot);
        *slot = value;
        return n;
    }
    if (header_is(data, name_len, "ETag")) { free(r->etag); r->etag = normalise_etag(value); }
    else if (header_is(data, name_len, "X-Linked-Etag")) { free(r->linked_etag); r->linked_etag = normalise_etag(value); }
    else if (header_is(data, name_len, "Content-Length")) r->content_length = parse_int64(value);
    else if (header_is(data, name_len, "X-Linked-Size")) r->linked_size = parse_int64(value);
    else if (header_is(data, name_len, "Retry-After")) r->retry_after = parse_int64(value);
    else if (header_is(data, name_len, "Content-Range") && !strncasecmp(value, "bytes ", 6)) r->range_start = parse_int64(value + 6);
    free(value);
    return n;
}

static long current_status(transfer *t, CURL *curl) {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    t->r->status = code;
    return code;
}

/* Keeps up to `limit` bytes in r->body. Returns 0 if they did not fit. */
static int keep_body(hub_response *r, const char *data, size_t n, size_t limit) {
    size_t room = r->body_len < limit ? limit - r->body_len : 0;
    size_t take = n < room ? n : room;
    if (take > 0) {
        char *grown = realloc(r->body, r->body_len + take + 1);
        if (!grown) return 0;
        r->body = grown;
        memcpy(r->body + r->body_len, data, take);
        r->body_len += take;
        r->body[r->body_len] = '\0';
    }
    return take == n;
}

typedef struct {
    transfer *t;
    CURL *curl;
} write_ctx;

static size_t on_body(char *data, size_t size, size_t count, void *user) {
    write_ctx *w = user;
    transfer *t = w->t;
    size_t n = size * count;
    long status = current_status(t, w->curl);
    int success = status >= 200 && status < 300;
    if (t->sink && success) {
        if (!t->sink_begun) {
            t->sink_begun = 1;
            t->sink_status = t->sink->begin(t->sink->user, t->r);
            if (t->sink_status != G4_OK) return 0;
        }
        t->sink_status = t->sink->write(t->sink->user, data, n);
        return t->sink_status == G4_OK ? n : 0;
    }
    if (success && !t->sink) {
        if (!keep_body(t->r, data, n, t->max_body)) {
            t->body_too_big = 1;
            return 0;
        }
        return n;
    }
    keep_body(t->r, data, n, ERROR_BODY_MAX); /* an error page: keep its start for messages */
    return n;
}

/* Network failures worth retrying; the rest (bad URL, TLS verification,
 * out of memory) will fail the same way again. */
static int curl_code_is_transient(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
        return 1;
    default:
        return 0;
    }
}

typedef enum { METHOD_GET, METHOD_HEAD } method;

/* One request without following redirects. */
static g4_status perform(hub_http *h, method m, const char *url, uint64_t offset, transfer *t) {
    CURL *c = h->curl;
    curl_easy_reset(c);
    reset_headers(t->r);
    free(t->r->url);
    t->r->url = strdup(url);
    if (!t->r->url) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");

    struct curl_slist *headers = NULL, *grown;
    char *auth = NULL;
    char *origin = origin_of(url);
    int same_origin = origin && !strcmp(origin, h->origin);
    free(origin);
    if (h->token && same_origin) auth = hub_printf("Authorization: Bearer %s", h->token);
    /* sizes and ranges must be those of the stored bytes, not of a compressed stream */
    if (!(grown = curl_slist_append(headers, "Accept-Encoding: identity"))) goto oom;
    headers = grown;
    if (auth) {
        if (!(grown = curl_slist_append(headers, auth))) goto oom;
        headers = grown;
    }

    char range[32];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)offset);
    write_ctx w = {t, c};
    h->errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, h->user_agent);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
    /* a stalled connection (under 1 KB/s for a minute) is dropped and retried */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->errbuf);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 256L * 1024); /* fewer, larger writes for multi-GB files */
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &w);
    if (m == METHOD_HEAD) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    if (offset > 0) curl_easy_setopt(c, CURLOPT_RANGE, range);

    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    if (auth) memset(auth, 0, strlen(auth));
    free(auth);
    current_status(t, c);

    if (t->sink_status != G4_OK) return t->sink_status;
    if (t->body_too_big) return g4_fail(G4_ERR_LIMIT, "%s: response larger than %zu bytes", url, t->max_body);
    if (rc == CURLE_OK && t->sink && !t->sink_begun && t->r->status >= 200 && t->r->status < 300) {
        t->sink_begun = 1; /* an empty body: the sink still has to start (and truncate) */
        g4_status s = t->sink->begin(t->sink->user, t->r);
        if (s != G4_OK) return s;
    }
    if (rc != CURLE_OK) {
        t->r->transient = curl_code_is_transient(rc);
        /* signed CDN URLs carry long query strings: leave them out of messages */
        int shown = (int)strcspn(url, "?");
        return g4_fail(G4_ERR_IO, "%.*s: %s", shown, url, h->errbuf[0] ? h->errbuf : curl_easy_strerror(rc));
    }
    return G4_OK;

oom:
    curl_slist_free_all(headers);
    free(auth);
    return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
}

static int is_redirect(long status) {
    return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

/* Runs a request and follows its redirects; when `stay_on_hub`, stops at the
 * first redirect that leaves the endpoint's origin. */
static g4_status run(hub_http *h, method m, const char *url, uint64_t offset, int stay_on_hub, transfer *t) {
    char *current = strdup(url);
    if (!current) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    for (int hop = 0;; hop++) {
        t->sink_begun = 0;
        g4_status s = perform(h, m, current, offset, t);
        if (s != G4_OK || !is_redirect(t->r->status) || !t->r->location) {
            free(current);
            return s;
        }
        char *next = resolve_location(current, t->r->location);
        if (!next) {
            g4_status e = g4_fail(G4_ERR_FORMAT, "%s: bad redirect to '%s'", current, t->r->location);
            free(current);
            return e;
        }
        free(t->r->location);
        t->r->location = next;
        if (stay_on_hub) {
            char *origin = origin_of(next);
            int leaves = !origin || strcmp(origin, h->origin) != 0;
            free(origin);
            if (leaves) {
                free(current);
                return G4_OK;
            }
        }
        if (hop + 1 >= MAX_REDIRECTS) {
            g4_status e = g4_fail(G4_ERR_FORMAT, "%s: more than %d redirects", url, MAX_REDIRECTS);
            free(current);
            return e;
        }
        free(current);
        current = strdup(next);
        if (!current) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
}

static void start_response(hub_response *r) {
    memset(r, 0, sizeof *r);
    hub_response_clear(r);
}

g4_status hub_http_get(hub_http *h, const char *url, size_t max_body, hub_response *r) {
    start_response(r);
    transfer t = {.r = r, .max_body = max_body};
    return run(h, METHOD_GET, url, 0, 0, &t);
}

g4_status hub_http_head(hub_http *h, const char *url, hub_response *r) {
    start_response(r);
    transfer t = {.r = r};
    return run(h, METHOD_HEAD, url, 0, 1, &t);
}

g4_status hub_http_download(hub_http *h, const char *url, uint64_t offset, hub_sink *sink, hub_response *r) {
    start_response(r);
    transfer t = {.r = r, .sink = sink};
    return run(h, METHOD_GET, url, offset, 0, &t);
}
