#!/usr/bin/env python3
"""Tokenizer benchmark: Hugging Face `tokenizers` (Python, one thread) against
gemma4.c's tokenizer on the same generated mixed text.

usage: python3 bench/tokenizer_bench.py TOKENIZER_JSON BUILD_DIR [--mb 4] [--repeats 5]

Writes the text to BUILD_DIR/tokenizer_bench.txt (seeded, so every run sees
the same bytes), times HF's load and encode (best of REPEATS, process CPU
time), runs BUILD_DIR/tokenizer_bench on the same file, and checks that both
produced the same ids (FNV-1a hash).
"""
import argparse
import os
import random
import subprocess
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

WORDS = {
    "en": "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
          "you were her she there been one all we their has would when if so no will more about can said up out time".split(),
    "fr": "le la les des une est dans pour qui avec pas sur être aussi très été après français élève où ça".split(),
    "de": "der die und das ist nicht mit sich auch für über können Straße schön größer müssen".split(),
    "ru": "и в не на я что тот быть с он а весь это как она по но они к у ты из мы за вы так же от сказать".split(),
    "zh": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明"),
    "ja": "これは 日本語の テキスト です。 ひらがな カタカナ 漢字 東京 大阪 ありがとう".split(),
    "ko": "안녕하세요 세계 한국어 텍스트 입니다 서울 감사합니다".split(),
    "ar": "مرحبا بالعالم هذا نص عربي للاختبار".split(),
    "emoji": ["😀", "👍🏽", "🇯🇵", "❤️", "👨\u200d👩\u200d👧", "🚀"],
}
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
        "const url = `https://example.com/api?q=${q}`;\n", "SELECT id, name FROM t WHERE x >= 10;\n"]


def make_text(mb, seed=1234):
    rng = random.Random(seed)
    parts, size = [], 0
    langs = list(WORDS)
    weights = [50, 8, 8, 10, 8, 5, 4, 3, 2, 4]  # per language, then code
    while size < mb * 1_000_000:
        kind = rng.choices(langs + ["code"], weights=weights)[0]
        if kind == "code":
            p = rng.choice(CODE)
        else:
            sep = "" if kind == "zh" else " "
            p = sep.join(rng.choice(WORDS[kind]) for _ in range(rng.randint(20, 120)))
            p += rng.choice([".\n", ".\n\n", "\n", ". "])
        parts.append(p)
        size += len(p.encode("utf-8"))
    return "".join(parts)


def fnv(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("build")
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    text = make_text(args.mb)
    path = os.path.join(args.build, "tokenizer_bench.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    nbytes = len(text.encode("utf-8"))

    load = []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        tok = Tokenizer.from_file(args.tokenizer)
        load.append((time.perf_counter() - t0, time.process_time() - c0))
    enc = []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        ids = tok.encode(text, add_special_tokens=False).ids
        enc.append((time.perf_counter() - t0, time.process_time() - c0))
    lw, lc = min(w for w, _ in load), min(c for _, c in load)
    ew, ec = min(w for w, _ in enc), min(c for _, c in enc)
    print("HF tokenizers: load best of %d: %.3f s wall, %.3f s CPU" % (args.repeats, lw, lc))
    print("HF tokenizers: encode %d bytes -> %d ids (fnv %s); best of %d: %.3f s wall, %.3f s CPU"
          % (nbytes, len(ids), fnv(ids), args.repeats, ew, ec))
    print("HF tokenizers: throughput (CPU time): %.2f MB/s, %.0f tokens/s" % (nbytes / 1e6 / ec, len(ids) / ec))
    out = subprocess.run([os.path.join(args.build, "tokenizer_bench"), args.tokenizer, path, str(args.repeats)],
                         check=True, capture_output=True, text=True).stdout
    print("".join("gemma4.c: " + line + "\n" for line in out.splitlines()), end="")
    print("same ids:", ("fnv %s" % fnv(ids)) in out)


if __name__ == "__main__":
    main()
