#!/usr/bin/env python3
"""The bundled model quantised by mlx-vlm's own converter, and MLX's own
perplexity of each conversion on the held-back chapters — the reference for
`gemma4 perplexity` on MLX files (tests/scripts/test_perplexity.py).

    /tmp/mlxenv/bin/python tests/tools/mlx_perplexity.py models/tiny tests/data/kjv_heldout.txt \\
        --hub ../shared/hub --out tests/fixtures/tiny-mlx.tar.xz --json tests/data/tiny_mlx_perplexity.json

(the virtualenv as tests/tools/make_mlx_reference.py describes: mlx, mlx-cpu and mlx-vlm from PyPI).

Writes the converted folders (config.json, model.safetensors of q4 and q8 with
groups of 64, and mxfp4 with groups of 32, plus the tokenizer so each is a
runnable model) as one archive, and a JSON of MLX's perplexity of every
variant — bf16 unquantised included — in its native bf16 run and cast to
float32 (as make_mlx_reference.py's float32 reference), with the windows of
`gemma4 perplexity` (tests/tools/perplexity_windows.py).
"""
import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_vlm import convert
from mlx_vlm.utils import load
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).parent))
from make_mlx_reference import as_float32_reference, hub_form_config, versions  # noqa: E402
from perplexity_windows import windows  # noqa: E402

VARIANTS = {
    "mlx4": dict(quantize=True, q_bits=4, q_group_size=64),
    "mlx8": dict(quantize=True, q_bits=8, q_group_size=64),
    "mxfp4": dict(quantize=True, q_bits=4, q_group_size=32, q_mode="mxfp4"),
}
KEEP = ("config.json", "model.safetensors")
RUNTIME = ("tokenizer.json", "chat_template.jinja", "generation_config.json")


def prepare_input(model, dst, hub):
    dst.mkdir(parents=True)
    for f in ("model.safetensors", "generation_config.json", "tokenizer.json", "chat_template.jinja"):
        shutil.copy(model / f, dst / f)
    config = json.loads((model / "config.json").read_text())
    hub_form_config(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(hub / "gemma-4-E2B-it.processor_config.json", dst / "processor_config.json")
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}))


def mlx_perplexity(folder, ids, ctx, stride, bos, float32=False):
    """MLX's own run: native bf16, or (float32) the model cast to float32 as make_mlx_reference does."""
    model, _ = load(str(folder))
    undo = as_float32_reference(model) if float32 else (lambda: None)
    try:
        return window_nll(model, ids, ctx, stride, bos)
    finally:
        undo()


def window_nll(model, ids, ctx, stride, bos):
    nll = []
    for b, e, first in windows(len(ids), ctx, stride):
        out = model(mx.array([[bos] + ids[b:e]]))
        logits = np.array((out.logits if hasattr(out, "logits") else out).astype(mx.float32))[0].astype(np.float64)
        rows = logits[first - b:e - b]
        lse = np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1)) + rows.max(1)
        nll.extend(lse - rows[np.arange(len(rows)), [ids[j] for j in range(first, e)]])
    nll = np.array(nll)
    mean = float(nll.mean())
    return {"tokens": len(nll), "mean_nll": mean, "ppl": math.exp(mean),
            "ppl_err": math.exp(mean) * float(nll.std(ddof=1)) / math.sqrt(len(nll))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("text")
    ap.add_argument("--hub", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    stride = args.ctx - 1
    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    ids = tok.encode(open(args.text, encoding="utf-8").read(), add_special_tokens=False).ids
    bos = tok.token_to_id("<bos>")
    work = Path(tempfile.mkdtemp())
    hf = work / "hf"
    prepare_input(args.model, hf, args.hub)
    doc = {"text": args.text, "ctx": args.ctx, "stride": stride, "versions": versions(),
           "bf16": mlx_perplexity(hf, ids, args.ctx, stride, bos),
           "f32": mlx_perplexity(hf, ids, args.ctx, stride, bos, float32=True), "variants": {}}
    stage = work / "stage"
    for name, kw in VARIANTS.items():
        dst = work / name
        convert(str(hf), str(dst), **kw)
        doc["variants"][name] = dict(mlx_perplexity(dst, ids, args.ctx, stride, bos),
                                     f32=mlx_perplexity(dst, ids, args.ctx, stride, bos, float32=True),
                                     convert_call="mlx_vlm.convert(hf, out, %s)" % ", ".join(
                                         f"{k}={v!r}" for k, v in kw.items()))
        (stage / f"tiny-{name}").mkdir(parents=True)
        for f in KEEP:
            shutil.copy(dst / f, stage / f"tiny-{name}" / f)
        for f in RUNTIME:
            shutil.copy(args.model / f, stage / f"tiny-{name}" / f)
        print(name, doc["variants"][name], flush=True)
    print("bf16", doc["bf16"])
    subprocess.run(["tar", "-cJf", str(args.out.resolve()), "-C", str(stage)] + sorted(p.name for p in stage.iterdir()),
                   check=True)
    args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
