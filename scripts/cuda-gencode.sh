#!/usr/bin/env bash
# Prints the nvcc -gencode flags run.sh and test.sh build the CUDA backend
# with: machine code for each GPU this machine has (nvidia-smi's compute
# capability; "a" features on Hopper), or, without a GPU, Hopper's alone —
# enough to compile-check every kernel at a quarter of the time of the
# library's default (sm_90a + sm_80 + compute_80 PTX, for binaries that move).
set -euo pipefail
caps=""
if command -v nvidia-smi >/dev/null 2>&1; then
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u || true)
fi
flags=()
for cap in $caps; do
  case "$cap" in
    [0-9][0-9]|[0-9][0-9][0-9]) ;;
    *) continue ;;
  esac
  arch=$cap
  [ "$cap" = 90 ] && arch=90a
  flags+=("-gencode=arch=compute_${arch},code=sm_${arch}")
done
[ ${#flags[@]} -eq 0 ] && flags=("-gencode=arch=compute_90a,code=sm_90a")
(IFS=';'; echo "${flags[*]}")
