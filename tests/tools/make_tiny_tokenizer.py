"""Builds the 1024-token tokenizer of the bundled demo model (models/tiny).

The vendored fixtures are Gemma 4 models with a 1024-token vocabulary whose
multimodal placeholders sit at ids 1000-1006 and whose pad/eos/bos are 0/1/2.
This writes a Gemma-style tokenizer.json that fits them: the same pipeline as
Gemma's (space -> "▁" normaliser, BPE with byte fallback, Replace + ByteFallback
+ Fuse decoder), the Gemma 4 chat markers as special tokens, the 256 byte
tokens, and BPE merges learned from a small English text to fill the rest.
It is checked by loading it with Hugging Face `tokenizers` and round-tripping.

usage: python3 tests/tools/make_tiny_tokenizer.py models/tiny/tokenizer.json
"""
import json
import sys

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>",
           "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>",
           "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>']
MEDIA = ["<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>"]  # ids 1000..1006
VOCAB = 1024
FIRST_MEDIA = 1000

CORPUS = """The quick brown fox jumps over the lazy dog. A model reads text as tokens and writes text
one token at a time. Hello, how are you today? I am fine, thank you. What is the weather like?
It is sunny and warm. Please describe the image. This picture shows a red square and a green
rectangle on a colourful background. Listen to the audio and tell me what you hear. The sound
rises from a low tone to a high one. Why is the sky blue? Because air scatters blue light more
than red light. Write a short poem about the sea. The sea is wide, the sea is deep, the waves
go on and never sleep. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Code: def main(): return 0
int main(void) { return 0; } for i in range(10): print(i)
""" * 4


def main(out_path):
    lines = CORPUS.replace(" ", "\u2581").split("\n")
    n_learned = FIRST_MEDIA - len(SPECIAL) - 256
    trainer = trainers.BpeTrainer(vocab_size=n_learned, show_progress=False, special_tokens=[],
                                  initial_alphabet=[], limit_alphabet=200)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Split("\u2581", "merged_with_previous")
    learner.train_from_iterator(lines, trainer)
    learned = json.loads(learner.to_str())["model"]
    pieces = sorted(learned["vocab"].items(), key=lambda kv: kv[1])

    vocab = {}
    for i, t in enumerate(SPECIAL):
        vocab[t] = i
    for b in range(256):
        vocab["<0x%02X>" % b] = len(SPECIAL) + b
    for piece, _ in pieces:
        if piece not in vocab and len(vocab) < FIRST_MEDIA:
            vocab[piece] = len(vocab)
    while len(vocab) < FIRST_MEDIA:  # pad the learned range if the text was too small
        vocab["<unused%d>" % len(vocab)] = len(vocab)
    for i, t in enumerate(MEDIA):
        vocab[t] = FIRST_MEDIA + i
    for i in range(FIRST_MEDIA + len(MEDIA), VOCAB):
        vocab["<unused%d>" % i] = i
    merges = [m if isinstance(m, list) else m.split(" ") for m in learned["merges"]]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and (m[0] + m[1]) in vocab]

    unused = [t for t in vocab if t.startswith("<unused")]
    specials = SPECIAL + MEDIA + unused
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": sorted([{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True} for t in specials],
                               key=lambda a: a["id"]),
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    text = json.dumps(tok, ensure_ascii=False, separators=(",", ":"))
    check = Tokenizer.from_str(text)
    assert check.get_vocab_size() == VOCAB, check.get_vocab_size()
    for sample in ["Hello, how are you?", "ünïcödé 🙂 text", "<|turn>user\nhi<turn|>", "<|image|><|audio|>"]:
        ids = check.encode(sample, add_special_tokens=False).ids
        assert max(ids) < VOCAB
        assert check.decode(ids, skip_special_tokens=False) == sample, (sample, ids)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote", out_path, "with", len(merges), "merges")


if __name__ == "__main__":
    main(sys.argv[1])
