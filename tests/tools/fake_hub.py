#!/usr/bin/env python3
"""A small imitation of the Hugging Face hub for testing `gemma4 pull` offline.

Two threaded HTTP servers on 127.0.0.1: the "hub" (API, resolve) and a "CDN"
on another port, so that the client's redirect handling and its rule of never
sending the token off the hub can be observed. What they answer follows
huggingface_hub's client (file_download.py, hf_api.py, utils/_http.py):

  GET  /api/models/ORG/NAME/revision/REV[?blobs=true]
       {"id", "sha": commit, "siblings": [{"rfilename", "size", "blobId",
        "lfs": {"sha256", "size", "pointerSize"}}]}
  GET  /api/models/ORG/NAME/tree/REV?recursive=true   (huggingface_hub's
       snapshot_download lists files this way; one page)
       [{"type": "file", "path", "size", "oid", "lfs": {"oid", "size", "pointerSize"}}]
  HEAD|GET /ORG/NAME/resolve/REV/FILE
       regular file: 200, ETag "<git blob sha1>", Content-Length, X-Repo-Commit
       LFS file: 302 to the CDN, X-Linked-Etag "<sha256>", X-Linked-Size,
       X-Repo-Commit (Content-Length is that of the redirect's own body)
       errors: X-Error-Code RepoNotFound (401 without a token, 404 with one),
       RevisionNotFound, EntryNotFound (404), GatedRepo (401 no token, 403
       token without access); 401 "Invalid credentials in Authorization header"
  CDN: GET|HEAD /cdn/REPOKEY/SHA256?X-Amz-Signature=... with Range support.

Fault modes, chosen by repo name: flaky (the first CDN transfer of a weight
file stops halfway and the connection is closed), norange (the same, then the
Range header is ignored and 200 sent), stubborn (every transfer ignores Range
and stops halfway), corrupt (one byte flipped), busy (the first API call
answers 503). Every request is logged (server, method, path,
Range, whether Authorization came) for the test to inspect.

Run it by hand: tests/tools/fake_hub.py --fixture build/fixtures/dense
"""
import argparse
import functools
import hashlib
import json
import os
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VALID_TOKEN = "hf_fake_valid_token"
NO_ACCESS_TOKEN = "hf_fake_no_access_token"


# The files never change: hash each one once (bytes cache their hash() too).
@functools.lru_cache(maxsize=None)
def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=None)
def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data):
    return ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n"
            % (sha256_hex(data), len(data))).encode()


