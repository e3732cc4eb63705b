"""Constrained decoding through `gemma4 serve`, on the bundled trained model
and the random-weight e2b fixture:
  - sampled replies at temperature 1 for the 20 schemas of
    tests/data/constrain/schemas.json parse with json and validate with
    jsonschema (a few per schema here; bench/constrain_acceptance.py runs
    1,000 per schema);
  - tool_choice "required" and a named function give OpenAI tool_calls whose
    arguments validate against the tool's parameters; a strict tool in auto
    mode too, once the model calls it;
  - the official openai client's chat.completions.parse with a Pydantic model;
  - the Responses API's text.format and forced tool calls there and in the
    Messages API (the same constraint field);
  - json_object, the llama-server and vLLM aliases (json_schema, grammar,
    guided_json, guided_regex, guided_choice), streaming;
  - 400s naming the unsupported keyword and its JSON pointer, and conflicts.
Needs (PyPI): openai, pydantic, jsonschema.
"""
import json
import os
import re
import sys

import jsonschema

sys.path.insert(0, os.path.dirname(__file__))
from checks import check, summary  # noqa: E402
from constrain_server import SCHEMAS, Server, models, sample_schemas, validate  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "days": {"type": "integer"},
                                         "unit": {"enum": ["C", "F"]}},
        "required": ["city", "days", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"},
                                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                  "maxItems": 2}},
        "required": ["a", "b", "tags"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_schemas(srv, label):
    results = sample_schemas(srv, 1, 128)
    bad = [(n, s, st, c) for n, s, st, c, _ in results if st != 200 or validate(
        next(x["schema"] for x in SCHEMAS if x["name"] == n), c)]
    check(not bad, "%s: %d sampled replies over 20 schemas all parse and validate" % (label, len(results)),
          "\n".join("%s seed %d: %s %r" % (n, s, st, c[:300]) for n, s, st, c in bad[:5]))


def check_tools(srv, label):
    msgs = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    for choice, names in (("required", {"get_weather", "add"}),
                          ({"type": "function", "function": {"name": "add"}}, {"add"})):
        for seed in range(2):
            st, r = srv.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice": choice,
                                                      "temperature": 1, "seed": seed, "max_tokens": 120})
            ok = st == 200
            calls = r["choices"][0]["message"].get("tool_calls") if ok else None
            check(ok and calls, "%s: tool_choice %s gives tool_calls" % (label, json.dumps(choice)), json.dumps(r)[:600])
            if not calls:
                continue
            check(r["choices"][0]["finish_reason"] == "tool_calls", "%s: finish_reason tool_calls" % label,
                  r["choices"][0]["finish_reason"])
            if choice != "required":
                check(len(calls) == 1, "%s: a named function gives exactly one call" % label, calls)
            for c in calls:
                fn = c["function"]
                check(fn["name"] in names, "%s: call of an allowed tool" % label, fn["name"])
                try:
                    args = json.loads(fn["arguments"])
                    jsonschema.validate(args, PARAMS[fn["name"]])
                    good = True
                except (ValueError, jsonschema.ValidationError, KeyError) as e:
                    good = str(e)
                check(good is True, "%s: arguments of %s validate against its parameters" % (label, fn["name"]),
                      "%s: %s" % (fn["arguments"], good))
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice":
                                              {"type": "function", "function": {"name": "nope"}}})
    check(st == 400 and "nope" in r["error"]["message"], "%s: a named function that is not a tool is a 400" % label, r)


