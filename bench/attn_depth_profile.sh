#!/bin/bash
# Decode attention at depth, kernel by kernel (issue 32): `gemma4 bench -d
# DEPTH` on a synthetic model under Nsight Compute, only the decode attention
# kernels (attention_kernel, attention_merge_kernel; prefill runs the flash
# kernel), with each launch's grid, duration and DRAM bytes, summed per
# (kernel, grid, block) and printed with the achieved bandwidth.
#   bench/attn_depth_profile.sh GEMMA4 MODEL FORMAT DEPTH KV_TYPE [GEN]
set -u
gemma4=$1 model=$2 format=$3 depth=$4 kv=$5 gen=${6:-4}
csv=$(mktemp)
G4_CUDA_TUNE="${G4_CUDA_TUNE:+$G4_CUDA_TUNE,}graphs=0" ncu --clock-control none --cache-control all \
  --kernel-name regex:"attention_kernel|attention_merge_kernel" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active \
  --csv "$gemma4" bench --device cuda --synthetic "$model" --format "$format" -p 0 -n "$gen" -d "$depth" -r 1 \
  --kv-type "$kv" > "$csv" 2> "$csv.err" || { tail -5 "$csv.err"; tail -5 "$csv"; }
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no kernel rows")
head, body = rows[0], rows[1:]
ii = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value", "Metric Unit")}
launch = collections.defaultdict(dict)
for r in body:
    v = r[ii["Metric Value"]].replace(",", "")
    try: v = float(v)
    except ValueError: continue
    unit = r[ii["Metric Unit"]].strip().lower()
    v *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit, 1.0)
    d = launch[r[ii["ID"]]]
    d["name"] = r[ii["Kernel Name"]].split("(")[0].replace("void ", "")[:60]
    d[r[ii["Metric Name"]]] = v
groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for d in launch.values():
    key = (d["name"], int(d.get("launch__grid_size", 0)), int(d.get("launch__block_size", 0)))
    g = groups[key]
    g[0] += 1; g[1] += d.get("gpu__time_duration.sum", 0); g[2] += d.get("dram__bytes_read.sum", 0)
    g[3] += d.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0)
print("| kernel | grid | block | launches | us per launch | MB read per launch | GB/s | warps active % |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (name, grid, block), (n, us, by, occ) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {grid} | {block} | {n} | {us/n:.1f} | {by/n/1e6:.2f} | {by/us/1e3 if us else 0:.0f} | {occ/n:.0f} |")
PY
rm -f "$csv" "$csv.err"
