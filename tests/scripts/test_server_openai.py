#!/usr/bin/env python3
"""`gemma4 serve` driven by the official `openai` client (and raw HTTP).

Servers run on free loopback ports over the `dense` and `e2b` fixtures with
the tiny test tokenizer (tests/data/tiny_tokenizer) and the official chat
templates (tests/data/chat/templates). References:
  - prompts: jinja2 renders the vendored template as transformers does, the
    Hugging Face `tokenizers` library encodes it;
  - generated ids and log-probabilities: transformers' greedy ids and logits
    of the fixtures (ref.json / ref.safetensors), including the image
    (dense) and audio (e2b) prompts, through the completions `media`
    extension;
  - chat ids: `gemma4 generate` (the plain session loop, no batching);
  - completion text: `tokenizers` decoding of the returned ids.
Then: streaming framing and usage, stop strings, seeds, logprobs shape,
finish reasons, tokenize/detokenize, metrics format, auth, 16 concurrent
greedy requests equal to each alone, a client that disconnects, a full
queue (503), 1,000+ malformed or hostile requests (bad JSON, wrong types,
giant numbers, huge bodies, invalid base64, unknown model, protocol garbage,
slowloris headers and bodies) after which the server still serves, a short
64-client streaming load test, and graceful shutdown (finish, or cancel
after the grace period). Any sanitizer report in a server's stderr fails the
test (run it with G4_BIN pointing at an ASan build for the leak check).

G4_SERVER_TEST_PARTS=a,b,... runs only those parts (names in PARTS below).
Needs (PyPI): openai, tokenizers, jinja2, numpy, safetensors.
"""
import base64
import concurrent.futures
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import jinja2
import jinja2.sandbox
import numpy as np
import openai
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from serve_process import CRASH_REPORTS, ServeProcess

BIN = os.environ.get("G4_BIN", "build/gemma4")
FIXTURES = os.environ.get("G4_FIXTURES", "build/fixtures")
DATA = os.environ.get("G4_TEST_DATA", "tests/data")
SOURCE = os.environ.get("G4_SOURCE", ".")
TMP = os.environ.get("G4_TMP", tempfile.gettempdir())
KEY = "test-key-123"
TOKENIZER = os.path.join(DATA, "tiny_tokenizer", "tokenizer.json")
TEMPLATES = {"dense": "gemma-4-31B-it.chat_template.jinja", "e2b": "gemma-4-E2B-it.chat_template.jinja"}
STOP_IDS = {1, 50, 106}  # <eos>, <|tool_response>, <turn|> of the tiny tokenizer
MARKERS = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<turn|>", "<|tool_response>", "<eos>"]

failures = []
n_checks = 0


def check(cond, what):
    global n_checks
    n_checks += 1
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)
    return cond


HF = Tokenizer.from_file(TOKENIZER)


# ---- model folders, servers, HTTP ----------------------------------------------

def model_dir(root, fixture):
    d = os.path.join(root, fixture)
    os.makedirs(d)
    src = os.path.join(FIXTURES, fixture)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        os.symlink(os.path.realpath(os.path.join(src, f)), os.path.join(d, f))
    shutil.copy(TOKENIZER, os.path.join(d, "tokenizer.json"))
    shutil.copy(os.path.join(DATA, "chat", "templates", TEMPLATES[fixture]), os.path.join(d, "chat_template.jinja"))
    return d


RUNNING = []


class Server(ServeProcess):
    def __init__(self, model, *args, name="server"):
        # a float32 KV cache: the references (transformers, `gemma4 generate`, one request alone) are
        # float32, and bf16's rounding flips the random fixtures' greedy ids (test_kv_types.c)
        super().__init__(BIN, model, ["--threads", "1", "--kv-type", "f32", *args],
                         os.path.join(TMP, "test_server_openai.%s.log" % name))
        RUNNING.append(self)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        rc, text, killed = super().stop(sig, timeout)
        if killed:
            check(False, "server did not stop within %d s" % timeout)
        check(rc == 0, "server exit status %s" % rc)
        for bad in CRASH_REPORTS:
            check(bad not in text, "server stderr reports %s: %s" % (bad, text[text.find(bad) - 200:][:3000]))
        return rc, text


