#!/usr/bin/env python3
"""Trains the bundled model's tokenizer: 4,096 ids in the layout of Gemma 4's
own tokenizer.json (BPE with byte fallback, "▁" for spaces, Gemma 4's special
tokens at their real ids below 107, byte tokens at Gemma's ids 238..493,
image/audio placeholders at 1000..1006), the free ids learned by Hugging Face
`tokenizers`' BpeTrainer from train.txt. The file layout is the one
tests/tools/make_tiny_tokenizer.py writes for the test fixtures; only the
vocabulary size and the training text differ.

usage: python3 tools/train/make_tokenizer.py .train/train.txt models/tiny/tokenizer.json
"""
import json
import os
import sys

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic merges
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "tools"))

import make_tiny_tokenizer as layout  # noqa: E402
from tokenizers import Tokenizer, models, normalizers, trainers  # noqa: E402

VOCAB = 4096


def train(path):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    alphabet = [chr(c) for c in range(32, 127) if chr(c) != " "] + ["\u2581", "\n"]
    n_free = VOCAB - len(layout.SPECIAL) - 256
    trainer = trainers.BpeTrainer(vocab_size=n_free, initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                  special_tokens=[], show_progress=False, min_frequency=2, max_token_length=16)
    lines = [line + "\n" for line in open(path, encoding="utf-8").read().split("\n")]
    tok.train_from_iterator(lines, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    return [p for p, _ in pieces][:n_free], model["merges"]


def main():
    src, out = sys.argv[1], sys.argv[2]
    layout.VOCAB = VOCAB
    pieces, merges = train(src)
    data = layout.build(pieces, merges)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_str(text)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB
    sample = "And God said, Let there be light. <|turn>user\nWhy?<turn|>\n 日本"
    assert tok.decode(tok.encode(sample).ids, skip_special_tokens=False) == "<bos>" + sample
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    ids = tok.encode(open(src, encoding="utf-8").read()).ids
    print(f"wrote {out}: {len(pieces)} pieces, {len(data['model']['merges'])} merges; train.txt = {len(ids)} tokens")


if __name__ == "__main__":
    main()
