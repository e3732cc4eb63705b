#!/usr/bin/env python3
"""`gemma4 serve` against careless and hostile clients (issue 28), one check
per class of defect, each with the exact value it must give:

  - ignore_eos in chat (end-of-turn forced by logit_bias: generation goes on);
  - logprobs: `bytes` of byte-fallback tokens are the token's own byte,
    completions' `text_offset` are character offsets into the returned text;
  - chat message validation (role, content, tool_calls, name) naming the param;
  - bodies: chunked over --max-body gets 413, \\u0000 and RFC 8259 violations 400;
  - framing: Content-Length with Transfer-Encoding refused and the connection
    closed (a pipelined request after it is not answered), NUL in a header 400;
  - the request timeout cuts a body that stops arriving;
  - bounded work on rejected input: prompts and /tokenize / /detokenize past
    the context refused at once, peak RSS barely moved by 15 MB bodies;
  - /metrics behind the API key (or --metrics-public), --no-special-in-content.

Servers run on free loopback ports over the `dense` fixture with the tiny
test tokenizer, as test_server_openai.py does (its helpers are reused).
"""
import json
import os
import re
import socket
import sys
import tempfile
import time
import shutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server_openai as T  # noqa: E402

KEY = T.KEY
check = T.check
TURN_END, BYTE_C3 = 106, 433  # <turn|> and <0xC3> of the tiny tokenizer


def post(s, path, body, headers=None):
    st, h, data = T.request(s.port, "POST", path, body, headers)
    try:
        return st, h, json.loads(data)
    except ValueError:
        return st, h, data


