#!/usr/bin/env python3
"""The cache `gemma4 pull` writes is huggingface_hub's own: checked with
huggingface_hub itself (pip install huggingface_hub), both ways, against
tests/tools/fake_hub.py.

1. gemma4 pulls; huggingface_hub finds every file offline (try_to_load_from_cache,
   snapshot_download(local_files_only=True)) with the same bytes.
2. huggingface_hub's snapshot_download fetches from the fake hub (which also
   shows that the fake hub answers the way the real client expects); gemma4
   finds it offline and, online, downloads nothing more.
"""
import os
import shutil
import subprocess
import sys

SOURCE = os.environ.get("G4_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "tools"))
from fake_hub import FakeHub  # noqa: E402
from checks import check, summary  # noqa: E402

G4_BIN = os.environ["G4_BIN"]
FIXTURE = os.path.join(os.environ["G4_FIXTURES"], "dense")
DATA = os.path.join(os.environ["G4_TEST_DATA"], "hub")
TMP = os.path.join(os.environ.get("G4_TMP", "/tmp"), "test_pull_hf_interop")
FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
         "model.safetensors"]
def gemma4_pull(args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "HUGGING_FACE_HUB_TOKEN"}
    env["HF_HOME"] = os.path.join(TMP, "hf_home")
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"  # the fake hub is on loopback
    return subprocess.run([G4_BIN, "pull"] + args, env=env, capture_output=True, text=True, timeout=120)


def main():
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(os.path.join(TMP, "hf_home"))
    hub = FakeHub(FIXTURE, DATA).start()
    # huggingface_hub reads its settings at import time
    os.environ.update(HF_ENDPOINT=hub.hub_url, HF_HOME=os.path.join(TMP, "hf_home"), HF_HUB_DISABLE_TELEMETRY="1",
                      HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_XET="1",
                      no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost")
    os.environ.pop("HF_TOKEN", None)
    try:
        import huggingface_hub
        from huggingface_hub import snapshot_download, try_to_load_from_cache
    except ImportError as e:
        print("FAIL: this test needs huggingface_hub (pip install huggingface_hub): %s" % e)
        print("0 passed, 1 failed")
        hub.stop()
        return 1
    repo = hub.repos["test-org/tiny-gemma"]
    try:
        print("huggingface_hub", huggingface_hub.__version__)
        # 1. gemma4 writes, huggingface_hub reads
        cache = os.path.join(TMP, "by_gemma4")
        r = gemma4_pull(["test-org/tiny-gemma", "--endpoint", hub.hub_url, "--cache", cache])
        check(r.returncode == 0, "gemma4 pull", r.stderr)
        for f in FILES:
            p = try_to_load_from_cache("test-org/tiny-gemma", f, cache_dir=cache)
            check(isinstance(p, str), "huggingface_hub finds %s" % f, p)
            if isinstance(p, str):
                with open(p, "rb") as fh:
                    check(fh.read() == repo.files[f], "same bytes: %s" % f)
        snap = snapshot_download("test-org/tiny-gemma", cache_dir=cache, local_files_only=True)
        check(snap == r.stdout.strip(), "snapshot_download(local_files_only) gives gemma4's directory",
              (snap, r.stdout))

        # 2. huggingface_hub writes, gemma4 reads
        cache = os.path.join(TMP, "by_huggingface_hub")
        hub.clear_log()
        snap = snapshot_download("test-org/tiny-gemma", cache_dir=cache,
                                 allow_patterns=["*.json", "*.jinja", "*.safetensors"])
        check(any(q["server"] == "cdn" for q in hub.requests()), "huggingface_hub downloaded through the fake CDN")
        r = gemma4_pull(["test-org/tiny-gemma", "--cache", cache, "--offline"])
        check(r.returncode == 0 and r.stdout.strip() == snap, "gemma4 finds huggingface_hub's snapshot offline",
              (r.stdout, r.stderr, snap))
        hub.clear_log()
        r = gemma4_pull(["test-org/tiny-gemma", "--endpoint", hub.hub_url, "--cache", cache, "--verify"])
        check(r.returncode == 0 and r.stdout.strip() == snap, "gemma4 pull over huggingface_hub's cache", r.stderr)
        check(r.stderr.count("cached") == len(FILES), "every file is already there (and verifies)", r.stderr)
        check(not [q for q in hub.requests() if q["method"] == "GET" and "/resolve/" in q["path"]]
              and not hub.requests(server="cdn"), "nothing downloaded again", hub.requests())
    finally:
        hub.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
