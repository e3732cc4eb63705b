#!/usr/bin/env python3
"""transformers' perplexity of the bundled model (models/tiny) on a held-back
text, computed the way `gemma4 perplexity` defines it (tools/cmd_perplexity.c):
the text tokenised without special tokens, windows of <bos> + ctx - 1 tokens
starting every `stride` tokens, each token scored once, by the first window
that holds it after its first position.

Also transformers' own bf16 run against its float32 run on the same windows
(mean KL divergence, top-1 agreement, worst token): the yardstick the
precision policy compares our fast paths with (README, "Precision").

Needs torch and transformers (5.17) — run it where they are installed, never
in the test suite:
    python3 tests/tools/perplexity_reference.py models/tiny tests/data/kjv_heldout.txt \\
        --ctx 512 --out tests/data/tiny_perplexity.json
"""
import argparse
import json
import math

import torch
from tokenizers import Tokenizer
from transformers import Gemma4ForConditionalGeneration

from perplexity_windows import windows


def scored_logits(model, ids, ctx, stride, bos, dtype):
    rows = []
    for b, e, first in windows(len(ids), ctx, stride):
        x = torch.tensor([[bos] + ids[b:e]])
        with torch.no_grad():
            logits = model(input_ids=x, use_cache=False).logits[0].double()
        rows.append(logits[first - b:e - b])  # row r predicts t[b + r]
    return torch.cat(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stride", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    stride = args.stride or args.ctx - 1
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    ids = tok.encode(open(args.text, encoding="utf-8").read(), add_special_tokens=False).ids
    bos = tok.token_to_id("<bos>")
    model = Gemma4ForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    starts = [first for _, _, first in windows(len(ids), args.ctx, stride)]
    targets = torch.tensor([ids[j] for b, e, first in windows(len(ids), args.ctx, stride) for j in range(first, e)])
    f32 = scored_logits(model, ids, args.ctx, stride, bos, torch.float32)
    lp32 = torch.log_softmax(f32, -1)
    nll = -lp32.gather(1, targets[:, None])[:, 0]
    n = len(nll)
    mean = nll.mean().item()
    err = nll.std().item() / math.sqrt(n)
    model = model.to(torch.bfloat16)
    bf = scored_logits(model, ids, args.ctx, stride, bos, torch.bfloat16)
    lpb = torch.log_softmax(bf, -1)
    kl = (lp32.exp() * (lp32 - lpb)).sum(-1).clamp_min(0)
    nll_bf = -lpb.gather(1, targets[:, None])[:, 0]
    ref = {
        "model": args.model, "text": args.text, "ctx": args.ctx, "stride": stride, "tokens": n,
        "windows": len(starts), "mean_nll": mean, "ppl": math.exp(mean), "ppl_err": math.exp(mean) * err,
        "transformers_bf16_vs_f32": {
            "ppl": math.exp(nll_bf.mean().item()), "kld_mean": kl.mean().item(),
            "kld_err": kl.std().item() / math.sqrt(n), "kld_max": kl.max().item(),
            "top1_agreement": (f32.argmax(-1) == bf.argmax(-1)).double().mean().item()},
        "made_with": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                      "attn_implementation": "eager", "device": "cpu"},
    }
    with open(args.out, "w") as f:
        json.dump(ref, f, indent=1)
    print(json.dumps(ref, indent=1))


if __name__ == "__main__":
    main()
