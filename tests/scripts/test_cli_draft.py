"""Speculative decoding from the command line (issue 29), on the bundled model
and its trained drafter, and on a transformers fixture pair.

`generate --draft` must print the ids transformers' greedy search gave
(dense-assistant's ref.json) and, on the bundled pair, the ids plain
`generate` prints; `run --draft --temp 0` must print exactly what plain
`run --temp 0` prints, with the drafts' acceptance on its timing line;
`run --draft` while sampling runs and repeats itself for one seed; a drafter that does not fit, a bad
--draft-max and a drafter given as the model fail with clear messages;
`info` describes a drafter alone and attached; `bench --draft` reports
tokens/s with and without drafting and that the ids agree.
"""
import json
import os
import subprocess

from checks import check, summary

BIN = os.environ["G4_BIN"]
FIX = os.environ["G4_FIXTURES"]
MODELS = os.path.join(os.path.dirname(FIX), "models")
MODEL, DRAFTER = os.path.join(MODELS, "tiny"), os.path.join(MODELS, "tiny-assistant")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True)


# a transformers pair: greedy ids through drafting = transformers' greedy ids
ref = json.load(open(os.path.join(FIX, "dense-assistant", "ref.json")))
ids = ",".join(map(str, ref["prompt_ids"]))
want = ",".join(map(str, ref["greedy_ids"]))
for k in (1, 4):
    r = run("generate", "-m", os.path.join(FIX, "dense"), "--ids", ids, "-n", str(len(ref["greedy_ids"])),
            "--ignore-eos", "--draft", os.path.join(FIX, "dense-assistant"), "--draft-max", str(k))
    check(r.returncode == 0, "generate --draft exits 0 (%s)" % r.stderr.strip()[-300:])
    check(r.stdout.strip() == want, "generate --draft-max %d = transformers' greedy ids: %s vs %s"
          % (k, r.stdout.strip(), want))
    check("draft %d:" % k in r.stderr, "generate --draft reports the acceptance: %r" % r.stderr.strip())

# the bundled pair: drafting changes no id and no byte of text
prompt_ids = "2,818,506,4034,1091,1114"
plain = run("generate", "-m", MODEL, "--ids", prompt_ids, "-n", "64", "--ignore-eos")
drafted = run("generate", "-m", MODEL, "--ids", prompt_ids, "-n", "64", "--ignore-eos", "--draft", DRAFTER)
check(plain.returncode == 0 and drafted.returncode == 0, "bundled generate runs (%s)" % drafted.stderr.strip()[-300:])
check(plain.stdout == drafted.stdout, "bundled generate: drafted ids = plain ids")

# --draft auto finds models/tiny-assistant beside models/tiny; a model with none is refused, naming what was looked for
auto = run("generate", "-m", MODEL, "--ids", prompt_ids, "-n", "64", "--ignore-eos", "--draft", "auto")
check(auto.returncode == 0 and auto.stdout == drafted.stdout and "tiny-assistant" in auto.stderr,
      "--draft auto uses the drafter beside the model (%s)" % auto.stderr.strip()[-300:])
none = run("generate", "-m", os.path.join(FIX, "moe"), "--ids", "2,5,7", "-n", "4", "--draft", "auto")
check(none.returncode != 0 and "no drafter beside" in none.stderr and "moe-assistant" in none.stderr,
      "--draft auto without a drafter beside the model fails clearly: %r" % none.stderr.strip()[-300:])

for prompt in ("And God said", "Who is the king of glory?"):
    plain = run("run", "-m", MODEL, "-p", prompt, "-n", "48", "--temp", "0")
    drafted = run("run", "-m", MODEL, "-p", prompt, "-n", "48", "--temp", "0", "--draft", DRAFTER, "--draft-max", "3")
    check(plain.returncode == 0 and drafted.returncode == 0, "run --draft exits 0 (%s)" % drafted.stderr[-300:])
    check(plain.stdout == drafted.stdout, "run --draft prints what plain run prints: %r vs %r"
          % (drafted.stdout, plain.stdout))
    check("draft 3:" in drafted.stderr and "accepted a round" in drafted.stderr and "by position" in drafted.stderr,
          "run --draft reports mean accepted length and per-position acceptance: %r" % drafted.stderr.strip())

