#!/usr/bin/env python3
"""Converts HF fixtures with mlx-vlm's own converter and records mlx-vlm's own
logits, as an outside check of the engine's MLX loader (test_mlx_reference.c).

The MLX-layout fixtures in ../shared/fixtures (dense-mlx8, moe-mlx4, ...) were
written by our make_fixtures.py from a reading of mlx-vlm's source. These are
written by mlx-vlm itself: `mlx_vlm.convert(...)` quantises the HF fixture,
`mlx_vlm.utils.load(...)` loads the result and mlx-vlm's Gemma 4 model computes
the references.

Needs a virtualenv with MLX's CPU build and mlx-vlm from PyPI (never used at
run time, only here):

    python3 -m venv /tmp/mlxenv
    /tmp/mlxenv/bin/pip install mlx==0.32.4 mlx-cpu==0.32.4 mlx-vlm==0.7.10
    /tmp/mlxenv/bin/python tests/tools/make_mlx_reference.py \
        --fixtures ../shared/fixtures --hub ../shared/hub --tokenizer ../shared/tokenizer

Writes tests/fixtures/mlxvlm-NAME.tar.xz, one folder each holding exactly what
mlx-vlm wrote that a loader needs (config.json, model.safetensors,
model.safetensors.index.json) plus ref.json and ref.safetensors (float32):

  text.logits.mlx_bf16  mlx-vlm as loaded (bf16 activations, its native run)
  text.logits.mlx_f32   the same model after model.set_dtype(mx.float32), with
                        embed_scale kept at the value the bf16 run multiplies by
                        (see EMBED_SCALE below)
  image.soft_tokens.mlx_f32, image.logits.mlx_f32 (where the fixture has an
                        image): mlx-vlm's vision tower + embedder on the HF
                        processor's pixel values vendored in the source fixture,
                        float32 as above, with mlx-vlm's own attention mask
  image.logits.mlx_f32_transformers_mask (use_bidirectional_attention="vision",
                        i.e. moe): the same with transformers' image mask
                        patched in (transformers_vision_masks). mlx-vlm 0.7.10
                        makes image groups bidirectional on every layer and
                        ignores the sliding window for them; transformers 5.17
                        (the fixtures' reference) only on sliding layers and
                        windowed to the past. On these models the two rules
                        give logits >100% apart.

ref.json also records mlx_f32_vs_transformers_float64_unquantised: mlx-vlm
loading the unquantised HF fixture, cast to float32 as above, against
transformers' float64 references. That is MLX's own float32 error, and sets
the tolerances of test_mlx_reference.c.

What had to be supplied to mlx-vlm (the weights are never changed):
  * Input folder = the fixture's config.json, generation_config.json and
    model*.safetensors (+ index). ref.safetensors must stay out: mlx-vlm loads
    every *.safetensors in the folder as weights.
  * config.json in the hub's form: the fixtures were written by transformers
    5.17, whose config puts the full-attention head size in
    text_config.per_layer_config = {"2": {"head_dim": 64, ...}}; mlx-vlm 0.7.10
    (like the released hub configs) reads text_config.global_head_dim and
    num_global_key_value_heads, and without them builds 512-wide heads. The
    tool rewrites per_layer_config into those two keys (it checks every full
    layer has the same entry and no sliding layer has one).
  * processor_config.json (the released model's, from ../shared/hub) and the
    Gemma tokenizer (../shared/tokenizer): mlx_vlm.convert loads the processor
    and fails without them. They are not vendored.

The f32 reference is the model after model.set_dtype(mx.float32) with two
adjustments that keep it the same model, only unrounded (ref.json records how
far the plain set_dtype run is from it):

EMBED_SCALE: mlx-vlm multiplies the bf16 embeddings by the Python float
sqrt(hidden_size); MLX casts a Python scalar to the array's dtype, so the bf16
run really multiplies by bf16(sqrt(d)) (11.3125 for d=128, as transformers'
bf16 inference does). After set_dtype(float32) the same line would multiply by
the unrounded 11.3137..., a different model; the f32 reference keeps the
bf16-rounded value.

MXFP4 EMBEDDINGS: MLX dequantises a QuantizedEmbedding row to the scales'
dtype; for mxfp4 (uint8 scales) that is bf16 even after set_dtype(float32), so
the lookup and its * embed_scale stay bf16. The f32 run dequantises to float32
(float32_embedding_lookup; a no-op for affine, whose scales are f32 by then).
"""
import argparse
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_vlm import convert
from mlx_vlm.utils import load
from safetensors.numpy import load_file, save_file

