"""How close transformers itself gets, in float32, to the fixtures' float64
image references: run each fixture's image prompt through transformers in
float32 (CPU, and CUDA with TF32 off when present) from the same bf16
checkpoint and print the relative RMS error of the soft tokens and the
logits against ref.safetensors. This is the float32 floor our own image
results are judged beside (tests/unit/test_vision_tower.c).

    python3 tests/tools/transformers_f32_floor.py FIXTURES_DIR [dense moe e2b]
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import Gemma4ForConditionalGeneration


def rel_rms(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def run(fixture_dir, device):
    model = Gemma4ForConditionalGeneration.from_pretrained(fixture_dir, dtype=torch.float32,
                                                           attn_implementation="eager")
    model.config.text_config._experts_implementation = "eager"
    with torch.no_grad():  # the fixtures' convention: embedding scale bf16(sqrt(d))
        for m in model.modules():
            if hasattr(m, "embed_scale") and isinstance(m.embed_scale, torch.Tensor):
                m.embed_scale.copy_(m.embed_scale.to(torch.bfloat16).to(m.embed_scale.dtype))
    model = model.to(device).eval()
    ref = load_file(os.path.join(fixture_dir, "ref.safetensors"))
    meta = json.load(open(os.path.join(fixture_dir, "ref.json")))["image"]
    pv = ref["image.pixel_values"][None].to(device)
    pos = ref["image.position_ids"][None].long().to(device)
    with torch.no_grad():
        soft = model.model.get_image_features(pv, pos, return_dict=True).pooler_output[0]
        o = model(input_ids=torch.tensor([meta["prompt_ids"]], device=device), pixel_values=pv,
                  image_position_ids=pos, mm_token_type_ids=torch.tensor([meta["mm_token_type_ids"]], device=device))
    return rel_rms(soft, ref["image.soft_tokens"]), rel_rms(o.logits[0], ref["image.logits"])


def main():
    root = sys.argv[1]
    names = sys.argv[2:] or ["dense", "moe", "e2b"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print("| fixture | device | soft tokens rel_rms | image logits rel_rms |")
    print("|---|---|---:|---:|")
    for name in names:
        for device in devices:
            s, l = run(os.path.join(root, name), device)
            print(f"| {name} | transformers float32 {device} | {s:.2e} | {l:.2e} |", flush=True)


if __name__ == "__main__":
    main()
