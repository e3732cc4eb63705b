"""Shared by test_server_constrain.py and bench/constrain_acceptance.py:
servers over the bundled trained model and the random-weight e2b fixture,
and sampled constrained replies checked with json + jsonschema.
(Not a test itself: ctest runs only test_*.py.)
"""
import concurrent.futures
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request

from serve_process import ServeProcess

try:
    import jsonschema  # the tests always have it; bench/constrain_acceptance.py --save runs where it may not
except ImportError:
    jsonschema = None

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("G4_SOURCE", os.path.join(HERE, "..", ".."))
BIN = os.environ.get("G4_BIN", os.path.join(SOURCE, "build", "gemma4"))
FIXTURES = os.environ.get("G4_FIXTURES", os.path.join(SOURCE, "build", "fixtures"))
DATA = os.environ.get("G4_TEST_DATA", os.path.join(SOURCE, "tests", "data"))
TMP = os.environ.get("G4_TMP", tempfile.gettempdir())
SCHEMAS = json.load(open(os.path.join(DATA, "constrain", "schemas.json"), encoding="utf-8"))
FORMATS = jsonschema.FormatChecker() if jsonschema else None


def random_model_dir():
    """The e2b fixture (random weights) with the tiny test tokenizer and the E2B chat template."""
    d = tempfile.mkdtemp(prefix="constrain_e2b_", dir=TMP)
    src = os.path.join(FIXTURES, "e2b")
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        os.symlink(os.path.realpath(os.path.join(src, f)), os.path.join(d, f))
    shutil.copy(os.path.join(DATA, "tiny_tokenizer", "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    shutil.copy(os.path.join(DATA, "chat", "templates", "gemma-4-E2B-it.chat_template.jinja"),
                os.path.join(d, "chat_template.jinja"))
    return d


def models():
    return [("trained", os.path.join(SOURCE, "models", "tiny")), ("random", random_model_dir())]


class Server(ServeProcess):
    def __init__(self, model, *args, name="constrain"):
        super().__init__(BIN, model, ["--threads", "2", *args],
                         os.path.join(TMP, "test_server_constrain.%s.log" % name))

    def post(self, path, body, timeout=600):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        rc, text, _ = super().stop()
        return rc, text


def schema_request(schema, seed, max_tokens):
    return {"messages": [{"role": "user", "content": "Describe it as JSON."}], "temperature": 1, "seed": seed,
            "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}}


def validate(schema, text):
    """None when text parses and validates, else why not."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return "not JSON: %s" % e
    try:
        jsonschema.validate(value, schema, format_checker=FORMATS)
    except jsonschema.ValidationError as e:
        return "invalid: %s" % e.message
    return None


def sample_schemas(server, n_per_schema, max_tokens, seed0=0, workers=32):
    """[(schema name, seed, status, content or error, finish_reason)] for n replies per schema, sent at once."""
    jobs = [(s["name"], s["schema"], seed0 + k) for s in SCHEMAS for k in range(n_per_schema)]

    def one(job):
        name, schema, seed = job
        st, r = server.post("/v1/chat/completions", schema_request(schema, seed, max_tokens))
        if st != 200:
            return name, seed, st, json.dumps(r), None
        c = r["choices"][0]
        return name, seed, st, c["message"]["content"], c["finish_reason"]

    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, jobs))
