/* The CUDA tuning struct (backend/cuda_tuning.h), no GPU needed: the
 * defaults per device, the "key=value,..." parser (every key, every kind of
 * bad input named in the error, the struct untouched on error) and the
 * printed settings parsed back. */
#include <stdint.h>
#include <string.h>

#include "backend/cuda_tuning.h"
#include "test_util.h"

static const g4_cuda_caps h200 = {132, 9, 0, 232448, 1};
static const g4_cuda_caps a100 = {108, 8, 0, 166912, 0};

static void test_defaults(void) {
    const g4_cuda_tuning t = g4_cuda_tuning_defaults(&h200);
    CHECK(t.graphs == 1 && t.pdl == 1, "graphs %d pdl %d", t.graphs, t.pdl);
    CHECK(t.i8_min8 == (int64_t)1 << 25, "i8_min8 %lld", (long long)t.i8_min8);
    CHECK(t.gemv_copies == 4 && t.gemv_split == -1, "copies %d split %d", t.gemv_copies, t.gemv_split);
    CHECK(t.attn_min_split == 0 && t.attn_tc_split == -1, "attn %d %d", t.attn_min_split, t.attn_tc_split);
    CHECK(t.moe_cublas == 64, "moe_cublas %d", t.moe_cublas);
    CHECK(t.q_chunk == 64, "q_chunk %d", t.q_chunk);
    CHECK(t.wgmma == 1, "wgmma %d (on by default)", t.wgmma);
    CHECK(t.gemv == G4_CUDA_GEMV_AUTO && t.attn == G4_CUDA_ATTN_AUTO && t.moe == G4_CUDA_MOE_AUTO, "hooks off");
    /* no programmatic dependent launch before compute capability 9 */
    const g4_cuda_tuning old = g4_cuda_tuning_defaults(&a100);
    CHECK(old.pdl == 0 && old.graphs == 1, "sm80: pdl %d", old.pdl);
}

static void test_keys(void) {
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&h200);
    char err[512];
    CHECK(g4_cuda_tuning_parse(&t,
                               "graphs=0,pdl=0,i8_min8=0,gemv_copies=64,gemv_split=1,attn_min_split=128,"
                               "attn_tc_split=256,moe_cublas=0,q_chunk=1,wgmma=0,gemv=float32,attn=cores,"
                               "moe=mma",
                               err, sizeof err),
          "every key: %s", err);
    CHECK(t.graphs == 0 && t.pdl == 0 && t.i8_min8 == 0 && t.gemv_copies == 64 && t.gemv_split == 1,
          "switches and GEMV thresholds set");
    CHECK(t.attn_min_split == 128 && t.attn_tc_split == 256 && t.moe_cublas == 0, "attention and MoE thresholds set");
    CHECK(t.q_chunk == 1 && t.wgmma == 0, "quantised prefill set");
    CHECK(t.gemv == G4_CUDA_GEMV_FLOAT32 && t.attn == G4_CUDA_ATTN_CORES && t.moe == G4_CUDA_MOE_MMA, "hooks set");
    CHECK(g4_cuda_tuning_parse(&t, "gemv=fp16,attn=tc,gemv_split=-1,attn_tc_split=-1", err, sizeof err), "%s", err);
    CHECK(t.gemv == G4_CUDA_GEMV_FP16 && t.attn == G4_CUDA_ATTN_TC && t.gemv_split == -1 && t.attn_tc_split == -1,
          "the other choices");
    CHECK(g4_cuda_tuning_parse(&t, "i8_min8=9223372036854775807", err, sizeof err) && t.i8_min8 == INT64_MAX,
          "int64 range: %s", err);
    /* nothing to apply */
    const g4_cuda_tuning before = t;
    CHECK(g4_cuda_tuning_parse(&t, NULL, err, sizeof err) && g4_cuda_tuning_parse(&t, "", err, sizeof err) &&
              g4_cuda_tuning_parse(&t, ",,", err, sizeof err),
          "empty specs");
    CHECK(memcmp(&before, &t, sizeof t) == 0, "empty specs change nothing");
    /* later items win; a trailing comma is allowed */
    CHECK(g4_cuda_tuning_parse(&t, "gemv_copies=2,gemv_copies=3,", err, sizeof err) && t.gemv_copies == 3, "%s",
          err);
}

/* spec must fail, leave the struct as it was and say `needle` */
static void expect_error(const char *spec, const char *needle) {
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&h200);
    const g4_cuda_tuning before = t;
    char err[512];
    const int ok = g4_cuda_tuning_parse(&t, spec, err, sizeof err);
    CHECK(!ok, "\"%s\" accepted", spec);
    CHECK(memcmp(&before, &t, sizeof t) == 0, "\"%s\" changed the settings", spec);
    CHECK(strstr(err, needle) != NULL, "\"%s\": error \"%s\" lacks \"%s\"", spec, err, needle);
}

