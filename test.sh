#!/usr/bin/env bash
# Builds gemma4.c and runs the whole test suite. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
cd build && ctest --output-on-failure -j "$(nproc)" "$@"
