#!/usr/bin/env python3
"""MLX-layout conversions of the drafter fixtures (gemma4_assistant), for
test_assistant's MLX drafter check. Writes tests/fixtures/mlx-assistant.tar.xz
with, for each SOURCE-mlxBITS of e2b-assistant (centroid head) at 4 and 8
bits and dense-assistant (dense tied head) at 4 bits:

  SOURCE-mlxBITS/          the drafter as an MLX conversion stores it: the
                           Hugging Face names (mlx-vlm's Gemma4AssistantDraftModel
                           mirrors transformers' modules), every Linear and
                           Embedding whose input width is a multiple of the
                           group size quantised by MLX's own mx.quantize
                           (affine, group 64: packed uint32 .weight, bf16
                           .scales and .biases), as mlx_vlm.convert's
                           quantisation predicate does; norms and scalars bf16;
                           masked_embedding.token_ordering int32 (mlx-vlm's
                           sanitize casts it); config.json with the
                           "quantization" and "quantization_config" blocks
                           mlx-vlm writes.
  SOURCE-mlxBITS-dequant/  the same drafter in the Hugging Face layout with
                           float32 weights = mx.dequantize of those codes: what
                           MLX itself reads the quantised weights as. A loader
                           of the MLX folder must compute what the HF loader
                           computes on this one.

Needs MLX's CPU build (never at run time, only here):

    python3 -m venv /tmp/mlxenv && /tmp/mlxenv/bin/pip install mlx==0.32.4 mlx-cpu==0.32.4
    /tmp/mlxenv/bin/python tests/tools/make_mlx_assistant.py --fixtures build/fixtures
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

import mlx.core as mx

GROUP = 64
CONVERSIONS = [("e2b-assistant", 4), ("e2b-assistant", 8), ("dense-assistant", 4)]


def quantisable(name, w):
    """mlx_vlm.convert's predicate on this model: modules with to_quantized
    (Linear, Embedding: every 2-D .weight here but the norms, which are 1-D)
    whose last dimension is a multiple of the group size."""
    return name.endswith(".weight") and w.ndim == 2 and w.shape[-1] % GROUP == 0


def convert(src, bits, out_mlx, out_deq):
    weights = mx.load(os.path.join(src, "model.safetensors"))
    mlx_w, deq_w = {}, {}
    for name, w in sorted(weights.items()):
        if name == "masked_embedding.token_ordering":
            mlx_w[name] = w.astype(mx.int32)
            deq_w[name] = w
        elif quantisable(name, w):
            module = name[: -len(".weight")]
            q, scales, biases = mx.quantize(w.astype(mx.bfloat16), group_size=GROUP, bits=bits)
            mlx_w[name] = q
            mlx_w[module + ".scales"] = scales
            mlx_w[module + ".biases"] = biases
            deq_w[name] = mx.dequantize(q, scales.astype(mx.float32), biases.astype(mx.float32),
                                        group_size=GROUP, bits=bits).astype(mx.float32)
        else:
            mlx_w[name] = w.astype(mx.bfloat16)
            deq_w[name] = w.astype(mx.bfloat16)
    for d in (out_mlx, out_deq):
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(src, "generation_config.json"), d)
    mx.save_safetensors(os.path.join(out_mlx, "model.safetensors"), mlx_w, metadata={"format": "mlx"})
    mx.save_safetensors(os.path.join(out_deq, "model.safetensors"), deq_w, metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out_deq, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    quant = {"group_size": GROUP, "bits": bits, "mode": "affine"}
    config["quantization"] = dict(quant)
    config["quantization_config"] = dict(quant)
    with open(os.path.join(out_mlx, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return sum(1 for n in mlx_w if n.endswith(".scales"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", required=True, help="folder holding e2b-assistant/ and dense-assistant/")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "mlx-assistant.tar.xz"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "mlx-assistant")
        for name, bits in CONVERSIONS:
            base = os.path.join(root, f"{name}-mlx{bits}")
            n = convert(os.path.join(args.fixtures, name), bits, base, base + "-dequant")
            print(f"{name} -> {name}-mlx{bits}: {n} quantised modules (MLX {mx.__version__})")
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("Written by tests/tools/make_mlx_assistant.py (MLX %s) from the e2b-assistant and "
                    "dense-assistant fixtures.\n" % mx.__version__)
        tar = subprocess.run(["tar", "cf", "-", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "-C", tmp,
                              "mlx-assistant"], check=True, capture_output=True).stdout
        xz = subprocess.run(["xz", "-9"], input=tar, check=True, capture_output=True).stdout
        with open(args.out, "wb") as f:
            f.write(xz)
        print(f"wrote {args.out} ({len(xz)} bytes)")


if __name__ == "__main__":
    main()
