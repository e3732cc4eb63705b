#!/usr/bin/env bash
# Builds gemma4.c and runs it. With no arguments it answers a prompt with the
# small model bundled for this purpose (models/tiny: random weights, so its
# output is noise; it shows the engine working end to end). Any arguments go to `gemma4` instead,
# e.g. ./run.sh run -m /path/to/gemma-4-E2B-it -p "Why is the sky blue?"
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
if [ $# -eq 0 ]; then
  set -- run -m build/models/tiny -p "Describe the sea in one sentence." -n 24
fi
exec build/gemma4 "$@"
