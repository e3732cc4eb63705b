#!/usr/bin/env python3
"""Peak RSS of `gemma4 serve` under a storm of oversized and invalid requests.

Starts a server on a free loopback port (the `dense` fixture with the tiny
test tokenizer unless --model names a model folder), reads its peak RSS
(VmHWM) once it has answered one request, then sends a bounded number of
hostile requests from a few concurrent clients, each close to or over
--max-body: chunked and declared bodies over the limit (413), a chat message
and a /tokenize text of almost max-body bytes (far over the context: 400), a
list of ~max-body/2 tiny JSON values, deep nesting, an escaped NUL, invalid
UTF-8, a body that stops arriving. Reports the peak RSS before and after and
the growth as a multiple of --max-body. Loopback only; nothing else is
contacted.

  bench/server_rss_storm.py [--bin build/gemma4] [--model DIR] [--max-body BYTES]
                            [--requests N] [--clients C] [--json OUT]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "storm-key"


def fixture_model(root):
    """The dense fixture as a model folder (as tests/scripts/test_server_openai.py builds it)."""
    d = os.path.join(root, "dense")
    os.makedirs(d)
    src = os.path.join(os.environ.get("G4_FIXTURES", os.path.join(ROOT, "build", "fixtures")), "dense")
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        os.symlink(os.path.realpath(os.path.join(src, f)), os.path.join(d, f))
    data = os.path.join(ROOT, "tests", "data")
    shutil.copy(os.path.join(data, "tiny_tokenizer", "tokenizer.json"), d)
    shutil.copy(os.path.join(data, "chat", "templates", "gemma-4-31B-it.chat_template.jinja"),
                os.path.join(d, "chat_template.jinja"))
    return d


def rss_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(field + r":\s+(\d+)", f.read()).group(1))


def exchange(port, data, timeout=30):
    """Sends raw bytes; returns the answer's status (0: closed without one)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # answered and closed before the whole body went out (413)
        got = b""
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        m = re.match(rb"HTTP/1\.[01] (\d{3})", got)
        return int(m.group(1)) if m else 0
    except OSError:
        return 0
    finally:
        s.close()


def post(path, body, extra=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def storm_requests(max_body):
    """(name, raw request, allowed statuses), each near or over max_body."""
    near = max_body - 4096
    text = "word " * (near // 5 - 40)
    chunk = 1 << 16
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
               b"\r\nTransfer-Encoding: chunked\r\n\r\n" +
               (b"%x\r\n" % chunk + b"a" * chunk + b"\r\n") * (max_body // chunk + 2) + b"0\r\n\r\n")
    values = b'{"tokens": [' + b",".join([b"0"] * (near // 2 - 16)) + b"]}"
    return [
        ("chunked over the limit", chunked, {413}),
        ("declared over the limit", post(b"/v1/completions", b"x" * (max_body + 1)), {413}),
        ("chat message over the context", post(b"/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": text}]}).encode()), {400}),
        ("completion prompt over the context", post(b"/v1/completions", json.dumps(
            {"prompt": text, "max_tokens": 1}).encode()), {400}),
        ("/tokenize over the context", post(b"/tokenize", json.dumps({"prompt": text}).encode()), {400}),
        ("tiny values", post(b"/detokenize", values), {400}),
        ("deep nesting", post(b"/v1/completions", b"[" * (near // 2) + b"]" * (near // 2)), {400}),
        ("escaped NUL", post(b"/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "a" * (near - 200) + "\x00"}]}).encode()), {400}),
        ("invalid UTF-8", post(b"/v1/completions", b'{"prompt": "' + b"\xff" * (near - 20) + b'"}'), {400}),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "gemma4"))
    ap.add_argument("--model", help="model folder (default: the dense test fixture)")
    ap.add_argument("--max-body", type=int, default=16 << 20)
    ap.add_argument("--requests", type=int, default=90, help="hostile requests in all (bounded)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.requests > 1000:
        ap.error("--requests is bounded at 1000")
    tmp = tempfile.mkdtemp(prefix="g4storm-")
    proc = None
    try:
        model = args.model or fixture_model(tmp)
        proc = subprocess.Popen([args.bin, "serve", "-m", model, "--port", "0", "--threads", "1", "--quiet",
                                 "--api-key", KEY, "--max-body", str(args.max_body), "--request-timeout", "10"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        port = int(re.search(r"http://[^:]+:(\d+)", proc.stdout.readline()).group(1))
        ok = exchange(port, post(b"/v1/completions", b'{"prompt": "Hi", "max_tokens": 2}'))
        base_hwm, base_rss = rss_kb(proc.pid, "VmHWM"), rss_kb(proc.pid, "VmRSS")
        kinds = storm_requests(args.max_body)
        plan = [kinds[i % len(kinds)] for i in range(args.requests)]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            got = list(pool.map(lambda k: exchange(port, k[1]), plan))
        wall = time.monotonic() - t0
        bad = ["%s -> %d" % (k[0], st) for k, st in zip(plan, got) if st not in k[2]]
        after = exchange(port, post(b"/v1/completions", b'{"prompt": "Hi", "max_tokens": 2}'))
        peak = rss_kb(proc.pid, "VmHWM")
        growth = (peak - base_hwm) * 1024
        result = {"max_body": args.max_body, "requests": args.requests, "clients": args.clients,
                  "baseline_peak_rss_kb": base_hwm, "baseline_rss_kb": base_rss, "peak_rss_kb": peak,
                  "growth_kb": peak - base_hwm, "growth_over_max_body": round(growth / args.max_body, 2),
                  "wall_s": round(wall, 1), "unexpected": bad[:10], "served_before_after": [ok, after]}
        print("peak RSS %.1f MiB before the storm, %.1f MiB after %d hostile requests (%d clients, %.1f s): "
              "+%.1f MiB = %.2f x --max-body (%.0f MiB)" %
              (base_hwm / 1024, peak / 1024, args.requests, args.clients, wall, (peak - base_hwm) / 1024,
               growth / args.max_body, args.max_body / 1048576))
        if bad:
            print("unexpected answers: " + "; ".join(bad[:10]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0 if not bad and ok == 200 and after == 200 else 1
    finally:
        if proc and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
