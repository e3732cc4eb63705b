#!/bin/bash
# Constrained decoding on the GPU machine (issue 31), one call from the
# repository root; logs to $OUT (default ./out):
#   1. CUDA build, the constraint tests (ctest);
#   2. token-mask cost at the full vocabulary on this host's CPU (bench/constrain_masks.py);
#   3. decode with a JSON Schema against without, batch 1 and 32, on full-size
#      synthetic checkpoints (gemma4 synth: random weights) with the vendored
#      262,144-token tokenizer: bench/server_load.py's time per output token
#      and steady-state tokens/s, plain and with --extra response_format;
#   4. before the server runs, where STEP_BENCH names bench/constrain_step_bench
#      (default: build/constrain_step_bench if built), the engine's decode step
#      at 1 and 32 sequences: free, with the schema's masks on the device, and
#      on the host path (the backend's masked op hidden), no server between.
# Random weights are the hard case for the candidate path: the model's
# favourites are rarely allowed at structural positions, so those steps copy
# the full row back.
#   bench/constrain_gpu.sh [e2b:bf16 31b:mlx4 ...]
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(e2b:bf16 31b:mlx4)
# GEMMA4 and G4_FIXTURES set (binaries built elsewhere, bench/cuda_prebuilt_env.sh): no build, no tests here,
# straight to the decode runs (DURATION seconds each, default 45)
if [ -z "${GEMMA4:-}" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4_CUDA=ON >"$OUT/constrain_build.txt" 2>&1 &&
    cmake --build build -j"$(nproc)" >>"$OUT/constrain_build.txt" 2>&1 || { echo "build failed"; tail -30 "$OUT/constrain_build.txt"; exit 1; }
  (cd build && timeout 900 ctest -R "test_constrain|test_openai_request|test_public_api|test_engine" --output-on-failure) \
    >"$OUT/constrain_tests.txt" 2>&1
  tail -3 "$OUT/constrain_tests.txt"
  timeout 900 python3 bench/constrain_masks.py --walks 20 --tokenizer build/fixtures/tokenizer/tokenizer-gemma4-style.json \
    >"$OUT/constrain_masks.txt" 2>&1
  tail -3 "$OUT/constrain_masks.txt"
  GEMMA4=build/gemma4 G4_FIXTURES=build/fixtures
fi
# the vendored tokenizer has one id past the 262,144 of the configs (<image_soft_token>): leave it out
tok=/tmp/constrain_tokenizer.json
python3 - "$tok" "$G4_FIXTURES" <<'EOF'
import json, sys
t = json.load(open(sys.argv[2] + "/tokenizer/tokenizer-gemma4-style.json"))
t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < 262144]
json.dump(t, open(sys.argv[1], "w"))
EOF
schema='{"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object",
 "properties": {"answer": {"type": "string"}, "points": {"type": "array", "items": {"type": "object",
 "properties": {"title": {"type": "string"}, "score": {"type": "number"}}, "required": ["title", "score"],
 "additionalProperties": false}}}, "required": ["answer", "points"], "additionalProperties": false}}}}'
for cfg in "${configs[@]}"; do
  preset=${cfg%%:*} fmt=${cfg##*:} dir=/tmp/constrain-$preset-$fmt
  rm -rf "$dir"
  timeout 900 "$GEMMA4" synth --preset "$preset" --format "$fmt" -o "$dir" >/dev/null || { echo "$cfg: synth failed"; continue; }
  cp "$tok" "$dir/tokenizer.json"
  case $preset in
    e2b) tpl=gemma-4-E2B-it ;; e4b) tpl=gemma-4-E4B-it ;; 26b-a4b) tpl=gemma-4-26B-A4B-it ;;
    31b) tpl=gemma-4-31B-it ;; *) tpl=gemma-4-12B-it ;;
  esac
  cp "tests/data/chat/templates/$tpl.chat_template.jinja" "$dir/chat_template.jinja" 2>/dev/null ||
    cp tests/data/chat/templates/gemma-4-E2B-it.chat_template.jinja "$dir/chat_template.jinja"
  step=${STEP_BENCH:-build/constrain_step_bench}
  if [ -x "$step" ]; then
    for n in 1 32; do
      echo "== $cfg engine step, $n sequences" | tee -a "$OUT/constrain_step.txt"
      timeout 600 "$step" "$dir" --device cuda --seqs $n --tokens 128 --rounds 3 2>&1 | tee -a "$OUT/constrain_step.txt" | tail -2
    done
  fi
  "$GEMMA4" serve -m "$dir" --device cuda --port 8931 --max-seqs 32 --quiet >"$OUT/constrain_serve_$preset.txt" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:8931/health >/dev/null && break; sleep 1; done
  for c in 1 32; do
    for mode in plain schema; do
      extra=()
      [ "$mode" = schema ] && extra=(--extra "$schema")
      echo "== $cfg clients $c $mode" | tee -a "$OUT/constrain_decode.txt"
      timeout 300 python3 bench/server_load.py --url http://127.0.0.1:8931 --clients $c --duration "${DURATION:-45}" --warmup 10 \
        --max-tokens 128 --json "$OUT/constrain_decode_${preset}_${fmt}_c${c}_$mode.json" "${extra[@]}" \
        2>&1 | tail -2 | tee -a "$OUT/constrain_decode.txt"
    done
  done
  kill "$pid"
  wait "$pid" 2>/dev/null
  rm -rf "$dir"
done
