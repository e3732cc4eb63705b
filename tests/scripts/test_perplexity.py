"""`gemma4 perplexity` on the bundled trained model against transformers.

The reference (tests/data/tiny_perplexity.json, made by
tests/tools/perplexity_reference.py with transformers 5.17 in float32 on the
CPU) scores the same held-back chapters (tests/data/kjv_heldout.txt, never
seen in training) with the same windows. Checked here: perplexity equal to
1e-4 relative on the exact path, every token scored once whatever the stride,
a baseline saved with --save-logits compared with itself (KL 0, top-1 100%),
the fast path against the exact one no further than transformers' own bf16
run is from its float32 run, and clear errors for a mismatched baseline or
bad arguments; and the conversions mlx-vlm's converter wrote from the bundled
model against MLX's own perplexity of the same files.
"""
import json
import os
import subprocess
import sys

from checks import check, summary

BIN = os.environ["G4_BIN"]
MODEL = os.path.join(os.path.dirname(os.environ["G4_FIXTURES"]), "models", "tiny")
DATA = os.environ["G4_TEST_DATA"]
TEXT = os.path.join(DATA, "kjv_heldout.txt")
REF = json.load(open(os.path.join(DATA, "tiny_perplexity.json")))
TMP = os.environ.get("G4_TMP", "/tmp")
os.makedirs(TMP, exist_ok=True)
# The sanitizer build (G4_TEST_SANITIZED) runs each code path once for memory errors and leaves the repeats
# (--stride, the self-comparison, the 8-bit and mxfp4 conversions) to the Release build, which runs them all.
SANITIZED = os.environ.get("G4_TEST_SANITIZED") == "1"


def ppl(*args):
    r = subprocess.run([BIN, "perplexity", "-m", MODEL, "-f", TEXT, "--device", "cpu", *args], capture_output=True,
                       text=True)
    return r, (json.loads(r.stdout) if r.returncode == 0 and "--json" in args else None)


# the exact path against transformers' float32, keeping its logits as a baseline
base = os.path.join(TMP, "perplexity_base.safetensors")
r, exact = ppl("--precision", "exact", "--json", "--save-logits", base)
check(r.returncode == 0, "perplexity runs", r.stderr[-300:])
if exact:
    rel = abs(exact["ppl"] - REF["ppl"]) / REF["ppl"]
    check(rel < 1e-4, "perplexity equals transformers' float32 to 1e-4 relative",
          "%.8f vs %.8f (%.2e)" % (exact["ppl"], REF["ppl"], rel))
    check(exact["tokens"] == REF["tokens"] and exact["windows"] == REF["windows"],
          "same scored tokens and windows as the reference", (exact["tokens"], exact["windows"]))
    check(abs(exact["ppl_err"] - REF["ppl_err"]) / REF["ppl_err"] < 1e-3, "same +/- error",
          (exact["ppl_err"], REF["ppl_err"]))
    # a trained model: far below what random weights give (about the vocabulary size, 4096)
    check(exact["ppl"] < 4096 / 20, "held-back text perplexity far below a random model's", exact["ppl"])

check(r.returncode == 0 and os.path.getsize(base) > REF["tokens"] * 4096 * 4, "--save-logits writes the logits",
      r.stderr[-300:])

if not SANITIZED:
    # a smaller stride still scores each token once, with more context each
    r, strided = ppl("--precision", "exact", "--json", "--stride", "256")
    check(strided is not None and exact is not None and strided["tokens"] == exact["tokens"]
          and strided["windows"] > exact["windows"], "--stride 256: every token once, more windows", strided)
    # a baseline compared with itself
    r, same = ppl("--precision", "exact", "--json", "--kl-divergence", base)
    check(same is not None and same["kld_mean"] == 0 and same["top1_agreement"] == 1,
          "the same run against its own baseline: KL 0, top-1 100%", same)

# the fast path against the exact baseline
r, fast = ppl("--precision", "fast", "--json", "--kl-divergence", base)
yard = REF["transformers_bf16_vs_f32"]
check(fast is not None and fast["kld_mean"] <= yard["kld_mean"] and fast["top1_agreement"] >= 0.99,
      "the fast path is no further from exact than transformers' bf16 from its float32 (KLD %.3g, top-1 %.4f)"
      % (yard["kld_mean"], yard["top1_agreement"]), fast)
