/* The HTTP side of the server: libmicrohttpd in thread-per-connection mode,
 * routing, authentication, request bodies and their limits, slow-client
 * defence, graceful shutdown. */
#define _GNU_SOURCE
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "server/server_internal.h"
#include "text/strbuf.h"
#include "text/utf8.h"

typedef enum {
    R_NONE = 0,
    R_HEALTH,
    R_METRICS,
    R_MODELS,
    R_MODEL,
    R_CHAT,
    R_COMPLETIONS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_RESPONSES,
    R_RESPONSE,        /* /v1/responses/ID: GET */
    R_RESPONSE_DELETE, /* ... DELETE */
    R_MESSAGES,
    R_COUNT_TOKENS,
} route_id;

static const struct {
    const char *path;
    const char *method;
    route_id id;
    const char *label; /* the endpoint label of the metrics */
} routes[] = {
    {"/health", "GET", R_HEALTH, "health"},
    {"/metrics", "GET", R_METRICS, "metrics"},
    {"/v1/models", "GET", R_MODELS, "models"},
    {"/v1/chat/completions", "POST", R_CHAT, "chat_completions"},
    {"/v1/completions", "POST", R_COMPLETIONS, "completions"},
    {"/tokenize", "POST", R_TOKENIZE, "tokenize"},
    {"/detokenize", "POST", R_DETOKENIZE, "detokenize"},
    {"/v1/responses", "POST", R_RESPONSES, "responses"},
    {"/v1/responses/", "GET, DELETE", R_RESPONSE, "responses"},
    {"/v1/messages", "POST", R_MESSAGES, "messages"},
    {"/v1/messages/count_tokens", "POST", R_COUNT_TOKENS, "count_tokens"},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

/* One open connection, for the reaper. */
struct conn_entry {
    int fd;
    double since; /* connection start or end of its last request */
    int busy;     /* a request's headers have arrived and it is not answered yet */
    int reaped;
    conn_entry *prev, *next;
};

typedef struct {
    route_id route;
    const char *label;
    char *model_in_url; /* /v1/models/NAME */
    char *id_in_url;    /* /v1/responses/ID */
    int anthropic;      /* a Messages API path: errors in Anthropic's shape */
    g4_strbuf body;
    size_t accounted; /* bytes of body counted in the server's body_bytes */
    double t_arrival;
    int status;   /* what we answered (0: nothing yet) */
    int answered; /* a response is queued: ignore the rest of the body */
    int refused;  /* 413 or 503 decided while the body arrives: the rest is dropped, the answer follows it */
    int started;  /* the handler has seen the request (the URI callback may create it earlier) */
    int nul_in_url; /* the raw URI holds %00: the decoded path would end there */
    conn_entry *conn;
    char method[8];
    char path[64];
} http_req;

/* ---- replies ---------------------------------------------------------------- */

cJSON *g4_error_json(const g4_oai_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    /* messages quote request text and may be cut mid-character: always send valid UTF-8 */
    size_t len;
    char *message = g4_utf8_repair(e->message, strlen(e->message), &len);
    cJSON_AddStringToObject(err, "message", message ? message : "(error message lost: out of memory)");
    free(message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return root;
}

void g4_reply_json(g4_http_reply *r, int status, cJSON *obj) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        text = strdup(oom);
        status = 503;
    }
    r->status = text ? status : 0;
    r->content_type = "application/json";
    r->body = text;
    r->body_len = text ? strlen(text) : 0;
}

void g4_reply_error(g4_http_reply *r, const g4_oai_error *e) { g4_reply_json(r, e->status, g4_error_json(e)); }

