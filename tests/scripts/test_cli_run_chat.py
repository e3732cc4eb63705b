"""`gemma4 run` and `gemma4 chat` end to end on the bundled demo model.

The reference is independent of our chat and tokenizer code: the official
chat template rendered with jinja2 the way transformers' apply_chat_template
does (sandboxed, trim_blocks + lstrip_blocks), tokenised with Hugging Face
`tokenizers`, continued greedily by `gemma4 generate` and decoded by
`tokenizers` again. `run` must print exactly that text; `chat`, fed through
stdin, must print for its second turn exactly what the whole two-turn
conversation gives from scratch (so reusing the KV cache between turns
changes nothing), survive /reset, and report timing lines.
"""
import json
import os
import subprocess
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from checks import check, summary

BIN = os.environ["G4_BIN"]
MODEL = os.path.join(os.path.dirname(os.environ["G4_FIXTURES"]), "models", "tiny")
N = 12


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.globals["raise_exception"] = raise_exception
template = env.from_string(open(os.path.join(MODEL, "chat_template.jinja"), encoding="utf-8").read())
tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
stop_ids = {tok.token_to_id(t) for t in ("<turn|>", "<eos>", "<|tool_response>")}


def greedy_text(messages):
    prompt = template.render(messages=messages, add_generation_prompt=True, bos_token="<bos>")
    ids = tok.encode(prompt, add_special_tokens=False).ids
    out = subprocess.run([BIN, "generate", "-m", MODEL, "--ids", ",".join(map(str, ids)), "-n", str(N),
                          "--ignore-eos"], capture_output=True, text=True, check=True).stdout.strip()
    gen = [int(x) for x in out.split(",") if x]
    cut = [i for i, t in enumerate(gen) if t in stop_ids]
    gen = gen[:cut[0]] if cut else gen
    return tok.decode(gen, skip_special_tokens=True)


# run: one prompt
want = greedy_text([{"role": "user", "content": "Why is the sky blue?"}])
r = subprocess.run([BIN, "run", "-m", MODEL, "-p", "Why is the sky blue?", "-n", str(N), "--temp", "0"],
                   capture_output=True, text=True)
check(r.returncode == 0, "run exits 0 (%s)" % r.stderr.strip()[-200:])
check(r.stdout.rstrip("\n") == want, "run prints the greedy continuation of the templated prompt: %r vs %r"
      % (r.stdout.rstrip("\n"), want))
check("tok/s" in r.stderr and "[prompt" in r.stderr, "run prints a timing line")

# chat: two turns, a reset, a third turn
turn1, turn2 = "Hello, who are you?", "Tell me about the sea."
chat_in = "%s\n%s\n/reset\n%s\n" % (turn1, turn2, turn1)
r = subprocess.run([BIN, "chat", "-m", MODEL, "-n", str(N), "--temp", "0"], input=chat_in, capture_output=True,
                   text=True, timeout=300)
check(r.returncode == 0, "chat exits 0 at end of input (%s)" % r.stderr.strip()[-200:])
replies = r.stdout.split("\n")
first = greedy_text([{"role": "user", "content": turn1}])
check(len(replies) >= 3 and replies[0] == first, "chat turn 1 equals a fresh run: %r vs %r" % (replies[:1], first))
second = greedy_text([{"role": "user", "content": turn1}, {"role": "assistant", "content": first.strip()},
                      {"role": "user", "content": turn2}])
check(len(replies) >= 3 and replies[1] == second,
      "chat turn 2 (KV cache kept) equals the whole conversation from scratch: %r vs %r" % (replies[1:2], second))
check(len(replies) >= 3 and replies[2] == first, "after /reset the conversation starts over")
check(r.stderr.count("[prompt") == 3 and "(conversation cleared)" in r.stderr, "three timing lines and the reset")
# the second turn evaluated only the new part of the prompt
lines = [l for l in r.stderr.splitlines() if l.startswith("[prompt")]
n_new = int(lines[1].split()[1]) if len(lines) > 1 else -1
full = len(tok.encode(template.render(messages=[{"role": "user", "content": turn1},
                                               {"role": "assistant", "content": first.strip()},
                                               {"role": "user", "content": turn2}],
                                     add_generation_prompt=True, bos_token="<bos>"), add_special_tokens=False).ids)
check(0 < n_new < full, "turn 2 evaluated %d of its %d prompt tokens" % (n_new, full))

# errors: no model, bad model, missing image
r = subprocess.run([BIN, "run", "-p", "hi"], capture_output=True, text=True)
check(r.returncode == 2 and "gemma4 pull" in r.stderr, "no model: explains how to get one")
r = subprocess.run([BIN, "run", "-m", MODEL, "-p", "hi", "--image", "/nonexistent.png"], capture_output=True, text=True)
check(r.returncode != 0 and "nonexistent" in r.stderr, "missing image named in the error")
r = subprocess.run([BIN, "run", "-m", MODEL, "-p", "hi", "--image", BIN], capture_output=True, text=True)
check(r.returncode == 1 and "image" in r.stderr.lower(), "a non-image file is refused: " + r.stderr.strip()[-120:])

sys.exit(summary())