def split_safetensors(data, parts=2):
    """Splits a safetensors file into `parts` valid shards and an index."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    shards, weight_map = [], {}
    for i in range(parts):
        chunk = names[i * len(names) // parts:(i + 1) * len(names) // parts]
        shard_name = "model-%05d-of-%05d.safetensors" % (i + 1, parts)
        new_header, blobs, pos = {}, [], 0
        for k in chunk:
            a, b = header[k]["data_offsets"]
            new_header[k] = dict(header[k], data_offsets=[pos, pos + b - a])
            blobs.append(data[base + a:base + b])
            pos += b - a
            weight_map[k] = shard_name
        if meta is not None:
            new_header["__metadata__"] = meta
        h = json.dumps(new_header).encode()
        h += b" " * (-len(h) % 8)
        shards.append((shard_name, struct.pack("<Q", len(h)) + h + b"".join(blobs)))
    total = sum(len(b) for _, b in shards)
    index = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    return shards, index


class Repo:
    def __init__(self, name, files, lfs_names, gated=False, fault=None):
        self.name = name
        self.files = files  # name -> bytes
        self.lfs = set(lfs_names)
        self.gated = gated
        self.fault = fault
        self.commit = hashlib.sha1(("commit of " + name).encode()).hexdigest()
        self.refs = {"main": self.commit, "v1.0": self.commit, "refs/pr/1": self.commit}
        self.key = hashlib.sha1(name.encode()).hexdigest()[:12]


def build_repos(fixture_dir, data_dir):
    def read(d, n):
        with open(os.path.join(d, n), "rb") as f:
            return f.read()

    model = read(fixture_dir, "model.safetensors")
    small = {
        "config.json": read(fixture_dir, "config.json"),
        "generation_config.json": read(fixture_dir, "generation_config.json"),
        "tokenizer.json": read(data_dir, "tokenizer.json"),
        "tokenizer_config.json": read(data_dir, "tokenizer_config.json"),
        "chat_template.jinja": read(data_dir, "chat_template.jinja"),
        "README.md": b"# tiny gemma\nnot downloaded by gemma4 pull\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }
    shards, index = split_safetensors(model)
    repos = {}

    def add(name, files, lfs, **kw):
        repos[name] = Repo(name, files, lfs, **kw)

    add("test-org/tiny-gemma", dict(small, **{"model.safetensors": model}), ["model.safetensors"])
    sharded = dict(small, **{"model.safetensors.index.json": index})
    sharded.update(dict(shards))
    add("test-org/tiny-gemma-sharded", sharded, [n for n, _ in shards])
    for fault in ("flaky", "norange", "corrupt", "busy", "stubborn"):
        add("test-org/%s-gemma" % fault, dict(small, **{"model.safetensors": model}), ["model.safetensors"],
            fault=fault)
    add("test-org/gated-gemma", dict(small, **{"model.safetensors": model}), ["model.safetensors"], gated=True)
    add("test-org/no-weights", {"config.json": small["config.json"], "README.md": small["README.md"]}, [])
    renamed = {"test-org/old-name": "test-org/tiny-gemma"}
    return repos, renamed


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], OSError):  # clients hanging up are part of the tests
            super().handle_error(request, client_address)


class FakeHub:
    def __init__(self, fixture_dir, data_dir, host="127.0.0.1"):
        self.repos, self.renamed = build_repos(fixture_dir, data_dir)
        self.log = []
        self.lock = threading.Lock()
        self.counters = {}
        self.hub = QuietServer((host, 0), self._handler("hub"))
        self.cdn = QuietServer((host, 0), self._handler("cdn"))
        self.hub_url = "http://%s:%d" % (host, self.hub.server_address[1])
        self.cdn_url = "http://%s:%d" % (host, self.cdn.server_address[1])
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.hub, self.cdn)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    def requests(self, **match):
        with self.lock:
            return [e for e in self.log if all(e.get(k) == v for k, v in match.items())]

    def clear_log(self):
        with self.lock:
            self.log.clear()

    def count(self, key):
        """How many times `key` happened before (0 the first time)."""
        with self.lock:
            n = self.counters.get(key, 0)
            self.counters[key] = n + 1
            return n

    def _handler(self, role):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_HEAD(self):
                self._dispatch(head=True)

            def do_GET(self):
                self._dispatch(head=False)

            def _dispatch(self, head):
                auth = self.headers.get("Authorization")
                with hub.lock:
                    hub.log.append({"server": role, "method": self.command, "path": self.path,
                                    "range": self.headers.get("Range"), "auth": auth})
                try:
                    if role == "cdn":
                        self._cdn(head)
                    else:
                        self._hub(head, auth)
                except OSError:  # the client went away, or a fault mode closed the connection
                    pass

            # ---- replies ----
            def _send(self, status, headers, body, head):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status, code, message, head, extra=None):
                headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
                headers.update(extra or {})
                self._send(status, headers, json.dumps({"error": message}).encode(), head)

            def _bytes(self, data, headers, head, fault=None):
                """Serves data honouring "Range: bytes=N-"."""
                start, status = 0, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and fault not in ("ignore-range", "drop-whole"):
                    start = int(rng[6:].split("-")[0])
                    if start >= len(data) and data:
                        self._send(416, {"Content-Range": "bytes */%d" % len(data)}, b"", head)
                        return
                    status = 206
                    headers = dict(headers, **{"Content-Range": "bytes %d-%d/%d" % (start, len(data) - 1, len(data))})
                body = data[start:]
                if fault == "corrupt" and body:
                    mid = len(body) // 2
                    body = body[:mid] + bytes([body[mid] ^ 0x55]) + body[mid + 1:]
                self.send_response(status)
                for k, v in dict(headers, **{"Accept-Ranges": "bytes"}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if head:
                    return
                if fault in ("drop", "drop-whole"):
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

            # ---- the CDN ----
            def _cdn(self, head):
                parts = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
                repo = next((r for r in hub.repos.values() if len(parts) == 3 and r.key == parts[1]), None)
                if repo is None or parts[0] != "cdn":
                    self._send(404, {}, b"no such object", head)
                    return
                data = next((d for n, d in repo.files.items() if sha256_hex(d) == parts[2]), None)
                if data is None:
                    self._send(404, {}, b"no such object", head)
                    return
                fault = None
                if not head and repo.fault in ("flaky", "norange"):
                    n = hub.count((repo.name, parts[2]))
                    if n == 0:
                        fault = "drop"
                    elif repo.fault == "norange":
                        fault = "ignore-range"
                elif repo.fault == "corrupt":
                    fault = "corrupt"
                elif repo.fault == "stubborn" and not head:
                    fault = "drop-whole"
                self._bytes(data, {"Content-Type": "application/octet-stream",
                                   "ETag": '"%s"' % parts[2]}, head, fault)

            # ---- the hub ----
            def _repo_or_error(self, name, auth, head):
                """The repo, or None after answering like the hub does."""
                token = auth[7:] if auth and auth.startswith("Bearer ") else None
                if token is not None and token not in (VALID_TOKEN, NO_ACCESS_TOKEN):
                    self._error(401, "", "Invalid credentials in Authorization header", head)
                    return None
                repo = hub.repos.get(name)
                if repo is None:
                    # unauthenticated callers cannot tell missing from private: 401
                    self._error(401 if token is None else 404, "RepoNotFound", "Repository not found", head)
                    return None
                return repo

            def _commit_or_error(self, repo, rev, head):
                commit = repo.refs.get(rev) or (rev if rev == repo.commit else None)
                if commit is None:
                    self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev, head)
                return commit

            def _hub(self, head, auth):
                url = urllib.parse.urlsplit(self.path)
                path = url.path
                if path.startswith("/api/models/"):
                    self._api(path[len("/api/models/"):], url.query, auth, head)
                    return
                parts = path.strip("/").split("/", 4)
                if len(parts) == 5 and parts[2] == "resolve":
                    self._resolve(parts, url.query, auth, head)
                    return
                self._send(404, {}, b"not found", head)

            def _api(self, rest, query, auth, head):
                parts = rest.split("/")
                if len(parts) != 4 or parts[2] not in ("revision", "tree"):
                    self._send(404, {}, b"not found", head)
                    return
                name = "/".join(parts[:2])
                if name in hub.renamed:
                    target = "/api/models/%s/revision/%s" % (hub.renamed[name], parts[3])
                    self._send(307, {"Location": target + ("?" + query if query else "")}, b"", head)
                    return
                repo = self._repo_or_error(name, auth, head)
                if repo is None:
                    return
                if repo.fault == "busy" and hub.count((repo.name, "api")) == 0:
                    self._send(503, {"Retry-After": "0"}, b"busy", head)
                    return
                commit = self._commit_or_error(repo, urllib.parse.unquote(parts[3]), head)
                if commit is None:
                    return
                if parts[2] == "tree":
                    self._tree(repo, head)
                    return
                blobs = "blobs=true" in query
                siblings = []
                for n, d in sorted(repo.files.items()):
                    s = {"rfilename": n}
                    if blobs:
                        if n in repo.lfs:
                            p = lfs_pointer(d)
                            s.update(size=len(d), blobId=git_blob_sha1(p),
                                     lfs={"sha256": sha256_hex(d), "size": len(d),
                                          "pointerSize": len(p)})
                        else:
                            s.update(size=len(d), blobId=git_blob_sha1(d))
                    siblings.append(s)
                body = json.dumps({"_id": repo.key, "id": repo.name, "modelId": repo.name, "sha": commit,
                                   "private": False, "gated": "manual" if repo.gated else False,
                                   "siblings": siblings}).encode()
                self._send(200, {"Content-Type": "application/json"}, body, head)

            def _tree(self, repo, head):
                entries = []
                for n, d in sorted(repo.files.items()):
                    e = {"type": "file", "path": n, "size": len(d), "oid": git_blob_sha1(d)}
                    if n in repo.lfs:
                        p = lfs_pointer(d)
                        e.update(oid=git_blob_sha1(p),
                                 lfs={"oid": sha256_hex(d), "size": len(d), "pointerSize": len(p)})
                    entries.append(e)
                self._send(200, {"Content-Type": "application/json"}, json.dumps(entries).encode(), head)

            def _resolve(self, parts, query, auth, head):
                name = "/".join(parts[:2])
                if name in hub.renamed:
                    target = "/%s/resolve/%s/%s" % (hub.renamed[name], parts[3], parts[4])
                    self._send(307, {"Location": target}, b"", head)  # relative, as the hub does for renames
                    return
                repo = self._repo_or_error(name, auth, head)
                if repo is None:
                    return
                commit = self._commit_or_error(repo, urllib.parse.unquote(parts[3]), head)
                if commit is None:
                    return
                file = urllib.parse.unquote(parts[4])
                if repo.gated and auth != "Bearer " + VALID_TOKEN:
                    msg = ("Access to model %s is restricted. You must have access to it and be authenticated "
                           "to access it. Please log in." % repo.name)
                    self._error(401 if auth is None else 403, "GatedRepo", msg, head)
                    return
                if file not in repo.files:
                    self._error(404, "EntryNotFound", "Entry not found", head, {"X-Repo-Commit": commit})
                    return
                data = repo.files[file]
                if file in repo.lfs:
                    sha = sha256_hex(data)
                    location = "%s/cdn/%s/%s?X-Amz-Signature=fake%d" % (hub.cdn_url, repo.key, sha, time.time())
                    body = b"Found. Redirecting to " + location.encode()
                    self._send(302, {"Location": location, "X-Repo-Commit": commit, "X-Linked-Etag": '"%s"' % sha,
                                     "X-Linked-Size": str(len(data)), "ETag": '"%s"' % git_blob_sha1(lfs_pointer(data))},
                               body, head)
                    return
                self._bytes(data, {"X-Repo-Commit": commit, "ETag": '"%s"' % git_blob_sha1(data),
                                   "Content-Type": "text/plain; charset=utf-8"}, head)

        return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", required=True, help="a fixture folder with config.json and model.safetensors")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "data", "hub"))
    args = ap.parse_args()
    hub = FakeHub(args.fixture, args.data).start()
    print("hub %s  cdn %s  (token %s)" % (hub.hub_url, hub.cdn_url, VALID_TOKEN), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":
    main()
