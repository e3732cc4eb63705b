#define _GNU_SOURCE /* POLLRDHUP */
#include "server/gen_job.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/file.h"

struct g4_job {
    g4_engine *engine;
    pthread_mutex_t lock;
    int refs;
    int wake_fd;
    uint64_t id;
    int submitted;
    g4_job_event *queue, *taken;
    int n_queue, cap_queue, cap_taken;
    int overflow; /* an allocation failed: the request is failed */
};

g4_status g4_job_create(g4_engine *e, g4_job **out) {
    *out = NULL;
    g4_job *j = calloc(1, sizeof *j);
    if (!j) return g4_fail(G4_ERR_OUT_OF_MEMORY, "out of memory");
    j->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (j->wake_fd < 0) {
        free(j);
        return g4_fail(G4_ERR_IO, "eventfd: %s", strerror(errno));
    }
    pthread_mutex_init(&j->lock, NULL);
    j->engine = e;
    j->refs = 1;
    *out = j;
    return G4_OK;
}

static void job_free(g4_job *j) {
    close(j->wake_fd);
    pthread_mutex_destroy(&j->lock);
    free(j->queue);
    free(j->taken);
    free(j);
}

static void drop_ref(g4_job *j) {
    pthread_mutex_lock(&j->lock);
    int left = --j->refs;
    pthread_mutex_unlock(&j->lock);
    if (left == 0) job_free(j);
}

/* Engine thread: copy, wake, and let go after the last event. */
static void on_token(void *user, const g4_token_event *ev) {
    g4_job *j = user;
    double now = g4_now_seconds();
    pthread_mutex_lock(&j->lock);
    int was_empty = j->n_queue == 0;
    if (j->n_queue == j->cap_queue) {
        int cap = j->cap_queue ? j->cap_queue * 2 : 16;
        g4_job_event *grown = realloc(j->queue, (size_t)cap * sizeof *grown);
        if (grown) j->queue = grown, j->cap_queue = cap;
    }
    if (j->n_queue < j->cap_queue) {
        g4_job_event *q = &j->queue[j->n_queue++];
        q->has_token = ev->has_token;
        q->is_stop_token = ev->is_stop_token;
        q->sample = ev->sample;
        q->finish = ev->finish;
        q->message[0] = 0;
        if (ev->message) {
            strncpy(q->message, ev->message, sizeof q->message - 1);
            q->message[sizeof q->message - 1] = 0;
        }
        q->n_prompt = ev->n_prompt;
        q->n_generated = ev->n_generated;
        q->n_cached = ev->n_cached;
        q->n_drafted = ev->n_drafted;
        q->n_accepted = ev->n_accepted;
        q->n_rounds = ev->n_rounds;
        q->time = now;
    } else {
        j->overflow = 1;
    }
    if (was_empty || ev->finish != G4_FINISH_NONE) {
        uint64_t one = 1;
        ssize_t w = write(j->wake_fd, &one, sizeof one);
        (void)w; /* a full counter still wakes the reader */
    }
    pthread_mutex_unlock(&j->lock);
    if (ev->finish != G4_FINISH_NONE) drop_ref(j);
}

g4_status g4_job_submit(g4_job *j, g4_request *req) {
    req->on_token = on_token;
    req->user = j;
    pthread_mutex_lock(&j->lock);
    j->refs++; /* the engine's, from now until its last event */
    pthread_mutex_unlock(&j->lock);
    g4_status st = g4_engine_submit(j->engine, req, &j->id);
    if (st != G4_OK) {
        pthread_mutex_lock(&j->lock);
        j->refs--;
        pthread_mutex_unlock(&j->lock);
        return st;
    }
    j->submitted = 1;
    return G4_OK;
}

uint64_t g4_job_id(const g4_job *j) { return j->id; }

int g4_socket_hung_up(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

g4_job_wait_result g4_job_wait(g4_job *j, int fd, int timeout_ms) {
    struct pollfd p[2] = {{.fd = j->wake_fd, .events = POLLIN}, {.fd = fd, .events = POLLRDHUP}};
    int n = fd >= 0 ? 2 : 1;
    for (;;) {
        int r = poll(p, (nfds_t)n, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return G4_JOB_HANGUP;
        if (r == 0) return G4_JOB_TIMEOUT;
        if (n == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return G4_JOB_HANGUP;
        if (p[0].revents & POLLIN) {
            uint64_t v;
            ssize_t rd = read(j->wake_fd, &v, sizeof v);
            (void)rd;
        }
        return G4_JOB_READY;
    }
}

int g4_job_take(g4_job *j, const g4_job_event **events) {
    pthread_mutex_lock(&j->lock);
    g4_job_event *t = j->taken;
    int cap = j->cap_taken;
    j->taken = j->queue;
    j->cap_taken = j->cap_queue;
    int n = j->n_queue;
    j->queue = t;
    j->cap_queue = cap;
    j->n_queue = 0;
    if (j->overflow && n < j->cap_taken) {
        /* report the lost events as a failure of the request */
        g4_job_event *q = &j->taken[n++];
        memset(q, 0, sizeof *q);
        q->finish = G4_FINISH_ERROR;
        strcpy(q->message, "out of memory for the token queue");
        j->overflow = 0;
    }
    pthread_mutex_unlock(&j->lock);
    *events = j->taken;
    return n;
}

void g4_job_cancel(g4_job *j) {
    if (j->submitted) g4_engine_cancel(j->engine, j->id);
}

void g4_job_release(g4_job *j) {
    if (j) drop_ref(j);
}