def request(port, method, path, body=None, headers=None, timeout=30):
    """(status, headers dict, body bytes); status 0 when the server closed the connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Authorization": "Bearer " + KEY}
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    if headers is not None:
        h = headers
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (ConnectionError, http.client.HTTPException, socket.timeout, OSError):
        return 0, {}, b""
    finally:
        conn.close()


def error_shape(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and isinstance(e["type"], str) and "param" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


def sse_events(body):
    """Splits a text/event-stream body; returns (payloads, well_formed)."""
    text = body.decode("utf-8")
    if not text.endswith("\n\n"):
        return [], False
    events = text[:-2].split("\n\n")
    payloads = []
    for ev in events:
        if ev.startswith(":"):
            continue
        if not ev.startswith("data: ") or "\n" in ev:
            return payloads, False
        payloads.append(ev[6:])
    return payloads, True


# ---- references ----------------------------------------------------------------

def render(fixture, messages, enable_thinking=False, tools=None):
    """The chat template as transformers' apply_chat_template renders it."""
    with open(os.path.join(DATA, "chat", "templates", TEMPLATES[fixture]), encoding="utf-8") as f:
        text = f.read()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(text).render(messages=messages, tools=tools, add_generation_prompt=True,
                                        enable_thinking=enable_thinking, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>")


def expand(text, image_tokens=0, audio_tokens=0):
    text = text.replace("<|image|>", "<|image>" + "<|image|>" * image_tokens + "<image|>")
    return text.replace("<|audio|>", "<|audio>" + "<|audio|>" * audio_tokens + "<audio|>")


def ref_prompt_ids(fixture, messages, **kw):
    return HF.encode(expand(render(fixture, messages), **kw), add_special_tokens=False).ids


def greedy_generate(model, ids, n):
    """`gemma4 generate` (the session loop), cut after the first stop id."""
    out = subprocess.run([BIN, "generate", "-m", model, "--ids", ",".join(map(str, ids)), "-n", str(n),
                          "--ignore-eos", "--threads", "1"], capture_output=True, text=True, check=True)
    gen = [int(x) for x in out.stdout.strip().split(",")]
    for i, t in enumerate(gen):
        if t in STOP_IDS:
            return gen[:i + 1]
    return gen


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def top_error(top, want, k):
    """Completions' top_logprobs ({token text: logprob}; tokens with the same
    text share one key) against the reference's k most likely tokens."""
    ref = {}
    for t in np.argsort(-want, kind="stable")[:k]:
        ref.setdefault(HF.decode([int(t)], skip_special_tokens=False), []).append(want[t])
    if set(top) != set(ref):
        return float("inf")
    return max(min(abs(v - r) for r in ref[text]) for text, v in top.items())


def data_uri(path, mime):
    with open(path, "rb") as f:
        return "data:%s;base64,%s" % (mime, base64.b64encode(f.read()).decode())


def b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


# ---- parts -----------------------------------------------------------------------

def part_basics(s, client, model):
    st, h, body = request(s.port, "GET", "/health", headers={})
    check(st == 200 and json.loads(body)["status"] == "ok", "health: %d %r" % (st, body))
    models = client.models.list()
    check([m.id for m in models.data] == ["dense"], "models: %r" % [m.id for m in models.data])
    st, _, body = request(s.port, "GET", "/v1/models/dense")
    check(st == 200 and json.loads(body)["id"] == "dense", "model by name")
    st, _, body = request(s.port, "GET", "/v1/models/other")
    check(st == 404 and error_shape(body), "unknown model by name: %d" % st)
    # authentication
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY},
                    {"Authorization": "Bearer"}):
        st, h, body = request(s.port, "GET", "/v1/models", headers=headers)
        check(st == 401 and error_shape(body) and json.loads(body)["error"]["code"] == "invalid_api_key"
              and h.get("www-authenticate") == "Bearer", "auth %r: %d %r" % (headers, st, body))
    try:
        openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "AuthenticationError 401")
    # tokenize / detokenize against Hugging Face tokenizers
    for text in ["Hello world", "Why is the sky blue?", "日本語 and émoji 🎉", "<|turn>user\nHi<turn|>",
                 "  spaces\n\ttabs  ", ""]:
        st, _, body = request(s.port, "POST", "/tokenize", {"prompt": text})
        want = HF.encode(text).ids
        got = json.loads(body) if st == 200 else {}
        check(st == 200 and got["tokens"] == want and got["count"] == len(want), "tokenize %r: %r vs %r" %
              (text, got, want))
        st, _, body = request(s.port, "POST", "/detokenize", {"tokens": want})
        check(st == 200 and json.loads(body)["prompt"] == HF.decode(want, skip_special_tokens=False),
              "detokenize %r" % text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    st, _, body = request(s.port, "POST", "/tokenize", {"messages": messages})
    check(st == 200 and json.loads(body)["tokens"] == ref_prompt_ids("dense", messages),
          "tokenize messages = jinja2 template + tokenizers")
    st, _, body = request(s.port, "POST", "/detokenize", {"tokens": [1, 5000]})
    check(st == 400 and error_shape(body), "detokenize out of range: %d" % st)


def part_chat(s, client, model):
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    prompt = ref_prompt_ids("dense", messages)
    r = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=12,
                                       extra_body={"return_token_ids": True})
    d = r.model_dump()
    want = greedy_generate(model, prompt, 12)
    check(d["prompt_token_ids"] == prompt, "chat prompt ids = template + tokenizers")
    check(d["choices"][0]["token_ids"] == want, "chat ids %r = gemma4 generate %r" % (d["choices"][0]["token_ids"], want))
    check(r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want) and
          r.usage.total_tokens == len(prompt) + len(want), "chat usage %r" % r.usage)
    finish = "stop" if want[-1] in STOP_IDS else "length"
    check(r.choices[0].finish_reason == finish, "chat finish %s, want %s" % (r.choices[0].finish_reason, finish))
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.choices[0].message.role == "assistant",
          "chat object shape")
    # the same request streamed
    chunks = list(client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    check(chunks[0].choices[0].delta.role == "assistant", "first chunk names the role")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(text == (r.choices[0].message.content or ""), "streamed %r = non-streamed %r" %
          (text, r.choices[0].message.content))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finishes == [finish], "one finish reason: %r" % finishes)
    check(not chunks[-1].choices and chunks[-1].usage and chunks[-1].usage.completion_tokens == len(want) and
          chunks[-1].usage.prompt_tokens == len(prompt), "usage chunk last")
    check(all(c.usage is None for c in chunks[:-1]), "usage null before the last chunk")
    check(len({c.id for c in chunks}) == 1, "one id per stream")
    # raw framing
    st, h, body = request(s.port, "POST", "/v1/chat/completions",
                          {"messages": messages, "max_tokens": 5, "temperature": 0, "stream": True})
    payloads, ok = sse_events(body)
    check(st == 200 and h.get("content-type") == "text/event-stream" and ok and payloads and
          payloads[-1] == "[DONE]" and h.get("transfer-encoding") == "chunked", "SSE framing: %r" % body[:300])
    check(all(json.loads(p)["object"] == "chat.completion.chunk" for p in payloads[:-1]), "chunk objects")
    # thinking: the template's thinking mode is on and reasoning is split out
    r = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=8,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True},
                                                   "return_token_ids": True})
    tp = HF.encode(render("dense", messages, enable_thinking=True), add_special_tokens=False).ids
    check(r.model_dump()["prompt_token_ids"] == tp, "thinking prompt = template with enable_thinking")
    # logprobs
    r = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=6, logprobs=True,
                                       top_logprobs=3)
    lp = r.choices[0].logprobs.content
    n = r.usage.completion_tokens
    check(len(lp) == n or (r.choices[0].finish_reason == "stop" and len(lp) >= n - 1),
          "one logprob entry per token (%d, %d)" % (len(lp), n))
    for e in lp:
        # a byte-fallback token's text alone is U+FFFD; its bytes are its own byte (<0xC3> -> [195])
        own = (lambda t: list(t.token.encode()) == t.bytes or (t.token == "\ufffd" and len(t.bytes) == 1 and
                                                              t.bytes[0] >= 0x80))
        check(e.logprob <= 0 and own(e) and all(own(t) for t in e.top_logprobs) and len(e.top_logprobs) == 3 and
              e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob and
              e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6,
              "logprob entry shape %r" % e)
    # seeds
    kw = dict(model="dense", messages=messages, temperature=1.0, top_p=1.0, max_tokens=16,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    a = client.chat.completions.create(seed=1234, **kw).model_dump()["choices"][0]["token_ids"]
    b = client.chat.completions.create(seed=1234, **kw).model_dump()["choices"][0]["token_ids"]
    c = client.chat.completions.create(seed=987654321, **kw).model_dump()["choices"][0]["token_ids"]
    check(a == b, "same seed, same tokens")
    check(a != c, "another seed, other tokens")
    # stop strings in chat
    base = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=24,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    if check(len(base) >= 6, "chat text long enough for a stop string: %r" % base):
        stop = base[4:6]
        cut = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=24,
                                             stop=[stop], extra_body={"ignore_eos": True})
        check(cut.choices[0].message.content == base[:base.find(stop)].strip() and
              cut.choices[0].finish_reason == "stop", "chat stop %r: %r" % (stop, cut.choices[0].message.content))


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Forecast days"}}, "required": ["city"]}}}


