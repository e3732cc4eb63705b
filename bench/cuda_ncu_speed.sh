#!/bin/bash
# Nsight Compute's full report (occupancy, warp stalls, memory) of one kernel
# launched by bench/cuda_ops_bench (the op timings), e.g. the tensor-core GEMV:
#   bench/cuda_ncu_speed.sh BIN_DIR 'regex:gemv_tc_kernel' [SKIP]
# (BIN_DIR: where cuda_ops_bench is: build-gpu, or $TESTS of a prebuilt.)
# SKIP launches of that kernel are passed over first (the first launch of all
# the timings is the 21504 x 5376 affine4 warm-up). G4_ONLY_SPEED=gemv4 runs
# only the one-token 4-bit GEMVs (first: 16384 x 5376 affine4, 51 launches on
# the default backend); attn, moe: those parts.
set -u
bin=$1 kernel=$2 skip=${3:-0}
ncu --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  "$bin/cuda_ops_bench" "${G4_ONLY_SPEED:-all}" 2>&1 | grep -vE "^  (gemv|gemm|attention|top_logits)|^==PROF==" | sed -n '/Section/,$p' | head -150
