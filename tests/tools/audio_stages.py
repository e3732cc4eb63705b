"""transformers' Gemma4AudioModel outputs for tests/unit/test_audio_tower.c.

    python3 tests/tools/audio_stages.py FIXTURE_DIR OUT.safetensors

transformers 5.17 runs the audio tower's attention mask inverted when the
model is loaded with attn_implementation="eager" (as the fixtures were): the
eager mask interface returns a float additive mask (0 = attend) but the
5.17 audio attention masks with `attention_mask.logical_not()`, meant for a
boolean mask. With "sdpa" (the default) the mask is boolean and correct, and
transformers >= 5.2x fixed the eager path. This tool reruns the fixture's
audio tower both ways on its reference features (float32 tower, float64
text model, bf16(sqrt(d)) embedding scale, exactly as make_fixtures.py):
  eager  must reproduce the fixture's audio.soft_tokens / audio.logits (printed)
  sdpa   is saved as the correct reference:
    audio.soft_tokens [n, d_text], audio.logits [len(prompt), vocab],
    audio.subsample [T', h] (after input_proj_linear), audio.layer<i> [T', h],
    audio.output_proj [T', out] (bias included, padding rows included).
Needs torch and transformers (the GPU machine has both)."""
import json
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForConditionalGeneration


def run(model, mode, feats, mask, prompt):
    tower = model.model.audio_tower
    tower.config._attn_implementation = mode
    st, hooks, seen = {}, [], {}

    def keep(name, pick=lambda o: o):
        def hook(mod, inp, out):
            st[name] = pick(out).detach()[0].float().contiguous().clone()
        return hook

    def mask_kind(mod, args, kwargs):
        m = kwargs.get("attention_mask")
        seen["mask"] = None if m is None else str(m.dtype)

    hooks.append(tower.subsample_conv_projection.register_forward_hook(keep("audio.subsample", lambda o: o[0])))
    for i, layer in enumerate(tower.layers):
        hooks.append(layer.register_forward_hook(keep(f"audio.layer{i}")))
    hooks.append(tower.output_proj.register_forward_hook(keep("audio.output_proj")))
    hooks.append(tower.layers[0].self_attn.register_forward_pre_hook(mask_kind, with_kwargs=True))
    with torch.no_grad():
        ao = model.model.get_audio_features(feats, mask, return_dict=True)
        for h in hooks:
            h.remove()
        st["audio.soft_tokens"] = ao.pooler_output[ao.attention_mask].float().contiguous()
        o = model(input_ids=torch.tensor([prompt]), input_features=feats, input_features_mask=mask)
    st["audio.logits"] = o.logits[0].float().contiguous()
    return st, seen["mask"]


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main(fixture, out):
    model = Gemma4ForConditionalGeneration.from_pretrained(fixture, dtype=torch.float32, attn_implementation="eager")
    model = model.eval().to(torch.float64)
    model.model.audio_tower.float()
    model.model.embed_audio.float()
    for m in model.modules():  # make_fixtures.py canonical_buffers
        if hasattr(m, "embed_scale") and isinstance(m.embed_scale, torch.Tensor):
            m.embed_scale.copy_(m.embed_scale.to(torch.bfloat16).to(m.embed_scale.dtype))
    ref = load_file(f"{fixture}/ref.safetensors")
    prompt = json.load(open(f"{fixture}/ref.json"))["audio"]["prompt_ids"]
    feats = ref["audio.features"][None].float()
    mask = ref["audio.features_mask"][None].bool()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    res = {}
    for mode in ("eager", "sdpa"):
        st, kind = run(model, mode, feats, mask, prompt)
        res[mode] = st
        print(f"{mode}: mask {kind}; vs fixture: soft tokens {rel(st['audio.soft_tokens'], ref['audio.soft_tokens']):.2e}"
              f", logits {rel(st['audio.logits'], ref['audio.logits']):.2e}")
    print(f"sdpa vs eager soft tokens {rel(res['sdpa']['audio.soft_tokens'], res['eager']['audio.soft_tokens']):.2e}")
    save_file(res["sdpa"], out, metadata={"transformers": transformers.__version__, "attn": "sdpa"})


if __name__ == "__main__":
    main(*sys.argv[1:])