def part_tools(s, client, model):
    """Tools and a tool-call round trip reach the template as transformers renders them."""
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
                {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 21 C"}]
    # transformers takes the arguments as a dict; the OpenAI API sends JSON text
    as_dicts = json.loads(json.dumps(messages))
    as_dicts[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "days": 2}
    want = HF.encode(render("dense", as_dicts, tools=[WEATHER]), add_special_tokens=False).ids
    r = client.chat.completions.create(model="dense", messages=messages, tools=[WEATHER], temperature=0, max_tokens=4,
                                       extra_body={"return_token_ids": True})
    check(r.model_dump()["prompt_token_ids"] == want, "tools prompt = template with tools")
    st, _, body = request(s.port, "POST", "/tokenize", {"messages": messages, "tools": [WEATHER]})
    check(st == 200 and json.loads(body)["tokens"] == want, "tokenize with tools")
    r = client.chat.completions.create(model="dense", messages=messages, tools=[WEATHER], tool_choice="none",
                                       temperature=0, max_tokens=4, extra_body={"return_token_ids": True})
    want = HF.encode(render("dense", as_dicts), add_special_tokens=False).ids
    check(r.model_dump()["prompt_token_ids"] == want, "tool_choice none: no tools in the prompt")
    # forced calls (constrained decoding, test_server_constrain.py checks them in depth): tool_calls come back
    for forced in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        st, _, body = request(s.port, "POST", "/v1/chat/completions", {"messages": messages, "tools": [WEATHER],
                                                                        "tool_choice": forced, "max_tokens": 80})
        calls = json.loads(body)["choices"][0]["message"].get("tool_calls") if st == 200 else None
        check(calls and all(c["function"]["name"] == "get_weather" and
                            isinstance(json.loads(c["function"]["arguments"]).get("city"), str) for c in calls),
              "tool_choice %r: calls of get_weather with a city: %s" % (forced, body[:500]))
    st, _, body = request(s.port, "POST", "/v1/chat/completions", {"messages": messages, "tools": [WEATHER],
                                                                    "tool_choice": "sometimes", "max_tokens": 2})
    check(st == 400 and error_shape(body), "an unknown tool_choice is refused")


def part_completions(s, client, model):
    ref = json.load(open(os.path.join(FIXTURES, "dense", "ref.json")))
    logits = load_file(os.path.join(FIXTURES, "dense", "ref.safetensors"))["text.logits"]
    all_ids, greedy = ref["text"]["all_ids"], ref["text"]["greedy_ids"]
    P = len(all_ids) - len(greedy)
    r = client.completions.create(model="dense", prompt=all_ids[:P], max_tokens=len(greedy), temperature=0,
                                  logprobs=5, extra_body={"ignore_eos": True, "return_token_ids": True})
    d = r.model_dump()["choices"][0]
    check(d["token_ids"] == greedy, "completion ids = transformers' greedy ids")
    check(d["prompt_token_ids"] == all_ids[:P], "completion prompt ids echoed")
    lps = r.choices[0].logprobs
    worst = 0.0
    for i, t in enumerate(greedy):
        want = log_softmax(logits[P - 1 + i])
        worst = max(worst, abs(lps.token_logprobs[i] - want[t]), top_error(lps.top_logprobs[i], want, 5))
    check(worst < 2e-3, "completion logprobs vs transformers: max error %.2g" % worst)
    check(r.choices[0].text == HF.decode(greedy, skip_special_tokens=True), "completion text = tokenizers decode")
    check(lps.text_offset[0] == 0 and lps.tokens[0] == HF.decode([greedy[0]], skip_special_tokens=False),
          "completion logprob tokens and offsets")
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == len(greedy) and
          r.usage.prompt_tokens == P, "completion usage %r" % r.usage)
    # text prompt: <bos> first, as the tokenizer's post-processor does
    r = client.completions.create(model="dense", prompt="The quick brown fox", max_tokens=3, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    check(r.model_dump()["choices"][0]["prompt_token_ids"] == HF.encode("The quick brown fox").ids,
          "completion text prompt ids")
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3, "max_tokens -> length")
    # streaming equals non-streaming
    kw = dict(model="dense", prompt="The quick brown fox", max_tokens=24, temperature=0,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    check(whole == streamed, "completion stream %r = %r" % (streamed, whole))
    # stop strings
    if check(len(whole) >= 8, "completion long enough for stop strings: %r" % whole):
        for stop in (whole[3:5], [whole[6:8], whole[2:3]]):
            stops = stop if isinstance(stop, list) else [stop]
            cut = min(whole.find(x) for x in stops)
            r = client.completions.create(stop=stop, **kw)
            check(r.choices[0].text == whole[:cut] and r.choices[0].finish_reason == "stop",
                  "stop %r: %r, want %r" % (stop, r.choices[0].text, whole[:cut]))
            streamed = "".join(c.choices[0].text for c in client.completions.create(stop=stop, stream=True, **kw)
                               if c.choices)
            check(streamed == whole[:cut], "streamed stop %r: %r" % (stop, streamed))


def part_image(s, client, model, media_dir):
    img = os.path.join(FIXTURES, "dense", "image.png")
    uri = data_uri(img, "image/png")
    ref = json.load(open(os.path.join(FIXTURES, "dense", "ref.json")))
    n_soft = ref["image"]["num_soft_tokens"]
    content = [{"type": "text", "text": "Describe this image."},
               {"type": "image_url", "image_url": {"url": uri, "detail": "low"}}]
    messages = [{"role": "user", "content": content}]
    r = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=6,
                                       extra_body={"return_token_ids": True})
    want = ref_prompt_ids("dense", messages, image_tokens=n_soft)
    check(r.model_dump()["prompt_token_ids"] == want and r.usage.prompt_tokens == len(want),
          "image prompt: %d tokens, want %d" % (r.usage.prompt_tokens, len(want)))
    ids_uri = r.model_dump()["choices"][0]["token_ids"]
    # the same image as a local file inside --allowed-media-dir
    local = os.path.join(media_dir, "image.png")
    content[1] = {"type": "image_url", "image_url": {"url": "file://" + local, "detail": "low"}}
    r = client.chat.completions.create(model="dense", messages=messages, temperature=0, max_tokens=6,
                                       extra_body={"return_token_ids": True})
    check(r.model_dump()["choices"][0]["token_ids"] == ids_uri, "local file = data: URI")
    content[1] = {"type": "image_url", "image_url": {"url": "/etc/passwd"}}
    st, _, body = request(s.port, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    check(st == 403 and error_shape(body), "a file outside the media folder: %d" % st)
    # against transformers: the fixture's image prompt and logits
    logits = load_file(os.path.join(FIXTURES, "dense", "ref.safetensors"))["image.logits"]
    r = client.completions.create(model="dense", prompt=ref["image"]["prompt_ids"], max_tokens=1, temperature=0,
                                  logprobs=5, extra_body={"ignore_eos": True, "return_token_ids": True, "media": [
                                      {"type": "image_url", "image_url": {"url": uri, "detail": "low"}}]})
    want = log_softmax(logits[-1])
    tok = r.model_dump()["choices"][0]["token_ids"][0]
    err = max(abs(r.choices[0].logprobs.token_logprobs[0] - want[tok]),
              top_error(r.choices[0].logprobs.top_logprobs[0], want, 5))
    check(tok == int(np.argmax(logits[-1])) and err < 2e-3, "image logprobs vs transformers: token %d, error %.2g" %
          (tok, err))


def part_audio(root):
    model = model_dir(root, "e2b")
    s = Server(model, "--api-key", KEY, name="e2b")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        wav = os.path.join(FIXTURES, "e2b", "audio.wav")
        ref = json.load(open(os.path.join(FIXTURES, "e2b", "ref.json")))
        n_soft = ref["audio"]["num_soft_tokens"]
        messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": b64(wav),
                                                                                          "format": "wav"}},
                                                 {"type": "text", "text": "Transcribe this audio."}]}]
        r = client.chat.completions.create(model="e2b", messages=messages, temperature=0, max_tokens=6,
                                           extra_body={"return_token_ids": True})
        want = ref_prompt_ids("e2b", messages, audio_tokens=n_soft)
        check(r.model_dump()["prompt_token_ids"] == want, "audio prompt: %d tokens, want %d" %
              (r.usage.prompt_tokens, len(want)))
        # the fixture's own audio logits come from transformers 5.17's broken eager audio mask;
        # tests/data/audio holds transformers' logits with the correct (sdpa) mask
        logits = load_file(os.path.join(DATA, "audio", "e2b_audio_sdpa.safetensors"))["audio.logits"]
        r = client.completions.create(model="e2b", prompt=ref["audio"]["prompt_ids"], max_tokens=1, temperature=0,
                                      logprobs=5, extra_body={"ignore_eos": True, "return_token_ids": True, "media": [
                                          {"type": "input_audio", "input_audio": {"data": b64(wav)}}]})
        want = log_softmax(logits[-1])
        tok = r.model_dump()["choices"][0]["token_ids"][0]
        err = max(abs(r.choices[0].logprobs.token_logprobs[0] - want[tok]),
                  top_error(r.choices[0].logprobs.top_logprobs[0], want, 5))
        check(tok == int(np.argmax(logits[-1])) and err < 2e-3,
              "audio logprobs vs transformers: token %d, error %.2g" % (tok, err))
        st, _, body = request(s.port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "@@@not base64@@@"}}]}], "max_tokens": 2})
        check(st == 400 and error_shape(body), "invalid base64 audio: %d" % st)
    finally:
        s.stop()


