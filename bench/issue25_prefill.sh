#!/bin/bash
# Issue 25, quantised prefill: pp512 of synthetic models under G4_CUDA_TUNE
# settings in one call on the GPU machine, with the prebuilt binaries:
#   . bench/cuda_prebuilt_env.sh .gpu/pre.tar.xz && bash bench/issue25_prefill.sh "31b:mlx4:wgmma=0 31b:mlx4:-"
# Each item NAME:FORMAT:SETTINGS (SETTINGS "-": the defaults; wgmma=0 the
# dequantising pass + cuBLAS instead of the warpgroup GEMM), REPS benches of -r 2 each (default 1),
# PRECISION=exact for the split path. Prints the table last; logs under $OUT.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
for item in $1; do
  name=${item%%:*} rest=${item#*:}; fmt=${rest%%:*} vars=${rest#*:}
  envs=(); [ "$vars" != - ] && envs=("G4_CUDA_TUNE=$vars")
  for rep in $(seq 1 "${REPS:-1}"); do
    s=$(date +%s)
    r=$(timeout 120 env "${envs[@]}" "$GEMMA4" bench --device cuda --synthetic "$name" --format "$fmt" -p 512 -n 0 \
        -r 2 ${PRECISION:+--precision $PRECISION} --json 2>> "$OUT/bench.err" |
        python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(f\"{r['pp_tps']:.0f} ± {r['pp_sd']:.0f}\")")
    printf '%-8s %-6s %-40s %14s  (%d s)\n' "$name" "$fmt" "$vars" "${r:-failed}" $(( $(date +%s) - s ))
  done
done > "$OUT/pp.txt"
echo "pp512 t/s (${PRECISION:-fast}):"
cat "$OUT/pp.txt"
