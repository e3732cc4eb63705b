/* What the hub's error answers mean to the user, retries with backoff, and
 * progress events. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "io/hub_internal.h"

/* The hub's own explanation, when it sent one, as " (hub: ...)". */
static void hub_says(const hub_response *r, char *buf, size_t n) {
    buf[0] = '\0';
    if (r->error_message && *r->error_message) snprintf(buf, n, " (hub: %s)", r->error_message);
}

g4_status hub_response_error(hub_response *r, const hub_context *ctx, const char *file) {
    long st = r->status;
    const char *code = r->error_code ? r->error_code : "";
    const char *rev = ctx->revision ? ctx->revision : "main";
    char extra[512];
    hub_says(r, extra, sizeof extra);
    r->transient = 0;

    if (!strcmp(code, "GatedRepo"))
        return g4_fail(G4_ERR_IO,
                       "%s is a gated model (HTTP %ld): open %s/%s while logged in, accept its license, then set "
                       "HF_TOKEN to an access token of that account%s%s",
                       ctx->repo_id, st, ctx->endpoint, ctx->repo_id,
                       ctx->have_token ? " (a token was sent: its account has no access yet)" : "", extra);
    if (st == 401 && r->error_message && strstr(r->error_message, "Invalid credentials"))
        return g4_fail(G4_ERR_IO, "the hub rejected the access token (HTTP 401): check HF_TOKEN%s", extra);
    if (!strcmp(code, "RevisionNotFound"))
        return g4_fail(G4_ERR_NOT_FOUND, "revision '%s' not found in %s (HTTP %ld)%s", rev, ctx->repo_id, st, extra);
    if (!strcmp(code, "RepoNotFound") || st == 401)
        return g4_fail(G4_ERR_NOT_FOUND, "repository %s not found on %s (HTTP %ld)%s%s", ctx->repo_id,
                       ctx->endpoint, st,
                       ctx->have_token ? "" : "; if it is private or gated, set HF_TOKEN to an access token", extra);
    if (!strcmp(code, "EntryNotFound") || (st == 404 && file))
        return g4_fail(G4_ERR_NOT_FOUND, "%s not found in %s at revision %s (HTTP %ld)%s", file ? file : "file",
                       ctx->repo_id, rev, st, extra);
    if (st == 404)
        return g4_fail(G4_ERR_NOT_FOUND, "%s@%s not found on %s (HTTP 404)%s", ctx->repo_id, rev, ctx->endpoint,
                       extra);
    if (st == 403)
        return g4_fail(G4_ERR_IO, "access to %s%s%s denied (HTTP 403): check that HF_TOKEN may read it%s", ctx->repo_id,
                       file ? "/" : "", file ? file : "", extra);
    if (st == 429 || st >= 500 || st == 408) {
        r->transient = 1;
        return g4_fail(G4_ERR_IO, "%s%s%s: %s (HTTP %ld)%s", ctx->repo_id, file ? "/" : "", file ? file : "",
                       st == 429 ? "rate limited" : "server error", st, extra);
    }
    return g4_fail(G4_ERR_IO, "%s%s%s: unexpected HTTP status %ld%s", ctx->repo_id, file ? "/" : "",
                   file ? file : "", st, extra);
}

void hub_retry_init(hub_retry *r, const g4_hub_options *opt) {
    r->failures = 0;
    r->max_retries = opt->max_retries > 0 ? opt->max_retries : 5;
    r->backoff_ms = opt->backoff_ms > 0 ? opt->backoff_ms : 1000;
    r->opt = opt;
}

int hub_retry_wait(hub_retry *r, const char *file, const char *why, int64_t retry_after_s) {
    if (r->failures >= r->max_retries) return 0;
    double ms = r->backoff_ms;
    for (int i = 0; i < r->failures && ms < 30000; i++) ms *= 2;
    if (ms > 30000) ms = 30000;
    if (retry_after_s > 0 && retry_after_s * 1000.0 > ms) ms = retry_after_s > 120 ? 120000 : retry_after_s * 1000.0;
    r->failures++;
    if (r->opt->progress) {
        g4_hub_event e = {.kind = G4_HUB_RETRY, .file = file, .message = why, .wait_seconds = ms / 1000};
        r->opt->progress(&e, r->opt->progress_user);
    }
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return 1;
}

void hub_emit(const g4_hub_options *opt, g4_hub_event_kind kind, const char *file, int index, int count,
              uint64_t done, uint64_t total) {
    if (!opt->progress) return;
    g4_hub_event e = {.kind = kind, .file = file, .index = index, .count = count, .done = done, .total = total};
    opt->progress(&e, opt->progress_user);
}

const char *hub_format_bytes(int64_t n, char buf[32]) {
    if (n >= 1000000000) snprintf(buf, 32, "%.2f GB", n / 1e9);
    else if (n >= 1000000) snprintf(buf, 32, "%.1f MB", n / 1e6);
    else if (n >= 1000) snprintf(buf, 32, "%.1f kB", n / 1e3);
    else snprintf(buf, 32, "%lld B", (long long)n);
    return buf;
}
