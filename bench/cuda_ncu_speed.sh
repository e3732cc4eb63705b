#!/bin/bash
# Nsight Compute's full report (occupancy, warp stalls, memory) of one kernel
# launched by test_cuda_backend's speed section, e.g. the tensor-core GEMV:
#   bench/cuda_ncu_speed.sh TESTS_DIR 'regex:gemv_tc_kernel' [SKIP]
# SKIP launches of that kernel are passed over first (the first launch in the
# speed section is the 21504 x 5376 affine4 warm-up). G4_ONLY_SPEED=gemv4 runs
# only the one-token 4-bit GEMVs (first: 16384 x 5376 affine4, 51 launches on
# the default backend).
set -u
tests=$1 kernel=$2 skip=${3:-0}
G4_ONLY_SPEED=${G4_ONLY_SPEED:-1} ncu --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  "$tests/test_cuda_backend" 2>&1 | grep -vE "^  (gemv|gemm|attention|top_logits)|^==PROF==" | sed -n '/Section/,$p' | head -150
