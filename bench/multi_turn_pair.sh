#!/usr/bin/env bash
# bench/multi_turn_load.py against one server with the prefix cache, then one
# without (--no-prefix-cache), one after the other (a 31B model does not fit
# twice), and the ratio of their mean TTFT over turns 2..T.
#
# usage: bench/multi_turn_pair.sh OUT_PREFIX "SERVE ARGS" [LOAD ARGS...]
#   e.g. bench/multi_turn_pair.sh /tmp/mt_e2b "--synthetic e2b" --conversations 32
# GEMMA4 (default build-cuda/gemma4, else build/gemma4) is the binary; port 18480.
set -euo pipefail
out=$1
serve_args=$2
shift 2
load_args=("$@")
here=$(cd "$(dirname "$0")" && pwd)
bin=${GEMMA4:-$here/../build-cuda/gemma4}
[ -x "$bin" ] || bin=$here/../build/gemma4
port=${PORT:-18480}

run_one() { # label, extra serve flags
    local label=$1 flags=$2 log=$out.$1.serve.log
    # shellcheck disable=SC2086
    "$bin" serve $serve_args $flags --port "$port" --quiet > "$log.out" 2> "$log" &
    local pid=$!
    for _ in $(seq 600); do
        grep -q "listening" "$log.out" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
        sleep 1
    done
    python3 "$here/multi_turn_load.py" --url "http://127.0.0.1:$port" --json "$out.$label.json" "${load_args[@]}" || true
    kill "$pid"
    wait "$pid" || true
}

run_one warm ""
run_one cold "--no-prefix-cache"
python3 - "$out" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1] + ".warm.json"))[0]
c = json.load(open(sys.argv[1] + ".cold.json"))[0]
a, b = w["ttft_turns_2_on"]["mean"], c["ttft_turns_2_on"]["mean"]
print("mean TTFT turns 2-%d: %.0f ms with the cache, %.0f ms without: %.2fx lower; prefilled %d vs %d tokens"
      % (w["turns"], 1000 * a, 1000 * b, b / a, w["prefilled_tokens"], c["prefilled_tokens"]))
EOF