# name -> (source fixture, processor_config from the hub, convert kwargs)
VARIANTS = {
    "mlxvlm-e2b-q4": ("e2b", "gemma-4-E2B-it", dict(quantize=True, q_bits=4, q_group_size=64)),
    "mlxvlm-e2b-q8": ("e2b", "gemma-4-E2B-it", dict(quantize=True, q_bits=8, q_group_size=64)),
    "mlxvlm-moe-q4": ("moe", "gemma-4-26B-A4B-it", dict(quantize=True, q_bits=4, q_group_size=64)),
    # mxfp4 fixes group 32 (mlx-vlm refuses q_group_size=64 with mxfp4)
    "mlxvlm-moe-mxfp4": ("moe", "gemma-4-26B-A4B-it",
                         dict(quantize=True, q_bits=4, q_group_size=32, q_mode="mxfp4")),
}
# What mlx-vlm wrote that a loader needs; the rest (README.md, tokenizer,
# chat template, processor config, generation config) is not vendored.
KEEP = ("config.json", "model.safetensors", "model.safetensors.index.json")


def hub_form_config(config):
    """per_layer_config -> global_head_dim / num_global_key_value_heads."""
    t = config["text_config"]
    plc = t.pop("per_layer_config", None)
    if not plc:
        return []
    full = [i for i, k in enumerate(t["layer_types"]) if k == "full_attention"]
    entries = {json.dumps(plc[str(i)], sort_keys=True) for i in full if str(i) in plc}
    if set(plc) != {str(i) for i in full} or len(entries) != 1:
        raise SystemExit(f"per_layer_config {plc} is not one entry per full layer")
    entry = plc[str(full[0])]
    changes = ["text_config.per_layer_config removed"]
    if "head_dim" in entry:
        t["global_head_dim"] = entry["head_dim"]
        changes.append(f"text_config.global_head_dim = {entry['head_dim']}")
    if "num_key_value_heads" in entry:
        t["num_global_key_value_heads"] = entry["num_key_value_heads"]
        changes.append(f"text_config.num_global_key_value_heads = {entry['num_key_value_heads']}")
    return changes


