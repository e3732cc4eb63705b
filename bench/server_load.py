#!/usr/bin/env python3
"""Load test for `gemma4 serve`: N concurrent clients, each sending streaming
requests back to back for a fixed time, every response checked.

Checks per response: HTTP 200, SSE framing (only "data: ..." lines and blank
separators), every chunk valid JSON of the right object type, exactly one
finish_reason, a usage chunk that agrees with the tokens received, and
"data: [DONE]" last. With --verify, the streamed text must also equal the
non-streaming greedy answer for the same prompt (fetched once before the
run): nothing garbled or mixed up between concurrent streams.

Reports requests, failures, generated tokens, aggregate tokens/s (generated
tokens / wall time, prefills and the last requests' tail included), time to
first token and time per output token percentiles, as text and (--json) as
JSON. With --warmup S it also reads the server's /metrics counter
gemma4_generation_tokens_total at S seconds and at the end of --duration:
the steady-state generation rate once every client is streaming.

usage:
  python3 bench/server_load.py --url http://127.0.0.1:8080 [--clients 64] [--duration 60]
      [--max-tokens 32] [--mode chat|completions] [--prompt-ids 2,17,33] [--verify]
      [--api-key KEY] [--model NAME] [--warmup S] [--json OUT] [--extra JSON]
--prompt-ids makes every client send that token-id prompt to /v1/completions
(for models without a tokenizer, e.g. `gemma4 serve --synthetic e2b`), with
ignore_eos so each request generates exactly --max-tokens tokens.
--extra merges a JSON object into every request body: constrained decoding's
cost is TPOT with --extra '{"response_format": ...}' against TPOT without.
Needs only the Python standard library.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Why is the sky blue?",
    "Write a short poem about the sea.",
    "Count from one to ten.",
    "What is the weather like in Paris?",
    "Explain bread in one sentence.",
    "Hello! How are you today?",
    "Give three examples of colours.",
    "Describe a quick brown fox.",
]


class Client:
    def __init__(self, url, api_key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        self.conn = None

    def post(self, path, body, timeout=600):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            self.conn.request("POST", path, body=json.dumps(body), headers=self.headers)
            return self.conn.getresponse()
        except (http.client.HTTPException, OSError):
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def make_request(args, i, stream):
    if args.prompt_ids:
        body = {"prompt": args.prompt_ids, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}  # without a tokenizer the ids mark each token's arrival
        path = "/v1/completions"
    elif args.mode == "completions":
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.max_tokens, "temperature": 0}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": args.max_tokens,
                "temperature": 0}
        path = "/v1/chat/completions"
    if args.model:
        body["model"] = args.model
    if args.extra:
        body.update(json.loads(args.extra))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return path, body


def text_of(kind, obj):
    ch = obj["choices"][0]
    if kind == "chat":
        return ch["message"]["content"] or ""
    return ch["text"]


def run_stream(client, args, i, expected):
    """One streaming request; returns (ok, problem, n_tokens, ttft, token_times)."""
    path, body = make_request(args, i, True)
    chat = path.endswith("chat/completions")
    t0 = time.monotonic()
    resp = client.post(path, body)
    if resp.status != 200:
        data = resp.read()
        return False, "HTTP %d: %s" % (resp.status, data[:200]), 0, None, []
    text, finish, usage, done, n_chunks = [], [], None, False, 0
    times = []
    problem = None
    expect_blank = False
    for raw in resp:
        line = raw.decode("utf-8")
        if expect_blank:
            if line not in ("\n", "\r\n"):
                problem = "no blank line after an event"
                break
            expect_blank = False
            continue
        if line.startswith(":"):
            expect_blank = True  # comment (keep-alive)
            continue
        if not line.startswith("data: ") or not line.endswith("\n"):
            problem = "bad SSE line %r" % line[:80]
            break
        payload = line[6:].rstrip("\n")
        expect_blank = True
        if done:
            problem = "data after [DONE]"
            break
        if payload == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            problem = "chunk is not JSON: %r" % payload[:80]
            break
        if "error" in obj:
            problem = "error event: %s" % obj["error"].get("message")
            break
        want = "chat.completion.chunk" if chat else "text_completion"
        if obj.get("object") != want:
            problem = "object %r" % obj.get("object")
            break
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices", []):
            piece = (ch.get("delta", {}).get("content") or "") if chat else ch.get("text", "")
            if piece or ch.get("token_ids") or (chat and ch.get("delta", {}).get("reasoning_content")):
                times.append(time.monotonic())
            text.append(piece)
            if ch.get("finish_reason"):
                finish.append(ch["finish_reason"])
        n_chunks += 1
    resp.read()
    if problem is None:
        if not done:
            problem = "stream ended without [DONE]"
        elif len(finish) != 1:
            problem = "%d finish reasons" % len(finish)
        elif usage is None:
            problem = "no usage chunk"
        elif expected is not None and "".join(text) != expected:
            problem = "text differs from the non-streaming answer: %r vs %r" % ("".join(text)[:60], expected[:60])
    n_tokens = usage["completion_tokens"] if usage else 0
    ttft = times[0] - t0 if times else None
    return problem is None, problem, n_tokens, ttft, times


def generated_tokens(url, api_key=None):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    # /metrics needs the key when the server has one (unless --metrics-public)
    conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + api_key} if api_key else {})
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith("gemma4_generation_tokens_total "):
            return float(line.split()[1])
    return 0.0


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--mode", choices=["chat", "completions"], default="chat")
    ap.add_argument("--prompt-ids", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--api-key")
    ap.add_argument("--model")
    ap.add_argument("--warmup", type=float, default=0)
    ap.add_argument("--json")
    ap.add_argument("--extra", help="JSON object merged into every request body (e.g. a response_format)")
    args = ap.parse_args(argv)

    expected = {}
    if args.verify:
        c = Client(args.url, args.api_key)
        n_prompts = 1 if args.prompt_ids else len(PROMPTS)
        for i in range(n_prompts):
            path, body = make_request(args, i, False)
            r = c.post(path, body)
            data = json.loads(r.read())
            if r.status != 200:
                print("reference request failed: %s" % data, file=sys.stderr)
                return 1
            expected[i] = text_of("chat" if path.endswith("chat/completions") else "completions", data)
        c.close()

    lock = threading.Lock()
    stats = {"ok": 0, "failed": 0, "tokens": 0, "ttft": [], "tpot": [], "problems": []}
    start = time.monotonic()
    deadline = start + args.duration

    def worker(w):
        client = Client(args.url, args.api_key)
        i = w
        while time.monotonic() < deadline:
            key = 0 if args.prompt_ids else i % len(PROMPTS)
            try:
                ok, problem, n, ttft, times = run_stream(client, args, i, expected.get(key))
            except (http.client.HTTPException, OSError) as e:
                ok, problem, n, ttft, times = False, "connection: %r" % e, 0, None, []
            with lock:
                stats["ok" if ok else "failed"] += 1
                stats["tokens"] += n
                if ttft is not None:
                    stats["ttft"].append(ttft)
                if len(times) > 1:
                    stats["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
                if problem and len(stats["problems"]) < 10:
                    stats["problems"].append(problem)
            i += args.clients
        client.close()

    samples = []

    def sample_metrics():
        for at in (start + args.warmup, deadline):
            time.sleep(max(0.0, at - time.monotonic()))
            samples.append((time.monotonic(), generated_tokens(args.url, args.api_key)))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.clients)]
    if args.warmup > 0:
        threads.append(threading.Thread(target=sample_metrics))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    steady = None
    if len(samples) == 2 and samples[1][0] > samples[0][0]:
        steady = (samples[1][1] - samples[0][1]) / (samples[1][0] - samples[0][0])
    result = {
        "clients": args.clients,
        "duration_s": round(wall, 2),
        "requests": stats["ok"] + stats["failed"],
        "failed": stats["failed"],
        "generated_tokens": stats["tokens"],
        "tokens_per_s": round(stats["tokens"] / wall, 2),
        "steady_tokens_per_s": round(steady, 3) if steady is not None else None,
        "ttft_p50_s": percentile(stats["ttft"], 0.5),
        "ttft_p95_s": percentile(stats["ttft"], 0.95),
        "tpot_p50_s": percentile(stats["tpot"], 0.5),
        "tpot_mean_s": statistics.mean(stats["tpot"]) if stats["tpot"] else None,
        "problems": stats["problems"],
    }
    print("clients %d, %.1f s: %d requests, %d failed, %d tokens, %.2f tokens/s aggregate; TTFT p50 %s s, "
          "p95 %s s; time per output token p50 %s s"
          % (args.clients, wall, result["requests"], result["failed"], result["generated_tokens"],
             result["tokens_per_s"], fmt(result["ttft_p50_s"]), fmt(result["ttft_p95_s"]), fmt(result["tpot_p50_s"])))
    if steady is not None:
        print("steady state (%.0f s to %.0f s): %.3f tokens/s generated" % (args.warmup, args.duration, steady))
    for p in stats["problems"]:
        print("  problem: %s" % p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if stats["failed"] == 0 and result["requests"] > 0 else 1


def fmt(x):
    return "-" if x is None else "%.4f" % x


if __name__ == "__main__":
    sys.exit(main())
