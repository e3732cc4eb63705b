#!/bin/bash
# The precision table of README "Precision": for each model folder, the CPU's
# exact (float32) run is the baseline (--save-logits), and every other path —
# CPU fast, and on a machine with a GPU CUDA exact and CUDA fast — is compared
# with it by `gemma4 perplexity --kl-divergence` (mean KL divergence, top-1
# agreement, perplexity). Prints one markdown row per model and path.
#   bench/precision.sh GEMMA4 TEXT MODEL_DIR...      (CTX=512 by default)
set -u
bin=$1 text=$2
shift 2
ctx=${CTX:-512}
work=$(mktemp -d)
echo "| model | path | ppl | mean KLD vs CPU exact | max KLD | top-1 agreement |"
echo "|---|---|---:|---:|---:|---:|"
for model in "$@"; do
  name=$(basename "$model")
  base=$work/$name.safetensors
  if ! "$bin" perplexity -m "$model" -f "$text" --ctx "$ctx" --device cpu --precision exact --save-logits "$base" \
       --json > "$work/$name.exact.json" 2> "$work/err"; then
    echo "| $name | cpu exact | failed: $(tail -1 "$work/err") | | | |"
    continue
  fi
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('| %s | cpu exact | %.4f | (baseline) | | |' % (sys.argv[2], r['ppl']))" \
    "$work/$name.exact.json" "$name"
  paths="cpu:fast"
  if [ -n "${CUDA:-}" ]; then paths="$paths cuda:exact cuda:fast"; fi
  for p in $paths; do
    dev=${p%%:*} prec=${p##*:}
    if "$bin" perplexity -m "$model" -f "$text" --ctx "$ctx" --device "$dev" --precision "$prec" \
         --kl-divergence "$base" --json > "$work/r.json" 2> "$work/err"; then
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('| %s | %s %s | %.4f | %.3g | %.3g | %.4f |' % (sys.argv[2], sys.argv[3], sys.argv[4], r['ppl'], r['kld_mean'], r['kld_max'], r['top1_agreement']))" \
        "$work/r.json" "$name" "$dev" "$prec"
    else
      echo "| $name | $dev $prec | failed: $(tail -1 "$work/err") | | | |"
    fi
  done
  rm -f "$base"
done
rm -rf "$work"
