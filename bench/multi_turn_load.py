#!/usr/bin/env python3
"""Multi-turn load for `gemma4 serve`: what the prefix cache saves.

C conversations run at once, each T turns back to back. Every conversation
starts with the same S-token system prompt; turn t's prompt is turn t-1's
prompt + its reply + U new "user" tokens, so a server that reuses KV needs to
prefill only the new tokens (and the KV block they start in). Prompts are
token ids sent to /v1/completions (streaming, ignore_eos, return_token_ids),
so it runs on synthetic models without a tokenizer (`gemma4 serve
--synthetic e2b`) as on real ones; the ids are drawn from --id-range (keep
it clear of special and placeholder ids: the default suits the Gemma 4
tokenizers and models/tiny).

For each --url (e.g. one server with the cache, one with --no-prefix-cache)
it reports time to first token (client-side: request sent -> first token)
p50 / p99 / mean for turn 1 and for turns 2..T, the prompt tokens sent, the
cached tokens the server reported (usage.prompt_tokens_details
.cached_tokens) and the tokens it prefilled (/metrics
gemma4_engine_prefill_tokens_total, before and after). With two URLs it
prints the ratio of their mean TTFT over turns 2..T.

usage:
  python3 bench/multi_turn_load.py --url http://127.0.0.1:8080 [--url http://127.0.0.1:8081]
      [--conversations 32] [--turns 10] [--system-tokens 2048] [--user-tokens 64] [--reply-tokens 32]
      [--id-range 1100,4096] [--seed 1] [--json OUT]
Needs only the Python standard library.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request


def metrics(url):
    values = {}
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
    return values


def stream_turn(conn, prompt, reply_tokens):
    """One streaming completion; returns (ttft seconds, reply ids, cached tokens, prompt tokens)."""
    body = {"prompt": prompt, "max_tokens": reply_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:300]))
    ttft, ids, usage = None, [], None
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        obj = json.loads(line[6:])
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices", []):
            got = ch.get("token_ids") or []
            if got and ttft is None:
                ttft = time.monotonic() - t0
            ids.extend(got)
    details = (usage or {}).get("prompt_tokens_details") or {}
    return ttft, ids, details.get("cached_tokens", 0), (usage or {}).get("prompt_tokens", len(prompt))


def run(url, args):
    u = urllib.parse.urlparse(url)
    rng = random.Random(args.seed)
    lo, hi = args.id_range
    system = [2] + [rng.randrange(lo, hi) for _ in range(args.system_tokens)]
    users = [[[rng.randrange(lo, hi) for _ in range(args.user_tokens)] for _ in range(args.turns)]
             for _ in range(args.conversations)]
    results = []  # (conversation, turn, ttft, prompt tokens, cached)
    errors = []
    lock = threading.Lock()

    def conversation(c):
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=3600)
        prompt = list(system)
        try:
            for t in range(args.turns):
                prompt += users[c][t]
                ttft, reply, cached, n_prompt = stream_turn(conn, prompt, args.reply_tokens)
                with lock:
                    results.append((c, t, ttft, n_prompt, cached))
                prompt += reply
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append("conversation %d: %s" % (c, e))
        finally:
            conn.close()

    before = metrics(url)
    t0 = time.monotonic()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(args.conversations)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    after = metrics(url)

    def stats(xs):
        xs = sorted(x for x in xs if x is not None)
        if not xs:
            return {"n": 0}
        q = lambda p: xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]  # noqa: E731
        return {"n": len(xs), "p50": q(0.5), "p99": q(0.99), "mean": statistics.mean(xs)}

    first = stats([r[2] for r in results if r[1] == 0])
    later = stats([r[2] for r in results if r[1] > 0])
    key = "gemma4_engine_prefill_tokens_total"
    return {
        "url": url,
        "prefix_cache": after.get("gemma4_prefix_cache_enabled"),
        "conversations": args.conversations, "turns": args.turns, "system_tokens": args.system_tokens,
        "user_tokens": args.user_tokens, "reply_tokens": args.reply_tokens,
        "requests": len(results), "errors": errors, "wall_seconds": wall,
        "ttft_turn1": first, "ttft_turns_2_on": later,
        "prompt_tokens": sum(r[3] for r in results),
        "cached_tokens": sum(r[4] for r in results),
        "prefilled_tokens": after.get(key, 0) - before.get(key, 0),
    }


def show(r):
    def ms(s, k):
        return "%.0f" % (1000 * s[k]) if s.get("n") else "-"
    print("%s  (prefix cache %s): %d requests in %.1f s, %d errors" %
          (r["url"], {1.0: "on", 0.0: "off"}.get(r["prefix_cache"], "?"), r["requests"], r["wall_seconds"],
           len(r["errors"])))
    for e in r["errors"][:5]:
        print("  " + e)
    for name, s in (("turn 1", r["ttft_turn1"]), ("turns 2-%d" % r["turns"], r["ttft_turns_2_on"])):
        print("  TTFT %-10s p50 %6s ms  p99 %6s ms  mean %6s ms  (%d)" % (name, ms(s, "p50"), ms(s, "p99"),
                                                                          ms(s, "mean"), s.get("n", 0)))
    print("  prompt tokens %d, cached %d (%.0f%%), prefilled %d" %
          (r["prompt_tokens"], r["cached_tokens"], 100.0 * r["cached_tokens"] / max(1, r["prompt_tokens"]),
           r["prefilled_tokens"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", action="append", required=True)
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-tokens", type=int, default=2048)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--id-range", default="1100,4096")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.id_range = tuple(int(x) for x in args.id_range.split(","))
    out = []
    for url in args.url:
        r = run(url.rstrip("/"), args)
        show(r)
        out.append(r)
    if len(out) == 2 and all(r["ttft_turns_2_on"].get("n") for r in out):
        a, b = out[0]["ttft_turns_2_on"]["mean"], out[1]["ttft_turns_2_on"]["mean"]
        print("mean TTFT over turns 2-%d: %s / %s = %.2fx" % (args.turns, args.url[1], args.url[0], b / a))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if any(r["errors"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