def check_aliases(srv, label):
    msgs = [{"role": "user", "content": "Say something."}]
    cases = [
        ({"response_format": {"type": "json_object"}}, lambda c: isinstance(json.loads(c), dict)),
        ({"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
         lambda c: jsonschema.validate(json.loads(c), {"type": "array", "items": {"type": "integer"}}) is None),
        ({"guided_json": json.dumps({"enum": ["yes", "no"]})}, lambda c: json.loads(c) in ("yes", "no")),
        ({"guided_regex": "[A-C]{2}-[0-9]{1,3}"}, lambda c: re.fullmatch("[A-C]{2}-[0-9]{1,3}", c)),
        ({"guided_choice": ["alpha", "beta gamma"]}, lambda c: c in ("alpha", "beta gamma")),
        ({"grammar": 'root ::= "(" [a-z]{1,5} ("," [a-z]{1,5})? ")"'},
         lambda c: re.fullmatch(r"\([a-z]{1,5}(,[a-z]{1,5})?\)", c)),
    ]
    for extra, ok in cases:
        for seed in range(1):
            body = {"messages": msgs, "temperature": 1, "seed": seed, "max_tokens": 40, **extra}
            st, r = srv.post("/v1/chat/completions", body)
            content = r["choices"][0]["message"]["content"] if st == 200 else None
            try:
                good = st == 200 and bool(ok(content))
            except Exception:  # noqa: BLE001 - any parse failure is a failed check
                good = False
            check(good, "%s: %s" % (label, list(extra)[0]), "%s %r" % (st, content if content is not None else r))
    # completions endpoint: vLLM's guided_regex
    st, r = srv.post("/v1/completions", {"prompt": "In the beginning", "guided_regex": "( [a-z]+){2,4}\\.",
                                         "temperature": 1, "max_tokens": 30, "seed": 3})
    text = r["choices"][0]["text"] if st == 200 else None
    check(st == 200 and re.fullmatch("( [a-z]+){2,4}\\.", text), "%s: completions with guided_regex" % label,
          "%s %r" % (st, text if text is not None else r))
    # streaming: the concatenated deltas validate
    schema = SCHEMAS[0]["schema"]
    import urllib.request
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(
        {"messages": msgs, "stream": True, "temperature": 1, "seed": 5, "max_tokens": 80,
         "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}).encode(),
        headers={"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:])["choices"]:
                    text += ch.get("delta", {}).get("content") or ""
    check(validate(schema, text) is None, "%s: streamed deltas form a valid instance" % label, repr(text))


def check_agent_apis(srv, label):
    """The Responses and Messages APIs fill the same constraint: text.format and forced tool calls."""
    schema = next(x["schema"] for x in SCHEMAS if x["name"] == "enum_status")
    st, r = srv.post("/v1/responses", {"input": "Status?", "temperature": 1, "max_output_tokens": 60,
                                       "text": {"format": {"type": "json_schema", "name": "s", "schema": schema,
                                                           "strict": True}}})
    text = "".join(c.get("text", "") for o in (r.get("output") or []) if o.get("type") == "message"
                   for c in o.get("content", [])) if st == 200 else None
    check(st == 200 and validate(schema, text) is None, "%s: Responses text.format json_schema validates" % label,
          "%s %r" % (st, text if text is not None else r))
    params = PARAMS["get_weather"]
    st, r = srv.post("/v1/responses", {"input": "Weather?", "temperature": 1, "max_output_tokens": 120,
                                       "tools": [{"type": "function", "name": "get_weather", "parameters": params}],
                                       "tool_choice": "required"})
    calls = [o for o in (r.get("output") or []) if o.get("type") == "function_call"] if st == 200 else []
    check(calls and all(o["name"] == "get_weather" and jsonschema.Draft202012Validator(params).is_valid(
        json.loads(o["arguments"])) for o in calls), "%s: Responses tool_choice required gives valid calls" % label,
          json.dumps(r)[:600])
    st, r = srv.post("/v1/messages", {"max_tokens": 120, "temperature": 1,
                                      "messages": [{"role": "user", "content": "Weather?"}],
                                      "tools": [{"name": "get_weather", "input_schema": params}],
                                      "tool_choice": {"type": "tool", "name": "get_weather"}})
    uses = [b for b in (r.get("content") or []) if b.get("type") == "tool_use"] if st == 200 else []
    check(len(uses) == 1 and uses[0]["name"] == "get_weather" and
          jsonschema.Draft202012Validator(params).is_valid(uses[0]["input"]),
          "%s: Messages tool_choice {type: tool} gives one valid tool_use" % label, json.dumps(r)[:600])


def check_errors(srv, label):
    msgs = [{"role": "user", "content": "x"}]
    for schema, needle in [({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}},
                            "'maximum' at #/properties/n/maximum"),
                           ({"type": "string", "format": "hostname"}, "format 'hostname'")]:
        st, r = srv.post("/v1/chat/completions", {"messages": msgs, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        check(st == 400 and needle in r["error"]["message"] and r["error"]["param"] == "response_format",
              "%s: 400 names %s" % (label, needle), r)
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_object"},
                                              "guided_regex": "a"})
    check(st == 400 and "conflicts" in r["error"]["message"], "%s: two constraints are a 400" % label, r)
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "grammar": "root ::= root \"a\" | \"b\""})
    check(st == 400 and "left-recursive" in r["error"]["message"], "%s: a bad grammar is a 400" % label, r)
    st, r = srv.post("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "xml"}})
    check(st == 400 and r["error"]["param"] == "response_format", "%s: unknown response_format type" % label, r)


def check_openai_parse(srv, label):
    import openai
    from pydantic import BaseModel, Field

    class Step(BaseModel):
        verse: str = Field(max_length=30)
        number: int

    class Answer(BaseModel):
        title: str = Field(max_length=20)
        steps: list[Step] = Field(max_length=2)
        done: bool

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    model = client.models.list().data[0].id
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for seed in range(2):
        r = parse(model=model, messages=[{"role": "user", "content": "Answer."}], response_format=Answer,
                  temperature=1, seed=seed, max_tokens=120)
        parsed = r.choices[0].message.parsed
        check(isinstance(parsed, Answer), "%s: openai parse gives the Pydantic model" % label, r.choices[0].message)


def timed(what, fn, *args):
    import time
    t = time.time()
    fn(*args)
    print("%s: %.1f s" % (what, time.time() - t), flush=True)


def main():
    for label, model in models():
        srv = Server(model, name=label)
        try:
            timed(label + ' schemas', check_schemas, srv, label)
            timed(label + ' tools', check_tools, srv, label)
            timed(label + ' aliases', check_aliases, srv, label)
            timed(label + ' agent_apis', check_agent_apis, srv, label)
            timed(label + ' errors', check_errors, srv, label)
            timed(label + ' openai_parse', check_openai_parse, srv, label)
        finally:
            rc, log = srv.stop()
        check(rc == 0, "%s: server exit status" % label, rc)
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            check(bad not in log, "%s: server log reports %s" % (label, bad), log[log.find(bad) - 300:][:2000])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
