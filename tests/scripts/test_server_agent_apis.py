#!/usr/bin/env python3
"""`gemma4 serve` speaking the OpenAI Responses API and the Anthropic
Messages API (issue 30), driven by the official `openai` and `anthropic`
clients against the bundled model (models/tiny), greedy.

References:
  - prompts: the model's chat template rendered by jinja2 as transformers
    does, tokenized by Hugging Face `tokenizers`, for the chat messages each
    request is equivalent to (instructions / system -> a system message,
    function_call / tool_use -> assistant tool_calls, function_call_output /
    tool_result -> tool messages, previous_response_id -> the stored turns);
    the server returns its prompt ids with the return_token_ids extension;
  - replies: the text, token count and end of /v1/chat/completions for the
    same greedy request; streamed text equals the non-streamed text; the
    clients' own stream accumulators (responses.stream, messages.stream)
    rebuild the same final object;
  - count_tokens: the reference prompt's length;
  - event sequences: the documented order of each API.
Then stored responses (GET, DELETE, the LRU bound), x-api-key / Bearer
auth, and a table of malformed bodies per API, each answered with a 4xx in
that API's error shape, the server serving normally afterwards.

Needs (PyPI): openai, anthropic, tokenizers, jinja2.
"""
import base64
import http.client
import json
import os
import sys
import tempfile

import anthropic
import jinja2
import jinja2.sandbox
import openai
from tokenizers import Tokenizer

from checks import check, summary
from serve_process import CRASH_REPORTS, ServeProcess

BIN = os.environ.get("G4_BIN", "build/gemma4")
FIXTURES = os.environ.get("G4_FIXTURES", "build/fixtures")
TMP = os.environ.get("G4_TMP", tempfile.gettempdir())
MODEL = os.path.join(os.path.dirname(os.path.abspath(FIXTURES)), "models", "tiny")
KEY = "agent-key-1"
HF = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
IMAGE = os.path.join(FIXTURES, "dense", "image.png")

with open(os.path.join(MODEL, "chat_template.jinja"), encoding="utf-8") as f:
    TEMPLATE = f.read()


def render(messages, tools=None, enable_thinking=False):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=True,
                                            enable_thinking=enable_thinking, bos_token="<bos>")


def ref_ids(messages, **kw):
    return HF.encode(render(messages, **kw), add_special_tokens=False).ids


class Server(ServeProcess):
    def __init__(self, *args, name):
        super().__init__(BIN, MODEL, ["--threads", "1", "--api-key", KEY, "--device", "cpu", "--max-tokens", "1200",
                                      *args], os.path.join(TMP, "test_server_agent_apis.%s.log" % name))

    def stop(self):
        rc, text, _ = super().stop()
        check(rc == 0, "server exit status %s" % rc, text[-2000:])
        for bad in CRASH_REPORTS:
            check(bad not in text, "server stderr reports %s" % bad, text[text.find(bad) - 200:][:3000])


