#!/usr/bin/env python3
"""Prefix reuse through `gemma4 serve`: a 10-turn chat replayed against a
server with the prefix cache and one without (--no-prefix-cache), both on
the CPU's exact path (batch-invariant, so reuse must change no bit), over
the bundled model (models/tiny: sliding window 128, so the conversation
crosses it and the sliding layers' ring wraps).

Checked with the official `openai` client, every turn:
  - the reply (text, token ids, every log-probability) equals the cold
    server's;
  - usage.prompt_tokens_details.cached_tokens: 0 on the cold server; on the
    warm one, from turn 2 on, everything the previous turn computed that the
    new prompt repeats, down to the KV block (16 positions) it ends in: the
    server reprocesses only the turn's new tokens, plus under a block;
  - /metrics: gemma4_prefix_cache_reused_tokens_total is the sum of
    cached_tokens, gemma4_engine_prefill_tokens_total the prompt tokens less
    it, hits and misses counted.
Then the host-RAM tier (--cache-ram) on a server whose pool holds one
conversation: another conversation in between takes the pool, so the first
one's next turn reuses its KV from host RAM (cached_tokens as before, reply
equal to the cold server's, /metrics counting the blocks restored).
Needs (PyPI): openai.
"""
import os
import sys
import tempfile
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, summary  # noqa: E402
from serve_process import SANITIZER_REPORTS, ServeProcess  # noqa: E402

BIN = os.environ.get("G4_BIN", "build/gemma4")
SOURCE = os.environ.get("G4_SOURCE", ".")
TMP = os.environ.get("G4_TMP", tempfile.gettempdir())
MODEL = os.path.join(SOURCE, "models", "tiny")
BLOCK = 16  # the engine's KV block


class Server(ServeProcess):
    def __init__(self, name, *args):
        super().__init__(BIN, MODEL, ["--threads", "2", "--precision", "exact", "--quiet", *args],
                         os.path.join(TMP, "test_server_prefix_cache.%s.log" % name))
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def metrics(self):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self):
        rc, text, _ = super().stop()
        check(rc == 0, "server exit status %s" % rc, text[-2000:])
        for bad in SANITIZER_REPORTS:
            check(bad not in text, "server stderr reports " + bad, text[-3000:])


def ask(server, messages):
    r = server.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=24, temperature=0, logprobs=True, top_logprobs=5,
        extra_body={"return_token_ids": True})
    ch = r.choices[0]
    lps = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in ch.logprobs.content]
    extra = r.model_extra or {}
    details = r.usage.prompt_tokens_details
    return {
        "content": ch.message.content,
        "logprobs": lps,
        "prompt_ids": extra.get("prompt_token_ids") or [],
        "ids": (ch.model_extra or {}).get("token_ids") or [],
        "prompt_tokens": r.usage.prompt_tokens,
        "cached": details.cached_tokens if details is not None else None,
        "finish": ch.finish_reason,
    }


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


USER_TURNS = [
    "In the beginning what did God create?",
    "And what was upon the face of the deep?",
    "What did he call the light?",
    "Tell me of the firmament.",
    "What did the waters bring forth?",
    "Who was made in his image?",
    "What was given for meat?",
    "Tell me of the seventh day.",
    "What river went out of Eden?",
    "What was the name of the first man?",
]


def check_host_tier(cold, system):
    ram = Server("ram", "--cache-ram", "64", "--kv-blocks", "24", "--ctx", "384", "--max-seqs", "1")
    try:
        first = [{"role": "system", "content": system}, {"role": "user", "content": USER_TURNS[0]}]
        a = ask(ram, first)
        other = [{"role": "system", "content": ("Speak of the sea and of ships. " * 40).strip()},
                 {"role": "user", "content": USER_TURNS[1]}]
        ask(ram, other)  # takes the pool's blocks: the first conversation's go to host RAM
        second = first + [{"role": "assistant", "content": a["content"]}, {"role": "user", "content": USER_TURNS[2]}]
        w = ask(ram, second)
        c = ask(cold, second)
        check(w["content"] == c["content"] and w["ids"] == c["ids"] and w["logprobs"] == c["logprobs"],
              "host tier: the reply equals the cold server's")
        repeated = common_prefix(a["prompt_ids"] + a["ids"][:-1], w["prompt_ids"])
        expect = min(repeated, w["prompt_tokens"] - 1) // BLOCK * BLOCK
        m = ram.metrics()
        check(w["cached"] == expect and expect > 0,
              "host tier: cached_tokens %r = %d after another conversation took the pool" % (w["cached"], expect))
        check(m.get("gemma4_prefix_cache_evicted_blocks_total", 0) > 0 and
              m.get("gemma4_prefix_cache_host_restored_blocks_total", 0) > 0 and
              m.get("gemma4_prefix_cache_host_budget_bytes") == 64 << 20,
              "host tier metrics: evicted %r, restored %r, budget %r" % (
                  m.get("gemma4_prefix_cache_evicted_blocks_total"),
                  m.get("gemma4_prefix_cache_host_restored_blocks_total"),
                  m.get("gemma4_prefix_cache_host_budget_bytes")))
        print("  host tier: %d of %d prompt tokens reused after eviction, %d blocks restored from host RAM" %
              (w["cached"] or 0, w["prompt_tokens"], m.get("gemma4_prefix_cache_host_restored_blocks_total", 0)))
    finally:
        ram.stop()


