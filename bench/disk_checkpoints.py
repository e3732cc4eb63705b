#!/usr/bin/env python3
"""Peak RSS of loading and running full-size checkpoints from disk.

For each PRESET:FORMAT: `gemma4 synth` writes the checkpoint, its pages are
dropped from the page cache (posix_fadvise DONTNEED, so the first touch reads
the disk), `gemma4 info` loads it, `gemma4 bench --json` runs it, and the
folder is deleted (unless --keep). Checks the memory goal

    peak RSS <= 1.15 x checkpoint bytes on disk + KV cache + 200 MB

and prints one markdown row per model (and the raw JSON to --log).

usage: bench/disk_checkpoints.py --bin build/gemma4 --dir /tmp/ckpt e2b:bf16 e2b:mlx4 ...
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time


def drop_from_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout, time.time() - t0


def measure(args, preset, fmt):
    out = os.path.join(args.dir, f"{preset}-{fmt}")
    text, t_write = run([args.bin, "synth", "--preset", preset, "--format", fmt, "-o", out])
    st_path = os.path.join(out, "model.safetensors")
    disk = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    drop_from_page_cache(st_path)
    info, t_info = run([args.bin, "info", "-m", out, "--device", "cpu"])
    m = re.search(r"peak RSS ([\d.]+) MiB after loading \(now ([\d.]+) MiB private, ([\d.]+) MiB mapped", info)
    info_rss, info_private = float(m.group(1)) * 2**20, float(m.group(2)) * 2**20
    problems = re.search(r"problems\s+(.*)", info).group(1)
    drop_from_page_cache(st_path)
    bench, t_bench = run([args.bin, "bench", "-m", out, "--device", "cpu", "-p", str(args.p), "-n", str(args.n),
                          "-r", str(args.r), "--json"])
    b = json.loads(bench.strip().splitlines()[-1])
    if not args.keep:
        shutil.rmtree(out)
    peak = b["peak_rss_gib"] * 2**30
    bound = 1.15 * disk + b["kv_cache_bytes"] + 200e6
    r = dict(model=preset, format=fmt, disk_bytes=disk, write_s=t_write, info_peak_rss=info_rss,
             info_private=info_private, problems=problems, bench=b, bench_wall_s=t_bench, bound=bound,
             ok=peak <= bound)
    if args.log:
        with open(args.log, "a") as f:
            f.write(json.dumps(r) + "\n")
    return r


def row(r):
    b = r["bench"]
    gb = 1e9
    return (f"| {r['model']} | {r['format']} | {r['disk_bytes'] / gb:.2f} | {r['info_peak_rss'] / 2**20:.0f} MiB | "
            f"{b['tg_tps']:.2f} ± {b['tg_sd']:.2f} | {100 * b['tg_tps'] / b['tg_limit_tps']:.0f}% | "
            f"{b['pp_tps']:.1f} | {b['load_s']:.2f} s | {b['peak_rss_gib'] * 2**30 / gb:.2f} | "
            f"{b['rss_private_gib'] * 2**30 / gb:.2f} / {b['rss_file_gib'] * 2**30 / gb:.2f} | "
            f"{b['kv_cache_bytes'] / 1e6:.0f} MB | {r['bound'] / gb:.2f} | "
            f"{b['peak_rss_gib'] * 2**30 / r['disk_bytes']:.2f} | {'yes' if r['ok'] else 'NO'} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/gemma4")
    ap.add_argument("--dir", required=True, help="where checkpoints are written (deleted after each)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--log", help="append raw results (JSON lines) here")
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("models", nargs="+", help="PRESET:FORMAT, e.g. e2b:bf16 12b:mlx4")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print("| model | format | checkpoint GB | info: peak RSS after loading | decode t/s | of bandwidth limit | "
          "prefill t/s | load | bench peak RSS GB | private / file-mapped GB after the runs | KV cache | "
          "bound GB | peak / checkpoint | within bound |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for spec in args.models:
        preset, fmt = spec.split(":")
        print(row(measure(args, preset, fmt)), flush=True)


if __name__ == "__main__":
    main()