def metric_values(port):
    st, h, body = request(port, "GET", "/metrics")  # with the key: /metrics is behind it
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return st, h, body.decode(), values


def settled(port, timeout=10.0):
    """Metrics once nothing runs any more (cancelled sequences leave at the engine's next step)."""
    t0 = time.monotonic()
    while True:
        st, h, text, v = metric_values(port)
        idle = v["gemma4_requests_running"] == 0 and v["gemma4_requests_waiting"] == 0 and \
            v["gemma4_kv_cache_blocks_used"] == 0
        if idle or time.monotonic() - t0 > timeout:
            return st, h, text, v
        time.sleep(0.01)


def part_metrics(s, client, model):
    client.completions.create(model="dense", prompt="Hi", max_tokens=2)
    st, h, text, values = settled(s.port)
    check(st == 200 and h.get("content-type", "").startswith("text/plain; version=0.0.4"), "metrics content type")
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? '
                        r'(-?[0-9.]+(e[+-]?[0-9]+)?|\+Inf|NaN)$')
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            check(kind in ("counter", "gauge", "histogram"), "metric type %s" % kind)
            typed.add(name)
        elif line.startswith("# HELP "):
            continue
        else:
            check(bool(sample.match(line)), "metric line format: %r" % line)
            base = re.sub(r"(_bucket|_sum|_count)?(\{.*\})?$", "", line.split(" ")[0])
            check(base in typed or re.sub(r"(_bucket|_sum|_count)$", "", base) in typed, "metric typed: %r" % line)
    for hist in ("gemma4_time_to_first_token_seconds", "gemma4_time_per_output_token_seconds",
                 "gemma4_request_duration_seconds"):
        buckets = [v for k, v in values.items() if k.startswith(hist + "_bucket")]
        check(buckets == sorted(buckets) and buckets[-1] == values[hist + "_count"] and values[hist + "_count"] > 0,
              "histogram %s cumulative" % hist)
    check(values["gemma4_generation_tokens_total"] > 0 and values["gemma4_prompt_tokens_total"] > 0, "token counters")
    check(values.get('gemma4_requests_total{endpoint="completions",code="200"}', 0) > 0, "request counter")
    check(values["gemma4_kv_cache_blocks_total"] > 0 and values["gemma4_kv_cache_usage_ratio"] == 0, "KV gauges")
    # the pool's bytes: every full-layer block at the per-token cost, plus the sliding rings
    check(values["gemma4_kv_cache_element_bits"] == 32 and values["gemma4_kv_cache_block_size"] == 16 and
          values["gemma4_kv_cache_bytes"] >= values["gemma4_kv_cache_blocks_total"] * 16 *
          values["gemma4_kv_cache_full_bytes_per_token"] > 0, "KV bytes gauges")