void g4_reply_errorf(g4_http_reply *r, int status, const char *param, const char *fmt, ...) {
    g4_oai_error e;
    g4_oai_fail(&e, status, param, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    if (status == 401) e.code = "invalid_api_key";
    if (status == 503) e.type = "server_error";
    g4_reply_error(r, &e);
}

/* ---- streamed bodies ------------------------------------------------------- */

static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    g4_body_source *src = cls;
    long n = src->read(src->cls, buf, max);
    if (n > 0) return (ssize_t)n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void free_stream(void *cls) {
    g4_body_source *src = cls;
    if (src->free) src->free(src->cls);
    free(src);
}

/* The request has arrived whole: the reaper leaves its connection alone
 * until the answer is sent. Before that (also while the body of a request
 * answered early, e.g. with 401, is still read and dropped) the time the
 * request takes to arrive counts against the request timeout. */
static void mark_busy(g4_server *s, http_req *hr) {
    if (!hr->conn) return;
    pthread_mutex_lock(&s->conn_lock);
    hr->conn->busy = 1;
    pthread_mutex_unlock(&s->conn_lock);
}

static enum MHD_Result send_reply(g4_server *s, struct MHD_Connection *c, http_req *hr, g4_http_reply *r) {
    hr->answered = 1;
    if (hr->anthropic) g4_anthropic_reshape_error(r);
    if (r->status == 0) {
        if (r->stream.free) r->stream.free(r->stream.cls);
        free(r->body);
        return MHD_NO; /* close without an answer (the client went away) */
    }
    struct MHD_Response *resp;
    if (r->stream.read) {
        g4_body_source *src = malloc(sizeof *src);
        if (!src) {
            if (r->stream.free) r->stream.free(r->stream.cls);
            return MHD_NO;
        }
        *src = r->stream;
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_stream, src, free_stream);
        if (!resp) {
            free_stream(src);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        resp = MHD_create_response_from_buffer(r->body_len, r->body ? r->body : (void *)"", r->body ? MHD_RESPMEM_MUST_FREE
                                                                                          : MHD_RESPMEM_PERSISTENT);
        if (!resp) {
            free(r->body);
            return MHD_NO;
        }
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "application/json");
    if (r->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r->allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
    /* every 503 is a transient state (overload, memory, shutdown): say when to retry */
    if (r->status == 503 || r->status == 529) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (atomic_load(&s->draining) || r->status == 413 || r->close)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    hr->status = r->status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- requests ------------------------------------------------------------- */

/* value equals key, white space around it aside */
static int key_equal(const char *header, const char *key) {
    if (!header) return 0;
    while (*header == ' ' || *header == '\t') header++;
    size_t a = strlen(header), b = strlen(key);
    while (a && (header[a - 1] == ' ' || header[a - 1] == '\t')) a--; /* optional white space ends a field */
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(i < a ? header[i] : 0) ^ (unsigned char)key[i];
    return diff == 0; /* no early exit: timing says nothing about the key */
}

/* "Authorization: Bearer KEY" */
static int key_matches(const char *header, const char *key) {
    if (!header || strncasecmp(header, "Bearer ", 7) != 0) return 0;
    return key_equal(header + 7, key);
}

/* A NUL byte in a header line (RFC 9110 5.5 forbids it). libmicrohttpd
 * 0.9.75 keeps the header block in place in its read buffer and ends each
 * name and value at the first NUL, so "Authorization: Bearer KEY\0junk"
 * reads as "Bearer KEY" and the rest is silently ignored. The block is
 * [method, method + header size): every byte outside the request line and
 * the names and values must be a separator (NUL where libmicrohttpd cut
 * CR, LF and ':', or white space); a byte of text there is what followed
 * a NUL. Names and values outside that range (the buffer moved while the
 * headers arrived) are not checked. */
typedef struct {
    const char *lo, *hi;
    unsigned char *known; /* per byte of the block: part of a name or value */
} header_scan;

static void mark_known(header_scan *h, const char *p, size_t n) {
    if (!p || p < h->lo || p + n > h->hi) return;
    memset(h->known + (p - h->lo), 1, n);
}

static enum MHD_Result mark_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size) {
    (void)kind;
    mark_known(cls, key, key_size);
    mark_known(cls, value, value_size);
    return MHD_YES;
}

static int header_has_nul(struct MHD_Connection *c, const char *method, const char *version) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (!info || !method || !version || info->header_size == 0 || info->header_size > (size_t)1 << 20) return 0;
    header_scan h = {method, method + info->header_size, calloc(info->header_size, 1)};
    if (!h.known) return 0;
    if (version > method && version + strlen(version) <= h.hi) mark_known(&h, method, (size_t)(version - method) + strlen(version));
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, mark_header, &h);
    int nul = 0;
    for (size_t i = 0; i < info->header_size && !nul; i++) {
        char b = h.lo[i];
        nul = !h.known[i] && b != 0 && b != ' ' && b != '\t' && b != '\r' && b != '\n' && b != ':';
    }
    free(h.known);
    return nul;
}

