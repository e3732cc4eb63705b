#!/usr/bin/env python3
"""One markdown table from llama_cpp_cpu.sh's runs.jsonl: per format pair and
round, gemma4.c's and llama.cpp's pp512 and tg128 tokens/s and their ratio
(gemma4.c / llama.cpp) within the round, each rate as mean ± sd of its
repetitions; the 1-minute load average when each run ended. Then each
engine's best round mean per format and their ratio."""
import json
import sys

PAIRS = [("bf16", "BF16"), ("mlx4", "Q4_0"), ("mlx8", "Q8_0")]


def llama_rates(records):
    pp = tg = None
    for r in records:
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            pp = (r["avg_ts"], r.get("stddev_ts", 0.0))
        elif r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            tg = (r["avg_ts"], r.get("stddev_ts", 0.0))
    return pp, tg


def main(path):
    runs = {}
    for line in open(path):
        if not line.strip():
            continue
        rec = json.loads(line)
        key = (rec["engine"], rec["format"], rec["round"])
        if rec["engine"] == "gemma4.c":
            res = rec["result"]
            runs[key] = ((res["pp_tps"], res["pp_sd"]), (res["tg_tps"], res["tg_sd"]), rec["load1"])
        else:
            pp, tg = llama_rates(rec["result"])
            runs[key] = (pp, tg, rec["load1"])
    rounds = sorted({k[2] for k in runs})
    print("| E2B | round | gemma4.c pp512 | llama.cpp pp512 | ratio | gemma4.c tg128 | llama.cpp tg128 | ratio | load (1 min) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for ours, theirs in PAIRS:
        for r in rounds:
            a, b = runs.get(("gemma4.c", ours, r)), runs.get(("llama.cpp", theirs, r))
            if not a or not b:
                continue
            print(f"| {ours} / {theirs} | {r} | {a[0][0]:.1f} ± {a[0][1]:.1f} | {b[0][0]:.1f} ± {b[0][1]:.1f} | "
                  f"{a[0][0] / b[0][0]:.2f}x | {a[1][0]:.2f} ± {a[1][1]:.2f} | {b[1][0]:.2f} ± {b[1][1]:.2f} | "
                  f"{a[1][0] / b[1][0]:.2f}x | {a[2]} / {b[2]} |")
    # each engine's best round: the least disturbed runs on a shared machine
    print()
    print("| E2B, best round of each | gemma4.c pp512 | llama.cpp pp512 | ratio | gemma4.c tg128 | llama.cpp tg128 | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for ours, theirs in PAIRS:
        a = [runs[k] for k in runs if k[0] == "gemma4.c" and k[1] == ours]
        b = [runs[k] for k in runs if k[0] == "llama.cpp" and k[1] == theirs and runs[k][0] and runs[k][1]]
        if not a or not b:
            continue
        app, bpp = max(x[0][0] for x in a), max(x[0][0] for x in b)
        atg, btg = max(x[1][0] for x in a), max(x[1][0] for x in b)
        print(f"| {ours} / {theirs} | {app:.1f} | {bpp:.1f} | {app / bpp:.2f}x | {atg:.2f} | {btg:.2f} | {atg / btg:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1])