def call(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"} if headers is None else headers
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def sse(body):
    """[(event, data)] of a text/event-stream body."""
    out = []
    for block in body.decode().split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        ev = data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        out.append((ev, data))
    return out


def openai_error_shape(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and isinstance(e["type"], str) and "param" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


def anthropic_error_shape(body):
    try:
        d = json.loads(body)
        return (d["type"] == "error" and isinstance(d["error"]["message"], str) and
                d["error"]["type"] in ("invalid_request_error", "authentication_error", "permission_error",
                                       "not_found_error", "request_too_large", "rate_limit_error", "api_error",
                                       "overloaded_error"))
    except (ValueError, KeyError, TypeError):
        return False


WEATHER = {"name": "get_weather", "description": "Get the current weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                          "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": WEATHER}
QUESTION = "Who made the heaven and the earth?"


def greedy(kw):
    """This client has no sampling arguments (newer Claude models take none): temperature in the body."""
    body = dict(kw.pop("extra_body", None) or {})
    body["temperature"] = kw.pop("temperature", 0)
    kw["extra_body"] = body
    return kw


def acreate(ant, **kw):
    return ant.messages.create(**greedy(kw))


def astream(ant, **kw):
    return ant.messages.stream(**greedy(kw))


def chat_reference(oai, messages, n, **kw):
    r = oai.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=n, **kw)
    return r.choices[0].message.content or "", r.usage, r.choices[0].finish_reason


# ---- Responses API --------------------------------------------------------------------------------

def part_responses(s, oai):
    msgs = [{"role": "user", "content": QUESTION}]
    text, usage, finish = chat_reference(oai, msgs, 24)
    check(usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None and
          0 <= usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens,
          "chat usage has prompt_tokens_details.cached_tokens", usage)
    r = oai.responses.create(model="tiny", input=QUESTION, max_output_tokens=24, temperature=0,
                             extra_body={"return_token_ids": True})
    d = r.model_dump()
    check(d["prompt_token_ids"] == ref_ids(msgs), "responses prompt = template + tokenizers",
          (d["prompt_token_ids"], ref_ids(msgs)))
    check(r.output_text == text, "responses text = chat completions text", (r.output_text, text))
    check(r.usage.input_tokens == usage.prompt_tokens and r.usage.output_tokens == usage.completion_tokens and
          r.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, "responses usage", r.usage)
    check(0 <= r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens and
          r.usage.output_tokens_details.reasoning_tokens == 0, "responses usage details", r.usage)
    check(r.status == ("incomplete" if finish == "length" else "completed") and r.object == "response" and
          r.id.startswith("resp_") and r.output[0].type == "message" and r.output[0].role == "assistant",
          "responses object shape (status %s, chat finish %s)" % (r.status, finish))
    if finish == "length":
        check(r.incomplete_details.reason == "max_output_tokens", "incomplete_details", r.incomplete_details)

    # instructions and input items: the equivalent chat messages
    items = [{"role": "user", "content": [{"type": "input_text", "text": "In the beginning"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "God created."}]},
             {"role": "user", "content": QUESTION}]
    chat = [{"role": "system", "content": "Answer as the scripture does."},
            {"role": "user", "content": [{"type": "text", "text": "In the beginning"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "God created."}]},
            {"role": "user", "content": QUESTION}]
    r = oai.responses.create(model="tiny", instructions="Answer as the scripture does.", input=items,
                             max_output_tokens=16, temperature=0, extra_body={"return_token_ids": True})
    check(r.model_dump()["prompt_token_ids"] == ref_ids(chat), "instructions + items prompt = template")
    check(r.output_text == chat_reference(oai, chat, 16)[0], "items reply = chat completions reply")

    # reasoning on: the template's thinking switch
    r = oai.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0,
                             reasoning={"effort": "high"}, extra_body={"return_token_ids": True})
    check(r.model_dump()["prompt_token_ids"] == ref_ids(msgs, enable_thinking=True),
          "reasoning effort high = enable_thinking")
    ref = oai.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=8,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    reasoning = [o for o in r.output if o.type == "reasoning"]
    want_reasoning = ref.choices[0].message.model_dump().get("reasoning_content")
    check(("".join(c.text for o in reasoning for c in (o.content or [])) or None) == (want_reasoning or None) and
          r.output_text == (ref.choices[0].message.content or ""), "reasoning items = chat's reasoning_content")
    r = oai.responses.create(model="tiny", input=QUESTION, max_output_tokens=4, temperature=0,
                             reasoning={"effort": "none"}, extra_body={"return_token_ids": True})
    check(r.model_dump()["prompt_token_ids"] == ref_ids(msgs), "reasoning effort none = thinking off")

    # streaming: the documented event sequence, text equal to the whole answer
    whole = oai.responses.create(model="tiny", input=QUESTION, max_output_tokens=24, temperature=0)
    events = list(oai.responses.create(model="tiny", input=QUESTION, max_output_tokens=24, temperature=0,
                                       stream=True))
    types = [e.type for e in events]
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers 0..n-1")
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.incomplete" if whole.status == "incomplete" else "response.completed"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    check(types == head + ["response.output_text.delta"] * len(deltas) + tail, "stream event order", types)
    streamed = "".join(e.delta for e in deltas)
    check(streamed == whole.output_text and events[-4].text == streamed, "streamed text = whole text",
          (streamed, whole.output_text))
    final = events[-1].response
    check(final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens and
          final.id == events[0].response.id and events[0].response.status == "in_progress",
          "final event carries the response")
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    check(item_ids == {final.output[0].id}, "one item id throughout", item_ids)
    # the client's own accumulator rebuilds the same response
    with oai.responses.stream(model="tiny", input=QUESTION, max_output_tokens=24, temperature=0) as st:
        got = st.get_final_response()
    check(got.output_text == whole.output_text, "responses.stream accumulates the same text")

    # raw framing: "event: TYPE" lines match the payloads' type
    st_, h, body = call(s.port, "POST", "/v1/responses",
                        {"input": QUESTION, "max_output_tokens": 4, "temperature": 0, "stream": True})
    evs = sse(body)
    check(st_ == 200 and h.get("content-type") == "text/event-stream" and evs and
          all(ev == data["type"] for ev, data in evs), "responses SSE framing", body[:300])


def part_responses_tools(s, oai):
    """Function calls and their outputs through previous_response_id."""
    r1 = oai.responses.create(
        model="tiny", tools=[dict(type="function", **WEATHER)], temperature=0, max_output_tokens=12,
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": "call_7", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call_7", "output": "sunny, 21 C"}],
        extra_body={"return_token_ids": True})
    chat1 = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_7", "type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21 C"}]
    check(r1.model_dump()["prompt_token_ids"] == ref_ids(chat1, tools=[CHAT_WEATHER]),
          "function_call + output prompt = template with tools")
    # the chat API gives the same reply for the same conversation
    chat1_api = json.loads(json.dumps(chat1))
    chat1_api[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    ref = chat_reference(oai, chat1_api, 12, tools=[CHAT_WEATHER])[0]
    check(r1.output_text == ref, "tool-output reply = chat completions reply", (r1.output_text, ref))
    # a second turn on top of the stored one: the server replays the stored conversation
    r2 = oai.responses.create(model="tiny", previous_response_id=r1.id, tools=[dict(type="function", **WEATHER)],
                              input="And tomorrow?", temperature=0, max_output_tokens=8,
                              extra_body={"return_token_ids": True})
    reply1 = {"role": "assistant", "content": r1.output_text}
    chat2 = chat1 + [reply1, {"role": "user", "content": "And tomorrow?"}]
    check(r2.model_dump()["prompt_token_ids"] == ref_ids(chat2, tools=[CHAT_WEATHER]),
          "previous_response_id prompt = the stored turns + the new input")
    check(r2.previous_response_id == r1.id, "previous_response_id echoed")
    # a function_call_output continuing a stored function_call (stored via an input item)
    r3 = oai.responses.create(model="tiny", tools=[dict(type="function", **WEATHER)], temperature=0,
                              max_output_tokens=4, input=[{"role": "user", "content": "Weather in Rome?"},
                                                          {"type": "function_call", "call_id": "call_9",
                                                           "name": "get_weather", "arguments": '{"city": "Rome"}'}])
    r4 = oai.responses.create(model="tiny", previous_response_id=r3.id, tools=[dict(type="function", **WEATHER)],
                              input=[{"type": "function_call_output", "call_id": "call_9", "output": "rain"}],
                              temperature=0, max_output_tokens=8, extra_body={"return_token_ids": True})
    # r3's reply follows its tool call in the same assistant turn (the function_call was the last item)
    chat4 = [{"role": "user", "content": "Weather in Rome?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_9", "type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Rome"}}}]},
             {"role": "assistant", "content": r3.output_text},
             {"role": "tool", "tool_call_id": "call_9", "content": "rain"}]
    check(r4.model_dump()["prompt_token_ids"] == ref_ids(chat4, tools=[CHAT_WEATHER]),
          "function_call_output after previous_response_id = template")
    # stored responses: GET returns the same object, DELETE removes it
    st_, _, body = call(s.port, "GET", "/v1/responses/" + r2.id)
    got = json.loads(body) if st_ == 200 else {}
    check(st_ == 200 and got.get("id") == r2.id and got["output"][0]["content"][0]["text"] == r2.output_text,
          "GET /v1/responses/ID", body[:200])
    check(oai.responses.retrieve(r2.id).output_text == r2.output_text, "client responses.retrieve")
    st_, _, body = call(s.port, "DELETE", "/v1/responses/" + r2.id)
    check(st_ == 200 and json.loads(body) == {"id": r2.id, "object": "response", "deleted": True}, "DELETE", body)
    st_, _, body = call(s.port, "GET", "/v1/responses/" + r2.id)
    check(st_ == 404 and openai_error_shape(body), "deleted response is gone: %d" % st_)
    try:
        oai.responses.create(model="tiny", previous_response_id=r2.id, input="x", max_output_tokens=2)
        check(False, "a deleted previous_response_id is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "previous_response_id", "unknown previous_response_id 400")
    # store false: not kept
    r = oai.responses.create(model="tiny", input="Hi", store=False, max_output_tokens=2)
    check(call(s.port, "GET", "/v1/responses/" + r.id)[0] == 404 and r.store is False, "store false is not kept")


def part_responses_store_bound():
    """--responses-store-entries 2: the least recently used goes first."""
    s = Server("--responses-store-entries", "2", name="store")
    try:
        oai = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        ids = [oai.responses.create(model="tiny", input="Hi %d" % i, max_output_tokens=2).id for i in range(2)]
        check(call(s.port, "GET", "/v1/responses/" + ids[0])[0] == 200, "first kept")  # now the most recent
        ids.append(oai.responses.create(model="tiny", input="Hi 2", max_output_tokens=2).id)
        present = [call(s.port, "GET", "/v1/responses/" + i)[0] for i in ids]
        check(present == [200, 404, 200], "LRU: the least recently used is dropped", present)
    finally:
        s.stop()
    s = Server("--responses-store", "0", name="nostore")
    try:
        oai = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        r = oai.responses.create(model="tiny", input="Hi", max_output_tokens=2)
        check(call(s.port, "GET", "/v1/responses/" + r.id)[0] == 404, "--responses-store 0 keeps nothing")
    finally:
        s.stop()


# ---- Messages API ----------------------------------------------------------------------------------

def part_messages(s, oai, ant):
    msgs = [{"role": "user", "content": QUESTION}]
    text, usage, finish = chat_reference(oai, msgs, 24)
    m = acreate(ant, model="tiny", max_tokens=24, messages=msgs, temperature=0,
                            extra_body={"return_token_ids": True})
    d = m.model_dump()
    check(d["prompt_token_ids"] == ref_ids(msgs), "messages prompt = template + tokenizers")
    got = "".join(b.text for b in m.content if b.type == "text")
    check(got == text, "messages text = chat completions text", (got, text))
    check(m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == usage.prompt_tokens and
          m.usage.output_tokens == usage.completion_tokens, "messages usage", m.usage)
    check(m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[finish] and m.stop_sequence is None,
          "stop_reason %s for finish %s" % (m.stop_reason, finish))
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "tiny",
          "message shape")
    # system (string and blocks), assistant turns, image blocks: the same as chat completions
    with open(IMAGE, "rb") as f:
        b64 = base64.b64encode(f.read()).decode()
    conv = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": b64}},
                                         {"type": "text", "text": "What is this?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A picture."}]},
            {"role": "user", "content": QUESTION}]
    chat = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
                                         {"type": "text", "text": "What is this?"}]},
            {"role": "assistant", "content": "A picture."},
            {"role": "user", "content": QUESTION}]
    m = acreate(ant, model="tiny", max_tokens=12, temperature=0, messages=conv,
                            system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                            extra_body={"return_token_ids": True})
    ref = oai.chat.completions.create(model="tiny", messages=chat, temperature=0, max_tokens=12,
                                      extra_body={"return_token_ids": True})
    check(m.model_dump()["prompt_token_ids"] == ref.model_dump()["prompt_token_ids"],
          "system blocks + image + turns prompt = chat completions prompt")
    check("".join(b.text for b in m.content if b.type == "text") == (ref.choices[0].message.content or ""),
          "the same reply")
    n = ant.messages.count_tokens(model="tiny", messages=conv,
                                  system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}])
    check(n.input_tokens == len(ref.model_dump()["prompt_token_ids"]), "count_tokens with an image = prompt length",
          (n.input_tokens, len(ref.model_dump()["prompt_token_ids"])))
    n = ant.messages.count_tokens(model="tiny", messages=msgs, system="Be brief.")
    want = ref_ids([{"role": "system", "content": "Be brief."}] + msgs)
    check(n.input_tokens == len(want), "count_tokens = reference prompt length", (n.input_tokens, len(want)))
    # thinking enabled: the template's thinking switch
    m = acreate(ant, model="tiny", max_tokens=1100, temperature=0, messages=msgs,
                            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"return_token_ids": True})
    check(m.model_dump()["prompt_token_ids"] == ref_ids(msgs, enable_thinking=True), "thinking enabled prompt")
    ref = oai.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=1100,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
    check((thinking or None) == (ref.choices[0].message.model_dump().get("reasoning_content") or None) and
          "".join(b.text for b in m.content if b.type == "text") == (ref.choices[0].message.content or ""),
          "thinking blocks = chat's reasoning_content")
    # stop_sequences
    base = acreate(ant, model="tiny", max_tokens=24, temperature=0, messages=msgs).content[0].text
    if check(len(base) >= 8, "reply long enough for a stop sequence", base):
        stop = base[5:7]
        m = acreate(ant, model="tiny", max_tokens=24, temperature=0, messages=msgs,
                                stop_sequences=["zzqq", stop])
        ref = oai.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=24, stop=[stop])
        check(m.stop_reason == "stop_sequence" and m.stop_sequence == stop and
              m.content[0].text == ref.choices[0].message.content, "stop_sequences", (m, stop))

    # streaming: raw event order, then the client's accumulator
    whole = acreate(ant, model="tiny", max_tokens=24, temperature=0, messages=msgs)
    st_, h, body = call(s.port, "POST", "/v1/messages", {"model": "tiny", "max_tokens": 24, "temperature": 0,
                                                         "messages": msgs, "stream": True},
                        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    evs = sse(body)
    names = [e for e, _ in evs]
    n_delta = names.count("content_block_delta")
    check(st_ == 200 and h.get("content-type") == "text/event-stream" and
          names == ["message_start", "ping", "content_block_start"] + ["content_block_delta"] * n_delta +
          ["content_block_stop", "message_delta", "message_stop"] and all(e == d["type"] for e, d in evs),
          "messages stream event order", names)
    streamed = "".join(d["delta"]["text"] for e, d in evs if e == "content_block_delta")
    check(streamed == whole.content[0].text, "streamed text = whole text")
    check(evs[-2][1]["delta"]["stop_reason"] == whole.stop_reason and
          evs[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens, "message_delta stop and usage")
    with astream(ant, model="tiny", max_tokens=24, temperature=0, messages=msgs) as st:
        parts = list(st.text_stream)
        final = st.get_final_message()
    check("".join(parts) == whole.content[0].text and final.content[0].text == whole.content[0].text and
          final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens,
          "messages.stream accumulates the same message")


def part_messages_tools(s, oai, ant):
    """A tool_use / tool_result round trip renders as the chat template's tool call and response."""
    tools = [{"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    conv = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]}]
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny, 21 C"}]
    for choice in (None, {"type": "auto"}):
        kw = {"tool_choice": choice} if choice else {}
        m = acreate(ant, model="tiny", max_tokens=12, temperature=0, messages=conv, tools=tools,
                                extra_body={"return_token_ids": True}, **kw)
        check(m.model_dump()["prompt_token_ids"] == ref_ids(chat, tools=[CHAT_WEATHER]),
              "tool_use round trip prompt = template with tools (tool_choice %r)" % choice)
    chat_api = json.loads(json.dumps(chat))
    chat_api[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris"}'
    ref = chat_reference(oai, chat_api, 12, tools=[CHAT_WEATHER])[0]
    check("".join(b.text for b in m.content if b.type == "text") == ref, "tool round trip reply = chat's")
    m = acreate(ant, model="tiny", max_tokens=4, temperature=0, messages=conv, tools=tools,
                            tool_choice={"type": "none"}, extra_body={"return_token_ids": True})
    check(m.model_dump()["prompt_token_ids"] == ref_ids(chat), "tool_choice none: no tools in the prompt")
    n = ant.messages.count_tokens(model="tiny", messages=conv, tools=tools)
    check(n.input_tokens == len(ref_ids(chat, tools=[CHAT_WEATHER])), "count_tokens with tools")
    # tool_result with blocks, and is_error
    conv2 = conv[:2] + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
         "content": [{"type": "text", "text": "no such city"}]},
        {"type": "text", "text": "Try again."}]}]
    chat2 = chat[:2] + [{"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "no such city"}]},
                        {"role": "user", "content": [{"type": "text", "text": "Try again."}]}]
    m = acreate(ant, model="tiny", max_tokens=4, temperature=0, messages=conv2, tools=tools,
                            extra_body={"return_token_ids": True})
    check(m.model_dump()["prompt_token_ids"] == ref_ids(chat2, tools=[CHAT_WEATHER]),
          "tool_result blocks + text after = tool message + user message")


def part_auth(s):
    ok = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)
    check(ok.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]).usage
          .output_tokens >= 1, "x-api-key accepted")
    bearer = anthropic.Anthropic(base_url=s.url, auth_token=KEY, max_retries=0)
    check(bearer.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]).usage
          .output_tokens >= 1, "Authorization: Bearer accepted on /v1/messages")
    try:
        anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        check(False, "a wrong x-api-key is refused")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", "401 authentication_error")
    st_, _, body = call(s.port, "GET", "/v1/models", headers={"x-api-key": KEY})
    check(st_ == 200, "x-api-key works on the OpenAI paths too")
    st_, _, body = call(s.port, "POST", "/v1/messages", {}, headers={})
    check(st_ == 401 and anthropic_error_shape(body), "no key on /v1/messages: Anthropic 401", body)
    st_, _, body = call(s.port, "GET", "/v1/messages", headers={"x-api-key": KEY})
    check(st_ == 405 and anthropic_error_shape(body), "GET /v1/messages: Anthropic-shaped 405", body)
    st_, _, body = call(s.port, "POST", "/v1/responses", {}, headers={})
    check(st_ == 401 and openai_error_shape(body), "no key on /v1/responses: OpenAI 401", body)