/* The raw request target, before libmicrohttpd decodes it in place: a %00
 * would end the decoded path early ("/v1/models/dense%00x" read as
 * "dense"). The request object starts here (on_request completes it). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls, (void)c;
    http_req *hr = calloc(1, sizeof *hr);
    if (hr && uri) hr->nul_in_url = strstr(uri, "%00") != NULL;
    return hr;
}

typedef struct {
    int lengths, codings, chunked_only;
} framing_headers;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing_headers *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) f->lengths++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->codings++;
        f->chunked_only = value && !strcasecmp(value, "chunked");
    }
    return MHD_YES;
}

/* Framing that a proxy in front could read differently than we do (request
 * smuggling, RFC 9112 6.1 and 6.3): refused, and the connection closed.
 * That is both Content-Length and Transfer-Encoding, either one twice, and
 * a transfer coding other than plain "chunked" (libmicrohttpd would read
 * such a body as absent, and its bytes as the next request). */
static int bad_framing(struct MHD_Connection *c, const http_req *hr, const char *method, const char *version,
                       g4_http_reply *r) {
    if (hr->nul_in_url) {
        g4_reply_errorf(r, 400, NULL, "the request target holds an encoded NUL (%%00)");
        r->close = 1;
        return 1;
    }
    if (header_has_nul(c, method, version)) {
        g4_reply_errorf(r, 400, NULL, "a request header holds a NUL byte");
        r->close = 1;
        return 1;
    }
    framing_headers f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    if (f.lengths && f.codings) {
        g4_reply_errorf(r, 400, NULL, "a request may not carry both Content-Length and Transfer-Encoding");
    } else if (f.lengths > 1 || f.codings > 1) {
        g4_reply_errorf(r, 400, NULL, "a request may carry one Content-Length or Transfer-Encoding header only");
    } else if (f.codings && !f.chunked_only) {
        g4_reply_errorf(r, 501, NULL, "the only transfer coding accepted is \"chunked\"");
    } else {
        return 0;
    }
    r->close = 1;
    return 1;
}

/* Route, method, shutdown, key and declared size, before any body is read.
 * Returns 1 with *r filled when the request is answered already. */
static int check_request(g4_server *s, struct MHD_Connection *c, http_req *hr, const char *url, const char *method,
                         const char *version, g4_http_reply *r) {
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int path_known = 0;
    const char *want = NULL;
    for (size_t i = 0; i < N_ROUTES; i++) {
        int match = !strcmp(url, routes[i].path);
        if (!match && routes[i].id == R_MODELS && !strncmp(url, "/v1/models/", 11) && url[11]) match = 2;
        if (routes[i].id == R_RESPONSE) match = !strncmp(url, "/v1/responses/", 14) && url[14] ? 3 : 0;
        if (!match) continue;
        path_known = 1;
        want = routes[i].method;
        hr->label = routes[i].label;
        if (match == 3) {
            /* GET or DELETE /v1/responses/ID */
            if (is_get || !strcmp(method, "DELETE")) {
                hr->route = is_get ? R_RESPONSE : R_RESPONSE_DELETE;
                hr->id_in_url = strdup(url + 14);
            }
        } else if (strcmp(routes[i].method, "GET") == 0 ? is_get : !strcmp(method, routes[i].method)) {
            hr->route = match == 2 ? R_MODEL : routes[i].id;
            if (match == 2) hr->model_in_url = strdup(url + 11);
        }
        break;
    }
    hr->anthropic = !strncmp(url, "/v1/messages", 12);
    if (bad_framing(c, hr, method, version, r)) {
        if (!hr->label) hr->label = "other";
        return 1;
    }
    if (!path_known) {
        hr->label = "other";
        g4_reply_errorf(r, 404, NULL, "no such endpoint: %s %.200s", method, url);
        return 1;
    }
    if (hr->route == R_NONE) {
        r->allow = want;
        g4_reply_errorf(r, 405, NULL, "%.200s accepts %s only", url, want);
        r->allow = want;
        return 1;
    }
    if (atomic_load(&s->draining)) {
        g4_reply_errorf(r, 503, NULL, "the server is shutting down");
        return 1;
    }
    int is_public = hr->route == R_HEALTH || (hr->route == R_METRICS && s->opt.metrics_public);
    if (s->opt.api_key && !is_public) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        const char *x_key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's header */
        if (!key_matches(auth, s->opt.api_key) && !key_equal(x_key, s->opt.api_key)) {
            g4_reply_errorf(r, 401, NULL,
                            auth || x_key ? "Incorrect API key provided."
                                          : "Missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'.");
            return 1;
        }
    }
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(length, &end, 10);
        if (errno || *end || n > s->opt.max_body) {
            g4_reply_errorf(r, 413, NULL, "the request body is larger than %zu bytes", s->opt.max_body);
            return 1;
        }
    }
    return 0;
}

