#!/bin/bash
# Why one kernel launch of bench/cuda_ops_bench (the op timings) waits: Nsight
# Compute's per-instruction stall breakdown (cycles a warp spent stalled, by
# reason, per issued instruction), instruction count, issue activity, DRAM
# and L2 bytes. Run on the GPU machine, e.g. the pipelined 4-bit GEMV on
# 16384 x 5376 (the first shape of G4_ONLY_SPEED=gemv4, after 10 launches):
#   bench/cuda_ncu_stalls.sh BIN_DIR regex:gemv_tc_pipe_kernel 10
# (BIN_DIR: where cuda_ops_bench is.) G4_ONLY_SPEED picks the part (default
# gemv4; all: every timing).
set -u
bin=$1 kernel=$2 skip=${3:-0}
m=smsp__inst_executed.sum,sm__cycles_active.avg,smsp__warps_active.avg.per_cycle_active
m=$m,smsp__issue_active.avg.per_cycle_active,gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum
for r in long_scoreboard short_scoreboard wait barrier membar mio_throttle lg_throttle math_pipe_throttle not_selected \
         selected dispatch_stall drain no_instruction branch_resolving tex_throttle imc_miss misc sleeping; do
  m=$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
ncu --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 --metrics "$m" \
  "$bin/cuda_ops_bench" "${G4_ONLY_SPEED:-gemv4}" 2>&1 | grep -E "^\s+(smsp|sm__|gpu__|dram|lts)"
