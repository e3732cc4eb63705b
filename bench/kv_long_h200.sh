#!/bin/bash
# Issue 32 on one H200: the KV cache types and long contexts. Build, the CUDA
# tests the issue touches, then the benchmarks (logs and a summary in $OUT):
#   bench/kv_long_h200.sh [tests|bench|all]
#  - decode at depth 0 / 8K / 32K / 128K (e2b bf16) and 31b mlx4 at 32K, each KV type
#  - 31b bf16 prefill of a 32K prompt
#  - the longest context per model for 1 and 16 sequences at each KV type
#    (gemma4 info --synthetic: the memory plan on the device), the server's
#    sizing from --gpu-memory 0.9 (its start lines), and decode at 262K
set -u
OUT=${OUT:-$PWD/out}
mode=${1:-all}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4_CUDA=ON &&
       cmake --build build-gpu -j16; } > "$OUT/build.log" 2>&1; then
  note "BUILD FAILED"; grep -v "^ptxas info" "$OUT/build.log" | tail -40; exit 1
fi
G=build-gpu/gemma4
export G4_FIXTURES=$PWD/build-gpu/fixtures
note "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"

if [ "$mode" != bench ]; then
  (cd build-gpu && timeout 1500 ctest -R "test_cuda_|test_kv_types|test_memory_plan|test_long_context|test_kv_quality" \
     --output-on-failure) > "$OUT/tests.log" 2>&1
  note "tests: $(grep -E 'tests passed' "$OUT/tests.log")"
  grep -E "FAIL" "$OUT/tests.log" | head -20 | tee -a "$summary"
fi
[ "$mode" = tests ] && exit 0

bench() { # label, args...
  local label=$1; shift
  timeout 900 $G bench "$@" > "$OUT/$label.txt" 2>&1
  note "$label: $(grep -E '^\| .* (pp|tg)' "$OUT/$label.txt" | sed 's/^| //' | tr '\n' ' ')"
}
for kv in bf16 fp8 f32; do
  bench "31b-mlx4-tg-d32k-$kv" --synthetic 31b --format mlx4 -p 0 -n 64 -d 32768 -r 2 --kv-type $kv
done
bench "31b-bf16-pp32k" --synthetic 31b --format bf16 -p 32768 -n 0 -r 2 --kv-type bf16
for d in 0 8192 32768 130000; do
  for kv in bf16 fp8; do bench "e2b-bf16-tg-d$d-$kv" --synthetic e2b --format bf16 -p 0 -n 64 -d $d -r 2 --kv-type $kv; done
done
bench "e2b-bf16-pp32k" --synthetic e2b --format bf16 -p 32768 -n 0 -r 1 --kv-type bf16
bench "e2b-bf16-pp128k" --synthetic e2b --format bf16 -p 130000 -n 0 -r 1 --kv-type bf16

# the longest context of 1 and 16 sequences at each KV type: the memory plan on the device (weights uploaded)
for cfg in e2b:bf16 e4b:bf16 26b-a4b:mlx4 31b:bf16 31b:mlx4; do
  timeout 300 $G info --synthetic ${cfg%%:*} --format ${cfg##*:} --device cuda > "$OUT/info-${cfg/:/-}.txt" 2>&1
  note "info $cfg: $(grep -E '^kv |within' "$OUT/info-${cfg/:/-}.txt" | tr -s ' ' | tr '\n' ' ')"
done
# the server's own sizing from --gpu-memory 0.9 (its start lines), 31b mlx4 with 16 sequences
log=$OUT/serve-31b-mlx4.txt
timeout 300 $G serve --synthetic 31b --format mlx4 --max-seqs 16 --port 0 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 280); do grep -q "KV cache\|error\|cannot" "$log" 2>/dev/null && break; sleep 1; done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
note "serve 31b mlx4 x16: $(grep -E 'listening|KV cache|error' "$log" | sed 's/gemma4 serve: //' | tr '\n' ' ')"
# decode at the whole window, one sequence (31b bf16: 256K positions; e2b: 128K)
bench "31b-bf16-tg-d262000-bf16" --synthetic 31b --format bf16 -p 0 -n 16 -d 262000 -r 1 --kv-type bf16
bench "26b-a4b-mlx4-tg-d262000-fp8" --synthetic 26b-a4b --format mlx4 -p 0 -n 16 -d 262000 -r 1 --kv-type fp8