def part_batching(s, client, model):
    prompts = ["Prompt number %d: %s" % (i, " ".join(["word%d" % (i * 7 + k) for k in range(i % 5 + 1)]))
               for i in range(16)]

    def run(p):
        r = client.completions.create(model="dense", prompt=p, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        return r.model_dump()["choices"][0]["token_ids"]

    alone = [run(p) for p in prompts]
    steps0 = metric_values(s.port)[3]["gemma4_engine_steps_total"]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(run, prompts))
    steps = metric_values(s.port)[3]["gemma4_engine_steps_total"] - steps0
    same = sum(a == b for a, b in zip(alone, together))
    check(same == 16, "16 concurrent greedy requests: %d of 16 equal to alone" % same)
    check(len({tuple(a) for a in alone}) > 1, "different prompts, different outputs")
    check(steps < 16 * 17 / 2, "the 16 requests shared forward passes (%d steps for 16 x 17)" % steps)


def part_disconnect(s, client, model):
    _, _, _, before = metric_values(s.port)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    body = json.dumps({"prompt": "Hello", "max_tokens": 400, "stream": True, "ignore_eos": True,
                       "temperature": 0})
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: "
                  "application/json\r\nContent-Length: %d\r\n\r\n%s" % (KEY, len(body), body)).encode())
    got = b""
    while b"data: " not in got:
        got += sock.recv(4096)
    sock.close()
    t0 = time.monotonic()
    freed = False
    while time.monotonic() - t0 < 10:
        _, _, _, v = metric_values(s.port)
        if v["gemma4_requests_running"] == 0 and v["gemma4_kv_cache_blocks_used"] == 0:
            freed = True
            break
        time.sleep(0.02)
    _, _, _, after = metric_values(s.port)
    check(freed, "a client that disconnects frees its sequence (%.2f s)" % (time.monotonic() - t0))
    check(after["gemma4_client_disconnects_total"] == before["gemma4_client_disconnects_total"] + 1,
          "the disconnect is counted")
    check(after["gemma4_generation_tokens_total"] - before["gemma4_generation_tokens_total"] < 400,
          "generation stopped early")


