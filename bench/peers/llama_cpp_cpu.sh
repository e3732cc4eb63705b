#!/usr/bin/env bash
# gemma4.c against llama.cpp on the CPU: same machine, same model (E2B with
# the random weights of `gemma4 synth`), same bits, runs alternated, one table.
#
#   bench/peers/llama_cpp_cpu.sh [build] [convert] [run] [table]   (default: all four)
#
# build:   llama.cpp as vendored in PyPI's llama-cpp-python sdist (version
#          LLAMA_CPP_PYTHON, default 0.3.36), CPU only, native flags, -j JOBS
#          (default 2); a venv with its converter's requirements.
# convert: `gemma4 synth --preset e2b` in bf16, mlx4 and mlx8; the bf16 folder
#          with the Gemma tokenizer files added (../shared/tokenizer) through
#          convert_hf_to_gguf.py to BF16, then llama-quantize to Q4_0 and Q8_0.
#          The bf16 safetensors go once the GGUF is written (disk).
# run:     for each pair (bf16/BF16, mlx4/Q4_0, mlx8/Q8_0), ROUNDS times
#          (default 2): `gemma4 bench -m DIR -p 512 -n 128 -r 3 --threads 2`,
#          then `llama-bench -m GGUF -p 512 -n 128 -r 3 -t 2`, never both at once.
# table:   bench/peers/table.py over the JSON records -> $WORK/table.md.
#
# WORK (default build-peers) holds everything; G4 (default build/gemma4) is
# the gemma4 binary. Needs python3, cmake, a C/C++ compiler, ~45 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=${WORK:-$ROOT/build-peers}
G4=${G4:-$ROOT/build/gemma4}
VERSION=${LLAMA_CPP_PYTHON:-0.3.36}
JOBS=${JOBS:-2}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
TOKENIZER=${TOKENIZER:-$ROOT/../shared/tokenizer}
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
BIN=$WORK/llama-build/bin
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build convert run table)
mkdir -p "$WORK"

want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

if want build; then
  if [ ! -d "$SRC" ]; then
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$WORK"
    tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  fi
  cmake -S "$SRC" -B "$WORK/llama-build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
  cmake --build "$WORK/llama-build" -j "$JOBS" --target llama-bench llama-quantize
  if [ ! -x "$WORK/venv/bin/python" ]; then
    python3 -m venv "$WORK/venv"
    # requirements-convert_hf_to_gguf.txt without its extra package index (PyPI only)
    "$WORK/venv/bin/pip" install torch==2.11.0 "numpy~=2.2.6" "sentencepiece>=0.1.98,<0.3.0" transformers==4.57.6 \
      "protobuf>=4.21.0,<5.0.0" safetensors
  fi
fi

if want convert; then
  for f in mlx4 mlx8; do
    [ -f "$WORK/e2b-$f/config.json" ] || "$G4" synth --preset e2b --format $f -o "$WORK/e2b-$f"
  done
  if [ ! -f "$WORK/e2b-BF16.gguf" ]; then
    [ -f "$WORK/e2b-bf16/config.json" ] || "$G4" synth --preset e2b --format bf16 -o "$WORK/e2b-bf16"
    python3 "$ROOT/bench/peers/fit_tokenizer.py" "$TOKENIZER" "$WORK/e2b-bf16"
    (cd "$SRC" && "$WORK/venv/bin/python" convert_hf_to_gguf.py "$WORK/e2b-bf16" --outtype bf16 \
      --outfile "$WORK/e2b-BF16.gguf")
  fi
  for q in Q4_0 Q8_0; do
    [ -f "$WORK/e2b-$q.gguf" ] || "$BIN/llama-quantize" "$WORK/e2b-BF16.gguf" "$WORK/e2b-$q.gguf" $q "$THREADS"
  done
  # gemma4.c's bf16 run reads the same safetensors again: keep them unless asked
  [ "${DROP_BF16_SAFETENSORS:-0}" = 1 ] && rm -f "$WORK"/e2b-bf16/*.safetensors
fi

if want run; then
  out=$WORK/runs.jsonl
  : > "$out"
  pairs=("bf16 BF16" "mlx4 Q4_0" "mlx8 Q8_0")
  for round in $(seq 1 "$ROUNDS"); do
    for pair in "${pairs[@]}"; do
      set -- $pair
      echo "== round $round: gemma4.c $1" >&2
      # each engine's file read into the page cache first: the two bf16 files (17 GB) and the others do not all
      # fit in a 24 GiB machine's cache, and a half-cached file makes decode read the disk
      cat "$WORK/e2b-$1"/*.safetensors > /dev/null
      rec=$("$G4" bench -m "$WORK/e2b-$1" -p 512 -n 128 -r 3 --threads "$THREADS" --json | tail -1)
      echo "{\"engine\":\"gemma4.c\",\"format\":\"$1\",\"round\":$round,\"load1\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$rec}" >> "$out"
      echo "== round $round: llama.cpp $2" >&2
      cat "$WORK/e2b-$2.gguf" > /dev/null
      rec=$("$BIN/llama-bench" -m "$WORK/e2b-$2.gguf" -p 512 -n 128 -r 3 -t "$THREADS" -o json | tr -d '\n')
      echo "{\"engine\":\"llama.cpp\",\"format\":\"$2\",\"round\":$round,\"load1\":\"$(cut -d' ' -f1 /proc/loadavg)\",\"result\":$rec}" >> "$out"
    done
  done
fi

if want table; then
  python3 "$ROOT/bench/peers/table.py" "$WORK/runs.jsonl" | tee "$WORK/table.md"
fi
