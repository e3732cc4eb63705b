#!/usr/bin/env bash
# Builds gemma4.c and runs it. With no arguments it generates from the small
# model bundled for this purpose (random weights: its output is noise, it only
# shows the engine working end to end). Any arguments go to `gemma4` instead,
# e.g. ./run.sh run -m /path/to/gemma-4-E2B-it -p "Why is the sky blue?"
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
if [ $# -eq 0 ]; then
  set -- generate -m build/fixtures/dense --ids 2,372,457,709,536,88 -n 12
fi
exec build/gemma4 "$@"
