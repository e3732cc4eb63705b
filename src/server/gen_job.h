/* One engine request seen from the thread that serves its HTTP connection.
 *
 * The engine calls back on its own thread for every token; the callback
 * only copies the event into the job's queue and wakes the connection
 * thread (an eventfd), which does the text work. The job is shared by the
 * two threads and freed when both have let go: the engine after its final
 * event, the connection when it is done (a client that goes away cancels
 * the request and lets go at once). */
#ifndef G4_SERVER_GEN_JOB_H
#define G4_SERVER_GEN_JOB_H

#include "runtime/engine.h"

typedef struct {
    int has_token, is_stop_token;
    g4_sample sample;
    g4_finish_reason finish; /* G4_FINISH_NONE until the last event */
    char message[256];       /* with G4_FINISH_ERROR */
    int n_prompt, n_generated;
    int n_cached; /* prompt tokens the prefix cache supplied */
    int n_drafted, n_accepted, n_rounds; /* speculative decoding so far (g4_token_event) */
    double time; /* g4_now_seconds() when the engine produced it */
} g4_job_event;

typedef enum { G4_JOB_READY = 0, G4_JOB_TIMEOUT, G4_JOB_HANGUP } g4_job_wait_result;

typedef struct g4_job g4_job;

g4_status g4_job_create(g4_engine *e, g4_job **out);
/* Submits req (its callback and user are set here). On failure the job is
 * still the caller's to release. */
g4_status g4_job_submit(g4_job *j, g4_request *req);
uint64_t g4_job_id(const g4_job *j);
/* Waits until events are queued, the client socket `fd` (-1: none) hangs
 * up, or timeout_ms passes. */
g4_job_wait_result g4_job_wait(g4_job *j, int fd, int timeout_ms);
/* Takes every queued event; *events stays valid until the next take. */
int g4_job_take(g4_job *j, const g4_job_event **events);
/* Asks the engine to stop this request (its last event then says CANCELLED). */
void g4_job_cancel(g4_job *j);
/* The connection thread lets go; the engine may still hold the job. */
void g4_job_release(g4_job *j);

/* Whether the peer of socket fd has closed it (or it failed). */
int g4_socket_hung_up(int fd);

#endif
