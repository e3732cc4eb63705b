#!/bin/bash
# One call on the GPU machine: build with CUDA (or unpack prebuilt binaries),
# run the CUDA tests, then benchmark synthetic full-size models. Logs go to
# $OUT (default ./out). Run from the repository root:
#   bench/cuda_h200.sh [tests|bench|all|quick|extras] [bench configs as NAME:FORMAT ...]
# (extras: only what the variables below ask for)
# Extras by environment: STREAMS=1,32 (aggregate decode of concurrent streams),
# PROFILE_CONFIGS="e2b:bf16 31b:bf16" (per-kernel decode profiles, Nsight Compute), NSYS_CONFIGS (the same
# inside the recorded graphs, Nsight Systems), KNOBS (decode under G4_CUDA_TUNE settings, see below), SPEED=all
# (bench/cuda_ops_bench: the op timings; SPEED=gemv4|attn|moe one part),
# PP_KNOBS (pp512 under G4_CUDA_TUNE settings), DEPTH_KNOBS (decode at a context depth in a long session),
# PREFILL_PROFILE="31b:bf16:key=value,.." (per-kernel prefill profile),
# MEMCHECK_FIXTURES, G4_SKIP_MEMCHECK=1, EXACT_CONFIGS (prefill on the exact path, --precision exact).
# The working tree travels to the GPU machine whole (64 MiB at most): remove what a call does not need
# (e.g. models/tiny-assistant, or tests/fixtures for a bench-only call) and `git checkout` it after — never
# `git commit -a` while files are moved out (that commits their deletion: 4332cc9 did).
# G4_PREBUILT=path.tar.xz uses binaries built elsewhere (bin/, lib/ with the
# shared libraries the GPU image may lack, COMMIT) instead of building there.
# Each step has a time limit so that one hang cannot eat the whole lease.
set -u
OUT=${OUT:-$PWD/out}
mode=${1:-all}
shift || true
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
  configs=(e2b:bf16 e2b:mlx4 e2b:mxfp4 e4b:bf16 26b-a4b:bf16 26b-a4b:mlx4 26b-a4b:mxfp4 12b:bf16 31b:bf16 31b:mlx4
           31b:mxfp4)
fi
mkdir -p "$OUT"
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

gpu_txt=$(mktemp)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$gpu_txt" 2>&1
t0=$(date +%s)
if [ -n "${G4_PREBUILT:-}" ]; then
  . bench/cuda_prebuilt_env.sh "$G4_PREBUILT" > "$OUT/prebuilt.txt" || { note "PREBUILT UNPACK FAILED"; exit 1; }
  note "$(cat "$OUT/prebuilt.txt")"
  ldd "$GEMMA4" | grep "not found" | tee -a "$summary"
else
  if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEMMA4_CUDA=ON &&
         cmake --build build-gpu -j16; } > "$OUT/build.log" 2>&1; then
    note "BUILD FAILED"; grep -v "^ptxas info" "$OUT/build.log" | tail -40; exit 1
  fi
  GEMMA4=build-gpu/gemma4 TESTS=build-gpu/tests OPS_BENCH=build-gpu/cuda_ops_bench
  export G4_FIXTURES=$PWD/build-gpu/fixtures
  note "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); build $(( $(date +%s) - t0 )) s"
fi
note "$(tail -1 "$gpu_txt")"

run_step() { # name limit command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc, $(( $(date +%s) - s )) s; $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -1)"
  grep -E '^FAIL|failed:' "$OUT/$name.log" | head -20 | tee -a "$summary"
}