# chat: two turns (the second reuses the cache the first left after its rollbacks)
turns = "Hello, who are you?\nTell me about the sea.\n"
plain = subprocess.run([BIN, "chat", "-m", MODEL, "--temp", "0", "-n", "40"], input=turns, capture_output=True,
                       text=True)
drafted = subprocess.run([BIN, "chat", "-m", MODEL, "--temp", "0", "-n", "40", "--draft", DRAFTER, "--draft-max", "3"],
                         input=turns, capture_output=True, text=True)
check(plain.returncode == 0 and drafted.returncode == 0 and plain.stdout.strip(),
      "chat --draft runs (%s)" % drafted.stderr[-300:])
check(plain.stdout == drafted.stdout, "chat --draft prints what plain chat prints over two turns")
check(drafted.stderr.count("draft 3:") == 2, "chat --draft reports the acceptance of each reply: %r" % drafted.stderr)

# sampling through the drafter (the model's default temperature 0.8): runs, reproducible for a seed
a = run("run", "-m", MODEL, "-p", "And God said", "-n", "32", "--seed", "7", "--draft", DRAFTER, "--draft-max", "2")
b = run("run", "-m", MODEL, "-p", "And God said", "-n", "32", "--seed", "7", "--draft", DRAFTER, "--draft-max", "2")
check(a.returncode == 0 and a.stdout.strip() and "draft 2:" in a.stderr, "run --draft while sampling: %r" % a.stderr)
check(a.stdout == b.stdout, "run --draft while sampling is reproducible for one seed")

# clear errors
r = run("generate", "-m", os.path.join(FIX, "e2b"), "--ids", "2,5,6", "-n", "4",
        "--draft", os.path.join(FIX, "dense-assistant"))
check(r.returncode != 0 and "does not fit" in r.stderr and "KV heads" in r.stderr,
      "a drafter for another target is refused, naming the mismatch: %r" % r.stderr.strip())
r = run("run", "-m", MODEL, "-p", "Hello", "--temp", "0", "--draft", DRAFTER, "--draft-max", "99")
check(r.returncode == 2 and "--draft-max" in r.stderr, "--draft-max 99 is refused: %r" % r.stderr.strip()[:200])
r = run("run", "-m", DRAFTER, "-p", "Hello")
check(r.returncode != 0 and "MTP drafter" in r.stderr, "a drafter as the model is refused: %r" % r.stderr.strip())

# info
r = run("info", "-m", DRAFTER)
check(r.returncode == 0 and "gemma4_assistant" in r.stdout and "centroid head" in r.stdout,
      "info describes a drafter: %r" % r.stdout)
r = run("info", "-m", MODEL, "--draft", DRAFTER)
check(r.returncode == 0 and "attached" in r.stdout, "info --draft shows the attached drafter: %r" % r.stdout[-300:])

# bench
r = run("bench", "-m", MODEL, "-p", "8", "-n", "32", "-r", "1", "--draft", DRAFTER, "--json")
lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
drafts = [l for l in lines if "draft_tps" in l]
check(r.returncode == 0 and len(drafts) == 1, "bench --draft --json prints one drafted line (%s)" % r.stderr[-300:])
if drafts:
    d = drafts[0]
    check(d["same_ids"] and d["plain_tps"] > 0 and d["draft_tps"] > 0 and d["draft_max"] == 1,
          "bench --draft: both rates, same ids, default draft 1: %r" % d)
    check(len(d["acceptance"]) == 1 and 1.0 <= d["tokens_per_target_pass"] <= 2.0,
          "bench --draft: per-position acceptance and tokens per pass: %r" % d)

summary()