static void test_errors(void) {
    expect_error("gemv_copeis=2", "unknown CUDA tuning key \"gemv_copeis\"");
    expect_error("gemv_copies=2,bogus=1", "\"bogus\"");
    expect_error("G4_CUDA_GEMV_I8=0", "unknown CUDA tuning key \"G4_CUDA_GEMV_I8\"");
    expect_error("graphs", "graphs=: the value must be an integer from 0 to 1");
    expect_error("graphs=", "graphs=: the value must be");
    expect_error("graphs=2", "graphs=2: the value must be an integer from 0 to 1");
    expect_error("gemv_copies=0", "gemv_copies=0: the value must be an integer from 1 to 64");
    expect_error("gemv_copies=65", "from 1 to 64");
    expect_error("gemv_copies=4x", "gemv_copies=4x");
    expect_error("gemv_copies= 4", "gemv_copies= 4");
    expect_error("gemv_copies=+4", "gemv_copies=+4");
    expect_error("i8_min8=-1", "i8_min8=-1: the value must be an integer from 0");
    expect_error("i8_min8=99999999999999999999", "i8_min8=99999999999999999999");
    expect_error("gemv_split=-2", "from -1 to 1");
    expect_error("gemv=int8", "gemv=int8: the value must be one of auto, float32, fp16");
    expect_error("attn=flash", "one of auto, cores, tc");
    expect_error("moe=cublas", "one of auto, mma");
    expect_error("=1", "unknown CUDA tuning key \"\"");
    expect_error("moe_cublas=64=1", "moe_cublas=64=1");
    /* the error names a long bad value without overrunning the buffer */
    char spec[400];
    memset(spec, '9', sizeof spec);
    memcpy(spec, "moe_cublas=", 11);
    spec[sizeof spec - 1] = '\0';
    expect_error(spec, "moe_cublas=999");
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&h200);
    char small[16];
    CHECK(!g4_cuda_tuning_parse(&t, "nope=1", small, sizeof small) && strlen(small) == sizeof small - 1,
          "a short error buffer is filled and terminated (%zu)", strlen(small));
}

static void test_format(void) {
    g4_cuda_tuning t = g4_cuda_tuning_defaults(&h200);
    char err[512], text[512];
    CHECK(g4_cuda_tuning_parse(&t, "gemv=fp16,moe_cublas=7,attn_tc_split=0", err, sizeof err), "%s", err);
    const int n = g4_cuda_tuning_format(&t, text, sizeof text);
    CHECK(n > 0 && (size_t)n == strlen(text), "format length %d", n);
    CHECK(strstr(text, "gemv=fp16") && strstr(text, "moe_cublas=7") && strstr(text, "i8_min8=33554432"), "%s",
          text);
    g4_cuda_tuning back = g4_cuda_tuning_defaults(&a100);
    CHECK(g4_cuda_tuning_parse(&back, text, err, sizeof err), "the printed settings parse: %s", err);
    CHECK(memcmp(&back, &t, sizeof t) == 0, "and give the same settings: %s", text);
    char tiny[8];
    const int need = g4_cuda_tuning_format(&t, tiny, sizeof tiny);
    CHECK(need == n && strlen(tiny) == sizeof tiny - 1, "truncated format %d / %d", need, n);
}

/* the former G4_CUDA_* variables fail loudly instead of changing nothing */
static void test_env(void) {
    char err[512];
    char *clean[] = {"PATH=/usr/bin", "G4_CUDA_TUNE=gemv=fp16", "G4_CUDAX=1", "G4_LOG=debug", NULL};
    CHECK(g4_cuda_tuning_check_env(clean, err, sizeof err) && err[0] == '\0', "no former variable: %s", err);
    CHECK(g4_cuda_tuning_check_env(NULL, err, sizeof err), "no environment");
    char *graphs[] = {"HOME=/root", "G4_CUDA_GRAPHS=0", NULL};
    CHECK(!g4_cuda_tuning_check_env(graphs, err, sizeof err) &&
              strstr(err, "G4_CUDA_GRAPHS is no longer read: use G4_CUDA_TUNE=graphs=0"),
          "graphs: %s", err);
    char *i8[] = {"G4_CUDA_GEMV_I8=0", NULL};
    CHECK(!g4_cuda_tuning_check_env(i8, err, sizeof err) && strstr(err, "G4_CUDA_GEMV_I8 ") &&
              strstr(err, "gemv=fp16"),
          "GEMV_I8: %s", err);
    char *min8[] = {"G4_CUDA_GEMV_I8_MIN8=0", NULL};
    CHECK(!g4_cuda_tuning_check_env(min8, err, sizeof err) && strstr(err, "i8_min8=N"), "MIN8: %s", err);
    char *lost[] = {"G4_CUDA_GEMV_TC8_ONE=1", NULL};
    CHECK(!g4_cuda_tuning_check_env(lost, err, sizeof err) && strstr(err, "G4_CUDA_GEMV_TC8_ONE is not read") &&
              strstr(err, "measured slower"),
          "a removed alternative: %s", err);
}

int main(void) {
    test_defaults();
    test_keys();
    test_errors();
    test_format();
    test_env();
    return test_finish();
}
