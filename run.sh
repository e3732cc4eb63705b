#!/usr/bin/env bash
# Builds gemma4.c and runs it. With no arguments it continues a prompt with the
# small model bundled for this purpose (models/tiny: a 4.6M-parameter Gemma 4
# trained on the King James Bible; see its README), streaming the text and
# then a timing line. Any arguments go to `gemma4` instead,
# e.g. ./run.sh run -m /path/to/gemma-4-E2B-it -p "Why is the sky blue?"
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4_CUDA_GENCODE="$(scripts/cuda-gencode.sh)" >/dev/null
cmake --build build -j "$(nproc)"
if [ $# -eq 0 ]; then
  set -- run -m build/models/tiny --raw -p "And it came to pass, when the king heard" -n 64
fi
exec build/gemma4 "$@"
