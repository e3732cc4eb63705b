#!/usr/bin/env python3
"""Reference values for tests/unit/test_sampler.c (tests/data/sampler/reference.json).

An independent pure-Python (float64) model of the sampler's documented
contract, so that "same seed -> same tokens on any machine" is pinned to a
definition rather than to the C code:

- the random stream: xoshiro256** (Blackman & Vigna) seeded with four
  splitmix64 outputs of the seed; uniform doubles = (u64 >> 11) * 2^-53.
  splitmix64(1234567) must give the published test vector
  6457827717110365317, 3203168211198807973, 9817491932198370423.
- the filters as transformers' warpers define them (TemperatureLogitsWarper,
  TopKLogitsWarper keeping ties at the k-th value, TopPLogitsWarper on the
  ascending cumulative softmax, MinPLogitsWarper), in that order;
- the draw: inverse CDF over the kept tokens in ascending id order, one
  uniform double per token.

Usage: python3 tests/tools/sampler_reference.py   (standard library only)
"""
import json
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "sampler", "reference.json")
M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Xoshiro256ss:
    def __init__(self, seed):
        self.s = []
        x = seed
        for _ in range(4):
            x, out = splitmix64(x)
            self.s.append(out)

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def next_double(self):
        return (self.next() >> 11) * 2.0 ** -53


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def kept_set(logits, temperature, top_k, top_p, min_p):
    """HF warpers in float64: returns {id: probability} of the final distribution."""
    v = len(logits)
    scores = [x / temperature for x in logits]
    alive = set(range(v))
    if 0 < top_k < v:
        kth = sorted(scores, reverse=True)[top_k - 1]
        alive = {i for i in alive if scores[i] >= kth}
    if top_p < 1.0:
        m = max(scores[i] for i in alive)
        w = {i: math.exp(scores[i] - m) for i in alive}
        z = sum(w.values())
        # descending by value, ties by id: keep while the mass above is < top_p
        order = sorted(alive, key=lambda i: (-scores[i], i))
        above, keep = 0.0, set()
        for i in order:
            if above >= top_p * z:
                break
            keep.add(i)
            above += w[i]
        alive = keep
    if min_p > 0.0:
        m = max(scores[i] for i in alive)
        alive = {i for i in alive if math.exp(scores[i] - m) >= min_p}
    m = max(scores[i] for i in alive)
    w = {i: math.exp(scores[i] - m) for i in sorted(alive)}
    z = sum(w.values())
    return {i: w[i] / z for i in sorted(alive)}


def draw_sequence(logits, params, seed, steps):
    rng = Xoshiro256ss(seed)
    probs = kept_set(logits, params["temperature"], params["top_k"], params["top_p"], params["min_p"])
    ids = sorted(probs)
    out = []
    for _ in range(steps):
        u = rng.next_double()
        cum, chosen = 0.0, ids[-1]
        for i in ids:
            cum += probs[i]
            if cum > u:
                chosen = i
                break
        out.append(chosen)
    return out


def main():
    sm, state = [], 1234567
    for _ in range(3):
        state, o = splitmix64(state)
        sm.append(str(o))
    assert sm == ["6457827717110365317", "3203168211198807973", "9817491932198370423"]
    streams = []
    for seed in (0, 42, 1234567, M64):
        r = Xoshiro256ss(seed)
        u64 = [str(r.next()) for _ in range(8)]
        doubles = [r.next_double() for _ in range(4)]
        streams.append({"seed": str(seed), "u64": u64, "doubles": doubles})
    # logits exactly representable in float32, so C and Python see the same numbers
    logits = [f32(x) for x in (1.25, -0.5, 2.75, 2.75, 0.0, 1.5, -3.0, 2.0, 0.875, 1.0, -1.25, 2.5)]
    draws = []
    for params in (
        {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
        {"temperature": 0.7, "top_k": 5, "top_p": 1.0, "min_p": 0.0},
        {"temperature": 1.0, "top_k": 64, "top_p": 0.95, "min_p": 0.0},
        {"temperature": 1.3, "top_k": 0, "top_p": 0.8, "min_p": 0.1},
        {"temperature": 2.0, "top_k": 8, "top_p": 0.9, "min_p": 0.05},
    ):
        seed = 20260101
        draws.append({"params": params, "seed": seed, "kept": kept_set(logits, **params),
                      "tokens": draw_sequence(logits, params, seed, 64)})
    for d in draws:
        d["kept"] = {str(k): v for k, v in d["kept"].items()}
    doc = {"generator": "tests/tools/sampler_reference.py", "splitmix64_1234567": sm, "streams": streams,
           "logits": logits, "draws": draws}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
