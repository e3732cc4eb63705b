#!/usr/bin/env python3
"""Render the chat-format test cases with the official Gemma 4 chat templates.

Writes tests/data/chat/cases.json, which tests/unit/test_chat.c compares byte
for byte against src/text/chat_*.c.

The expected prompts come from transformers itself: a PreTrainedTokenizerFast
with Gemma's special tokens (bos "<bos>", eos "<eos>", ...) over a tiny
in-memory vocabulary (rendering does not look at the vocabulary) and
tokenizer.apply_chat_template(messages, tools=..., chat_template=<hub file>,
tokenize=False, add_generation_prompt=..., enable_thinking=...). That is the
real code path: jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, raise_exception, the special tokens as variables and
transformers' message preprocessing (reasoning-field aliasing).

The media-expansion expectations come from transformers' Gemma4Processor
(replace_image_token / replace_audio_token / replace_video_token and
ProcessorMixin.get_text_with_replacements) on a processor object that holds
only the token strings (no image/audio processing is needed for the text).

Usage: python3 tests/tools/render_chat_cases.py
Needs (PyPI): transformers (>= 5.5, no torch needed), jinja2 >= 3.1.6, numpy.
"""
import hashlib
import json
import os
import sys

import jinja2
import numpy as np
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.video_utils import VideoMetadata

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "chat")
TEMPLATES = {
    # variant name used by the C test -> vendored copy of the hub file
    "small": "gemma-4-E2B-it.chat_template.jinja",   # E2B and E4B (same bytes)
    "large": "gemma-4-31B-it.chat_template.jinja",   # 26B-A4B and 31B (same bytes)
    "12b": "gemma-4-12B-it.chat_template.jinja",     # 12B (same bytes as large)
}


def make_tokenizer():
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    vocab = Tokenizer(models.WordLevel({s: i for i, s in enumerate(specials)}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=vocab, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")


# ---------------------------------------------------------------- tools
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
        "days": {"type": "integer", "description": "Forecast days"}},
        "required": ["city"]}}}

SEARCH = {"type": "function", "function": {
    "name": "search_items",
    "description": "Search the catalogue — with filters.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags to match"},
        "colours": {"type": "array", "items": {"type": "string", "enum": ["red", "green"]}},
        "filters": {"type": "object", "description": "Filters",
                    "properties": {"min_price": {"type": "number"}, "in_stock": {"type": "boolean"}},
                    "required": ["in_stock"]},
        "points": {"type": "array", "items": {"type": "object",
                                              "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                              "required": ["x", "y"]}},
        "note": {"type": "string", "nullable": True},
        "Zeta": {"type": "string", "description": "upper-case key sorts case-insensitively"},
        "alpha": {"type": "STRING"},
        "meta": {"type": "object", "additionalProperties": {"type": "string"}, "description": "free form"},
        "maybe": {"type": "array", "items": {"type": ["string", "null"], "description": None}},
        "limit": {"type": "integer", "description": "Max results", "minimum": 1}},
        "required": ["query", "filters"]},
    "response": {"type": "object", "description": "The matching items"}}}

NO_PARAMS = {"type": "function", "function": {"name": "get_time", "description": "Current UTC time"}}
EMPTY_PARAMS = {"type": "function", "function": {"name": "ping", "description": "", "parameters": {}}}
# parameters without 'type': the template leaves 'parameters:{' unclosed; rendered as it is.
UNTYPED_PARAMS = {"type": "function", "function": {
    "name": "echo", "description": "Echo text",
    "parameters": {"properties": {"text": {"type": "string"}}, "required": ["text"]},
    "response": {"type": "string", "description": "the same text"}}}
# a property type given as a list: the template prints Python's repr of the list
LIST_TYPE = {"type": "function", "function": {
    "name": "f", "description": "d",
    "parameters": {"type": "object", "properties": {"x": {"type": ["string", "null"]}}}}}

ARGS = {"lat": 48.8566, "lon": -2.5, "count": 3, "tiny": 1e-07, "big": 12345678901234, "huge": 1.5e+300,
        "flag": True, "off": False, "nothing": None, "text": "a \"quoted\" {brace}, colon: and\nnewline",
        "list": [1, "two", [3.25, None]], "nested": {"Beta": "b", "alpha": {"x": 1}, "a": []},
        "unicode": "héllo 世界 🎉"}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello!"}
A1 = {"role": "assistant", "content": "Hi! How can I help?"}
U2 = {"role": "user", "content": "What is 2+2?"}

