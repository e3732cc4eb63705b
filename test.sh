#!/usr/bin/env bash
# Builds gemma4.c and runs the whole test suite, then runs it again built with
# AddressSanitizer + UndefinedBehaviorSanitizer (CPU only: the CUDA tests need
# a GPU and skip without one). Installs what it needs first. Extra arguments go
# to both ctest runs (e.g. -R tokenizer). The CUDA kernels are built for this
# machine's GPUs only, or for Hopper alone without one (scripts/cuda-gencode.sh).
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4_CUDA_GENCODE="$(scripts/cuda-gencode.sh)"
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEMMA4_SANITIZE=ON -DGEMMA4_CUDA=OFF
cmake --build build-asan -j "$(nproc)"
cd build-asan && ctest --output-on-failure -j "$(nproc)" "$@"
