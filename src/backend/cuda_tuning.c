/* The CUDA tuning struct's defaults and its "key=value,..." parser: one
 * table of keys, each an integer field with its range or a named choice. */
#include "backend/cuda_tuning.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

g4_cuda_tuning g4_cuda_tuning_defaults(const g4_cuda_caps *caps) {
    g4_cuda_tuning t;
    memset(&t, 0, sizeof t);
    t.graphs = 1;
    t.pdl = caps->major >= 9;
    t.i8_min8 = (int64_t)1 << 25; /* below, the integer kernel's pre-pass costs more than it saves */
    t.gemv_copies = 4;            /* fewer L2 slices queued on by all tiles; more make the pre-pass slower */
    t.gemv_split = -1;
    t.attn_min_split = 0;
    t.attn_tc_split = -1;
    t.moe_cublas = 64; /* below, the pipelined grouped kernel is faster */
    t.q_chunk = 64;    /* Mi weights: at 512 tokens cuBLAS keeps its large tiles on every chunk of a 31B matrix */
    t.wgmma = 1;       /* the 4-bit experts: 26B-A4B pp512 +10% (bench/RESULTS.md, issue 25); dense: slower */
    t.gemv = G4_CUDA_GEMV_AUTO;
    t.attn = G4_CUDA_ATTN_AUTO;
    t.moe = G4_CUDA_MOE_AUTO;
    return t;
}

/* names of a choice's values, in enum order */
static const char *const gemv_names[] = {"auto", "float32", "fp16", NULL};
static const char *const attn_names[] = {"auto", "cores", "tc", NULL};
static const char *const moe_names[] = {"auto", "mma", NULL};

typedef struct {
    const char *key;
    size_t offset;
    int is_int64;             /* the field is an int64_t (else an int, or an enum when names) */
    int64_t min, max;         /* integers */
    const char *const *names; /* a choice: one of these */
} tune_key;

#define TUNE_INT(name, lo, hi) {#name, offsetof(g4_cuda_tuning, name), 0, lo, hi, NULL}
static const tune_key keys[] = {
    TUNE_INT(graphs, 0, 1),
    TUNE_INT(pdl, 0, 1),
    {"i8_min8", offsetof(g4_cuda_tuning, i8_min8), 1, 0, INT64_MAX, NULL},
    TUNE_INT(gemv_copies, 1, 64),
    TUNE_INT(gemv_split, -1, 1),
    TUNE_INT(attn_min_split, 0, 1 << 20),
    TUNE_INT(attn_tc_split, -1, 1 << 20),
    TUNE_INT(moe_cublas, 0, 1 << 30),
    TUNE_INT(q_chunk, 1, 1024),
    TUNE_INT(wgmma, 0, 2),
    {"gemv", offsetof(g4_cuda_tuning, gemv), 0, 0, 0, gemv_names},
    {"attn", offsetof(g4_cuda_tuning, attn), 0, 0, 0, attn_names},
    {"moe", offsetof(g4_cuda_tuning, moe), 0, 0, 0, moe_names},
};
#undef TUNE_INT
enum { N_KEYS = sizeof keys / sizeof keys[0] };

static const tune_key *key_named(const char *s, size_t n) {
    for (int i = 0; i < N_KEYS; i++)
        if (strlen(keys[i].key) == n && memcmp(keys[i].key, s, n) == 0) return &keys[i];
    return NULL;
}

/* the value text [s, s + n) for key k into t; 0 when it is not one */
static int set_value(g4_cuda_tuning *t, const tune_key *k, const char *s, size_t n) {
    char buf[32];
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *field = (char *)t + k->offset;
    if (k->names) {
        for (int i = 0; k->names[i]; i++)
            if (!strcmp(k->names[i], buf)) {
                *(int *)field = i; /* the choices are enums of int size */
                return 1;
            }
        return 0;
    }
    if (!(buf[0] == '-' || (buf[0] >= '0' && buf[0] <= '9'))) return 0;
    errno = 0;
    char *end = NULL;
    const long long v = strtoll(buf, &end, 10);
    if (errno || *end != '\0' || v < k->min || v > k->max) return 0;
    if (k->is_int64)
        *(int64_t *)field = (int64_t)v;
    else
        *(int *)field = (int)v;
    return 1;
}

static void say_expected(const tune_key *k, char *out, size_t size) {
    if (!k->names) {
        snprintf(out, size, "an integer from %lld to %lld", (long long)k->min, (long long)k->max);
        return;
    }
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; k->names[i] && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? ", " : "one of ", k->names[i]);
}