OPS_BENCH=${OPS_BENCH:-$TESTS/cuda_ops_bench}
if [ "$mode" != bench ] && [ "$mode" != extras ]; then
  if [ -z "${G4_SKIP_OPS:-}" ]; then # (G4_SKIP_OPS=1: not the op tests, 2 minutes)
    # one program per op family, each against the float64 references; the table at the end of each log gives
    # every family's worst relative RMS and row max beside its tolerance (and 3x the worst: the tolerance rule)
    # (every test_cuda_* program but the fixtures', which runs below: matmul, moe, attention, norms, sampling, towers...)
    for path in "$TESTS"/test_cuda_*; do
      t=$(basename "$path")
      [ -x "$path" ] && [ "$t" != test_cuda_fixtures ] || continue
      run_step "$t" 300 "$path"
      sed -n '/^| op |/,$p' "$OUT/$t.log" | tee -a "$summary"
    done
  fi
  run_step test_cuda_fixtures 300 "$TESTS/test_cuda_fixtures"
  grep -E "worst rel_rms|engine" "$OUT/test_cuda_fixtures.log" | tee -a "$summary"
  # speculative decoding on the GPU (its CPU half runs too); needs models/tiny and models/tiny-assistant
  if [ -x "$TESTS/test_assistant" ]; then
    G4_SOURCE=$PWD run_step test_assistant 300 "$TESTS/test_assistant"
    grep -E "^-- CUDA|transformers drafter calls|assisted|no CUDA" "$OUT/test_assistant.log" | tail -8 | tee -a "$summary"
  fi
  # every recordable step shape eager vs recorded vs replayed, bit for bit (prebuilt: EXTRA_TESTS=test_cuda_replay)
  if [ -x "$TESTS/test_cuda_replay" ]; then
    run_step test_cuda_replay 300 "$TESTS/test_cuda_replay"
    grep -E "shapes \(" "$OUT/test_cuda_replay.log" | tee -a "$summary"
  fi
  if [ -z "${G4_SKIP_MEMCHECK:-}" ] && command -v compute-sanitizer > /dev/null; then
    run_step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$TESTS/test_cuda_fixtures" \
      ${MEMCHECK_FIXTURES:-dense moe-mlx4 e2b-mlx4}
    grep -E "ERROR SUMMARY" "$OUT/memcheck.log" | tee -a "$summary"
  fi
fi

