#!/bin/bash
# Where a decode step's GPU time goes, kernel by kernel: runs `gemma4 bench`
# on a synthetic model under Nsight Compute (one metric: each kernel's
# duration, clocks left alone), skipping the first launches (probes, warm-up,
# prefill), and sums the durations per kernel name.
#   [PROMPT=8 GEN=16 NCU_CACHE=all|none] bench/cuda_kernel_profile.sh GEMMA4 MODEL FORMAT [SKIP] [COUNT]
# Kernels are launched one by one here (G4_CUDA_TUNE graphs=0, after any
# settings the caller's G4_CUDA_TUNE gives), so the sum is the GPU time
# without launch gaps.
set -u
gemma4=$1 model=$2 format=$3 skip=${4:-4000} count=${5:-1200}
csv=$(mktemp)
G4_CUDA_TUNE="${G4_CUDA_TUNE:+$G4_CUDA_TUNE,}graphs=0" ncu --clock-control none --cache-control "${NCU_CACHE:-all}" --metrics gpu__time_duration.sum --csv --launch-skip "$skip" \
  --launch-count "$count" "$gemma4" bench --device cuda --synthetic "$model" --format "$format" -p "${PROMPT:-8}" -n "${GEN:-16}" -r 1 \
  > "$csv" 2> "$csv.err" || { tail -5 "$csv.err"; tail -5 "$csv"; }
python3 - "$csv" "$count" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no kernel rows")
head, body = rows[0], rows[1:]
name_i, val_i, unit_i = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
tot, cnt = collections.Counter(), collections.Counter()
for r in body:
    v = float(r[val_i].replace(",", ""))
    unit = r[unit_i].strip().lower()
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
    if unit not in scale: sys.exit(f"unknown time unit {unit!r}")
    v *= scale[unit]
    name = r[name_i].split("(")[0].split("<")[0].replace("void ", "")
    tot[name] += v; cnt[name] += 1
all_us = sum(tot.values())
print(f"{len(body)} kernels, {all_us:.0f} us of GPU time ({all_us/len(body):.2f} us per kernel)")
print("| kernel | launches | total us | share | us per launch |")
print("|---|---:|---:|---:|---:|")
for k, v in tot.most_common(25):
    print(f"| {k} | {cnt[k]} | {v:.0f} | {100*v/all_us:.1f}% | {v/cnt[k]:.2f} |")
PY
rm -f "$csv" "$csv.err"
