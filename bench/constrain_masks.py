"""Token-mask cost per decoding step at the full Gemma 4 vocabulary, for the
20 schemas of tests/data/constrain/schemas.json.

For each schema: `gemma4 grammar --json-schema S -m TOKENIZER --bench N`
(N random walks start to end, uniform over the allowed tokens, 256-token
budget), timing every mask on one thread. Cold: the first N walks of a
freshly compiled grammar; warm: a second round on the same grammar (what a
server sees once a schema repeats: it keeps compiled grammars and their
masks across requests). Prints per schema and overall mean / p99 and writes
JSON lines to --out.

  python3 bench/constrain_masks.py [--tokenizer /work/shared/tokenizer/tokenizer.json] [--walks 20]
"""
import argparse
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "gemma4"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "build", "fixtures", "tokenizer", "tokenizer.json"))
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    schemas = json.load(open(os.path.join(ROOT, "tests", "data", "constrain", "schemas.json"), encoding="utf-8"))
    rows = []
    all_warm = []
    for s in schemas:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(s["schema"], f)
        # --bench runs the walks twice on one grammar when given "N,N": cold then warm
        times = f.name + ".times"
        r = subprocess.run([a.bin, "grammar", "--json-schema", f.name, "-m", a.tokenizer, "--bench",
                            "%d,%d" % (a.walks, a.walks), "--times", times], capture_output=True, text=True)
        all_warm.extend(float(x) for x in open(times))
        os.unlink(times)
        os.unlink(f.name)
        if r.returncode != 0:
            raise SystemExit("%s: %s" % (s["name"], r.stderr))
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        cold, warm = lines[0], lines[1]
        rows.append({"schema": s["name"], "cold": cold, "warm": warm})
        print("%-22s cold: mean %8.1f us p99 %8.1f us (%5d masks, %4d first visits)   warm: mean %7.1f us p99 %7.1f us"
              % (s["name"], cold["mean_us"], cold["p99_us"], cold["masks"], cold["cold_masks"], warm["mean_us"],
                 warm["p99_us"]), flush=True)
    for phase in ("cold", "warm"):
        total = sum(r[phase]["masks"] for r in rows)
        mean = sum(r[phase]["mean_us"] * r[phase]["masks"] for r in rows) / total
        # p99 over all masks is not recoverable from per-schema p99s; report the median and worst schema p99
        p99s = sorted(r[phase]["p99_us"] for r in rows)
        print("%s: %d masks, mean %.1f us (mask-weighted over the 20 schemas); per-schema p99: median %.1f us, worst %.1f us"
              % (phase, total, mean, p99s[len(p99s) // 2], p99s[-1]))
    all_warm.sort()
    print("warm, all %d masks of the 20 schemas together: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us"
          % (len(all_warm), sum(all_warm) / len(all_warm), all_warm[len(all_warm) // 2],
             all_warm[int(0.99 * (len(all_warm) - 1))], all_warm[-1]))
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