if [ "$mode" != tests ] && [ "$mode" != extras ]; then
  : > "$OUT/bench.jsonl"
  : > "$OUT/bench.err"
  for cfg in "${configs[@]}"; do
    name=${cfg%%:*} fmt=${cfg##*:}
    s=$(date +%s)
    timeout 240 "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 512 -n 128 -r 2 --json \
      >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
    note "bench $name $fmt: rc=$?, $(( $(date +%s) - s )) s"
  done
  # prefill on the exact path (hi + lo products, --precision exact), for comparison
  : > "$OUT/bench_fast.jsonl"
  for cfg in ${EXACT_CONFIGS:-}; do
    name=${cfg%%:*} fmt=${cfg##*:}
    s=$(date +%s)
    timeout 240 "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 512 -n 0 -r 2 \
      --precision exact --json >> "$OUT/bench_fast.jsonl" 2>> "$OUT/bench.err"
    note "bench (exact prefill) $name $fmt: rc=$?, $(( $(date +%s) - s )) s"
  done
  python3 - "$OUT/bench.jsonl" "$OUT/bench_fast.jsonl" <<'EOF' | tee -a "$summary"
import json, sys
def rows(path):
    out = []
    for line in open(path):
        try: out.append(json.loads(line))
        except Exception: pass
    return out
main, fast = rows(sys.argv[1]), rows(sys.argv[2])
print("| model | format | pp512 t/s | limit | tg128 t/s | limit | GB/token | GPU GiB |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in main:
    print(f"| {r['model']} | {r['format']} | {r['pp_tps']:.0f} ± {r['pp_sd']:.0f} | {r['pp_limit_tps']:.0f} "
          f"({100*r['pp_tps']/r['pp_limit_tps']:.0f}%) | {r['tg_tps']:.1f} ± {r['tg_sd']:.1f} | "
          f"{r['tg_limit_tps']:.0f} ({100*r['tg_tps']/r['tg_limit_tps']:.0f}%) | {r['decode_bytes']/1e9:.2f} | "
          f"{r['gpu_mem_gib']:.1f} |")
for r in fast:
    print(f"| {r['model']} | {r['format']} (exact prefill) | {r['pp_tps']:.0f} ± {r['pp_sd']:.0f} | "
          f"{r['pp_limit_tps']:.0f} ({100*r['pp_tps']/r['pp_limit_tps']:.0f}%) | | | | |")
if main:
    r = main[0]
    print(f"limits: {r['bandwidth_gbs']:.0f} GB/s device copy, {r['gflops']/1000:.0f} TFLOP/s cuBLAS bf16")
EOF
  grep -v "loaded in\|^$" "$OUT/bench.err" | head -20 | tee -a "$summary"
fi
# concurrent streams through the engine (STREAMS="1,32" for e2b bf16) and
# where decode time goes per kernel (PROFILE_CONFIGS="e2b:bf16 26b-a4b:mlx4")
if [ "$mode" != tests ] && [ -n "${STREAMS:-}" ]; then
  timeout 120 "$GEMMA4" bench --device cuda --synthetic e2b --format bf16 -p 16 -n 128 -r 1 --streams "$STREAMS" \
    2>&1 | grep "streams" | tee -a "$summary"
fi
# speculative decoding at forced acceptance with a synthetic drafter: DRAFT_CONFIGS="31b:mlx4 e2b:bf16"
# (DRAFT_MAX drafts a round, default 4; FORCE: the kept counts, default 0,2,3,4; tg64, two runs)
for cfg in ${DRAFT_CONFIGS:-}; do
  name=${cfg%%:*} fmt=${cfg##*:}
  timeout 300 "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 0 -n 64 -r 2 --draft synthetic \
    --draft-max "${DRAFT_MAX:-4}" --force-accept "${FORCE:-0,2,3,4}" > "$OUT/draft-$name-$fmt.log" 2>&1
  note "draft $name $fmt: rc=$?"; grep -E "^\| synthetic|error" "$OUT/draft-$name-$fmt.log" | tee -a "$summary"
done
# the op timings (SPEED=all, or 1; SPEED=attn: the attention cases, gemv4: one-token 4- and 8-bit GEMVs, moe: the experts)
if [ -n "${SPEED:-}" ]; then
  run_step speed 240 "$OPS_BENCH" "$SPEED"
  grep -E "^  " "$OUT/speed.log" | tee -a "$summary"
fi
# decode under other tuning: KNOBS="31b:bf16:gemv_split=1 31b:bf16:-" (NAME:FORMAT:key=value,key=value, the
# G4_CUDA_TUNE keys of README.md "CUDA tuning", or - for none; tg128 only, one run)
for k in ${KNOBS:-}; do
  name=${k%%:*} rest=${k#*:}; fmt=${rest%%:*} vars=${rest#*:}
  envs=(); [ "$vars" != - ] && envs=("G4_CUDA_TUNE=$vars")
  r=$(timeout 150 env "${envs[@]}" "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 16 -n 128 \
      -r 1 --json 2>> "$OUT/bench.err" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f\"{r['tg_tps']:.1f}\")")
  note "knobs $name $fmt $vars: tg128 ${r:-failed} t/s"
done
# prefill under settings: PP_KNOBS="31b:bf16:attn=cores" (pp512 only, two runs; PP_TOKENS="64 512"
# for other prompt lengths)
for tokens in ${PP_TOKENS:-512}; do
  for k in ${PP_KNOBS:-}; do
    name=${k%%:*} rest=${k#*:}; fmt=${rest%%:*} vars=${rest#*:}
    envs=(); [ "$vars" != - ] && envs=("G4_CUDA_TUNE=$vars")
    r=$(timeout 200 env "${envs[@]}" "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p "$tokens" \
        -n 0 -r 2 --json 2>> "$OUT/bench.err" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f\"{r['pp_tps']:.0f} ± {r['pp_sd']:.0f}\")")
    note "pp knobs $name $fmt $vars: pp$tokens ${r:-failed} t/s"
  done
done
# decode at a context depth in a long session: DEPTH_KNOBS="e2b:bf16:- e2b:bf16:attn_min_split=64"
# (tg128 after DEPTH=4096 tokens, --ctx CTX=32768 positions; two runs)
for k in ${DEPTH_KNOBS:-}; do
  name=${k%%:*} rest=${k#*:}; fmt=${rest%%:*} vars=${rest#*:}
  envs=(); [ "$vars" != - ] && envs=("G4_CUDA_TUNE=$vars")
  r=$(timeout 200 env "${envs[@]}" "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 0 -n 128 \
      -d "${DEPTH:-4096}" --ctx "${CTX:-32768}" -r 2 --json 2>> "$OUT/bench.err" |
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f\"{r['tg_tps']:.1f} ± {r['tg_sd']:.1f} (limit {r['tg_limit_tps']:.0f})\")")
  note "depth knobs $name $fmt $vars: tg128 @ d${DEPTH:-4096} ctx ${CTX:-32768}: ${r:-failed} t/s"
done
# per-kernel decode time inside the recorded graphs (Nsight Systems), NSYS_CONFIGS="31b:bf16"
for cfg in ${NSYS_CONFIGS:-}; do
  name=${cfg%%:*} fmt=${cfg##*:}
  command -v nsys > /dev/null || { note "nsys: not installed"; break; }
  timeout 200 nsys profile -t cuda --cuda-graph-trace=node -f true -o "/tmp/nsys-$name-$fmt" "$GEMMA4" bench \
    --device cuda --synthetic "$name" --format "$fmt" -p 16 -n 64 -r 1 > "$OUT/nsys-$name-$fmt.log" 2>&1
  timeout 120 nsys stats -q --report cuda_gpu_kern_sum --format csv "/tmp/nsys-$name-$fmt.nsys-rep" \
    > "$OUT/nsys-$name-$fmt.csv" 2>> "$OUT/nsys-$name-$fmt.log"
  note "nsys $name $fmt (kernel, share of GPU time, instances, mean ns):"
  python3 - "$OUT/nsys-$name-$fmt.csv" <<'EOF2' | tee -a "$summary"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
try:
    h = rows.index(next(r for r in rows if "Time (%)" in r[0] or "Time(%)" in r[0]))
except StopIteration:
    print("  (no kernel table)"); sys.exit()
for r in rows[h + 1:h + 25]:
    print(f"  {r[0]:>6}%  {r[2]:>7}  {float(r[3]):>10.0f}  {r[-1][:90]}")
EOF2
done
for cfg in ${PROFILE_CONFIGS:-}; do
  name=${cfg%%:*} fmt=${cfg##*:}
  note "profile $name $fmt (bench/cuda_kernel_profile.sh, decode launches after 5000)"
  timeout 150 bench/cuda_kernel_profile.sh "$GEMMA4" "$name" "$fmt" 5000 600 2>&1 | head -16 | tee -a "$summary"
done
for cfg in ${PREFILL_PROFILE:-}; do
  name=${cfg%%:*} rest=${cfg#*:}; fmt=${rest%%:*} vars=${rest#*:}
  envs=(); [ "$vars" != - ] && envs=("G4_CUDA_TUNE=$vars")
  note "prefill profile $name $fmt $vars (one 512-token prefill after the warm-up one)"
  timeout 300 env "${envs[@]}" PROMPT=512 GEN=0 bench/cuda_kernel_profile.sh "$GEMMA4" "$name" "$fmt" \
    "${PREFILL_SKIP:-0}" "${PREFILL_COUNT:-3000}" 2>&1 | head -28 | tee -a "$summary"
done
note "total: $(( $(date +%s) - t0 )) s"
