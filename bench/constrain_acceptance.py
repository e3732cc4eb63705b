"""Issue 31's acceptance run: N sampled replies (temperature 1) for each of
the 20 schemas of tests/data/constrain/schemas.json, on the bundled trained
model and on the random-weight e2b fixture, every one parsed with json and
validated with jsonschema (formats checked). Exits non-zero on any failure.

  python3 bench/constrain_acceptance.py [--n 1000] [--max-tokens 160] [--device cpu|cuda]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="replies per schema and model")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=64, help="requests in flight")
    ap.add_argument("--seed0", type=int, default=0, help="first seed (reply k of a schema has seed seed0 + k)")
    a = ap.parse_args()
    by_name = {s["name"]: s["schema"] for s in SCHEMAS}
    failed = 0
    for label, model in models():
        extra = ["--device", a.device] if a.device else []
        srv = Server(model, "--max-seqs", str(a.batch), *extra, name="acceptance_" + label)
        t = time.time()
        try:
            results = sample_schemas(srv, a.n, a.max_tokens, seed0=a.seed0, workers=a.batch)
        finally:
            srv.stop()
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
              % (label, good, total, len(per), a.n, a.max_tokens, time.time() - t))
        for name, (n, ok, fin) in per.items():
            print("  %-22s %5d/%d  finish %s" % (name, ok, n, dict(fin)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
