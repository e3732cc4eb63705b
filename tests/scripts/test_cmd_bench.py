"""`gemma4 bench` on the bundled demo model: the JSON report's fields, decode
at a context depth (-d) and the session size (--ctx).

Speeds and limits are not asserted (timings, and the bandwidth measured on
each run, belong to benchmarks); what is checked is what the command reports
about the runs it made: the depth and positions it used, that the bytes a
decode step reads count the depth's KV reads (a deeper context reads more
per token), and that a --ctx too small for the runs is refused with a
message naming the sizes.
"""
import json
import os
import subprocess
import sys

from checks import check, summary

BIN = os.environ["G4_BIN"]
MODEL = os.path.join(os.path.dirname(os.environ["G4_FIXTURES"]), "models", "tiny")


def bench(*args):
    r = subprocess.run([BIN, "bench", "-m", MODEL, "--device", "cpu", "-r", "1", "--json", *args],
                       capture_output=True, text=True)
    check(r.returncode == 0, "bench %s exits 0 (%s)" % (" ".join(args), r.stderr.strip()[-200:]))
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    check(len(lines) == 1, "bench %s prints one JSON line" % " ".join(args))
    return json.loads(lines[0]) if lines else {}


flat = bench("-p", "8", "-n", "4")
deep = bench("-p", "8", "-n", "4", "-d", "40")
sized = bench("-p", "8", "-n", "4", "-d", "40", "--ctx", "100")

check(flat.get("depth") == 0 and flat.get("n_ctx") == 8 + 8, "no depth: n_ctx is max(p, n) + 8 (got %s)" % flat.get("n_ctx"))
check(deep.get("depth") == 40, "depth reported (got %s)" % deep.get("depth"))
check(deep.get("n_ctx") == 40 + 4 + 8, "depth: n_ctx is d + n + 8 (got %s)" % deep.get("n_ctx"))
check(sized.get("n_ctx") == 100, "--ctx 100 used (got %s)" % sized.get("n_ctx"))
check(deep.get("tg_tps", 0) > 0 and deep.get("pp_tps", 0) > 0, "depth run measured prefill and decode")
check(deep.get("decode_bytes", 0) > flat.get("decode_bytes", 0),
      "decode bytes grow with the depth's KV reads (%s > %s)" % (deep.get("decode_bytes"), flat.get("decode_bytes")))

# the KV type: the default on the fast path is bf16; the KV bytes a step reads at depth d are the
# visible positions' bytes of each layer (full layers: every position; sliding: the window) at the
# type's row size (fp8: head_dim + a 4-byte scale per row), checked against the model's config
cfg = json.load(open(os.path.join(MODEL, "config.json")))["text_config"]
def kv_bytes(ctx, value_bytes, scale_bytes):
    total = 0
    for i, kind in enumerate(cfg["layer_types"]):
        d = cfg.get("per_layer_config", {}).get(str(i), {}).get("head_dim", cfg["head_dim"])
        visible = min(ctx, cfg["sliding_window"]) if kind == "sliding_attention" else ctx
        total += visible * cfg["num_key_value_heads"] * 2 * (d * value_bytes + scale_bytes)
    return total
check(deep.get("kv_type") == "bf16", "bench's default KV type on the fast path is bf16 (got %s)" % deep.get("kv_type"))
typed = {t: bench("-p", "8", "-n", "4", "-d", "40", "--kv-type", t) for t in ("f32", "fp8")}
check(typed["f32"].get("kv_type") == "f32" and typed["fp8"].get("kv_type") == "fp8", "--kv-type reported")
k32, k16, k8 = typed["f32"].get("kv_decode_bytes"), deep.get("kv_decode_bytes"), typed["fp8"].get("kv_decode_bytes")
print("KV bytes per decode step at depth 42: f32 %s, bf16 %s, fp8 %s" % (k32, k16, k8))
check(k32 == 2 * k16 and k8 is not None and k8 < k16, "KV decode bytes halve at bf16 and shrink at fp8")
check(k32 == kv_bytes(42, 4, 0) and k8 == kv_bytes(42, 1, 4),
      "KV decode bytes from the config: f32 %s = %s, fp8 %s = %s" % (k32, kv_bytes(42, 4, 0), k8, kv_bytes(42, 1, 4)))

# decode alone (-p 0): the warm-up must not read an unset prompt id (it did: "token id -1489201393 ... outside
# the vocabulary"); under ASan that read is also an error
decode_only = bench("-p", "0", "-n", "4")
check(decode_only.get("tg_tps", 0) > 0, "-p 0 measures decode alone (got %s)" % decode_only.get("tg_tps"))

r = subprocess.run([BIN, "bench", "-m", MODEL, "--device", "cpu", "-p", "8", "-n", "4", "-d", "40", "--ctx", "20"],
                   capture_output=True, text=True)
check(r.returncode == 2, "--ctx too small exits 2 (got %d)" % r.returncode)
check("--ctx 20 is too small" in r.stderr and "52 positions needed" in r.stderr,
      "--ctx too small names the sizes (%s)" % r.stderr.strip()[-200:])

sys.exit(summary())