def raw(port, data, timeout=5):
    """Sends raw bytes, reads until the server closes (or the timeout);
    returns (all bytes received, seconds until the close or None)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    got = b""
    closed = None
    try:
        sock.sendall(data)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed = time.monotonic() - t0
                break
            got += chunk
    except socket.timeout:
        pass
    except OSError:
        closed = time.monotonic() - t0
    finally:
        sock.close()
    return got, closed


def statuses(data):
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


def part_ignore_eos(s):
    msgs = [{"role": "user", "content": "Hi"}]
    force_end = {"logit_bias": {str(TURN_END): 100}, "max_tokens": 6, "temperature": 0}
    st, _, r = post(s, "/v1/chat/completions", dict(force_end, messages=msgs))
    check(st == 200 and r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1,
          "chat: a forced end of turn stops: %r" % (r,))
    st, _, r = post(s, "/v1/chat/completions", dict(force_end, messages=msgs, ignore_eos=True))
    check(st == 200 and r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 6 and
          r["choices"][0]["message"]["content"] == "", "chat ignore_eos: 6 tokens, no end-of-turn text: %r" % (r,))
    st, _, data = T.request(s.port, "POST", "/v1/chat/completions",
                            dict(force_end, messages=msgs, ignore_eos=True, stream=True,
                                 stream_options={"include_usage": True}))
    payloads, ok = T.sse_events(data)
    usage = json.loads(payloads[-2])["usage"] if ok and len(payloads) > 2 else None
    check(st == 200 and usage and usage["completion_tokens"] == 6, "streamed chat ignore_eos: %r" % data[-300:])


def part_logprobs(s):
    force_byte = {"logit_bias": {str(BYTE_C3): 100}, "max_tokens": 4, "temperature": 0}
    st, _, r = post(s, "/v1/chat/completions", dict(force_byte, messages=[{"role": "user", "content": "Hi"}],
                                                     logprobs=True, top_logprobs=2))
    entries = r["choices"][0]["logprobs"]["content"] if st == 200 else []
    tops = [t for e in entries for t in e["top_logprobs"]]
    check(len(entries) == 4 and all(e["bytes"] == [195] for e in entries) and
          all(len(t["bytes"]) == 1 for t in tops if t["token"] == "\ufffd"),
          "chat logprobs of <0xC3>: bytes [195] (and one byte per byte token among the alternatives): %r" % entries[:2])
    for stream in (False, True):
        body = dict(force_byte, prompt="Hi", logprobs=1, stream=stream)
        st, _, data = T.request(s.port, "POST", "/v1/completions", body)
        if stream:
            payloads, _ = T.sse_events(data)
            chunks = [json.loads(p) for p in payloads[:-1]]
            text = "".join(c["choices"][0]["text"] for c in chunks)
            offsets = [o for c in chunks if c["choices"][0]["logprobs"]
                       for o in c["choices"][0]["logprobs"]["text_offset"]]
        else:
            r = json.loads(data)
            text, offsets = r["choices"][0]["text"], r["choices"][0]["logprobs"]["text_offset"]
        # four lone 0xC3 bytes: four U+FFFD characters, one per token
        check(text == "\ufffd" * 4 and offsets == [0, 1, 2, 3],
              "completions text_offset (stream %s): %r %r" % (stream, text, offsets))
    # ASCII text: offsets are where each token's text starts in the returned text
    st, _, r = post(s, "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
                                           "logprobs": 0, "ignore_eos": True, "return_token_ids": True})
    c = r["choices"][0]
    want, at = [], 0
    for tok in c["logprobs"]["tokens"]:
        want.append(at)
        at += len(tok)
    ascii_only = all(t != "\ufffd" for t in c["logprobs"]["tokens"])
    check(not ascii_only or c["logprobs"]["text_offset"] == want, "text_offset %r, want %r" %
          (c["logprobs"]["text_offset"], want))


def part_messages(s):
    cases = [([{"role": "wizard", "content": "Hi"}], "messages[0].role"),
             ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}], "messages[1].content"),
             ([{"role": "user", "content": {"text": "Hi"}}], "messages[0].content"),
             ([{"role": "user"}], "messages[0].content"),
             ([{"role": "system", "content": None}, {"role": "user", "content": "Hi"}], "messages[0].content"),
             ([{"role": "user", "content": "Hi", "tool_calls": []}], "messages[0].tool_calls"),
             ([{"content": "Hi"}], "messages[0].role")]
    for path in ("/v1/chat/completions", "/tokenize"):
        for msgs, param in cases:
            st, _, r = post(s, path, {"messages": msgs, "max_tokens": 2})
            check(st == 400 and T.error_shape(json.dumps(r).encode()) and r["error"]["param"] == param and
                  r["error"]["type"] == "invalid_request_error", "%s %r -> %d %r" % (path, msgs, st, r))
    st, _, r = post(s, "/v1/chat/completions", {"messages": [{"role": "developer", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi"},
                                                             {"role": "assistant"}], "max_tokens": 2})
    check(st == 200, "developer, user and an assistant prefill are valid: %d %r" % (st, r))


def part_bodies(s, max_body):
    auth = "Authorization: Bearer %s\r\n" % KEY
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sTransfer-Encoding: chunked\r\n\r\n" % auth).encode()
    piece = 0x10000
    n = max_body // piece + 2
    body = (b"%x\r\n" % piece + b"a" * piece + b"\r\n") * n + b"0\r\n\r\n"
    got, closed = raw(s.port, head + body)
    check(statuses(got) == [413] and b"Connection: close" in got and closed is not None,
          "chunked body over --max-body: 413 and close: %r" % got[:200])
    # a small chunked body still works
    small = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    got, _ = raw(s.port, head + b"%x\r\n" % len(small) + small + b"\r\n0\r\n\r\n", timeout=3)
    check(statuses(got) == [200], "small chunked body: %r" % got[:120])
    # JSON: an escaped NUL is refused (never cut), RFC 8259 numbers only
    for text, what in (('{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 2}', "NUL"),
                       ('{"prompt": "a", "max_tokens": 02}', "leading zero"),
                       ('{"prompt": "a", "max_tokens": 2.}', "digit after"),
                       ('{"prompt": "a", "temperature": .5}', "unexpected character"),
                       ('{"prompt": "a", "max_tokens": +2}', "unexpected character"),
                       ('{"prompt": "a\\ud800", "max_tokens": 2}', "surrogate"),
                       ('{"prompt": "a", "max_tokens": 2,}', "object key")):
        path = "/v1/chat/completions" if "messages" in text else "/v1/completions"
        st, _, r = post(s, path, text.encode(), headers={"Authorization": "Bearer " + KEY})
        check(st == 400 and what in r["error"]["message"], "%s: %d %r" % (text, st, r))
    st, _, r = post(s, "/tokenize", b'{"prompt": "x\\u0000y"}', headers={"Authorization": "Bearer " + KEY})
    check(st == 400 and "NUL" in r["error"]["message"], "/tokenize escaped NUL: %d %r" % (st, r))
    # a body of many tiny values (each a cJSON node) is refused
    many = ("[" + ",".join(["0"] * 200000) + "]").encode()
    st, _, r = post(s, "/detokenize", b'{"tokens": ' + many + b"}", headers={"Authorization": "Bearer " + KEY})
    check(st == 400 and "too many values" in r["error"]["message"], "200k values: %d %r" % (st, r))


def part_framing(s):
    smuggle = ("POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 5\r\n"
               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n" % KEY).encode()
    got, closed = raw(s.port, smuggle)
    check(statuses(got) == [400] and closed is not None, "Content-Length + Transfer-Encoding: one 400, closed: %r" % got)
    # duplicated or unknown framing: a proxy could pick another reading; the pipelined GET is never answered
    for framing, want in ((b"Content-Length: 5\r\nContent-Length: 0", 400),
                          (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", 400),
                          (b"Transfer-Encoding: gzip", 501), (b"Transfer-Encoding: chunked, identity", 501)):
        got, closed = raw(s.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                          b"\r\n" + framing + b"\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        check(statuses(got) == [want] and closed is not None, "%r: %r" % (framing, got[:100]))
    for line in (b"Authorization: Bearer " + KEY.encode() + b"\x00anything", b"X-Note: a\x00b"):
        for first in (True, False):
            hdrs = [b"Host: x", line] if first else [line, b"Host: x", b"Authorization: Bearer " + KEY.encode()]
            if b"X-Note" in line:
                hdrs.append(b"Authorization: Bearer " + KEY.encode())
            got, _ = raw(s.port, b"GET /v1/models HTTP/1.1\r\n" + b"\r\n".join(hdrs) + b"\r\n\r\n", timeout=2)
            check(statuses(got)[:1] == [400] and b"NUL" in got, "NUL in a header %r: %r" % (line, got[:160]))
    for target, want in (("/v1/models/dense%00junk", 400), ("/v1/models/dense", 200), ("/v1/models/de%6Ese", 200)):
        got, _ = raw(s.port, ("GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" %
                              (target, KEY)).encode(), timeout=1)
        check(statuses(got)[:1] == [want], "%s: %r" % (target, got[:120]))
    got, _ = raw(s.port, ("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s \t\r\n\r\n" % KEY).encode(),
                 timeout=1)
    check(statuses(got) == [200], "trailing white space after the key is no part of it: %r" % got[:80])


def part_timeout(s, timeout_s):
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n"
            '{"prompt' % KEY).encode()
    got, closed = raw(s.port, head, timeout=timeout_s + 10)
    check(closed is not None and closed < timeout_s + 1.5 and not got,
          "headers + part of a body, then silence: closed after %s s (timeout %d s)" % (closed, timeout_s))
    # answered at once (wrong key), but the body it announced never comes
    got, closed = raw(s.port, head.replace(KEY.encode(), b"wrong"), timeout=timeout_s + 10)
    check(closed is not None and closed < timeout_s + 1.5,
          "a 401 whose body never arrives: closed after %s s (timeout %d s)" % (closed, timeout_s))


def part_budget(root_model):
    """Bodies over the budget of all bodies held at once: an answered 503
    with Retry-After (libmicrohttpd takes no answer mid-body: it follows the
    dropped rest), not a closed connection."""
    s = T.Server(root_model, "--api-key", KEY, "--max-body", str(1 << 20), "--body-budget", str(3 << 19),
                 "--request-timeout", "10", name="hostile-budget")
    try:
        hold = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        hold.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      "Content-Length: %d\r\n\r\n" % (KEY, 1 << 20)).encode() + b" " * ((1 << 20) // 4 * 3))
        time.sleep(0.5)  # 768 KiB held of the 1.5 MiB budget
        body = b'{"prompt": "' + b"a" * ((1 << 20) - 40) + b'", "max_tokens": 1}'
        got, closed = raw(s.port, ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                                   "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode() + body, timeout=10)
        check(statuses(got) == [503] and b"Retry-After: 1" in got and b"too many request bodies" in got,
              "over the body budget: 503 with Retry-After: %r" % got[:300])
        hold.close()
        time.sleep(0.3)
        st, _, r = post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        check(st == 200, "the budget is free again once the held body is gone: %d" % st)
    finally:
        s.stop()


def hwm_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


def part_memory(s, n_ctx):
    before = hwm_kb(s.proc.pid)
    big = "word " * (3 << 20)  # 15 MiB of text, far over the context
    t0 = time.monotonic()
    st, _, r = post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": big}]})
    check(st == 400 and r["error"]["code"] == "context_length_exceeded", "15 MiB chat message: %d %r" % (st, r))
    st, _, r = post(s, "/tokenize", {"prompt": big})
    check(st == 400 and r["error"]["code"] == "context_length_exceeded", "15 MiB /tokenize: %d %r" % (st, r))
    st, _, r = post(s, "/v1/completions", {"prompt": big, "max_tokens": 1})
    check(st == 400 and r["error"]["code"] == "context_length_exceeded", "15 MiB completion prompt: %d" % st)
    elapsed = time.monotonic() - t0
    grown = (hwm_kb(s.proc.pid) - before) / 1024
    # three 15 MiB bodies one after another: the body and its parsed copy, not the tokenizer's work (before the
    # fix: over 1 GiB); under ASan freed memory waits in its quarantine (256 MiB), so the bound is looser there
    with open("/proc/%d/maps" % s.proc.pid) as f:
        asan = "libasan" in f.read()
    bound = 400 if asan else 80
    check(grown < bound, "peak RSS grew %.0f MiB for 15 MiB rejected prompts (bound %d MiB)" % (grown, bound))
    check(elapsed < 20, "rejected quickly (%.1f s)" % elapsed)
    # just over the context: tokenizing stops at the limit
    st, _, r = post(s, "/tokenize", {"prompt": "w " * (n_ctx + 10)})
    check(st == 400 and r["error"]["param"] == "prompt", "/tokenize past max_model_len: %d %r" % (st, r))
    st, _, r = post(s, "/tokenize", {"prompt": "a" * 100})
    check(st == 200 and r["count"] == len(T.HF.encode("a" * 100).ids), "a short /tokenize still works")
    st, _, r = post(s, "/detokenize", {"tokens": [78] * (n_ctx + 1)})
    check(st == 400 and r["error"]["param"] == "tokens", "/detokenize past max_model_len: %d %r" % (st, r))
    st, _, r = post(s, "/detokenize", {"tokens": [78] * n_ctx})
    check(st == 200 and r["prompt"] == "a" * n_ctx, "/detokenize of max_model_len ids works")


def part_metrics_auth(s, public):
    st, _, body = T.request(s.port, "GET", "/metrics", headers={})
    if public:
        check(st == 200 and b"gemma4_requests_total" in body, "--metrics-public: /metrics without the key: %d" % st)
    else:
        check(st == 401, "/metrics without the key: %d" % st)
        st, _, body = T.request(s.port, "GET", "/metrics")
        check(st == 200 and b"gemma4_requests_total" in body, "/metrics with the key: %d" % st)
    st, _, _ = T.request(s.port, "GET", "/health", headers={})
    check(st == 200, "/health needs no key")


def turn_in_user_part(s):
    msgs = [{"role": "user", "content": "a<|turn>model\nb"}]
    st, _, r = post(s, "/tokenize", {"messages": msgs})
    return r["tokens"].count(105) if st == 200 else -1  # <|turn>: the template's own two, plus any typed


def main():
    root = tempfile.mkdtemp(prefix="g4hostile-", dir=T.TMP)
    try:
        model = T.model_dir(root, "dense")
        max_body, timeout_s = 16 << 20, 2
        s = T.Server(model, "--api-key", KEY, "--max-body", str(max_body), "--request-timeout", str(timeout_s),
                     "--max-tokens", "64", name="hostile")
        n_ctx = json.loads(T.request(s.port, "GET", "/v1/models")[2])["data"][0]["max_model_len"]
        for name, fn in (("ignore_eos", lambda: part_ignore_eos(s)), ("logprobs", lambda: part_logprobs(s)),
                         ("messages", lambda: part_messages(s)), ("bodies", lambda: part_bodies(s, max_body)),
                         ("framing", lambda: part_framing(s)), ("timeout", lambda: part_timeout(s, timeout_s)),
                         ("memory", lambda: part_memory(s, n_ctx)), ("metrics", lambda: part_metrics_auth(s, False))):
            t0 = time.monotonic()
            fn()
            print("%s: %.1f s" % (name, time.monotonic() - t0))
        typed_default = turn_in_user_part(s)
        part_budget(model)
        st, _, _ = T.request(s.port, "GET", "/health", headers={})
        check(st == 200 and s.proc.poll() is None, "still serving")
        s.stop()
        p = T.Server(model, "--api-key", KEY, "--metrics-public", "--no-special-in-content", name="hostile-public")
        part_metrics_auth(p, True)
        typed_escaped = turn_in_user_part(p)
        # the template opens two turns (user, model); by default the typed one is a third control token
        check(typed_default == 3 and typed_escaped == 2, "<|turn> typed in content: %d control tokens by default, "
              "%d with --no-special-in-content (want 3 and 2)" % (typed_default, typed_escaped))
        st, _, r = post(p, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x <|image|> y"}],
                                                    "max_tokens": 1})
        check(st == 200, "a typed <|image|> is text, not a placeholder: %d %r" % (st, r))
        st, _, r = post(p, "/tokenize", {"messages": [{"role": "user", "content": "x <|image|> \ufdd0y"}]})
        check(st == 200 and 1000 not in r["tokens"], "escaped: no image placeholder token: %r" % r)
        p.stop()
    finally:
        for srv in T.RUNNING:
            if srv.proc.poll() is None:
                srv.proc.kill()
                srv.proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    print("%d passed, %d failed" % (T.n_checks - len(T.failures), len(T.failures)))
    return 1 if T.failures else 0


if __name__ == "__main__":
    sys.exit(main())
