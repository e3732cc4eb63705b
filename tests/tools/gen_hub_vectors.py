#!/usr/bin/env python3
"""Writes tests/data/hub/vectors.json: URLs, cache folder names and repo-id
validity as huggingface_hub itself computes them, for tests/unit/test_hub.c.

    pip install huggingface_hub   (2.4.0 was used)
    python3 tests/tools/gen_hub_vectors.py
"""
import json
import os
from urllib.parse import quote

import huggingface_hub
from huggingface_hub import hf_hub_url
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import HFValidationError, validate_repo_id

ENDPOINTS = ["https://huggingface.co", "http://127.0.0.1:8080/", "https://hf-mirror.example.org/sub"]
REPOS = ["google/gemma-4-E2B-it", "mlx-community/gemma-4-e2b-it-4bit", "a.b_c/D-9.x"]
REVISIONS = ["main", "refs/pr/12", "v1.0+beta", "7050d1648e09ecf2aa8de7604b9c97f3353feac9", "with space",
             "caf\u00e9~tilde", "100%#?&="]
FILES = ["config.json", "model-00001-of-00002.safetensors", "sub dir/a b.json", "x/y/z#1?.bin", "\u00fcber+.txt",
         "~tilde/semi;colon@at"]
QUOTE_INPUTS = ["", "abc", "a/b", "a b", "-_.~", "!*'();:@&=+$,/?#[]", "\u00e9\u4e2d\U0001f600", "%41", "\x7f\x01"]
REPO_IDS = ["google/gemma-4-E2B-it", "org/name", "a/b", "a.b/c_d-e", "a--b/c", "a/b..c", "-a/b", "a/b-", ".a/b",
            "a/b.", "a/b/c", "/a", "a/", "ab", "a b/c", "a/b@c", "x" * 96 + "/y", "x" * 97 + "/y", "y/" + "x" * 96,
            "y/" + "x" * 97, "org/na!me"]


def hub_ok(repo_id):
    """huggingface_hub's rule, plus ours: an ORG/NAME pair (a namespace is required)."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return repo_id.count("/") == 1


def main():
    out = {
        "huggingface_hub_version": huggingface_hub.__version__,
        "resolve": [],
        "api": [],
        "quote": [],
        "folder": [],
        "repo_id_valid": [],
    }
    for endpoint in ENDPOINTS:
        for repo in REPOS:
            for rev in REVISIONS:
                for f in FILES:
                    out["resolve"].append([endpoint, repo, rev, f,
                                           hf_hub_url(repo, f, revision=rev, endpoint=endpoint.rstrip("/"))])
                # HfApi.model_info: f"{endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}",
                # params {"blobs": True} (files_metadata=True), which httpx sends as "blobs=true"
                out["api"].append([endpoint, repo, rev, "%s/api/models/%s/revision/%s?blobs=true"
                                   % (endpoint.rstrip("/"), repo, quote(rev, safe=""))])
    for s in QUOTE_INPUTS + REVISIONS + FILES:
        out["quote"].append([s, quote(s, safe=""), quote(s)])
    for repo in REPOS:
        out["folder"].append([repo, repo_folder_name(repo_id=repo, repo_type="model")])
    for repo in REPO_IDS:
        out["repo_id_valid"].append([repo, hub_ok(repo)])
    path = os.path.join(os.path.dirname(__file__), "..", "data", "hub", "vectors.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