def prepare_input(src, dst, hub, tokenizer, processor_name):
    dst.mkdir(parents=True)
    for f in sorted(src.glob("model*.safetensors")) + [src / "model.safetensors.index.json",
                                                          src / "generation_config.json"]:
        if f.exists():
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    changes = hub_form_config(config)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(hub / f"{processor_name}.processor_config.json", dst / "processor_config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / f, dst / f)
    return changes


def float32_embedding_lookup(self, x):
    """nn.QuantizedEmbedding.__call__ with a float32 result. MLX infers the
    dequantised dtype from the scales: float32 for affine scales after
    set_dtype, but bf16 for mxfp4's uint8 scales, which would leave the
    embedding lookup (and its * embed_scale) in bf16 inside the f32 run."""
    biases = self.get("biases")
    return mx.dequantize(self["weight"][x], scales=self["scales"][x],
                         biases=biases[x] if biases is not None else None, group_size=self.group_size,
                         bits=self.bits, mode=self.mode, dtype=mx.float32)


def logits_of(model, ids, **kw):
    out = model(mx.array([ids]), **kw)
    logits = out.logits if hasattr(out, "logits") else out
    return np.array(logits.astype(mx.float32))[0]


def greedy(model, prompt, n):
    """Greedy continuation by full recomputation (no cache)."""
    ids, margins = list(prompt), []
    for _ in range(n):
        row = logits_of(model, ids)[-1]
        top = np.sort(row)[-2:]
        margins.append(float(top[1] - top[0]))
        ids.append(int(row.argmax()))
    return ids[len(prompt):], min(margins)


def rel_rms(a, b):
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def image_inputs(ref_json, ref_tensors):
    img = ref_json.get("image")
    if not img or "image.pixel_values" not in ref_tensors:
        return None
    kw = dict(pixel_values=mx.array(ref_tensors["image.pixel_values"])[None],
              image_position_ids=mx.array(ref_tensors["image.position_ids"].astype(np.int32))[None])
    if "mm_token_type_ids" in img:
        kw["mm_token_type_ids"] = mx.array([img["mm_token_type_ids"]])
    return img["prompt_ids"], kw


def transformers_vision_masks(self, h, cache, mm_token_type_ids=None):
    """Gemma4TextModel._make_masks with transformers 5.17's rule for
    use_bidirectional_attention="vision" (the rule of the source fixtures'
    references): each contiguous run of image tokens is a group; sliding
    layers get (causal or same group) and key > query - window, full layers
    plain causal. mlx-vlm 0.7.10's own rule ORs the group into every layer's
    mask, unwindowed (the engine's G4_VISION_MASK_ALL_LAYERS)."""
    n = h.shape[1]
    i, j = mx.arange(n)[:, None], mx.arange(n)[None, :]
    causal = j <= i
    groups = self._block_sequence_ids_for_mask(mm_token_type_ids)[0]
    same = (groups[:, None] != -1) & (groups[:, None] == groups[None, :])
    sliding = ((causal | same) & (j > i - self.window_size))[None, None]
    return [sliding if layer.layer_type == "sliding_attention" else causal[None, None] for layer in self.layers]


def image_refs(model, ref_json, ref_tensors, out):
    """Soft tokens and image-prompt logits (float32 model): mlx-vlm's own
    mask, and for use_bidirectional_attention="vision" also transformers'."""
    image = image_inputs(ref_json, ref_tensors)
    if not image:
        return
    ids, kw = image
    soft = model.encode_image(kw["pixel_values"], kw["image_position_ids"])
    out["image.soft_tokens.mlx_f32"] = np.array(soft.astype(mx.float32))[0]
    out["image.logits.mlx_f32"] = logits_of(model, ids, **kw)
    if model.config.text_config.use_bidirectional_attention != "vision":
        return
    text_model = type(model.language_model.model)
    own_masks = text_model._make_masks
    text_model._make_masks = transformers_vision_masks
    try:
        out["image.logits.mlx_f32_transformers_mask"] = logits_of(model, ids, **kw)
    finally:
        text_model._make_masks = own_masks


def as_float32_reference(model):
    """model.set_dtype(float32) plus the two adjustments in the module doc;
    returns a function undoing the class-level one."""
    model.set_dtype(mx.float32)
    lm = model.language_model.model
    lm.embed_scale = float(mx.array(lm.embed_scale, dtype=mx.bfloat16).item())
    plain_lookup = nn.QuantizedEmbedding.__call__
    nn.QuantizedEmbedding.__call__ = float32_embedding_lookup

    def undo():
        nn.QuantizedEmbedding.__call__ = plain_lookup
    return undo


def references(mlx_dir, ref_json, ref_tensors):
    model, _ = load(str(mlx_dir))
    text = ref_json["text"]
    all_ids, prompt = text["all_ids"], text["prompt_ids"]
    n_new = len(all_ids) - len(prompt)
    out, info = {}, {}

    out["text.logits.mlx_bf16"] = logits_of(model, all_ids)
    info["greedy_ids_mlx_bf16"], info["min_top2_margin_mlx_bf16"] = greedy(model, prompt, n_new)

    model.set_dtype(mx.float32)
    as_cast = logits_of(model, all_ids)
    info["embed_scale"] = {"python": model.language_model.model.embed_scale}
    undo = as_float32_reference(model)
    info["embed_scale"]["bf16_applied"] = model.language_model.model.embed_scale
    try:
        f32 = logits_of(model, all_ids)
        out["text.logits.mlx_f32"] = f32
        info["greedy_ids_mlx_f32"], info["min_top2_margin_mlx_f32"] = greedy(model, prompt, n_new)
        image_refs(model, ref_json, ref_tensors, out)
    finally:
        undo()
    if "image.logits.mlx_f32_transformers_mask" in out:
        info["rel_rms_image_logits_mlx_mask_vs_transformers_mask"] = rel_rms(
            out["image.logits.mlx_f32"], out["image.logits.mlx_f32_transformers_mask"])
    info["rel_rms_mlx_bf16_vs_mlx_f32"] = rel_rms(out["text.logits.mlx_bf16"], f32)
    info["rel_rms_mlx_bf16_vs_mlx_f32_position0"] = rel_rms(out["text.logits.mlx_bf16"][0], f32[0])
    info["rel_rms_plain_set_dtype_f32_vs_mlx_f32"] = rel_rms(as_cast, f32)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}, info


def calibration(hf_dir, ref_json, ref_tensors):
    """MLX's own float32 error: mlx-vlm on the unquantised HF fixture, cast to
    float32, against transformers' float64 references of that fixture."""
    model, _ = load(str(hf_dir))
    undo = as_float32_reference(model)
    got = {}
    try:
        got["text.logits"] = rel_rms(logits_of(model, ref_json["text"]["all_ids"]), ref_tensors["text.logits"])
        out = {}
        image_refs(model, ref_json, ref_tensors, out)
        if out:
            got["image.soft_tokens"] = rel_rms(out["image.soft_tokens.mlx_f32"], ref_tensors["image.soft_tokens"])
            key = "image.logits.mlx_f32_transformers_mask"
            got["image.logits"] = rel_rms(out.get(key, out["image.logits.mlx_f32"]), ref_tensors["image.logits"])
    finally:
        undo()
    return got