if fast:
    print("cpu fast vs exact: KLD %.3g (max %.3g), top-1 %.4f" % (fast["kld_mean"], fast["kld_max"],
                                                                 fast["top1_agreement"]))

# MLX files written by mlx-vlm's own converter from the bundled model (tests/fixtures/tiny-mlx.tar.xz) against
# MLX's own perplexity of the same files (tests/tools/mlx_perplexity.py): its float32 run to 1e-4, its native
# bf16 run (bf16 activations) to 0.5%
MLX = json.load(open(os.path.join(DATA, "tiny_mlx_perplexity.json")))
# The affine ones also keep a baseline for their int8 fast path (every CPU level has int8 kernels).
for name, ref in sorted(MLX["variants"].items()):
    if SANITIZED and name != "mlx4":
        continue
    folder = os.path.join(os.environ["G4_FIXTURES"], "tiny-" + name)
    keep = ["--save-logits", os.path.join(TMP, "perplexity_%s.safetensors" % name)] if name in ("mlx4", "mlx8") else []
    r = subprocess.run([BIN, "perplexity", "-m", folder, "-f", TEXT, "--device", "cpu", "--precision", "exact", "--json",
                        *keep], capture_output=True, text=True)
    got = json.loads(r.stdout) if r.returncode == 0 else None
    check(got is not None, "perplexity of the mlx-vlm %s conversion runs" % name, r.stderr[-300:])
    if not got:
        continue
    rel32 = abs(got["ppl"] - ref["f32"]["ppl"]) / ref["f32"]["ppl"]
    rel16 = abs(got["ppl"] - ref["ppl"]) / ref["ppl"]
    check(got["tokens"] == ref["tokens"] and rel32 < 1e-4, "%s: MLX's float32 perplexity to 1e-4 (%.2e)" % (name, rel32),
          (got["ppl"], ref["f32"]["ppl"]))
    check(rel16 < 5e-3, "%s: MLX's native bf16 perplexity to 0.5%% (%.2e)" % (name, rel16), (got["ppl"], ref["ppl"]))
    print("%s: ours %.4f, MLX float32 %.4f (%.1e), MLX bf16 %.4f (%.1e)" % (name, got["ppl"], ref["f32"]["ppl"], rel32,
                                                                        ref["ppl"], rel16))

    if keep:
        r = subprocess.run([BIN, "perplexity", "-m", folder, "-f", TEXT, "--device", "cpu", "--precision", "fast",
                            "--json", "--kl-divergence", keep[1]], capture_output=True, text=True)
        q8 = json.loads(r.stdout) if r.returncode == 0 else None
        check(q8 is not None and 0 < q8["kld_mean"] <= yard["kld_mean"] and q8["top1_agreement"] >= yard["top1_agreement"],
              "%s: the int8 fast path is no further from exact than transformers' bf16 from its float32" % name, q8)
        if q8:
            print("%s: cpu fast (int8) vs exact: KLD %.3g (max %.3g), top-1 %.4f" % (name, q8["kld_mean"], q8["kld_max"],
                                                                                q8["top1_agreement"]))
        os.remove(keep[1])

# errors: a baseline from another setup, bad arguments, a missing file
r, _ = ppl("--kl-divergence", base, "--ctx", "256")
check(r.returncode == 1 and "ctx" in r.stderr, "a baseline of another --ctx is refused, naming it", r.stderr[-300:])
r, _ = ppl("--kl-divergence", os.path.join(DATA, "tiny_perplexity.json"))
check(r.returncode == 1 and "tiny_perplexity.json" in r.stderr, "a file that is no baseline is refused",
      r.stderr[-300:])
r, _ = ppl("--stride", "0")
check(r.returncode == 2 and "stride" in r.stderr, "--stride 0 is refused", r.stderr[-200:])
r = subprocess.run([BIN, "perplexity", "-m", MODEL, "-f", os.path.join(TMP, "no-such-text.txt")],
                   capture_output=True, text=True)
check(r.returncode == 1 and "no-such-text.txt" in r.stderr, "a missing text file is named", r.stderr[-200:])
os.remove(base)
sys.exit(summary())