static void dispatch(g4_server *s, http_req *hr, int fd, g4_http_reply *r) {
    g4_http_request q = {.srv = s,
                         .body = hr->body.data ? hr->body.data : "",
                         .body_len = hr->body.len,
                         .fd = fd,
                         .t_arrival = hr->t_arrival};
    switch (hr->route) {
    case R_HEALTH: g4_serve_health(&q, r); break;
    case R_METRICS: g4_serve_metrics(&q, r); break;
    case R_MODELS: g4_serve_models(&q, NULL, r); break;
    case R_MODEL: g4_serve_models(&q, hr->model_in_url ? hr->model_in_url : "", r); break;
    case R_CHAT: g4_serve_generate(&q, G4_OAI_CHAT, r); break;
    case R_COMPLETIONS: g4_serve_generate(&q, G4_OAI_COMPLETION, r); break;
    case R_TOKENIZE: g4_serve_tokenize(&q, r); break;
    case R_DETOKENIZE: g4_serve_detokenize(&q, r); break;
    case R_RESPONSES: g4_serve_responses(&q, r); break;
    case R_RESPONSE: g4_serve_response_stored(&q, hr->id_in_url ? hr->id_in_url : "", 0, r); break;
    case R_RESPONSE_DELETE: g4_serve_response_stored(&q, hr->id_in_url ? hr->id_in_url : "", 1, r); break;
    case R_MESSAGES: g4_serve_messages(&q, r); break;
    case R_COUNT_TOKENS: g4_serve_count_tokens(&q, r); break;
    default: g4_reply_errorf(r, 404, NULL, "no such endpoint"); break;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **req_cls) {
    g4_server *s = cls;
    http_req *hr = *req_cls;
    if (!hr || !hr->started) {
        if (!hr) hr = calloc(1, sizeof *hr);
        if (!hr) return MHD_NO;
        *req_cls = hr;
        hr->started = 1;
        hr->t_arrival = g4_now_seconds();
        snprintf(hr->method, sizeof hr->method, "%s", method);
        snprintf(hr->path, sizeof hr->path, "%s", url);
        atomic_fetch_add(&s->in_flight, 1);
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        hr->conn = info ? info->socket_context : NULL;
        g4_http_reply r = {0};
        if (check_request(s, c, hr, url, method, version, &r)) return send_reply(s, c, hr, &r);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (g4_now_seconds() - hr->t_arrival > s->opt.request_timeout_s) return MHD_NO; /* too slow: drop */
        if (hr->answered || hr->refused) return MHD_YES;
        /* over the limit (a chunked body declares no length) or over the budget
         * of all bodies held at once (many large uploads get 503, not an OOM) */
        int refuse = hr->body.len + n > s->opt.max_body ? 413 : 0;
        if (!refuse && atomic_fetch_add(&s->body_bytes, n) + n > s->body_budget) {
            atomic_fetch_sub(&s->body_bytes, n);
            refuse = 503;
        }
        if (!refuse && !g4_strbuf_append(&hr->body, upload, n)) {
            atomic_fetch_sub(&s->body_bytes, n);
            refuse = 503;
        }
        if (refuse) {
            /* libmicrohttpd takes a response only once the body is in: drop
             * what came, discard the rest, answer then (the reaper cuts a body
             * that never ends) */
            hr->refused = refuse;
            atomic_fetch_sub(&s->body_bytes, hr->accounted);
            hr->accounted = 0;
            g4_strbuf_free(&hr->body);
            return MHD_YES;
        }
        hr->accounted += n;
        return MHD_YES;
    }
    if (hr->answered) return MHD_YES;
    mark_busy(s, hr);
    if (hr->refused) {
        g4_http_reply r = {0};
        if (hr->refused == 413) g4_reply_errorf(&r, 413, NULL, "the request body is larger than %zu bytes", s->opt.max_body);
        else g4_reply_errorf(&r, 503, NULL, "the server holds too many request bodies; try again later");
        r.close = 1;
        return send_reply(s, c, hr, &r);
    }
    const union MHD_ConnectionInfo *fdinfo = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g4_http_reply r = {0};
    dispatch(s, hr, fdinfo ? fdinfo->connect_fd : -1, &r);
    return send_reply(s, c, hr, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode why) {
    (void)c;
    g4_server *s = cls;
    http_req *hr = *req_cls;
    if (!hr) return;
    *req_cls = NULL;
    if (!hr->started) { /* libmicrohttpd refused it before our handler ran */
        free(hr);
        return;
    }
    /* 499 (nginx's "client closed request") for requests that got no answer */
    int status = hr->status ? hr->status : 499;
    g4_metrics_request(s->metrics, hr->label ? hr->label : "other", status);
    g4_log(G4_LOG_INFO, "%s %s %d %.1f ms%s", hr->method, hr->path, status, 1e3 * (g4_now_seconds() - hr->t_arrival),
           why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
    if (hr->conn) {
        pthread_mutex_lock(&s->conn_lock);
        hr->conn->busy = 0;
        hr->conn->since = g4_now_seconds();
        pthread_mutex_unlock(&s->conn_lock);
    }
    atomic_fetch_sub(&s->in_flight, 1);
    atomic_fetch_sub(&s->body_bytes, hr->accounted);
    g4_strbuf_free(&hr->body);
    free(hr->model_in_url);
    free(hr->id_in_url);
    free(hr);
}

/* ---- connections and the reaper ------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    g4_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_entry *e = calloc(1, sizeof *e);
        if (!e) return;
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        e->fd = info ? info->connect_fd : -1;
        e->since = g4_now_seconds();
        pthread_mutex_lock(&s->conn_lock);
        e->next = s->conns;
        if (s->conns) s->conns->prev = e;
        s->conns = e;
        pthread_mutex_unlock(&s->conn_lock);
        *socket_context = e;
    } else {
        conn_entry *e = *socket_context;
        if (!e) return;
        /* before libmicrohttpd closes the socket: the reaper never touches a reused fd */
        pthread_mutex_lock(&s->conn_lock);
        if (e->prev) e->prev->next = e->next;
        else s->conns = e->next;
        if (e->next) e->next->prev = e->prev;
        pthread_mutex_unlock(&s->conn_lock);
        free(e);
        *socket_context = NULL;
    }
}

/* Closes connections whose next request has not arrived in full within the
 * request timeout (a slow sender, or an idle keep-alive connection). */
static void *reaper_main(void *arg) {
    g4_server *s = arg;
    pthread_mutex_lock(&s->conn_lock);
    while (!s->reaper_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->reaper_wake, &s->conn_lock, &until);
        double now = g4_now_seconds();
        for (conn_entry *e = s->conns; e; e = e->next)
            if (!e->busy && !e->reaped && e->fd >= 0 && now - e->since > s->opt.request_timeout_s) {
                shutdown(e->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
                e->reaped = 1;
            }
    }
    pthread_mutex_unlock(&s->conn_lock);
    return NULL;
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    g4_log(G4_LOG_DEBUG, "http: %s", line);
}

/* ---- lifecycle ------------------------------------------------------------- */

void g4_server_track(g4_server *s, g4_job *j) {
    pthread_mutex_lock(&s->jobs_lock);
    if (s->n_jobs == s->cap_jobs) {
        int cap = s->cap_jobs ? s->cap_jobs * 2 : 64;
        g4_job **grown = realloc(s->jobs, (size_t)cap * sizeof *grown);
        if (grown) s->jobs = grown, s->cap_jobs = cap;
    }
    if (s->n_jobs < s->cap_jobs) s->jobs[s->n_jobs++] = j;
    int stopping = atomic_load(&s->stopping);
    pthread_mutex_unlock(&s->jobs_lock);
    if (stopping) g4_job_cancel(j);
}

void g4_server_untrack(g4_server *s, g4_job *j) {
    pthread_mutex_lock(&s->jobs_lock);
    for (int i = 0; i < s->n_jobs; i++)
        if (s->jobs[i] == j) {
            s->jobs[i] = s->jobs[--s->n_jobs];
            break;
        }
    pthread_mutex_unlock(&s->jobs_lock);
}

static void free_server(g4_server *s) {
    if (s->reaper_started) {
        pthread_mutex_lock(&s->conn_lock);
        s->reaper_stop = 1;
        pthread_cond_signal(&s->reaper_wake);
        pthread_mutex_unlock(&s->conn_lock);
        pthread_join(s->reaper, NULL);
    }
    g4_metrics_free(s->metrics);
    g4_response_store_free(s->responses);
    pthread_mutex_destroy(&s->media_lock);
    pthread_mutex_destroy(&s->jobs_lock);
    pthread_mutex_destroy(&s->conn_lock);
    pthread_cond_destroy(&s->reaper_wake);
    free(s->jobs);
    free(s->model_name);
    free(s);
}

g4_status g4_server_start(g4_context *ctx, g4_engine *engine, const g4_server_options *opt, g4_server **out) {
    *out = NULL;
    g4_server *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    s->ctx = ctx;
    s->engine = engine;
    if (opt) s->opt = *opt;
    g4_server_options *o = &s->opt;
    if (!o->host) o->host = "127.0.0.1";
    if (!o->max_body) o->max_body = (size_t)32 << 20;
    if (o->max_tokens <= 0) o->max_tokens = 4096;
    if (o->max_images <= 0) o->max_images = 8;
    if (o->max_audio <= 0) o->max_audio = 4;
    if (o->request_timeout_s <= 0) o->request_timeout_s = 30;
    if (o->idle_timeout_s <= 0) o->idle_timeout_s = 60;
    if (o->max_connections <= 0) o->max_connections = 1024;
    s->body_budget = o->body_budget ? o->body_budget
                     : o->max_body * 8 > ((size_t)512 << 20) ? o->max_body * 8 : (size_t)512 << 20;
    s->n_ctx = g4_engine_n_ctx(engine);
    s->max_token_bytes = ctx->tokenizer ? g4_tokenizer_max_token_bytes(ctx->tokenizer) : 1;
    /* room for a whole context of token ids several times over, and for large tool schemas */
    s->max_json_values = (size_t)s->n_ctx * 4 > G4_OAI_DEFAULT_MAX_VALUES ? (size_t)s->n_ctx * 4 : G4_OAI_DEFAULT_MAX_VALUES;
    if (o->max_prompt_tokens <= 0 || o->max_prompt_tokens >= s->n_ctx) o->max_prompt_tokens = s->n_ctx - 1;
    s->model_name = strdup(o->model_name ? o->model_name : "gemma4");
    s->created = (long)time(NULL);
    s->metrics = g4_metrics_create();
    if (o->responses_store_entries == 0) o->responses_store_entries = 1000;
    if (o->responses_store_bytes == 0) o->responses_store_bytes = (size_t)64 << 20;
    s->responses = g4_response_store_create(o->responses_store_entries, o->responses_store_bytes);
    pthread_mutex_init(&s->media_lock, NULL);
    pthread_mutex_init(&s->jobs_lock, NULL);
    pthread_mutex_init(&s->conn_lock, NULL);
    pthread_cond_init(&s->reaper_wake, NULL);
    if (!s->model_name || !s->metrics || !s->responses) {
        free_server(s);
        return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    }
    o->model_name = s->model_name;

    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(o->host, port_text, &hints, &ai);
    if (gai != 0 || !ai) {
        free_server(s);
        return g4_fail(G4_ERR_INVALID_ARGUMENT, "cannot use host '%s': %s", o->host, gai_strerror(gai));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (pthread_create(&s->reaper, NULL, reaper_main, s) == 0) s->reaper_started = 1;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)o->idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_EXTERNAL_LOGGER, log_mhd, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d || !s->reaper_started) {
        if (d) MHD_stop_daemon(d);
        free_server(s);
        return g4_fail(G4_ERR_IO, "cannot listen on %s port %d (in use, or not an address of this machine?)", o->host,
                       o->port);
    }
    s->daemon = d;
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = pi ? pi->port : o->port;
    *out = s;
    return G4_OK;
}

int g4_server_port(const g4_server *s) { return s->port; }

void g4_server_drain(g4_server *s) {
    if (atomic_exchange(&s->draining, 1)) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int g4_server_in_flight(g4_server *s) { return atomic_load(&s->in_flight); }

void g4_server_stop(g4_server *s) {
    if (!s) return;
    g4_server_drain(s);
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->jobs_lock);
    for (int i = 0; i < s->n_jobs; i++) g4_job_cancel(s->jobs[i]);
    pthread_mutex_unlock(&s->jobs_lock);
    /* the cancelled requests end within an engine step or two */
    for (int i = 0; i < 200 && atomic_load(&s->in_flight) > 0; i++) usleep(25 * 1000);
    MHD_stop_daemon(s->daemon); /* closes idle connections, joins their threads */
    free_server(s);
}