# ---- malformed and hostile bodies ----------------------------------------------------------------

def part_malformed(s, oai):
    user = [{"role": "user", "content": "Hi"}]
    big = 10 ** 30
    responses = [
        b"", b"{", b"[]", b"null", b"\"input\"", b'{"input": "a"} x', b'{"input": "\\u0000"}', b"\xff\xfe",
        {}, {"input": None}, {"input": 5}, {"input": {}}, {"input": []}, {"input": [5]}, {"input": [{}]},
        {"input": [{"role": "robot", "content": "x"}]}, {"input": [{"role": "user", "content": 5}]},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,@@"}]}]},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://example.com/a.png"}]}]},
        {"input": [{"type": "function_call", "name": "f"}]},
        {"input": [{"type": "function_call_output", "output": "x"}]},
        {"input": [{"type": "item_reference", "id": "x"}]}, {"input": [{"type": "web_search_call"}]},
        {"input": "x", "model": "gpt-4o"}, {"input": "x", "model": 5},
        {"input": "x", "max_output_tokens": 0}, {"input": "x", "max_output_tokens": -3},
        {"input": "x", "max_output_tokens": "9"}, {"input": "x", "max_output_tokens": big},
        {"input": "x", "max_output_tokens": 1.5}, {"input": "x", "temperature": 3}, {"input": "x", "temperature": "hot"},
        {"input": "x", "top_p": 0}, {"input": "x", "stream": "yes"}, {"input": "x", "store": 1},
        {"input": "x", "instructions": 5}, {"input": "x", "previous_response_id": 7},
        {"input": "x", "previous_response_id": "resp_nope"}, {"input": "x", "tools": {}},
        {"input": "x", "tools": [{"type": "web_search"}]}, {"input": "x", "tools": [{"type": "function"}]},
        {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]},
        {"input": "x", "tool_choice": "required"}, {"input": "x", "tool_choice": {"type": "function", "name": "f"}},
        {"input": "x", "reasoning": {"effort": "maximal"}}, {"input": "x", "reasoning": "high"},
        {"input": "x", "text": {"format": {"type": "xml"}}}, {"input": "x", "text": 5},
        {"input": "x", "background": True}, {"input": "x", "conversation": "conv_1"},
        {"input": "x", "parallel_tool_calls": "no"}, {"input": [{"role": "user", "content": "a" * 50}] * 3000},
    ]
    messages = [
        b"", b"{", b"[]", b"null", b"\xff", b'{"max_tokens": 5, "messages": []} []',
        {}, {"messages": user}, {"max_tokens": 5}, {"max_tokens": 5, "messages": None},
        {"max_tokens": 5, "messages": {}}, {"max_tokens": 5, "messages": []}, {"max_tokens": 5, "messages": [5]},
        {"max_tokens": 0, "messages": user}, {"max_tokens": -1, "messages": user}, {"max_tokens": "5", "messages": user},
        {"max_tokens": big, "messages": user}, {"max_tokens": 2.5, "messages": user},
        {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        {"max_tokens": 5, "messages": [{"role": "user"}]}, {"max_tokens": 5, "messages": [{"role": "user", "content": 5}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [5]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "!!!!"}}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
            "type": "url", "url": "https://example.com/cat.png"}}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                     "content": 5}]}]},
        {"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]},
        {"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                          "input": "{}"}]}]},
        {"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "image"}]}]},
        {"max_tokens": 5, "messages": user, "system": 5}, {"max_tokens": 5, "messages": user, "system": [{"type": "image"}]},
        {"max_tokens": 5, "messages": user, "model": "claude-x"}, {"max_tokens": 5, "messages": user, "temperature": 1.5},
        {"max_tokens": 5, "messages": user, "temperature": "0"}, {"max_tokens": 5, "messages": user, "top_p": 2},
        {"max_tokens": 5, "messages": user, "top_k": -1}, {"max_tokens": 5, "messages": user, "stream": 1},
        {"max_tokens": 5, "messages": user, "stop_sequences": "x"}, {"max_tokens": 5, "messages": user,
                                                                     "stop_sequences": [""]},
        {"max_tokens": 5, "messages": user, "stop_sequences": ["a"] * 17},
        {"max_tokens": 5, "messages": user, "tools": {}}, {"max_tokens": 5, "messages": user, "tools": [{"name": "f"}]},
        {"max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"max_tokens": 5, "messages": user, "tool_choice": "auto"},
        {"max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}},
        {"max_tokens": 5, "messages": user, "tool_choice": {"type": "tool", "name": "f"}},
        {"max_tokens": 5, "messages": user, "thinking": {"type": "enabled"}},
        {"max_tokens": 5, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 10}},
        {"max_tokens": 1100, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 2000}},
        {"max_tokens": 5, "messages": user, "thinking": {"type": "on"}},
        {"max_tokens": 5000, "messages": user},
    ]
    count = [b"{", {}, {"messages": 5}, {"messages": []}, {"messages": [{"role": "tool", "content": "x"}]},
             {"messages": user, "system": 5}, {"messages": user, "tools": [{"name": "f"}]}, {"messages": user,
                                                                                           "model": "other"}]
    bad = []
    n = 0
    for path, bodies, shape in (("/v1/responses", responses, openai_error_shape),
                                ("/v1/messages", messages, anthropic_error_shape),
                                ("/v1/messages/count_tokens", count, anthropic_error_shape)):
        for body in bodies:
            n += 1
            st_, _, data = call(s.port, "POST", path, body)
            if not (400 <= st_ < 500 and shape(data)):
                bad.append("%s %r -> %d %r" % (path, body if len(repr(body)) < 200 else repr(body)[:200], st_,
                                               data[:200]))
    check(not bad, "%d of %d malformed bodies mishandled" % (len(bad), n), "\n".join(bad))
    print("malformed: %d bodies, each a 4xx in its API's shape" % n)
    # the clients raise their own typed errors
    try:
        oai.responses.create(model="tiny", input="x", max_output_tokens=0)
        check(False, "openai client: max_output_tokens 0 refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "max_output_tokens", "responses error names its param", e.body)
    ant = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)
    try:
        acreate(ant, model="tiny", max_tokens=5, messages=[{"role": "user", "content": 5}])
        check(False, "anthropic client: bad content refused")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error" and "messages.0.content" in e.body["error"]["message"],
              "messages error names the field", e.body)
    try:
        acreate(ant, model="other", max_tokens=5, messages=user)
        check(False, "unknown model refused")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "unknown model: not_found_error")
    # still serving
    check(oai.responses.create(model="tiny", input="Hi", max_output_tokens=2).usage.output_tokens >= 1,
          "a normal request after the malformed ones")


def main():
    s = Server("--allowed-media-dir", TMP, name="main")
    try:
        oai = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        ant = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0, timeout=120)
        part_responses(s, oai)
        part_responses_tools(s, oai)
        part_messages(s, oai, ant)
        part_messages_tools(s, oai, ant)
        part_auth(s)
        part_malformed(s, oai)
    finally:
        s.stop()
    part_responses_store_bound()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