int g4_cuda_tuning_parse(g4_cuda_tuning *t, const char *spec, char *err, size_t err_size) {
    if (err_size) err[0] = '\0';
    if (!spec) return 1;
    g4_cuda_tuning next = *t;
    const char *p = spec;
    while (*p) {
        const char *item_end = strchr(p, ',');
        if (!item_end) item_end = p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(item_end - p));
        if (item_end == p) { /* an empty item: ",," or a trailing comma */
            p = *item_end ? item_end + 1 : item_end;
            continue;
        }
        const size_t key_len = (size_t)((eq ? eq : item_end) - p);
        const tune_key *k = key_named(p, key_len);
        if (!k) {
            char known[256];
            size_t used = 0;
            known[0] = '\0';
            for (int i = 0; i < N_KEYS && used < sizeof known; i++)
                used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", keys[i].key);
            snprintf(err, err_size, "unknown CUDA tuning key \"%.*s\" (the keys: %s)", (int)(key_len > 64 ? 64 : key_len),
                     p, known);
            return 0;
        }
        const char *v = eq ? eq + 1 : item_end;
        const size_t v_len = (size_t)(item_end - v);
        if (!eq || !set_value(&next, k, v, v_len)) {
            char expected[96];
            say_expected(k, expected, sizeof expected);
            snprintf(err, err_size, "CUDA tuning %s=%.*s: the value must be %s", k->key,
                     (int)(v_len > 64 ? 64 : v_len), v, expected);
            return 0;
        }
        p = *item_end ? item_end + 1 : item_end;
    }
    *t = next;
    return 1;
}

/* the former variables and what took their place */
static const struct {
    const char *name, *now;
} former[] = {
    {"G4_CUDA_GRAPHS", "G4_CUDA_TUNE=graphs=0"},
    {"G4_CUDA_PDL", "G4_CUDA_TUNE=pdl=0"},
    {"G4_CUDA_GEMV_I8_MIN8", "G4_CUDA_TUNE=i8_min8=N"},
    {"G4_CUDA_GEMV_COPIES", "G4_CUDA_TUNE=gemv_copies=N"},
    {"G4_CUDA_GEMV_SPLIT", "G4_CUDA_TUNE=gemv_split=0|1"},
    {"G4_CUDA_ATTN_MIN_SPLIT", "G4_CUDA_TUNE=attn_min_split=N"},
    {"G4_CUDA_ATTN_TC_SPLIT", "G4_CUDA_TUNE=attn_tc_split=N"},
    {"G4_CUDA_MOE_CUBLAS", "G4_CUDA_TUNE=moe_cublas=N"},
    {"G4_CUDA_GEMV_TC", "the test hook G4_CUDA_TUNE=gemv=float32"},
    {"G4_CUDA_GEMV_I8", "the test hook G4_CUDA_TUNE=gemv=fp16"},
    {"G4_CUDA_ATTN_TC", "the test hooks G4_CUDA_TUNE=attn=cores|tc"},
    {"G4_CUDA_MOE_PIPE", "the test hook G4_CUDA_TUNE=moe=mma"},
};

int g4_cuda_tuning_check_env(char *const *env, char *err, size_t err_size) {
    if (err_size) err[0] = '\0';
    for (; env && *env; env++) {
        const char *e = *env;
        if (strncmp(e, "G4_CUDA_", 8) != 0 || strncmp(e, "G4_CUDA_TUNE=", 13) == 0) continue;
        const char *eq = strchr(e, '=');
        const size_t n = eq ? (size_t)(eq - e) : strlen(e);
        const char *now = NULL;
        for (size_t i = 0; i < sizeof former / sizeof former[0]; i++)
            if (strlen(former[i].name) == n && memcmp(former[i].name, e, n) == 0) now = former[i].now;
        if (now)
            snprintf(err, err_size, "%.*s is no longer read: use %s (README.md, \"CUDA tuning\")", (int)(n > 64 ? 64 : n),
                     e, now);
        else
            snprintf(err, err_size,
                     "%.*s is not read: the CUDA backend's one setting is G4_CUDA_TUNE=key=value,... (README.md, "
                     "\"CUDA tuning\"; the alternatives such variables selected measured slower and were removed)",
                     (int)(n > 64 ? 64 : n), e);
        return 0;
    }
    return 1;
}

int g4_cuda_tuning_format(const g4_cuda_tuning *t, char *buf, size_t size) {
    size_t used = 0;
    for (int i = 0; i < N_KEYS; i++) {
        const tune_key *k = &keys[i];
        const char *field = (const char *)t + k->offset;
        char value[32];
        if (k->names) {
            int n_names = 0, v = *(const int *)field;
            while (k->names[n_names]) n_names++;
            snprintf(value, sizeof value, "%s", v >= 0 && v < n_names ? k->names[v] : "?");
        } else if (k->is_int64)
            snprintf(value, sizeof value, "%lld", (long long)*(const int64_t *)field);
        else
            snprintf(value, sizeof value, "%d", *(const int *)field);
        const int n = snprintf(used < size ? buf + used : NULL, used < size ? size - used : 0, "%s%s=%s",
                               i ? "," : "", k->key, value);
        used += (size_t)n;
    }
    return (int)used;
}
