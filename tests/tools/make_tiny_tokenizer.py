#!/usr/bin/env python3
"""Builds a small Gemma-4-style tokenizer.json for the 1024-token test
fixtures (tests/fixtures/*.tar.xz have no tokenizer of their own).

The file has the structure of the real Gemma tokenizer (BPE with byte
fallback, "▁" space normalizer, the same pre-tokenizer, decoder and <bos>
post-processor) and puts every special token at the id the fixtures and the
Gemma 4 chat format use:
  0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4 <mask>,
  46 <|tool>, 47 <tool|>, 48 <|tool_call>, 49 <tool_call|>,
  50 <|tool_response>, 51 <tool_response|>, 52 <|"|>, 98 <|think|>,
  100 <|channel>, 101 <channel|>, 105 <|turn>, 106 <turn|>   (real Gemma 4 ids)
  1000 <|image|>, 1001 <|image>, 1002 <image|>, 1003 <|audio|>,
  1004 <|audio>, 1005 <audio|>, 1006 <|video|>              (fixture config ids)
  238..493 <0x00>..<0xFF>                                      (as in Gemma)
Every other id below 1024 is a BPE piece learned by Hugging Face
`tokenizers`' BpeTrainer from the small English corpus below (deterministic:
one thread, fixed input), so any text encodes (unknown characters fall back
to bytes).

usage: python3 tests/tools/make_tiny_tokenizer.py [--out tests/data/tiny_tokenizer/tokenizer.json]
Requires: pip install tokenizers (made with 0.23.3).
"""
import argparse
import json
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # deterministic merges

from tokenizers import Tokenizer, models, normalizers, trainers  # noqa: E402

VOCAB = 1024
SPECIAL = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>",
    50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>",
    100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>",
    1000: "<|image|>", 1001: "<|image>", 1002: "<image|>", 1003: "<|audio|>",
    1004: "<|audio>", 1005: "<audio|>", 1006: "<|video|>",
}
NOT_SPECIAL = {4}  # <mask> is an added token but not "special" in Gemma's file
BYTE_BASE = 238

CORPUS = """\
The quick brown fox jumps over the lazy dog. Why is the sky blue? Sunlight is made of many colours,
and the air scatters the short blue waves more than the long red ones, so the whole sky glows blue.
Hello! How are you today? I am fine, thank you. What is the weather like in Paris, London and Tokyo?
It is sunny and warm in the morning, cloudy in the afternoon and it will rain in the evening.
Write a short poem about the sea. The sea is wide and the sea is deep; the waves roll in while the sailors sleep.
Count from one to ten: one, two, three, four, five, six, seven, eight, nine, ten. 0 1 2 3 4 5 6 7 8 9 10 100 2024.
The model answers the user. The user asks a question and the model thinks about it before it answers.
system user model assistant tool thought function call response image audio video
Describe this image. Transcribe this audio. What do you see in the picture? What do you hear?
def add(a, b):
    return a + b

for i in range(10):
    print(i, "hello", {"key": "value", "list": [1, 2, 3]})

A recipe for bread: mix flour, water, salt and yeast; knead the dough for ten minutes, let it rise
for an hour, shape the loaf and bake it in a hot oven until the crust is golden and sounds hollow.
The history of science is the story of people asking questions, testing ideas and sharing results.
Computers read numbers, letters and symbols as bytes; a tokenizer turns text into a list of token ids.
Please answer in one sentence. Explain it simply, as if to a child. Give three examples and a summary.
"""


def train():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    alphabet = [chr(c) for c in range(32, 127) if chr(c) != " "] + ["\u2581", "\n", "\t"]
    n_free = VOCAB - len(SPECIAL) - 256
    trainer = trainers.BpeTrainer(vocab_size=n_free, initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                  special_tokens=[], show_progress=False, min_frequency=2)
    lines = [line + "\n" for line in CORPUS.split("\n")]
    tok.train_from_iterator(lines * 4, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    return [p for p, _ in pieces][:n_free], model["merges"]


def build(pieces, merges):
    free = [i for i in range(VOCAB) if i not in SPECIAL and not (BYTE_BASE <= i < BYTE_BASE + 256)]
    assert len(pieces) <= len(free), (len(pieces), len(free))
    vocab = {}
    for i, s in SPECIAL.items():
        vocab[s] = i
    for b in range(256):
        vocab["<0x%02X>" % b] = BYTE_BASE + b
    for i, p in zip(free, pieces):
        vocab[p] = i
    # ids left over (when training found fewer pieces) get unused markers, as Gemma has
    for k, i in enumerate(free[len(pieces):]):
        vocab["<unused%d>" % k] = i
    known = set(vocab)
    merges = [m for m in merges if (m[0] if isinstance(m, list) else m.split(" ")[0]) in known]
    merges = [m if isinstance(m, list) else m.split(" ", 1) for m in merges]
    merges = [m for m in merges if m[0] + m[1] in known and m[0] in known and m[1] in known]
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": i not in NOT_SPECIAL} for i, s in sorted(SPECIAL.items())]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/tiny_tokenizer/tokenizer.json")
    args = ap.parse_args()
    pieces, merges = train()
    data = build(pieces, merges)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_str(text)  # the reference library must accept it
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB, tok.get_vocab_size(with_added_tokens=True)
    for s, i in [("<|turn>", 105), ("<turn|>", 106), ("<|image|>", 1000), ("<|video|>", 1006), ("<0x0A>", 248)]:
        assert tok.token_to_id(s) == i, s
    sample = "Hello, wörld! <|turn>user\nWhy is the sky blue?<turn|>\n 日本"
    assert tok.decode(tok.encode(sample).ids, skip_special_tokens=False) == "<bos>" + sample
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s: %d pieces, %d merges, %d bytes" % (args.out, len(pieces), len(data["model"]["merges"]),
                                                       len(text.encode())))


if __name__ == "__main__":
    main()