def versions():
    names = ("mlx", "mlx-cpu", "mlx-vlm", "mlx-metal", "numpy", "safetensors", "transformers")
    got = {}
    for n in names:
        try:
            got[n] = md.version(n)
        except md.PackageNotFoundError:
            pass
    got["python"] = platform.python_version()
    got["mlx.core.__version__"] = mx.__version__
    got["mlx.core.default_device"] = str(mx.default_device())
    return got


def make(name, args, work):
    fixture, processor_name, kwargs = VARIANTS[name]
    src = args.fixtures / fixture
    hf_dir, mlx_dir = work / f"{name}-hf", work / f"{name}-mlx"
    changes = prepare_input(src, hf_dir, args.hub, args.tokenizer, processor_name)
    convert(str(hf_dir), str(mlx_dir), **kwargs)

    ref_json = json.loads((src / "ref.json").read_text())
    ref_tensors = load_file(str(src / "ref.safetensors"))
    tensors, info = references(mlx_dir, ref_json, ref_tensors)
    calib = calibration(hf_dir, ref_json, ref_tensors)

    stage = work / "stage" / name
    stage.mkdir(parents=True)
    for f in KEEP:
        if (mlx_dir / f).exists():
            shutil.copy(mlx_dir / f, stage / f)
    save_file(tensors, str(stage / "ref.safetensors"))
    call = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    doc = {
        "fixture": name,
        "source_fixture": fixture,
        "written_by": "tests/tools/make_mlx_reference.py",
        "versions": versions(),
        "convert_call": f"mlx_vlm.convert(hf_path, mlx_path, {call})",
        "input_config_changes": changes,
        "input_extra_files": [f"processor_config.json (../shared/hub/{processor_name}.processor_config.json)",
                              "tokenizer.json, tokenizer_config.json (../shared/tokenizer)"],
        "mlx_wrote": sorted(p.name for p in mlx_dir.iterdir()),
        "vendored": [f for f in KEEP if (mlx_dir / f).exists()],
        "mlx_f32_vs_transformers_float64_unquantised": calib,
        "text": {"prompt_ids": ref_json["text"]["prompt_ids"], "all_ids": ref_json["text"]["all_ids"], **info},
        "notes": [
            "text.logits.mlx_bf16: mlx_vlm.utils.load(dir) then model(ids) as loaded (bf16 activations)",
            "text.logits.mlx_f32: the same after model.set_dtype(mx.float32), embed_scale kept at bf16(sqrt(d)), "
            "quantised embedding rows dequantised to float32",
            "greedy ids: argmax continuation of prompt_ids by full recomputation",
        ],
    }
    if "image.logits.mlx_f32" in tensors:
        doc["image"] = {k: ref_json["image"][k] for k in ("prompt_ids", "mm_token_type_ids") if k in ref_json["image"]}
        doc["image"]["inputs"] = f"image.pixel_values / image.position_ids of the source fixture {fixture}"
        doc["image"]["mask"] = ("image.logits.mlx_f32: mlx-vlm's own mask" + (
            "; image.logits.mlx_f32_transformers_mask: transformers 5.17's vision rule patched into mlx-vlm "
            "(transformers_vision_masks)" if "image.logits.mlx_f32_transformers_mask" in tensors else ""))
    (stage / "ref.json").write_text(json.dumps(doc, indent=1) + "\n")

    archive = args.out / f"{name}.tar.xz"
    subprocess.run(["tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0",
                    "-cJf", str(archive), "-C", str(stage.parent), name], check=True,
                   env={"XZ_OPT": "-9e", "PATH": "/usr/bin:/bin"})
    print(f"{name}: {archive} {archive.stat().st_size} bytes; bf16 vs f32 rel_rms "
          f"{info['rel_rms_mlx_bf16_vs_mlx_f32']:.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parents[2]
    ap.add_argument("--fixtures", type=Path, required=True, help="../shared/fixtures")
    ap.add_argument("--hub", type=Path, required=True, help="../shared/hub (processor_config.json files)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="../shared/tokenizer")
    ap.add_argument("--out", type=Path, default=here / "tests" / "fixtures")
    ap.add_argument("--keep", type=Path, help="keep the work folder here instead of a temporary one")
    ap.add_argument("names", nargs="*", default=list(VARIANTS))
    args = ap.parse_args()
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        args.keep.mkdir(parents=True)
        for n in args.names:
            make(n, args, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for n in args.names:
                make(n, args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
