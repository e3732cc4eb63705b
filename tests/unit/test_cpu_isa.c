/* SIMD level selection: G4_CPU_ISA lowers the level (never raises it past
 * what the processor has), cpu_isa_force does the same at run time, and
 * cpu_isa_name reports the level in use. The environment is read once per
 * process, so each value is checked in a fresh exec of this program. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/cpu_matmul.h"
#include "test_util.h"

static cpu_isa lower(cpu_isa a, cpu_isa b) { return a < b ? a : b; }

int main(int argc, char **argv) {
    const char *env = getenv("G4_CPU_ISA");
    const cpu_isa best = cpu_isa_supported();
    if (!env) {
        /* parent: no override means the best level */
        CHECK(cpu_isa_active() == best, "active %s, supported %s", cpu_isa_name(), cpu_isa_level_name(best));
        CHECK(strcmp(cpu_isa_name(), cpu_isa_level_name(best)) == 0, "name %s", cpu_isa_name());
        for (int level = CPU_ISA_AVX512; level >= CPU_ISA_SCALAR; level--) {
            cpu_isa got = cpu_isa_force((cpu_isa)level);
            CHECK(got == lower((cpu_isa)level, best), "force %d gave %d", level, (int)got);
            CHECK(cpu_isa_active() == got, "active after force");
        }
        /* each environment value in a child run */
        const char *values[] = {"scalar", "avx2", "avx512", "bogus"};
        for (int i = 0; i < 4; i++) {
            char cmd[4096];
            snprintf(cmd, sizeof cmd, "G4_CPU_ISA=%s '%s'", values[i], argc > 0 ? argv[0] : "");
            int rc = system(cmd);
            CHECK(rc == 0, "child with G4_CPU_ISA=%s failed (%d)", values[i], rc);
        }
        return test_finish();
    }
    /* child: the override applies from the first use on */
    cpu_isa want = best;
    if (strcmp(env, "scalar") == 0) want = CPU_ISA_SCALAR;
    else if (strcmp(env, "avx2") == 0) want = CPU_ISA_AVX2;
    else if (strcmp(env, "avx512") == 0) want = CPU_ISA_AVX512;
    const cpu_isa expect = lower(want, best);
    CHECK(cpu_isa_active() == expect, "G4_CPU_ISA=%s: active %s, expected %s", env, cpu_isa_name(),
          cpu_isa_level_name(expect));
    CHECK(strcmp(cpu_isa_name(), cpu_isa_level_name(expect)) == 0, "name %s", cpu_isa_name());
    /* and the kernels work at that level: a 2x32 f32 matrix times one token */
    float wdata[64], x[32], out[2];
    for (int i = 0; i < 64; i++) wdata[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 32; i++) x[i] = 0.5f * (float)(i % 5);
    g4_matrix w = {.format = G4_WEIGHT_F32, .rows = 2, .cols = 32, .data = wdata, .row_bytes = 32 * sizeof(float)};
    cpu_matmul(out, x, 1, &w);
    for (int r = 0; r < 2; r++) {
        double e = 0;
        for (int c = 0; c < 32; c++) e += (double)wdata[r * 32 + c] * x[c];
        CHECK(out[r] == (float)e, "row %d: %g vs %g", r, out[r], e); /* small integers and halves: exact */
    }
    return test_failed ? 1 : 0;
}
