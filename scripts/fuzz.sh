#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs every
# tests/fuzz target for the given number of seconds each (default 60), one
# after another. New inputs go to build-fuzz/fuzz-corpus/<target> (the
# committed seeds in tests/fuzz/corpus/<target> are read, never written);
# crashes to build-fuzz/fuzz-artifacts/<target>/. Exits non-zero if any target
# found a crash, leak or sanitizer report.
#   scripts/fuzz.sh [seconds] [target...]
#   FUZZ_JOBS=2 scripts/fuzz.sh 300      # run N targets at once (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
cc=${FUZZ_CC:-$(command -v clang-14 || command -v clang)}
build=${FUZZ_BUILD_DIR:-build-fuzz}

# no CUDA: clang's -fsanitize=fuzzer-no-link would reach nvcc's host compiler
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGEMMA4_FUZZ=ON -DGEMMA4_CUDA=OFF >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$src" .c)"); done
fi
cmake --build "$build" -j2 --target "${targets[@]}"

run_one() {
  local t=$1
  local bin="$build/tests/fuzz/$t" corpus="$build/fuzz-corpus/$t" artifacts="$build/fuzz-artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  local args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
              -artifact_prefix="$artifacts")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  local seeds=()
  [ -d "tests/fuzz/corpus/$t" ] && seeds+=("tests/fuzz/corpus/$t")
  echo "== $t: ${seconds}s"
  if "$bin" "${args[@]}" "$corpus" "${seeds[@]}" >"$build/fuzz-$t.log" 2>&1; then
    # libFuzzer's last status line and final stats: executions, speed, coverage.
    grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb' \
      "$build/fuzz-$t.log" | sed "s/^/$t: /"
    echo "$t: corpus $(ls "$corpus" | wc -l) inputs"
  else
    echo "$t: FAILED (see $build/fuzz-$t.log; inputs in $artifacts)"
    grep -E 'ERROR|SUMMARY|Test unit written' "$build/fuzz-$t.log" | head -5 | sed "s/^/$t: /"
    return 1
  fi
}

jobs=${FUZZ_JOBS:-1}
status=0
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
