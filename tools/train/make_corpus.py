#!/usr/bin/env python3
"""Splits the `bible` dump (get_corpus.sh) into the bundled model's texts.

Input lines: "Genesis 1" chapter headings, "  1 In the beginning ..." verses.
Output (in OUT): train.txt and heldout.txt, each chapter as its heading line
then one verse per line, chapters separated by a blank line. Every 40th
chapter (1,189 in all, so 30) is held out: the model never sees it, and the
perplexity tests read from it.
"""
import re
import sys

HELD_OUT_EVERY = 40


def chapters(path):
    chapter = None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            chapter["verses"].append(m.group(1).strip())
        else:
            if chapter:
                yield chapter
            chapter = {"title": line.strip(), "verses": []}
    if chapter:
        yield chapter


def main():
    src, out = sys.argv[1], sys.argv[2]
    train, held = [], []
    for i, ch in enumerate(chapters(src)):
        text = ch["title"] + "\n" + "\n".join(ch["verses"]) + "\n"
        (held if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).append(text)
    for name, part in (("train.txt", train), ("heldout.txt", held)):
        with open(f"{out}/{name}", "w", encoding="utf-8") as f:
            f.write("\n".join(part))
        print(f"{out}/{name}: {len(part)} chapters, {sum(map(len, part))} characters")


if __name__ == "__main__":
    main()
