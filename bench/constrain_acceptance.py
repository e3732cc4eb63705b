"""Issue 31's acceptance run: N sampled replies (temperature 1) for each of
the 20 schemas of tests/data/constrain/schemas.json, on the bundled trained
model and on the random-weight e2b fixture, every one parsed with json and
validated with jsonschema (formats checked). Exits non-zero on any failure.

  python3 bench/constrain_acceptance.py [--n 1000] [--max-tokens 160] [--device cpu|cuda]

Where the machine that runs the server has no jsonschema (the GPU machine),
`--save FILE` writes the replies (JSON lines) instead of checking them, and
`--check FILE` later validates a saved file where jsonschema is installed.

(tests/scripts/test_server_constrain.py runs the same with one reply per
schema inside ctest.)
"""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scripts"))
from constrain_server import SCHEMAS, Server, models, sample_schemas, validate  # noqa: E402


def generate(a):
    """{model label: ([(name, seed, status, content, finish)], seconds)}"""
    out = {}
    for label, model in models():
        extra = ["--device", a.device] if a.device else []
        srv = Server(model, "--max-seqs", str(a.batch), *extra, name="acceptance_" + label)
        t = time.time()
        try:
            results = sample_schemas(srv, a.n, a.max_tokens, seed0=a.seed0, workers=a.batch)
        finally:
            srv.stop()
        out[label] = (results, time.time() - t)
        print("%s: %d replies in %.0f s" % (label, len(results), out[label][1]), flush=True)
    return out


def check(runs, n, max_tokens):
    by_name = {s["name"]: s["schema"] for s in SCHEMAS}
    failed = 0
    for label, (results, seconds) in runs.items():
        per = collections.defaultdict(lambda: [0, 0, collections.Counter()])
        for name, seed, st, content, finish in results:
            row = per[name]
            row[0] += 1
            why = "HTTP %d %s" % (st, content[:200]) if st != 200 else validate(by_name[name], content)
            if why is None:
                row[1] += 1
            else:
                failed += 1
                print("FAIL %s %s seed %d: %s\n  %r" % (label, name, seed, why, content[:400]), flush=True)
            row[2][finish] += 1
        total = sum(r[0] for r in per.values())
        good = sum(r[1] for r in per.values())
        print("%s: %d/%d replies parse and validate (%d schemas x %d, max_tokens %d, %.0f s)"
              % (label, good, total, len(per), n, max_tokens, seconds))
        for name, (k, ok, fin) in per.items():
            print("  %-22s %5d/%d  finish %s" % (name, ok, k, dict(fin)))
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="replies per schema and model")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=64, help="requests in flight")
    ap.add_argument("--seed0", type=int, default=0, help="first seed (reply k of a schema has seed seed0 + k)")
    ap.add_argument("--save", help="write the replies to this JSON-lines file instead of validating them")
    ap.add_argument("--check", help="validate the replies saved in this file (no server)")
    a = ap.parse_args()
    if a.check:
        runs, n, max_tokens = {}, 0, 0
        with open(a.check, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                runs[rec["model"]] = ([tuple(r) for r in rec["replies"]], rec["seconds"])
                n, max_tokens = rec["n"], rec["max_tokens"]
        return 1 if check(runs, n, max_tokens) else 0
    runs = generate(a)
    if a.save:
        with open(a.save, "w", encoding="utf-8") as f:
            for label, (results, seconds) in runs.items():
                f.write(json.dumps({"model": label, "n": a.n, "max_tokens": a.max_tokens, "seconds": seconds,
                                    "device": a.device, "replies": results}) + "\n")
        return 0
    return 1 if check(runs, a.n, a.max_tokens) else 0


if __name__ == "__main__":
    sys.exit(main())
