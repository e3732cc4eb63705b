#!/usr/bin/env python3
"""Builds the tokenizer test corpus and its expected outputs with Hugging Face
`tokenizers` (the reference implementation), for both vendored tokenizer files.

usage: python3 tests/tools/make_tokenizer_corpus.py [--src /work/shared/tokenizer] [--out tests/data/tokenizer]

Writes, for each tokenizer file NAME (gemma3 = tokenizer.json, gemma4style =
tokenizer-gemma4-style.json), expected_NAME.jsonl with one JSON object a line:
  kind "text":   hex (UTF-8 of the text), ids (no special tokens added),
                 ids_special (add_special_tokens=True), ids_plain
                 (encode_special_tokens=True), decode / decode_skip (of ids,
                 skip_special_tokens False / True), roundtrip (decode == text)
  kind "bytes":  hex of bytes that are not valid UTF-8; ids = ids of
                 bytes.decode("utf-8", "replace")
  kind "decode": ids (random, in range), decode_hex, decode_skip_hex
  kind "long":   unit_hex, count (the text is unit * count), n_ids, ids_fnv
                 (FNV-1a 64 over the ids as little-endian uint32), decode_fnv
The JSONL files are packed into expected.tar.xz, and both tokenizer files
with reference_ids.jsonl into tokenizers.tar.xz (xz -9; the two files share
most bytes, so they pack to about 3.2 MB together). tests/CMakeLists.txt
unpacks both into <build>/fixtures/tokenizer/.
Requires: pip install tokenizers (tested with 0.23.3).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile

import tokenizers
from tokenizers import Tokenizer

FILES = {"gemma3": "tokenizer.json", "gemma4style": "tokenizer-gemma4-style.json"}


def fnv64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def fnv64_bytes(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def handwritten():
    t = []
    t += ["", " ", "  ", "a", "Hello world", "Hello, my dog is cute", " leading space", "trailing space ",
          "  two leading", "two trailing  ", "\n", "\n\n", "\r\n", "line1\r\nline2\r\n", "\t", "\t\t\tx",
          " \t \n \r\n  \t\t\n\n\n ", "mixed \t\tws\n \n", "a  b   c    d     e", "     ", "\u00a0nbsp\u00a0",
          "\u3000ideographic space\u3000", "\u2028line sep\u2029para sep", "zero\u200bwidth\u200cjoin\u200dx"]
    # scripts
    t += ["naïve café, Straße, Ærøskøbing, façade, coöperate, ÀÉÎÕÜ àéîõü ñ ç ğ ş ı İ",
          "Ελληνικά: Καλημέρα κόσμε, ΑΒΓΔ αβγδ ς",
          "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
          "Українська: їжак, ґанок, Київ. Български: щъркел.",
          "العربية: مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥",
          "עברית: שלום עולם, מה שלומך?",
          "हिन्दी: नमस्ते दुनिया, आप कैसे हैं? क्षत्रिय",
          "ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
          "中文：你好，世界！我们正在测试分词器。繁體字：臺灣",
          "日本語のテキスト：ひらがな、カタカナ、漢字。ｶﾀｶﾅ半角",
          "한국어: 안녕하세요 세계, 한글 자모 ㄱㄴㄷ",
          "Tiếng Việt: Xin chào thế giới, đường phố",
          "ქართული ენა, Հայերեն, አማርኛ, தமிழ், বাংলা, ગુજરાતી, ਪੰਜਾਬੀ, ಕನ್ನಡ, മലയാളം, සිංහල, မြန်မာ, ខ្មែរ, ລາວ, བོད་ཡིག",
          "NFC vs NFD: \u00e9 vs e\u0301, \u1e69 vs s\u0323\u0307, Å vs A\u030a",
          "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ combining overload"]
    # emoji
    t += ["Emoji: 😀👍🏽 👨\u200d👩\u200d👧\u200d👦 🇯🇵 ❤️", "👍👍🏻👍🏼👍🏽👍🏾👍🏿", "🏳️\u200d🌈 🏴\u200d☠️ 🧑\u200d💻 👩🏾\u200d🚀",
          "🇺🇸🇫🇷🇩🇪🇨🇳🇧🇷🇮🇳", "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f", "☺︎ ☺️ ✔ ✔️ #️⃣ 1️⃣",
          "😀" * 40]
    # code
    t += ["def f(x):\n    return x * 2\n\nprint(f(21))\n",
          "    indented code:\n    def f(x):\n        return x*2",
          "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
          "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
          "function add(a, b) { return a + b; } // JS\nconst x = `template ${add(1, 2)}`;",
          "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
          "<html><body><div class=\"x\"><p>Hi</p></div></body></html>",
          "<table><tr><td>a</td><td>b</td></tr></table> <h1>Title</h1> <code>x</code> <s>strike</s>",
          "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
          "x = [i**2 for i in range(10) if i % 2 == 0]  # comprehension",
          "if (a && b || !c) { x <<= 2; y >>= 3; z ^= ~w; }",
          "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
          "\\begin{equation} E = mc^2 \\end{equation}"]
    # numbers and urls
    t += ["numbers 1234567890 3.14159 1e-9", "0 00 000 0000 12345678901234567890", "-1.5e+10, 1_000_000, 0xFF, 0b1010",
          "$1,234.56 €99,99 ¥1000 £5", "2024-01-15T10:30:00Z", "+1 (555) 123-4567",
          "https://www.example.com/path/to/page?query=value&other=123#fragment",
          "http://localhost:8080/api/v1/users/42", "mailto:someone@example.org", "ftp://files.example.net/pub/file.tar.gz"]
    # special token literals (both real and fake), partial ones
    t += ["<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<bos>literal special <eos> <unused0> <image_soft_token> <start_of_image>",
          "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>", "<end_of_turn>",
          "<|turn>user\nHello<turn|>\n<|turn>model\n", "<|turn>", "<turn|>", "<|image|>", "<|image>", "<image|>",
          "<|audio|>", "<|video|>", "<|think|>", "<|channel>thought<channel|>", "<|tool_call>call:f{}<tool_call|>",
          "<|\"|>quoted<|\"|>", "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>",
          "<unused5>", "<unused99>", "<unused6241>", "<unused9999>", "<|tur", "<|turn", "turn|>", "<turn", "<unused", "<bos",
          "<<bos>>", "<bos><bos><eos>", "a<bos>b", " <bos> ", "<|image|><|image|><|image|>", "x<|image>y<image|>z",
          "<image_soft_token><image_soft_token>", "<start_of_image><end_of_image>", "<b>bold</b><i>it</i><u>u</u>",
          "▁", "▁▁", "▁▁▁x", "a▁b", "▁ ▁", "<0x41>", "<0xE2><0x82><0xAC>", "<0x0A>"]
    # rare and private use
    t += ["Rare bytes: \x00\x01 \ufffd \U0010ffff", "\x00", "\x7f\x1b[31mred\x1b[0m", "\ue000\ue001\uf8ff private",
          "\U000f0000\U00100000", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟘𝟙𝟚", "\U0001d11e music", "\u0600\u06dd arabic marks", "\ufeffBOM",
          "ᚠᛇᚻ runes", "𓀀𓀁 hieroglyphs", "\U00020000\U0002a6d6 CJK ext B", "\U000e0001\U000e0020 tags"]
    return t


def long_units():
    return [("a", 5000), (" ", 3000), ("\n", 2000), ("ab", 4000), ("日本", 2000), ("▁", 700), ("\t", 1000),
            ("x ", 3000), ("😀", 1500), ("<bos>", 500), ("<|turn>", 300), ("abc\n", 1000), ("0", 4000),
            ("a", 1000000), ("the quick brown fox ", 50000)]


def random_strings(rng, n):
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [" ", " ", "\t", "\n", "\r\n", "\u00a0", "\u3000"],
        [chr(c) for c in range(0xA0, 0x180)],
        [chr(c) for c in range(0x400, 0x460)],
        [chr(c) for c in range(0x370, 0x3CF) if c not in (0x378, 0x379, 0x380, 0x381, 0x382, 0x383, 0x38B, 0x38D, 0x3A2)],
        [chr(c) for c in range(0x4E00, 0x4E00 + 300)],
        [chr(c) for c in range(0xAC00, 0xAC00 + 200)],
        [chr(c) for c in range(0x0900, 0x0970)],
        [chr(c) for c in range(0x0E01, 0x0E3A)],
        [chr(c) for c in range(0x0600, 0x06FF)],
        [chr(c) for c in range(0x1F600, 0x1F64F)] + ["\U0001F3FB", "\U0001F3FF", "\u200d", "\ufe0f", "\U0001F1EF", "\U0001F1F5"],
        [chr(c) for c in range(0x300, 0x36F)],
        [chr(c) for c in range(0xE000, 0xE100)] + [chr(c) for c in (0x10FFFF, 0xFFFD, 0xFFFE, 0xE0001, 0x1D400, 0x2A6D6)],
        ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|image|>", "<unused5>", "<|tur", "<", ">", "|", "<start_of_turn>",
         "\n\n", "▁", "▁▁", "<0x41>", "<image_soft_token>"],
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 3)
        chosen = rng.sample(pools, k)
        length = rng.choice([1, 2, 3, 5, 8, 13, 30, 60, 120, 250])
        out.append("".join(rng.choice(rng.choice(chosen)) for _ in range(length)))
    return out


def random_words_text(rng, n_words):
    words = ["the", "of", "and", "to", "in", "tokenizer", "Gemma", "model", "inference", "naïve", "Straße", "Привет",
             "мир", "日本語", "中文", "한국어", "😀", "x=1;", "def", "return", "1234", "3.14", "https://a.b/c", "(", ")", ",",
             ".", "—", "«", "»", "\n", "  ", "\t"]
    return " ".join(rng.choice(words) for _ in range(n_words))


def invalid_byte_cases(rng):
    cases = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe2\x82", b"\xe2\x82\x41", b"\xed\xa0\x80",
             b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff\xfe", b"\xf0\x9f\x98",
             b"abc\x80def", b"\xe6\x97\xa5\xe6\x9c", b"ok \xe2\x82\xac \xe2\x82 end", b"\xc3\x28", b"\xa0\xa1",
             b"\xe1\x80\xc0", b"\xf8\x88\x80\x80\x80", b"<bos>\xff<eos>", b"\n\n\xfe\n", b"\xef\xbf\xbd\xef\xbf"]
    for _ in range(40):
        n = rng.randint(1, 40)
        cases.append(bytes(rng.choice([rng.randint(0, 255), rng.randint(0x80, 0xFF), ord("a"), 0x20, 0xE2, 0x82])
                           for _ in range(n)))
    return [c for c in cases if not _valid(c)]


def _valid(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def decode_id_cases(rng, tok, n):
    vocab = tok.get_vocab(with_added_tokens=True)
    size = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [vocab["<0x%02X>" % b] for b in range(256) if "<0x%02X>" % b in vocab]
    specials = [vocab[s] for s in ("<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|image|>", "<start_of_turn>",
                                   "<unused5>", "<image_soft_token>") if s in vocab]
    utf8_euro = [vocab["<0x%02X>" % b] for b in b"\xe2\x82\xac"]
    out = [[], utf8_euro, utf8_euro[:2], utf8_euro + utf8_euro[:1], utf8_euro[:1] + [vocab.get("a", 0)],
           [vocab.get("▁", 0)] * 3, [2, 2, 1]]
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.35:
                ids.append(rng.choice(byte_ids))
            elif r < 0.45:
                ids.append(rng.choice(specials))
            elif r < 0.55:
                ids.extend(utf8_euro[: rng.randint(1, 3)])
            else:
                ids.append(rng.randrange(size))
        out.append(ids)
    return out


def long_record(tok, unit, count):
    text = unit * count
    ids = tok.encode(text, add_special_tokens=False).ids
    dec = tok.decode(ids, skip_special_tokens=False)
    return {"kind": "long", "unit_hex": unit.encode("utf-8").hex(), "count": count, "n_ids": len(ids),
            "ids_fnv": fnv64(ids), "decode_fnv": fnv64_bytes(dec.encode("utf-8")), "roundtrip": dec == text}


def text_record(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    ids_special = tok.encode(text, add_special_tokens=True).ids
    tok.encode_special_tokens = True
    ids_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    dec = tok.decode(ids, skip_special_tokens=False)
    return {"kind": "text", "hex": text.encode("utf-8").hex(), "ids": ids, "ids_special": ids_special,
            "ids_plain": ids_plain, "decode_hex": dec.encode("utf-8").hex(),
            "decode_skip_hex": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex(),
            "roundtrip": dec == text}


# ---- small tokenizers exercising the parts Gemma's file does not use ----

VARIANT_TRAIN = [
    "the quick brown fox jumps over the lazy dog", "tokenizers split words into subword units",
    "hello world, hello there; the theory of everything", "naïve café Straße", "aaa bbb aaaa bbbb ab ba",
    "<s> start and </s> end markers", "numbers 123 4567 89", "  indented   text with   spaces  ",
]

VARIANT_TEXTS = [
    "", " ", "the quick brown fox", " the  quick   brown    fox ", "hello world", "theory", "thethethe",
    "naïve café", "unknown 日本語 chars", "a\tb\nc", "aaaa bbbb", "xyz q", "hello<s>world", "hello <s> world",
    "hello  <s>  world", "<s></s>", "<sep> <sep>", "<S>", "<a><b>", "<a><b><a>", "x<a>y", "  <a>  ", "HELLO",
    "te st", "▁the", "the▁quick", "  ", "ba ab", "é", "ü日", "🙂 hello", "\n\n\n", " \n \n ", "a\t\t b",
    "x \n\t y\t", "\t \t",
]


def variant_specs():
    split = lambda b, inv: {"type": "Split", "pattern": {"String": " "}, "behavior": b, "invert": inv}
    rep = lambda a, b: {"type": "Replace", "pattern": {"String": a}, "content": b}
    out = {}
    for b in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for inv in (False, True):
            out["split_%s%s" % (b, "_invert" if inv else "")] = {"pre_tokenizer": split(b, inv)}
    out["split_sequence"] = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split("MergedWithNext", False), {"type": "Split", "pattern": {"String": "th"}, "behavior": "Isolated", "invert": False}]}}
    out["whitespace_split"] = {"pre_tokenizer": {"type": "WhitespaceSplit"}}
    out["llama_style"] = {"byte_fallback": True, "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, rep(" ", "▁")]}, "decoder": {"type": "Sequence", "decoders": [
        rep("▁", " "), {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}
    out["strip_per_token"] = {"decoder": {"type": "Sequence", "decoders": [
        rep("a", " "), {"type": "Strip", "content": " ", "start": 2, "stop": 1}]}}
    out["fuse_then_strip_both"] = {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Fuse"}, {"type": "Strip", "content": "t", "start": 1, "stop": 1}]}}
    out["fuse_then_replace"] = {"decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, rep("th", "TH")]}}
    out["strip_normalizer"] = {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, rep("  ", " ")]}}
    out["added_flags"] = {
        "normalizer": rep(" ", "_"),
        "added": [{"content": "<a>", "special": False, "normalized": False, "lstrip": True, "rstrip": False},
                  {"content": "<a><b>", "special": True, "normalized": False, "lstrip": False, "rstrip": False},
                  {"content": "<b>", "special": False, "normalized": False, "lstrip": False, "rstrip": True},
                  {"content": "<sep>", "special": True, "normalized": False, "lstrip": True, "rstrip": True},
                  {"content": "hello", "special": False, "normalized": True, "lstrip": False, "rstrip": False},
                  {"content": "o w", "special": False, "normalized": True, "lstrip": False, "rstrip": False},
                  {"content": "xyz", "special": True, "normalized": True, "lstrip": False, "rstrip": False}]}
    out["whitespace_tokens"] = {
        "added": [{"content": "\n", "special": False, "normalized": False, "lstrip": True, "rstrip": True},
                  {"content": "\t", "special": False, "normalized": False, "lstrip": False, "rstrip": True}],
        "long": [("\n", 5000), ("\t", 5000), (" \n", 3000), ("a\t ", 3000)]}
    out["unk_fused"] = {"byte_fallback": False, "fuse_unk": True}
    out["unk_unfused"] = {"byte_fallback": False, "fuse_unk": False}
    out["unk_with_byte_fallback"] = {"byte_fallback": True, "fuse_unk": True, "partial_bytes": True}
    out["legacy_merges"] = {"legacy_merges": True}
    out["ignore_merges"] = {"ignore_merges": True}
    out["subword_prefix"] = {"train": {"continuing_subword_prefix": "##"}}
    out["word_suffix"] = {"train": {"end_of_word_suffix": "</w>"}}
    out["post_bert"] = {"post_processor": {"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]}}
    out["post_sequence"] = {"post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}},
                                                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                            "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}]}}
    out["no_decoder"] = {"decoder": None}
    return out


def build_variant(spec):
    from tokenizers import models, pre_tokenizers, trainers
    train = spec.get("train", {})
    model = models.BPE(unk_token="<unk>", **train)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False, **train)
    tok.train_from_iterator(VARIANT_TRAIN * 3, trainer)
    d = json.loads(tok.to_str())
    d["pre_tokenizer"] = spec.get("pre_tokenizer")
    d["normalizer"] = spec.get("normalizer")
    d["decoder"] = spec.get("decoder", {"type": "Fuse"})
    d["post_processor"] = spec.get("post_processor")
    m = d["model"]
    vocab = m["vocab"]
    if spec.get("byte_fallback"):
        m["byte_fallback"] = True
        for b in range(256):
            if spec.get("partial_bytes") and b >= 0xE0:
                continue  # some characters cannot fall back: they become <unk>
            vocab.setdefault("<0x%02X>" % b, len(vocab))
    else:
        m["byte_fallback"] = False
    m["fuse_unk"] = spec.get("fuse_unk", False)
    m["ignore_merges"] = spec.get("ignore_merges", False)
    if spec.get("legacy_merges"):
        m["merges"] = [" ".join(p) for p in m["merges"]]
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in ("<unk>", "<s>", "</s>")]
    next_id = len(vocab)
    for a in spec.get("added", []):
        entry = {"id": vocab.get(a["content"], next_id), "content": a["content"], "single_word": False,
                 "lstrip": a["lstrip"], "rstrip": a["rstrip"], "normalized": a["normalized"], "special": a["special"]}
        if a["content"] not in vocab:
            next_id += 1
        added.append(entry)
    d["added_tokens"] = added
    return d


def write_variants(stage, rng):
    """Writes variants/NAME.json and expected_variants.jsonl into stage; returns the member names."""
    os.makedirs(os.path.join(stage, "variants"), exist_ok=True)
    names = []
    with open(os.path.join(stage, "expected_variants.jsonl"), "w", encoding="utf-8") as f:
        for name, spec in variant_specs().items():
            d = build_variant(spec)
            text = json.dumps(d, ensure_ascii=False)
            rel = "variants/%s.json" % name
            with open(os.path.join(stage, rel), "w", encoding="utf-8") as vf:
                vf.write(text)
            names.append(rel)
            tok = Tokenizer.from_str(text)
            f.write(json.dumps({"kind": "variant", "name": name, "file": rel,
                                "vocab_size": tok.get_vocab_size(with_added_tokens=True)}) + "\n")
            # tokenizers panics in Strip when `stop` reaches past a token's start:
            # those cases have no reference and are left out
            for t in VARIANT_TEXTS:
                try:
                    f.write(json.dumps(text_record(tok, t)) + "\n")
                except BaseException:
                    pass
            size = tok.get_vocab_size(with_added_tokens=True)
            for _ in range(15):
                ids = [rng.randrange(size) for _ in range(rng.randint(1, 12))]
                try:
                    rec = {"kind": "decode", "ids": ids,
                           "decode_hex": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                           "decode_skip_hex": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex()}
                except BaseException:
                    continue
                f.write(json.dumps(rec) + "\n")
            for unit, count in spec.get("long", []):
                f.write(json.dumps(long_record(tok, unit, count)) + "\n")
    return names + ["expected_variants.jsonl"]



def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--src", default="/work/shared/tokenizer")
    ap.add_argument("--out", default=os.path.join(here, "..", "data", "tokenizer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    stage = tempfile.mkdtemp()

    rng = random.Random(20240607)
    texts = handwritten()
    texts += random_strings(rng, 700)
    texts += [random_words_text(rng, rng.randint(5, 300)) for _ in range(60)]
    byte_cases = invalid_byte_cases(rng)

    for name, fname in FILES.items():
        tok = Tokenizer.from_file(os.path.join(args.src, fname))
        drng = random.Random(7)
        path = os.path.join(stage, "expected_%s.jsonl" % name)
        with open(path, "w", encoding="utf-8") as f:
            header = {"kind": "header", "tokenizers_version": tokenizers.__version__, "file": fname,
                      "vocab_size": tok.get_vocab_size(with_added_tokens=True)}
            f.write(json.dumps(header) + "\n")
            for text in texts:
                f.write(json.dumps(text_record(tok, text)) + "\n")
            for b in byte_cases:
                repaired = b.decode("utf-8", "replace")
                f.write(json.dumps({"kind": "bytes", "hex": b.hex(),
                                    "ids": tok.encode(repaired, add_special_tokens=False).ids}) + "\n")
            for ids in decode_id_cases(drng, tok, 300):
                f.write(json.dumps({"kind": "decode", "ids": ids,
                                    "decode_hex": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                                    "decode_skip_hex": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex()})
                        + "\n")
            for unit, count in long_units():
                f.write(json.dumps(long_record(tok, unit, count)) + "\n")
        print("wrote", path)

    names = ["expected_%s.jsonl" % n for n in FILES] + write_variants(stage, random.Random(11))
    pack(os.path.join(args.out, "expected.tar.xz"), [(os.path.join(stage, n), n) for n in names])
    pack(os.path.join(args.out, "tokenizers.tar.xz"),
         [(os.path.join(args.src, n), n) for n in list(FILES.values()) + ["reference_ids.jsonl"]])
    shutil.rmtree(stage)


def pack(archive, members):
    """A reproducible tar.xz of (path, name) members under tokenizer/."""
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = os.path.join(tmp, "pack.tar")
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for path, name in members:
                info = tar.gettarinfo(path, arcname="tokenizer/" + name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                info.mtime = 0
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
        subprocess.run(["xz", "-9", "-e", "-f", "-T1", tar_path], check=True)
        os.replace(tar_path + ".xz", archive)
    print("wrote", archive, os.path.getsize(archive), "bytes")

if __name__ == "__main__":
    main()
