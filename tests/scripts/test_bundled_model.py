"""The bundled model (models/tiny, trained on the King James Bible) speaks
English: what `./run.sh` runs with no arguments — a raw continuation, sampled
with the model's generation_config — is mostly dictionary words (of the words of four letters or more, since
short letter runs are words by chance).

The dictionary is Debian's wamerican word list (/usr/share/dict/american-english,
installed by scripts/install-deps.sh), which is independent of the model and
its training text (it holds 96.8% of the words of the held-back chapters).
The same check on the e2b fixture (random weights, the same architecture)
must fail, so it can tell a trained model from noise.
"""
import os
import re
import subprocess
import sys

from checks import check, summary

BIN = os.environ["G4_BIN"]
FIXTURES = os.environ["G4_FIXTURES"]
MODEL = os.path.join(os.path.dirname(FIXTURES), "models", "tiny")
SOURCE = os.environ["G4_SOURCE"]
TMP = os.environ.get("G4_TMP", "/tmp")
WORDS = set(w.strip().lower() for w in open("/usr/share/dict/american-english", encoding="utf-8", errors="replace"))


def run_sh_arguments():
    """The arguments ./run.sh passes to gemma4 when given none (its `set -- run ...` line)."""
    for line in open(os.path.join(SOURCE, "run.sh"), encoding="utf-8"):
        line = line.strip()
        if line.startswith("set -- run "):
            args = re.findall(r'"[^"]*"|\S+', line[len("set -- "):])
            return [a.strip('"') for a in args]
    raise SystemExit("run.sh has no default `set -- run ...` line")


def dictionary_share(text):
    """Share of the words of four letters or more that the word list holds (short ones match too easily)."""
    words = [w for w in re.findall(r"[A-Za-z]+", text) if len(w) >= 4]
    return (sum(w.lower() in WORDS for w in words) / len(words) if words else 0.0), len(words)


args = run_sh_arguments()
check("--raw" in args and "-m" in args, "run.sh continues a prompt with the bundled model", args)
args[args.index("-m") + 1] = MODEL
shares = []
for seed in ("1", "2", "3"):
    r = subprocess.run([BIN, *args, "--seed", seed, "--device", "cpu"], capture_output=True, text=True)
    check(r.returncode == 0 and "tok/s" in r.stderr, "run.sh's command runs (seed %s)" % seed, r.stderr[-300:])
    share, n = dictionary_share(r.stdout)
    shares.append(share)
    check(n >= 15, "seed %s: at least 15 words of 4+ letters (%d)" % (seed, n), r.stdout)
    check(share >= 0.8, "seed %s: %.0f%% of the words are dictionary words" % (seed, 100 * share), r.stdout)
print("dictionary words in the bundled model's output: %s" % ", ".join("%.3f" % s for s in shares))

# random weights, same architecture, the fixtures' tokenizer: the check must fail
rand_dir = os.path.join(TMP, "random_e2b_model")
os.makedirs(rand_dir, exist_ok=True)
for name, src in (("config.json", os.path.join(FIXTURES, "e2b", "config.json")),
                  ("model.safetensors", os.path.join(FIXTURES, "e2b", "model.safetensors")),
                  ("tokenizer.json", os.path.join(SOURCE, "tests", "data", "tiny_tokenizer", "tokenizer.json"))):
    dst = os.path.join(rand_dir, name)
    if not os.path.exists(dst):
        os.symlink(src, dst)
r = subprocess.run([BIN, "run", "-m", rand_dir, "--raw", "-p", args[args.index("-p") + 1], "-n", "64", "--seed", "1",
                    "--device", "cpu"], capture_output=True, text=True)
share, n = dictionary_share(r.stdout)
check(r.returncode == 0 and share < 0.5, "random weights: %.0f%% dictionary words (the check tells them apart)"
      % (100 * share), r.stdout[:300])
sys.exit(summary())
