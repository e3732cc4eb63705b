#!/usr/bin/env python3
"""`gemma4 tokenize` against the ids Hugging Face `tokenizers` gave for the
vendored corpus (fixtures/tokenizer/expected_gemma4style.jsonl)."""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, summary

BIN = os.environ.get("G4_BIN", "build/gemma4")
FIX = os.path.join(os.environ.get("G4_FIXTURES", "build/fixtures"), "tokenizer")
MODEL = os.path.join(FIX, "tokenizer-gemma4-style.json")


def run(*args, stdin=None):
    return subprocess.run([BIN, "tokenize", *args], capture_output=True, input=stdin)


records = []
with open(os.path.join(FIX, "expected_gemma4style.jsonl"), encoding="utf-8") as f:
    for line in f:
        rec = json.loads(line)
        if rec["kind"] == "text":
            text = bytes.fromhex(rec["hex"])
            if b"\n" not in text and b"\r" not in text and b"\0" not in text and text:
                records.append((text, rec))
records = records[:200]

with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as tmp:
    tmp.write(b"\n".join(t for t, _ in records) + b"\n")
r = run("-m", MODEL, "--file", tmp.name)
check(r.returncode == 0, "--file exit status %d: %s" % (r.returncode, r.stderr.decode(errors="replace")))
lines = r.stdout.decode().splitlines()
check(len(lines) == len(records), "--file printed %d lines for %d inputs" % (len(lines), len(records)))
for line, (text, rec) in zip(lines, records):
    check(json.loads(line) == rec["ids"], "--file ids of %r" % text[:60])
os.unlink(tmp.name)

for text, rec in records[:4]:  # each run loads the 14 MB file: keep them few
    arg = text.decode("utf-8")
    r2 = run("-m", MODEL, "--text", arg, "--add-special")
    check(r2.returncode == 0 and json.loads(r2.stdout) == rec["ids_special"], "--add-special ids of %r" % arg[:60])
    r3 = run("-m", MODEL, "--text", arg, "--plain")
    check(r3.returncode == 0 and json.loads(r3.stdout) == rec["ids_plain"], "--plain ids of %r" % arg[:60])

# a folder means folder/tokenizer.json (the Gemma 3 file); ids from reference_ids.jsonl, after <bos>
r = run("-m", FIX, "--text", "Hello world", "--add-special")
check(r.returncode == 0 and json.loads(r.stdout) == [2, 9259, 1902], "-m DIR loads DIR/tokenizer.json: %r" % r.stdout)

check(run("--help").returncode == 0 and b"usage" in run("--help").stdout, "--help")
check(run("-m", "/nonexistent", "--text", "x").returncode == 1, "a missing tokenizer exits with 1")
check(run("--text", "x").returncode == 2, "no -m exits with 2")
check(run("-m", MODEL).returncode == 2, "neither --text nor --file exits with 2")
sys.exit(summary())