def main():
    warm = Server("warm")
    cold = Server("cold", "--no-prefix-cache")
    system = ("Answer in the words of the King James Bible. " * 12).strip()
    messages = [{"role": "system", "content": system}]
    previous = None  # (prompt ids, reply ids) of the last turn
    sum_cached = sum_prompt = 0
    try:
        for turn, text in enumerate(USER_TURNS, 1):
            messages.append({"role": "user", "content": text})
            w = ask(warm, messages)
            c = ask(cold, messages)
            check(w["content"] == c["content"] and w["ids"] == c["ids"], "turn %d: reply equals the cold server's" % turn,
                  "%r\n%r" % (w["content"], c["content"]))
            check(w["logprobs"] == c["logprobs"], "turn %d: every log-probability equals the cold server's" % turn)
            check(w["prompt_ids"] == c["prompt_ids"] and len(w["prompt_ids"]) == w["prompt_tokens"],
                  "turn %d: the same prompt on both" % turn)
            check(c["cached"] == 0, "turn %d: the cold server reuses nothing (%r)" % (turn, c["cached"]))
            if previous is None:
                check(w["cached"] == 0, "turn 1: nothing cached yet (%r)" % w["cached"])
            else:
                computed = previous[0] + previous[1][:-1]  # the reply's last token was never run
                repeated = common_prefix(computed, w["prompt_ids"])
                expect = min(repeated, w["prompt_tokens"] - 1) // BLOCK * BLOCK
                check(w["cached"] == expect,
                      "turn %d: cached_tokens %r = the %d tokens of the last turn it repeats, down to a block (%d)"
                      % (turn, w["cached"], repeated, expect))
                new = w["prompt_tokens"] - repeated
                check(w["prompt_tokens"] - w["cached"] < new + BLOCK,
                      "turn %d: reprocessed %d tokens, the turn's new ones are %d"
                      % (turn, w["prompt_tokens"] - w["cached"], new))
                print("  turn %2d: prompt %4d tokens, %4d cached, %3d new, %3d reprocessed" %
                      (turn, w["prompt_tokens"], w["cached"] or 0, new, w["prompt_tokens"] - (w["cached"] or 0)))
            sum_cached += w["cached"] or 0
            sum_prompt += w["prompt_tokens"]
            previous = (w["prompt_ids"], w["ids"])
            messages.append({"role": "assistant", "content": w["content"]})
        m = warm.metrics()
        check(m.get("gemma4_prefix_cache_enabled") == 1, "warm server: prefix cache on")
        check(m.get("gemma4_prefix_cache_reused_tokens_total") == sum_cached,
              "metrics: reused tokens %r = sum of cached_tokens %d" % (m.get("gemma4_prefix_cache_reused_tokens_total"),
                                                                       sum_cached))
        check(m.get("gemma4_engine_prefill_tokens_total") == sum_prompt - sum_cached,
              "metrics: prefilled %r = prompts %d - cached %d" % (m.get("gemma4_engine_prefill_tokens_total"),
                                                                  sum_prompt, sum_cached))
        check(m.get("gemma4_prefix_cache_hits_total") == 9 and m.get("gemma4_prefix_cache_misses_total") == 1,
              "metrics: 9 hits, 1 miss (%r, %r)" % (m.get("gemma4_prefix_cache_hits_total"),
                                                   m.get("gemma4_prefix_cache_misses_total")))
        check(m.get("gemma4_prefix_cache_blocks", 0) > 0 and m.get("gemma4_prefix_cache_bytes", 0) > 0,
              "metrics: cached blocks and bytes")
        mc = cold.metrics()
        check(mc.get("gemma4_prefix_cache_enabled") == 0 and mc.get("gemma4_engine_prefill_tokens_total") == sum_prompt,
              "cold server: no cache, every prompt token prefilled")
        print("  10 turns: %d prompt tokens, %d reused (%.0f%%)" % (sum_prompt, sum_cached, 100.0 * sum_cached / sum_prompt))
        check_host_tier(cold, system)
    finally:
        warm.stop()
        cold.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