TOOL_FLOW = [
    SYS,
    {"role": "user", "content": "Weather in Paris and London?"},
    {"role": "assistant", "content": "", "reasoning": "I should call the tool twice.",
     "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
         {"id": "call_2", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "London", "days": 3}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Rainy, 14 C"},
]

CASES = [
    # --- basics
    dict(name="user_only_gen", messages=[U1], add_generation_prompt=True),
    dict(name="user_only_nogen", messages=[U1], add_generation_prompt=False),
    dict(name="system_user", messages=[SYS, U1], add_generation_prompt=True),
    dict(name="developer_user", messages=[{"role": "developer", "content": "  Be terse.\n"}, U1],
         add_generation_prompt=True),
    dict(name="system_parts", messages=[
        {"role": "system", "content": [{"type": "text", "text": " Rule one. "}, {"type": "image"},
                                       {"type": "text", "text": "Rule two."}]}, U1],
         add_generation_prompt=True),
    dict(name="system_only", messages=[SYS], add_generation_prompt=True),
    dict(name="system_null_content", messages=[{"role": "system", "content": None}, U1],
         add_generation_prompt=True),
    dict(name="multi_turn", messages=[SYS, U1, A1, U2], add_generation_prompt=True),
    dict(name="multi_turn_nogen", messages=[U1, A1, U2, {"role": "assistant", "content": "4"}],
         add_generation_prompt=False),
    dict(name="ends_with_assistant_gen", messages=[U1, A1], add_generation_prompt=True),
    dict(name="model_role", messages=[U1, {"role": "model", "content": "<|channel>thought\nx<channel|>Yo"}, U2],
         add_generation_prompt=True),
    dict(name="system_mid_conversation", messages=[U1, A1, {"role": "system", "content": "New rule."}, U2],
         add_generation_prompt=True),
    dict(name="empty_messages", messages=[], add_generation_prompt=True),
    dict(name="empty_messages_thinking", messages=[], add_generation_prompt=True, enable_thinking=True),
    # --- thinking
    dict(name="thinking_on", messages=[U1], add_generation_prompt=True, enable_thinking=True),
    dict(name="thinking_on_system", messages=[SYS, U1], add_generation_prompt=True, enable_thinking=True),
    dict(name="thinking_off_explicit", messages=[SYS, U1], add_generation_prompt=True, enable_thinking=False),
    dict(name="thinking_on_nogen", messages=[U1, A1], add_generation_prompt=False, enable_thinking=True),
    dict(name="reasoning_dropped_before_last_user", messages=[
        U1, {"role": "assistant", "content": "Hi!", "reasoning": "The user greets me."}, U2],
         add_generation_prompt=True, enable_thinking=True),
    dict(name="reasoning_content_after_last_user", messages=[
        U1, {"role": "assistant", "content": "Hi!", "reasoning_content": "Greeting back."}],
         add_generation_prompt=False, enable_thinking=True),
    dict(name="thinking_field_alias", messages=[
        U1, {"role": "assistant", "content": "Hi", "thinking": "gpt-oss style field"}],
         add_generation_prompt=False),
    dict(name="reasoning_fields_precedence", messages=[
        U1, {"role": "assistant", "content": "A", "reasoning": "", "reasoning_content": None, "thinking": "T"},
        {"role": "assistant", "content": "B", "reasoning": "R", "reasoning_content": "RC"},
        {"role": "assistant", "content": "C", "reasoning_content": "", "thinking": "T2"}],
         add_generation_prompt=False),
    dict(name="reasoning_empty_string", messages=[U1, {"role": "assistant", "content": "Hi", "reasoning": ""}],
         add_generation_prompt=False),
    dict(name="content_with_thought_stripped", messages=[
        U1, {"role": "assistant", "content": "<|channel>thought\nLet me think.<channel|>  The answer. "}, U2],
         add_generation_prompt=True),
    dict(name="content_parts_with_thought_stripped", messages=[
        U1, {"role": "assistant", "content": [
            {"type": "text", "text": "<|channel>thought\nA<channel|>One "},
            {"type": "text", "text": " two<|channel>thought\nB<channel|> three"}]}],
         add_generation_prompt=False),
    dict(name="unterminated_thought_in_content", messages=[
        U1, {"role": "assistant", "content": "Before <|channel>thought\nnever closed"}],
         add_generation_prompt=False),
    dict(name="preserve_thinking_tool_calls", messages=[
        U1, {"role": "assistant", "reasoning": "old thought", "tool_calls": [
            {"id": "a", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."}, U2],
         add_generation_prompt=True, enable_thinking=True, preserve_thinking=True),
    # --- media
    dict(name="image_before_text", messages=[
        {"role": "user", "content": [{"type": "image", "url": "cat.png"}, {"type": "text", "text": "Describe."}]}],
         add_generation_prompt=True),
    dict(name="image_after_text", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image_url",
                                                                          "image_url": {"url": "x"}}]}],
         add_generation_prompt=True),
    dict(name="two_images_between_text", messages=[
        {"role": "user", "content": [{"type": "text", "text": "First"}, {"type": "image"},
                                     {"type": "text", "text": " and second "}, {"type": "image"},
                                     {"type": "text", "text": "compare"}]}],
         add_generation_prompt=True),
    dict(name="audio_parts", messages=[
        {"role": "user", "content": [{"type": "audio", "path": "a.wav"}, {"type": "text", "text": "Transcribe"},
                                     {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}],
         add_generation_prompt=True, enable_thinking=True),
    dict(name="video_part", messages=[
        SYS, {"role": "user", "content": [{"type": "video", "path": "v.mp4"}, {"type": "text", "text": "What happens?"}]}],
         add_generation_prompt=True),
    dict(name="media_only", messages=[{"role": "user", "content": [{"type": "image"}, {"type": "audio"}]}],
         add_generation_prompt=True),
    dict(name="unknown_part_type", messages=[
        {"role": "user", "content": [{"type": "file", "file": {}}, {"type": "text", "text": "ok"}]}],
         add_generation_prompt=True),
    dict(name="multi_turn_images", messages=[
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "And this?"}, {"type": "image"}]}],
         add_generation_prompt=True),
    # --- whitespace, empty, unicode
    dict(name="empty_content", messages=[{"role": "user", "content": ""}], add_generation_prompt=True),
    dict(name="null_content", messages=[{"role": "user", "content": None}, {"role": "assistant", "content": None}],
         add_generation_prompt=True),
    dict(name="missing_content", messages=[{"role": "user"}], add_generation_prompt=True),
    dict(name="whitespace_only", messages=[{"role": "user", "content": " \n\t "},
                                           {"role": "assistant", "content": "\n\n"}],
         add_generation_prompt=True),
    dict(name="trim_unicode_whitespace", messages=[
        {"role": "user", "content": "\u00a0\u3000 hi \u2028\u2003\x1c\x85"},
        {"role": "assistant", "content": "\u200bzero-width is not space\u200b"}],
         add_generation_prompt=True),
    dict(name="inner_whitespace_kept", messages=[{"role": "user", "content": "  a\n\n  b\t c  "}],
         add_generation_prompt=True),
    dict(name="unicode_text", messages=[
        {"role": "system", "content": "Réponds en français — s'il te plaît."},
        {"role": "user", "content": "日本語で？ 🎉 Ελληνικά"}], add_generation_prompt=True),
    dict(name="special_strings_in_text", messages=[
        {"role": "user", "content": "literal <|turn>user and <turn|> and <start_of_turn>"}],
         add_generation_prompt=True),
    dict(name="empty_list_content", messages=[{"role": "user", "content": []}], add_generation_prompt=True),
    # --- tools
    dict(name="tools_declared", messages=[SYS, U1], tools=[WEATHER], add_generation_prompt=True),
    dict(name="tools_no_system", messages=[U1], tools=[WEATHER, NO_PARAMS], add_generation_prompt=True),
    dict(name="tools_thinking", messages=[SYS, U1], tools=[WEATHER], add_generation_prompt=True,
         enable_thinking=True),
    dict(name="tools_complex_schema", messages=[U1], tools=[SEARCH, EMPTY_PARAMS, UNTYPED_PARAMS],
         add_generation_prompt=True),
    dict(name="tools_empty_list", messages=[U1], tools=[], add_generation_prompt=True),
    dict(name="tool_flow_gen", messages=TOOL_FLOW, tools=[WEATHER], add_generation_prompt=True),
    dict(name="tool_flow_gen_thinking", messages=TOOL_FLOW, tools=[WEATHER], add_generation_prompt=True,
         enable_thinking=True),
    dict(name="tool_flow_complete", messages=TOOL_FLOW + [
        {"role": "assistant", "content": "Paris: 21 °C. London: rainy, 14 °C."},
        {"role": "user", "content": "Thanks!"}], tools=[WEATHER], add_generation_prompt=True),
    dict(name="tool_flow_complete_nogen", messages=TOOL_FLOW + [
        {"role": "assistant", "content": "Done."}], tools=[WEATHER], add_generation_prompt=False),
    dict(name="tool_call_pending", messages=[
        U1, {"role": "assistant", "tool_calls": [
            {"id": "x", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}],
         tools=[WEATHER], add_generation_prompt=True),
    dict(name="tool_call_arguments_rich", messages=[
        U1, {"role": "assistant", "content": "Calling.", "tool_calls": [
            {"id": "r", "function": {"name": "search_items", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "r", "content": [{"type": "text", "text": "found "},
                                                          {"type": "image"}, {"type": "text", "text": "1"}]}],
         add_generation_prompt=True),
    dict(name="tool_call_null_arguments", messages=[
        U1, {"role": "assistant", "tool_calls": [{"function": {"name": "get_time", "arguments": None}}]},
        {"role": "tool", "content": "12:00", "name": "get_time"}], add_generation_prompt=True),
    dict(name="tool_name_resolution", messages=[
        U1, {"role": "assistant", "tool_calls": [
            {"id": "1", "function": {"name": "first", "arguments": {}}},
            {"id": "2", "function": {"name": "second", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "2", "content": "B"},
        {"role": "tool", "content": "no id: matches calls without id (none here) -> name"},
        {"role": "tool", "tool_call_id": "9", "name": "", "content": "unknown"}],
         add_generation_prompt=True),
    dict(name="tool_ids_missing_everywhere", messages=[
        U1, {"role": "assistant", "tool_calls": [
            {"function": {"name": "first", "arguments": {}}}, {"function": {"name": "second", "arguments": {}}}]},
        {"role": "tool", "content": "last call wins"}], add_generation_prompt=True),
    dict(name="tool_response_non_string", messages=[
        U1, {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "n", "arguments": {"k": 1}}}]},
        {"role": "tool", "tool_call_id": "t", "content": None},
        {"role": "tool", "tool_call_id": "t", "content": 42},
        {"role": "tool", "tool_call_id": "t", "content": 2.5},
        {"role": "tool", "tool_call_id": "t", "content": True}], add_generation_prompt=True),
    dict(name="error_tool_response_dict", messages=[
        U1, {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "n", "arguments": {"k": 1}}}]},
        {"role": "tool", "tool_call_id": "t", "content": {"temp": 3}}], add_generation_prompt=True),
    dict(name="error_user_content_dict", messages=[{"role": "user", "content": {"text": "hi"}}],
         add_generation_prompt=True),
    dict(name="legacy_tool_responses", messages=[
        U1, {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
             "tool_responses": [{"name": "get_weather", "response": {"temp": 25, "sky": "sunny"}},
                                {"name": "", "response": "plain"}]}],
         add_generation_prompt=True, enable_thinking=True),
    dict(name="legacy_tool_responses_then_answer", messages=[
        U1, {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}],
             "tool_responses": [{"name": "get_weather", "response": {"temp": 25}}]},
        {"role": "assistant", "content": "25 degrees in Rome."}], add_generation_prompt=False),
    dict(name="consecutive_assistant", messages=[
        U1, {"role": "assistant", "content": "Part one."}, {"role": "assistant", "content": "Part two."}, U2],
         add_generation_prompt=True),
    dict(name="tool_call_then_assistant_no_tool_msgs", messages=[
        U1, {"role": "assistant", "tool_calls": [{"id": "q", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "assistant", "content": "Answer without a tool result."}], add_generation_prompt=True),
    dict(name="tool_call_content_after_response", messages=[
        U1, {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "q", "function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "q", "content": "9am"}], add_generation_prompt=False),
    # --- errors (the template raises; the C renderer must fail too)
    dict(name="error_string_arguments", messages=[
        U1, {"role": "assistant", "tool_calls": [
            {"id": "s", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}],
         add_generation_prompt=True),
    dict(name="error_missing_role", messages=[{"content": "no role"}], add_generation_prompt=True),
    # --- rendered by jinja, deliberately rejected by C (Python-specific stringification)
    dict(name="c_unsupported_null_text_part", messages=[
        {"role": "user", "content": [{"type": "text", "text": None}]}], add_generation_prompt=True,
         c_unsupported=True),
    dict(name="c_unsupported_list_type", messages=[U1], tools=[LIST_TYPE], add_generation_prompt=True,
         c_unsupported=True),
    dict(name="c_unsupported_numeric_text", messages=[
        {"role": "user", "content": [{"type": "text", "text": 5}]}], add_generation_prompt=True,
         c_unsupported=True),
]

def random_cases(n, seed=4):
    """Seeded random conversations mixing every message shape, to exercise the
    template's turn bookkeeping (continuations, tool scans, closing markers)."""
    import random
    rng = random.Random(seed)
    words = ["alpha", " beta ", "γάμμα", "\n delta\n", "", "  ", "ε—ζ", "<|channel>thought\nx<channel|>y"]

    def text():
        return rng.choice(words) + rng.choice(words)

    def parts():
        out = []
        for _ in range(rng.randint(0, 4)):
            kind = rng.choice(["text", "text", "image", "audio", "video", "image_url", "input_audio", "other"])
            out.append({"type": kind, "text": text()} if kind == "text" else {"type": kind})
        return out

    def content():
        return rng.choice([text(), text(), parts(), None, ""])

    def call(i):
        args = rng.choice([{}, {"q": text()}, {"n": rng.randint(-5, 500), "f": rng.choice([0.25, -1.5, 3e-9])},
                           {"list": [1, {"k": None}, [True]], "Key": "v"}, None])
        return {"id": "id%d" % i, "function": {"name": rng.choice(["get_weather", "search_items", "f"]),
                                               "arguments": args}}

    cases = []
    for k in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": rng.choice(["system", "developer"]), "content": rng.choice([text(), parts()])})
        for _ in range(rng.randint(1, 7)):
            r = rng.random()
            if r < 0.35:
                msgs.append({"role": "user", "content": content()})
            elif r < 0.75:
                m = {"role": "assistant", "content": content()}
                if rng.random() < 0.4:
                    m[rng.choice(["reasoning", "reasoning_content", "thinking"])] = text()
                if rng.random() < 0.4:
                    m["tool_calls"] = [call(i) for i in range(rng.randint(1, 3))]
                    if rng.random() < 0.2:
                        m["tool_responses"] = [{"name": rng.choice(["get_weather", ""]),
                                                "response": rng.choice([{"t": 1}, "ok", None, 7])}]
                    else:
                        for i in range(rng.randint(0, len(m["tool_calls"]) + 1)):
                            tm = {"role": "tool", "content": rng.choice([text(), parts(), None, 3])}
                            if rng.random() < 0.7:
                                tm["tool_call_id"] = "id%d" % rng.randint(0, 3)
                            if rng.random() < 0.3:
                                tm["name"] = rng.choice(["named", ""])
                            m.setdefault("_tools", []).append(tm)
                tools_after = m.pop("_tools", [])
                msgs.append(m)
                msgs.extend(tools_after)
            elif r < 0.85:
                msgs.append({"role": "model", "content": content()})
            else:
                msgs.append({"role": "system", "content": text()})
        case = dict(name="random_%02d" % k, messages=msgs, add_generation_prompt=rng.random() < 0.7)
        if rng.random() < 0.5:
            case["enable_thinking"] = rng.random() < 0.6
        if rng.random() < 0.2:
            case["preserve_thinking"] = True
        if rng.random() < 0.3:
            case["tools"] = rng.sample([WEATHER, SEARCH, NO_PARAMS, UNTYPED_PARAMS], rng.randint(1, 2))
        cases.append(case)
    return cases


CASES += random_cases(60)


# Tool-call replies: the template's own rendering of a tool call is what the
# model is trained to emit, so the parser must turn it back into the arguments.
REPLY_CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "search_items", "arguments": ARGS},
    {"name": "get_time", "arguments": {}},
    {"name": "weird", "arguments": {"s": "", "e": "<", "q": "x}y,z:w[v]", "neg": -17, "f": 0.001,
                                    "deep": [[{"k": [True]}]]}},
]


def render(tok, template, case):
    kwargs = {}
    for key in ("enable_thinking", "preserve_thinking"):
        if key in case:
            kwargs[key] = case[key]
    return tok.apply_chat_template(case["messages"], tools=case.get("tools"), chat_template=template,
                                   tokenize=False, add_generation_prompt=case["add_generation_prompt"], **kwargs)


# Media expansion: (prompt text, items). Image/audio items: token count;
# video items: tokens per frame, fps and sampled frame indices.
MEDIA_CASES = [
    dict(name="one_image", text="<|turn>user\n<|image|>Describe.<turn|>\n", items=[("image", 3)]),
    dict(name="mixed_order", text="a<|audio|>b<|image|>c<|video|>d<|image|>e<|audio|>",
         items=[("image", 2), ("audio", 4), ("video", 2, 24.0, [0, 12, 1450]), ("image", 1), ("audio", 0)]),
    dict(name="video_long", text="<|video|>", items=[("video", 1, 2.0, [0, 3, 121, 12001])]),
    dict(name="lookalikes_untouched", text="<|image><image|><|image|x<|audio>", items=[]),
    dict(name="adjacent", text="<|image|><|image|>", items=[("image", 1), ("image", 2)]),
]


class _TokenStrings:
    boi_token, eoi_token, image_token = "<|image>", "<image|>", "<|image|>"
    boa_token, eoa_token, audio_token = "<|audio>", "<audio|>", "<|audio|>"
    video_token = "<|video|>"


def expand_media(case):
    proc = object.__new__(Gemma4Processor)
    for k, v in vars(_TokenStrings).items():
        if not k.startswith("_"):
            setattr(proc, k, v)
    images = [it for it in case["items"] if it[0] == "image"]
    audios = [it for it in case["items"] if it[0] == "audio"]
    videos = [it for it in case["items"] if it[0] == "video"]
    img_in = {"num_soft_tokens_per_image": [it[1] for it in images]}
    # a feature mask whose two stride-2 subsamplings leave exactly n valid frames
    aud_in = {"input_features_mask": [np.ones(4 * it[1], dtype=bool) for it in audios]}
    vid_in = {"num_soft_tokens_per_video": [it[1] for it in videos],
              "video_metadata": [VideoMetadata(total_num_frames=max(it[3]) + 1, fps=it[2], frames_indices=it[3])
                                 for it in videos]}
    rep_img = [proc.replace_image_token(img_in, i) for i in range(len(images))]
    rep_aud = [proc.replace_audio_token(aud_in, i) for i in range(len(audios))]
    rep_vid = [proc.replace_video_token(vid_in, i) for i in range(len(videos))]
    text, _ = proc.get_text_with_replacements([case["text"]], rep_img, rep_vid, rep_aud)
    items = []
    for it in case["items"]:
        d = {"kind": it[0], "n_tokens": it[1]}
        if it[0] == "video":
            d["frame_seconds"] = VideoMetadata(total_num_frames=1, fps=it[2], frames_indices=it[3]).timestamps
        items.append(d)
    return {"name": case["name"], "text": case["text"], "items": items, "expected": text[0]}


def main():
    tok = make_tokenizer()
    templates, sources = {}, {}
    for variant, fname in TEMPLATES.items():
        raw = open(os.path.join(DATA, "templates", fname), "rb").read()
        templates[variant] = {"file": "templates/" + fname, "sha256": hashlib.sha256(raw).hexdigest()}
        sources[variant] = raw.decode("utf-8")
    out_cases = []
    for case in CASES:
        entry = {k: v for k, v in case.items()}
        entry["expected"], entry["error"] = {}, {}
        for variant, template in sources.items():
            try:
                entry["expected"][variant] = render(tok, template, case)
            except (jinja2.exceptions.TemplateError, ValueError, TypeError) as e:
                entry["expected"][variant] = None
                entry["error"][variant] = "%s: %s" % (type(e).__name__, e)
        if not entry["error"]:
            del entry["error"]
        out_cases.append(entry)
    replies = []
    for call in REPLY_CALLS:
        msgs = [U1, {"role": "assistant", "tool_calls": [{"id": "c", "function": call}]}]
        text = render(tok, sources["large"], {"messages": msgs, "add_generation_prompt": False})
        start = text.index("<|tool_call>")
        end = text.index("<tool_call|>") + len("<tool_call|>")
        replies.append({"text": text[start:end], "name": call["name"], "arguments": call["arguments"]})
    media = [expand_media(c) for c in MEDIA_CASES]
    doc = {"generator": "tests/tools/render_chat_cases.py", "transformers": transformers.__version__,
           "jinja2": jinja2.__version__, "templates": templates, "cases": out_cases,
           "tool_call_replies": replies, "media": media}
    path = os.path.join(DATA, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in out_cases if "error" in c)
    print("wrote %s: %d cases (%d raise), %d tool-call replies, %d media cases"
          % (path, len(out_cases), n_err, len(replies), len(media)), file=sys.stderr)


if __name__ == "__main__":
    main()