def part_queue(root):
    model = os.path.join(root, "dense")
    # exact path: the slower kernels keep the long streams below running past the 1 s grace (the fast CPU path
    # writes 3000 tokens of this model in about a second)
    s = Server(model, "--max-seqs", "1", "--max-queue", "1", "--shutdown-grace", "1", "--idle-timeout", "2",
               "--precision", "exact", name="queue")
    try:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        body = json.dumps({"prompt": "Hello", "max_tokens": 3000, "stream": True, "ignore_eos": True})
        sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" %
                      (len(body), body)).encode())
        got = b""
        while b"data: " not in got:
            got += sock.recv(4096)
        waiting = {}

        def second():  # a stream that waits longer than the idle timeout for its first token
            waiting["r"] = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3,
                                                                        "stream": True})

        t = threading.Thread(target=second)
        t.start()
        # (a deadline, not a count of polls: two test programs share the CI's two cores)
        deadline = time.monotonic() + 15
        while metric_values(s.port)[3]["gemma4_requests_waiting"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        check(metric_values(s.port)[3]["gemma4_requests_waiting"] == 1, "the second stream is queued")
        st, h, body = request(s.port, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        check(st == 503 and error_shape(body) and h.get("retry-after") == "1",
              "a full queue answers 503 with Retry-After: %d %r %r" % (st, h, body))
        time.sleep(3)
        sock.close()  # frees the running sequence: the waiting one runs
        t.join(30)
        st, _, body = waiting.get("r", (0, {}, b""))
        payloads, ok = sse_events(body)
        check(st == 200 and ok and payloads[-1] == "[DONE]" and body.startswith(b": waiting\n\n"),
              "a stream waiting in the queue beyond the idle timeout: kept alive, then served: %r" % body[:80])
        # shutdown with a long request in flight: cancelled after the 1 s grace, the stream ends cleanly
        result = {}

        def long_stream():
            result["r"] = request(s.port, "POST", "/v1/completions",
                                  {"prompt": "Hello", "max_tokens": 4000, "stream": True, "ignore_eos": True})

        t = threading.Thread(target=long_stream)
        t.start()
        deadline = time.monotonic() + 15
        while metric_values(s.port)[3]["gemma4_requests_running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        t.join(30)
        st, _, body = result.get("r", (0, {}, b""))
        payloads, ok = sse_events(body)
        check(st == 200 and ok and payloads[-1] == "[DONE]" and "error" in json.loads(payloads[-2]),
              "a stream cancelled by shutdown ends with an error event and [DONE]")
        check(time.monotonic() - t0 < 10, "cancelled within the grace period")
    finally:
        s.stop()


def hostile_requests(port, uri):
    """(description, method, path, body, headers, allowed statuses) for the barrage."""
    rng = random.Random(1234)
    auth = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
    chat = {"model": "dense", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    comp = {"model": "dense", "prompt": "Hi", "max_tokens": 2}
    bad_values = ["x", "", [], {}, True, False, -1, 0, 0.5, 1e308, -1e308, 2 ** 70, -(2 ** 70), [1, 2], {"a": 1},
                  "1", 3.0e9, 21, 1025]
    fields = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
              "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "n", "stream",
              "stream_options", "logprobs", "top_logprobs", "logit_bias", "tools", "tool_choice", "response_format",
              "chat_template_kwargs", "reasoning_effort", "ignore_eos", "return_token_ids"]
    cases = []
    for f in fields:
        for v in bad_values:
            body = dict(chat)
            body[f] = v
            if f in ("max_tokens", "max_completion_tokens") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and v > 2:
                continue  # valid but long
            cases.append(("chat %s=%r" % (f, v), "POST", "/v1/chat/completions", json.dumps(body), auth,
                          {200, 400, 404}))
    for f in ["prompt", "max_tokens", "logprobs", "echo", "best_of", "suffix", "media", "add_special_tokens", "seed",
              "stop", "logit_bias", "temperature"]:
        for v in bad_values + [[-1], [1024], [1e10], [[1, 2], [3]], ["a", "b"], [0.5]]:
            body = dict(comp)
            body[f] = v
            if f == "max_tokens" and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 2:
                continue
            cases.append(("completions %s=%r" % (f, v), "POST", "/v1/completions", json.dumps(body), auth,
                          {200, 400, 404}))
    bad_messages = [
        "x", [], [1], [{}], [{"role": 5}], [{"role": "user"}], [{"role": "user", "content": 5}],
        [{"role": "user", "content": {"a": 1}}], [{"role": "user", "content": [5]}],
        [{"role": "user", "content": [{"type": 5}]}], [{"role": "user", "content": [{"type": "video"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": [{"type": "image_url"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!!"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,plain"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(
                b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\x7f\xff\xff\xff\x7f\xff\xff\xff\x08\x02\0\0\0").decode()}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri, "detail": "ultra"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "relative/path.png"}}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}] * 9}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "%%%"}}]}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "QUJDRA=="}}]}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}],
        [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
        [{"role": "assistant", "content": None, "tool_calls": "x"}],
        [{"role": "tool", "content": [1, 2]}],
        [{"role": "user", "content": "<|image|>"}],
        [{"role": "user", "content": "\u0000\ud7ff\ue000"}],
    ]
    for m in bad_messages:
        body = dict(chat)
        body["messages"] = m
        cases.append(("messages %.80r" % (m,), "POST", "/v1/chat/completions", json.dumps(body), auth, {200, 400, 403}))
    raw_bodies = ["", "{", "}", "null", "[]", "123", '"str"', "{\"messages\": [}", "{'a': 1}", "\xef\xbb\xbf{}",
                  "{\"a\":" * 3000 + "1" + "}" * 3000, "[" * 100000 + "]" * 100000, "{\"messages\": \"\\ud800\"}",
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u0000\"}], \"max_tokens\": 2}",
                  json.dumps(chat)[:-3], json.dumps(chat) + "garbage", "\x00" * 100, json.dumps(chat) + "\x00",
                  json.dumps(chat).replace(" ", "\x01")]
    for b in raw_bodies:
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
            valid = b.startswith('{"messages": [{"role"')  # escaped NUL: valid JSON
            cases.append(("raw body %.40r on %s" % (b, path), "POST", path, b, auth, {200, 400} if valid else {400}))
    for b in (b"\xff\xfe\x00garbage", bytes(rng.randrange(256) for _ in range(500)), b'{"prompt": "\xc3\x28"}'):
        cases.append(("binary body %.20r" % b, "POST", "/v1/completions", b, auth, {200, 400}))
    # unknown model, methods, paths, auth
    for path, body in (("/v1/chat/completions", dict(chat, model="gpt-4")), ("/v1/completions", dict(comp, model="x")),
                       ("/tokenize", {"model": "nope", "prompt": "a"})):
        cases.append(("unknown model on %s" % path, "POST", path, json.dumps(body), auth, {404}))
    for method, path in (("GET", "/v1/chat/completions"), ("DELETE", "/health"), ("PUT", "/v1/completions"),
                         ("GET", "/v2/anything"), ("POST", "/"), ("GET", "/v1/models/" + "x" * 5000),
                         ("PATCH", "/metrics"), ("GET", "/../../etc/passwd")):
        cases.append(("%s %s" % (method, path[:40]), method, path, None, auth, {400, 404, 405, 414, 431}))
    for h in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer " + KEY + "x"},
              {"Authorization": "bearer " + KEY[:-1]}, {"Authorization": "x" * 10000}):
        cases.append(("auth %.30r" % h, "POST", "/v1/chat/completions", json.dumps(chat), h, {401, 431}))
    # giant numbers and sizes
    for f, v in (("max_tokens", 10 ** 400), ("max_tokens", 99999999999), ("seed", 10 ** 30), ("top_k", 10 ** 20),
                 ("logit_bias", {"5": 1e30}), ("logit_bias", {"99999999999999999999": 1}), ("temperature", 10 ** 300),
                 ("stop", ["s%d" % i for i in range(17)]), ("stop", ["x" * 5000]), ("top_logprobs", 10 ** 9),
                 ("n", 2), ("n", 10 ** 10), ("max_tokens", 513), ("max_tokens", 0), ("max_tokens", -5)):
        body = dict(chat)
        body[f] = v
        text = json.dumps(body).replace("1e+400", "1e400")
        cases.append(("giant %s" % f, "POST", "/v1/chat/completions", text, auth, {400}))
    long_prompt = " ".join("w%d" % i for i in range(3000))
    cases.append(("prompt over the limit", "POST", "/v1/completions", json.dumps(dict(comp, prompt=long_prompt)), auth,
                  {400}))
    cases.append(("huge body", "POST", "/v1/chat/completions", "x" * (2 << 20), auth, {0, 413}))
    cases.append(("huge valid JSON", "POST", "/v1/chat/completions",
                  json.dumps(dict(chat, messages=[{"role": "user", "content": "a" * (2 << 20)}])), auth, {0, 413}))
    cases.append(("lying length", "POST", "/v1/completions", "{}", dict(auth, **{"Content-Length": "99999999999"}),
                  {0, 400, 413}))
    # random mutations of valid bodies (bytes flipped, cut, inserted); max_tokens
    # three times so a mangled key still leaves a short request
    base = ['{"max_tokens": 2, "model": "dense", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
            '"max_tokens": 2}', '{"max_tokens": 2, "model": "dense", "prompt": "Hi", "max_tokens": 2, "max_tokens": 2}']
    while len(cases) < 1100:
        b = bytearray(rng.choice(base).encode())
        for _ in range(rng.randrange(1, 4)):
            op, i = rng.randrange(3), rng.randrange(len(b))
            if op == 0:
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:i + rng.randrange(1, 10)]
            else:
                b[i:i] = bytes(rng.choice(b'{}[]",:0123456789e-.\\ntrufalse\x00\xff'))
        path = "/v1/chat/completions" if b"messages" in b else "/v1/completions"
        cases.append(("mutation %.60r" % bytes(b), "POST", path, bytes(b), auth, {200, 400, 404}))
    return cases


def raw_exchange(port, data, timeout=10):
    """Sends raw bytes; returns the status code of the answer, or 0 when the server just closed."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return 0
    try:
        s.sendall(data)
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


def part_barrage(s, client, model):
    uri = data_uri(os.path.join(FIXTURES, "dense", "image.png"), "image/png")
    cases = hostile_requests(s.port, uri)
    bad = []

    def one(case):
        what, method, path, body, headers, allowed = case
        st, h, resp = request(s.port, method, path, body, headers, timeout=60)
        ok = st in allowed and (st in (0, 200) or error_shape(resp))
        if st == 200 and h.get("content-type") == "text/event-stream":
            payloads, framed = sse_events(resp)
            ok = ok and framed and payloads[-1] == "[DONE]"
        elif st == 200 and path.endswith("completions"):
            try:
                ok = ok and json.loads(resp).get("usage") is not None
            except ValueError:
                ok = False
        return None if ok else "%s -> %d %r" % (what, st, resp[:200])

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for r in pool.map(one, cases):
            if r:
                bad.append(r)
    # protocol garbage on raw sockets
    raw = [b"GARBAGE\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200),
           b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}",
           b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}",
           b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",
           b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n",
           b"GET /health HTTP/1.1\r\nX-Big: " + b"b" * 200000 + b"\r\n\r\n",
           b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 20000 + b"\r\n",
           b"\r\n\r\n\r\n", b"GET /health\r\n\r\n", b"GET  /health  HTTP/1.1\r\n\r\n"]
    raw += [bytes(random.Random(i).randrange(256) for _ in range(300)) for i in range(20)]
    chunked_big = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                   b"\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"100000\r\n" + b"a" * 0x100000 + b"\r\n") * 2 +
                   b"0\r\n\r\n")
    raw.append(chunked_big)
    with concurrent.futures.ThreadPoolExecutor(len(raw)) as pool:
        for data, st in zip(raw, pool.map(lambda d: raw_exchange(s.port, d), raw)):
            if not (st == 0 or 400 <= st < 500):
                bad.append("raw %.40r -> %d" % (data, st))
    # an unknown HTTP version: libmicrohttpd answers 505 (HTTP Version Not Supported), as RFC 9110 says
    st = raw_exchange(s.port, b"GET / HTTP/9.9\r\n\r\n")
    if st not in (0, 505):
        bad.append("HTTP/9.9 -> %d" % st)
    n = len(cases) + len(raw) + 1
    # slowloris: headers and bodies trickled slower than the request timeout (3 s)
    slow = []
    for i in range(24):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" if i % 2 == 0 else
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Length: 100\r\n\r\n{")
        slow.append(sock)
    t_slow = time.monotonic()
    closed = [False] * len(slow)
    health_worst = 0.0
    while time.monotonic() - t_slow < 8 and not all(closed):
        for i, sock in enumerate(slow):
            if closed[i]:
                continue
            try:
                sock.sendall(b"X" if i % 2 == 0 else b" ")
            except OSError:
                closed[i] = True
        h0 = time.monotonic()
        st, _, _ = request(s.port, "GET", "/health", headers={})
        health_worst = max(health_worst, time.monotonic() - h0)
        if st != 200:
            bad.append("health during slowloris -> %d" % st)
        time.sleep(0.3)
    for i, sock in enumerate(slow):
        if not closed[i]:
            try:  # a closed socket shows as EOF or a reset
                sock.settimeout(0.5)
                closed[i] = sock.recv(100) == b"" or True
            except (socket.timeout, BlockingIOError):
                pass
            except OSError:
                closed[i] = True
        sock.close()
    n += len(slow)
    check(all(closed), "slow clients closed by the server: %d of %d" % (sum(closed), len(closed)))
    check(health_worst < 1.0, "health answered within 1 s during slowloris (worst %.2f s)" % health_worst)
    check(not bad, "%d of %d hostile requests mishandled: %s" % (len(bad), n, "; ".join(bad[:8])))
    check(n >= 1000, "at least 1000 hostile requests (%d)" % n)
    st, _, _ = request(s.port, "GET", "/health", headers={})
    check(st == 200 and s.proc.poll() is None, "server still serving after the barrage")
    r = client.chat.completions.create(model="dense", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    check(r.usage.completion_tokens >= 1, "a normal request after the barrage")
    _, _, _, v = settled(s.port)
    check(v["gemma4_requests_running"] == 0 and v["gemma4_requests_waiting"] == 0 and
          v["gemma4_kv_cache_blocks_used"] == 0, "nothing left running or reserved")
    print("barrage: %d hostile requests in %.1f s" % (n, time.monotonic() - t0))


def part_load(s, client, model):
    sys.path.insert(0, os.path.join(SOURCE, "bench"))
    import server_load
    rc = server_load.main(["--url", s.url, "--clients", "64", "--duration", "6", "--max-tokens", "8", "--verify",
                           "--api-key", KEY, "--model", "dense"])
    check(rc == 0, "64 streaming clients: no failed or garbled response")


def part_shutdown(s):
    """SIGTERM with a stream in flight: it finishes, then the server exits 0."""
    # The signal goes only after this stream's first event has arrived, so
    # the stream is surely in flight (a metrics poll could see another
    # request still running and signal before this one was even read).
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    body = b""
    st = 0
    try:
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": "Hello", "max_tokens": 400, "stream": True, "ignore_eos": True}),
                     headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
        r = conn.getresponse()
        st = r.status
        while b"data:" not in body:
            piece = r.read1(65536)
            if not piece:
                break
            body += piece
        s.proc.send_signal(signal.SIGTERM)
        body += r.read()
    except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
        check(False, "streaming through SIGTERM: %r" % e)
    finally:
        conn.close()
    payloads, ok = sse_events(body)
    finishes = [json.loads(p)["choices"][0].get("finish_reason") for p in payloads[:-1]
                if json.loads(p).get("choices")]
    check(st == 200 and ok and payloads and payloads[-1] == "[DONE]" and finishes and finishes[-1] == "length",
          "the stream in flight at SIGTERM finished: %r" % body[-200:])
    rc, text = s.stop()
    check("finishing 1 request(s)" in text, "the server drained the stream: %s" % text[-300:])
    check(raw_exchange(s.port, b"GET /health HTTP/1.1\r\n\r\n", timeout=2) == 0, "no longer listening")


PARTS = ["basics", "chat", "tools", "completions", "image", "metrics", "batching", "disconnect", "barrage", "load", "audio",
         "queue", "shutdown"]


def main():
    only = [p for p in os.environ.get("G4_SERVER_TEST_PARTS", "").split(",") if p]
    want = lambda p: not only or p in only  # noqa: E731
    root = tempfile.mkdtemp(prefix="g4serve-", dir=TMP)
    try:
        model = model_dir(root, "dense")
        media = os.path.join(root, "media")
        os.makedirs(media)
        shutil.copy(os.path.join(FIXTURES, "dense", "image.png"), media)
        s = Server(model, "--api-key", KEY, "--max-body", str(1 << 20), "--max-tokens", "512",
                   "--max-prompt-tokens", "2000", "--max-seqs", "16", "--request-timeout", "3", "--idle-timeout", "5",
                   "--allowed-media-dir", media, name="dense")
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        for name, fn in (("basics", part_basics), ("chat", part_chat), ("tools", part_tools),
                         ("completions", part_completions),
                         ("metrics", part_metrics), ("batching", part_batching), ("disconnect", part_disconnect),
                         ("barrage", part_barrage), ("load", part_load)):
            if want(name):
                t0 = time.monotonic()
                fn(s, client, model)
                print("%s: %.1f s" % (name, time.monotonic() - t0))
        if want("image"):
            part_image(s, client, model, media)
        if want("shutdown"):
            part_shutdown(s)
        else:
            s.stop()
        if want("audio"):
            part_audio(root)
        if want("queue"):
            part_queue(root)
    finally:
        for srv in RUNNING:  # after an exception: leave no server behind
            if srv.proc.poll() is None:
                srv.proc.kill()
                srv.proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    print("%d passed, %d failed" % (n_checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
