#!/usr/bin/env python3
"""`gemma4 pull` against tests/tools/fake_hub.py: files byte for byte, the
cache layout, the token policy, resume (within a run and across runs),
restarts, checksum failures, retries, gated/unknown repos, disk-full, offline
resolution and usage errors.

The fake hub runs in this process (threads), so it goes away with the test
whatever happens; every gemma4 run has a timeout. Env: G4_BIN, G4_FIXTURES,
G4_TEST_DATA, G4_TMP, G4_SOURCE (set by ctest).
"""
import hashlib
import os
import resource
import shutil
import socket
import subprocess
import sys

SOURCE = os.environ.get("G4_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests", "tools"))
from fake_hub import NO_ACCESS_TOKEN, VALID_TOKEN, FakeHub, git_blob_sha1  # noqa: E402
from checks import check, summary  # noqa: E402

G4_BIN = os.environ["G4_BIN"]
FIXTURE = os.path.join(os.environ["G4_FIXTURES"], "dense")
DATA = os.path.join(os.environ["G4_TEST_DATA"], "hub")
TMP = os.path.join(os.environ.get("G4_TMP", "/tmp"), "test_pull")

METADATA = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja"]
def fresh_dir(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


HF_HOME = None  # an empty HF_HOME, so no token file of the user's is read


def pull(args, env=None, limit_fsize=None, timeout=120):
    e = {k: v for k, v in os.environ.items()
         if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN_PATH",
                      "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    e["HF_HOME"] = HF_HOME
    e["no_proxy"] = e["NO_PROXY"] = "127.0.0.1,localhost"  # the fake hub is on loopback
    e.update(env or {})

    def limits():
        if limit_fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_fsize, limit_fsize))

    return subprocess.run([G4_BIN, "pull"] + args, env=e, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limits)


def show(r):
    return "exit %d\nstdout: %s\nstderr: %s" % (r.returncode, r.stdout.strip(), r.stderr.strip())


def expect_files(hub, repo_name, snap, names, what):
    """Each name in snap is a link to ../../blobs/<checksum> holding the hub's bytes."""
    repo = hub.repos[repo_name]
    for n in names:
        p = os.path.join(snap, n)
        ok = os.path.isfile(p)
        check(ok, "%s: %s exists" % (what, n))
        if not ok:
            continue
        with open(p, "rb") as f:
            check(f.read() == repo.files[n], "%s: %s has the hub's bytes" % (what, n))
        data = repo.files[n]
        blob = hashlib.sha256(data).hexdigest() if n in repo.lfs else git_blob_sha1(data)
        check(os.readlink(p) == "../../blobs/" + blob, "%s: %s links to blobs/%s" % (what, n, blob), os.readlink(p))
    extra = sorted(set(os.listdir(snap)) - set(names))
    check(not extra, "%s: nothing else in the snapshot" % what, extra)


def run_basic(hub, endpoint):
    cache = fresh_dir("basic")
    repo = hub.repos["test-org/tiny-gemma"]
    hub.clear_log()
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache], env={"HF_TOKEN": VALID_TOKEN})
    snap = os.path.join(cache, "models--test-org--tiny-gemma", "snapshots", repo.commit)
    check(r.returncode == 0, "basic pull succeeds", show(r))
    check(r.stdout.strip() == snap, "prints the snapshot directory", r.stdout)
    expect_files(hub, repo.name, snap, METADATA + ["model.safetensors"], "basic")
    with open(os.path.join(FIXTURE, "model.safetensors"), "rb") as f:
        check(f.read() == repo.files["model.safetensors"], "the fake repo serves the fixture's weights")
    with open(os.path.join(cache, "models--test-org--tiny-gemma", "refs", "main")) as f:
        check(f.read() == repo.commit, "refs/main holds the commit")
    check(not [n for n in os.listdir(os.path.join(cache, "models--test-org--tiny-gemma", "blobs"))
               if n.endswith(".incomplete")], "no partial files left")
    # the token goes to the hub, never to the CDN
    hub_reqs, cdn_reqs = hub.requests(server="hub"), hub.requests(server="cdn")
    check(hub_reqs and all(q["auth"] == "Bearer " + VALID_TOKEN for q in hub_reqs), "the hub gets the token",
          hub_reqs)
    check(len(cdn_reqs) == 1 and cdn_reqs[0]["auth"] is None, "the CDN gets no token", cdn_reqs)
    check(any(q["method"] == "HEAD" and "/resolve/%s/model.safetensors" % repo.commit in q["path"]
              for q in hub_reqs), "files are resolved at the pinned commit")
    check("verified" in r.stderr and "[6/6] model.safetensors" in r.stderr, "plain progress lines", r.stderr)

    # a second pull finds everything in the cache: one API call, no downloads
    hub.clear_log()
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and r.stdout.strip() == snap, "second pull", show(r))
    reqs = hub.requests()
    check(len(reqs) == 1 and reqs[0]["path"].startswith("/api/models/test-org/tiny-gemma/revision/main"),
          "second pull only lists the repo", reqs)
    check(r.stderr.count("cached") == 6, "second pull reports 6 cached files", r.stderr)

    # offline: from the cache, no network at all
    hub.clear_log()
    for args, env in ((["--offline"], {}), ([], {"HF_HUB_OFFLINE": "1"}), (["--offline", "--revision", repo.commit], {})):
        r = pull(["test-org/tiny-gemma", "--cache", cache, "--endpoint", "http://127.0.0.1:9"] + args, env=env)
        check(r.returncode == 0 and r.stdout.strip() == snap, "offline lookup %s %s" % (args, env), show(r))
    check(not hub.requests(), "offline runs make no requests")
    r = pull(["test-org/tiny-gemma@v1.0", "--cache", cache, "--offline"])
    check(r.returncode == 1 and "not in the cache" in r.stderr and "gemma4 pull test-org/tiny-gemma@v1.0" in r.stderr,
          "offline lookup of an unfetched ref fails with a hint", show(r))

    # tag and commit revisions
    r = pull(["test-org/tiny-gemma", "--revision", "v1.0", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and r.stdout.strip() == snap, "--revision v1.0", show(r))
    with open(os.path.join(cache, "models--test-org--tiny-gemma", "refs", "v1.0")) as f:
        check(f.read() == repo.commit, "refs/v1.0 written")
    hub.clear_log()
    r = pull(["test-org/tiny-gemma@refs/pr/1", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and r.stdout.strip() == snap, "@refs/pr/1", show(r))
    check(hub.requests()[0]["path"].startswith("/api/models/test-org/tiny-gemma/revision/refs%2Fpr%2F1?"),
          "a revision with slashes is one escaped path segment", hub.requests()[:1])
    with open(os.path.join(cache, "models--test-org--tiny-gemma", "refs", "refs", "pr", "1")) as f:
        check(f.read() == repo.commit, "refs/refs/pr/1 written (huggingface_hub's layout)")
    r = pull(["test-org/tiny-gemma@" + repo.commit, "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and r.stdout.strip() == snap, "@commit", show(r))
    check(not os.path.exists(os.path.join(cache, "models--test-org--tiny-gemma", "refs", repo.commit)),
          "no ref file named after a commit")

    # --verify re-hashes cached files and replaces a damaged one
    blob = os.path.join(cache, "models--test-org--tiny-gemma", "blobs", git_blob_sha1(repo.files["config.json"]))
    damaged = bytearray(repo.files["config.json"])
    damaged[10] ^= 1
    os.chmod(blob, 0o644)
    with open(blob, "wb") as f:
        f.write(damaged)
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache, "--verify"])
    check(r.returncode == 0 and "checksum mismatch" in r.stderr, "--verify notices the damaged file", show(r))
    with open(os.path.join(snap, "config.json"), "rb") as f:
        check(f.read() == repo.files["config.json"], "--verify fetched it again")


def run_sharded(hub, endpoint):
    cache = fresh_dir("sharded")
    repo = hub.repos["test-org/tiny-gemma-sharded"]
    r = pull(["test-org/tiny-gemma-sharded", "--endpoint", endpoint, "--cache", cache])
    snap = os.path.join(cache, "models--test-org--tiny-gemma-sharded", "snapshots", repo.commit)
    check(r.returncode == 0 and r.stdout.strip() == snap, "sharded pull", show(r))
    shards = sorted(n for n in repo.files if n.startswith("model-"))
    check(len(shards) == 2, "two shards", shards)
    expect_files(hub, repo.name, snap, METADATA + ["model.safetensors.index.json"] + shards, "sharded")
    r = pull(["test-org/tiny-gemma-sharded", "--cache", cache, "--offline"])
    check(r.returncode == 0 and r.stdout.strip() == snap, "sharded offline lookup", show(r))
    os.unlink(os.path.join(snap, shards[1]))
    r = pull(["test-org/tiny-gemma-sharded", "--cache", cache, "--offline"])
    check(r.returncode == 1 and "incomplete" in r.stderr and shards[1] in r.stderr,
          "offline lookup names the missing shard", show(r))


def model_blob(cache, repo):
    return os.path.join(cache, "models--%s" % repo.name.replace("/", "--"), "blobs",
                        hashlib.sha256(repo.files["model.safetensors"]).hexdigest())


def cdn_gets(hub, repo):
    return [q for q in hub.requests(server="cdn", method="GET") if "/cdn/%s/" % repo.key in q["path"]]


def run_resume(hub, endpoint):
    # the connection drops halfway: the client resumes with a Range request
    cache = fresh_dir("flaky")
    repo = hub.repos["test-org/flaky-gemma"]
    size = len(repo.files["model.safetensors"])
    hub.clear_log()
    r = pull(["test-org/flaky-gemma", "--endpoint", endpoint, "--cache", cache, "--backoff-ms", "50"])
    check(r.returncode == 0, "pull over a dropped connection", show(r))
    gets = cdn_gets(hub, repo)
    check([q["range"] for q in gets] == [None, "bytes=%d-" % (size // 2)],
          "a full GET, then a Range request from where the connection dropped", gets)
    check("retrying" in r.stderr, "the retry is reported", r.stderr)
    expect_files(hub, repo.name, r.stdout.strip(), METADATA + ["model.safetensors"], "flaky")

    # a partial file left by an earlier run is resumed
    cache = fresh_dir("resume")
    repo = hub.repos["test-org/tiny-gemma"]
    blob = model_blob(cache, repo)
    os.makedirs(os.path.dirname(blob))
    with open(blob + ".incomplete", "wb") as f:
        f.write(repo.files["model.safetensors"][:1000000])
    hub.clear_log()
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0, "resume across runs", show(r))
    check([q["range"] for q in cdn_gets(hub, repo)] == ["bytes=1000000-"], "asks for the rest only",
          cdn_gets(hub, repo))
    check("resuming at 1.0 MB" in r.stderr, "says it resumes", r.stderr)
    expect_files(hub, repo.name, r.stdout.strip(), METADATA + ["model.safetensors"], "resume")

    # a partial file longer than the real one is started over
    cache = fresh_dir("too-long")
    blob = model_blob(cache, repo)
    os.makedirs(os.path.dirname(blob))
    with open(blob + ".incomplete", "wb") as f:
        f.write(repo.files["model.safetensors"] + b"junk")
    hub.clear_log()
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and [q["range"] for q in cdn_gets(hub, repo)] == [None],
          "an over-long partial file is restarted", show(r))
    expect_files(hub, repo.name, r.stdout.strip(), METADATA + ["model.safetensors"], "too-long")

    # a partial file with wrong bytes: checksum error, deleted, and the next run succeeds
    cache = fresh_dir("bad-partial")
    blob = model_blob(cache, repo)
    os.makedirs(os.path.dirname(blob))
    with open(blob + ".incomplete", "wb") as f:
        f.write(b"\0" * 500000)
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 1 and "checksum mismatch" in r.stderr and "deleted" in r.stderr,
          "a resumed file with bad bytes fails its checksum", show(r))
    check(not os.path.exists(blob + ".incomplete") and not os.path.exists(blob), "and is not kept")
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0, "the next run fetches it anew", show(r))

    # the server ignores Range on the retry: the client starts the file over
    cache = fresh_dir("norange")
    repo = hub.repos["test-org/norange-gemma"]
    hub.clear_log()
    r = pull(["test-org/norange-gemma", "--endpoint", endpoint, "--cache", cache, "--backoff-ms", "50"])
    check(r.returncode == 0 and "starting the file over" in r.stderr, "200 to a Range request restarts", show(r))
    check(len(cdn_gets(hub, repo)) == 2, "two GETs", cdn_gets(hub, repo))
    expect_files(hub, repo.name, r.stdout.strip(), METADATA + ["model.safetensors"], "norange")


def run_failures(hub, endpoint):
    # corrupted bytes: clear error, nothing kept
    cache = fresh_dir("corrupt")
    repo = hub.repos["test-org/corrupt-gemma"]
    r = pull(["test-org/corrupt-gemma", "--endpoint", endpoint, "--cache", cache])
    sha = hashlib.sha256(repo.files["model.safetensors"]).hexdigest()
    check(r.returncode == 1 and "model.safetensors: checksum mismatch: expected sha256 " + sha in r.stderr,
          "corrupted download: checksum error", show(r))
    blob = model_blob(cache, repo)
    check(not os.path.exists(blob) and not os.path.exists(blob + ".incomplete"), "corrupted file not kept")
    snap = os.path.join(cache, "models--test-org--corrupt-gemma", "snapshots", repo.commit)
    check(not os.path.lexists(os.path.join(snap, "model.safetensors")), "no snapshot link to it")
    check(r.stdout == "", "no directory printed on failure", r.stdout)

    # the API answers 503 once: retried
    r = pull(["test-org/busy-gemma", "--endpoint", endpoint, "--cache", fresh_dir("busy"), "--backoff-ms", "50"])
    check(r.returncode == 0 and "HTTP 503" in r.stderr and "retrying" in r.stderr, "503 is retried", show(r))

    # disk full (a file size limit stands in for it): clear error, partial file kept, next run resumes
    cache = fresh_dir("full")
    repo = hub.repos["test-org/tiny-gemma"]
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache], limit_fsize=1000000)
    check(r.returncode == 1 and "file size limit reached" in r.stderr and "run again to resume" in r.stderr,
          "write failure is reported", show(r))
    part = model_blob(cache, repo) + ".incomplete"
    check(os.path.exists(part) and os.path.getsize(part) == 1000000, "the partial file is kept",
          os.path.exists(part) and os.path.getsize(part))
    hub.clear_log()
    r = pull(["test-org/tiny-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 0 and [q["range"] for q in cdn_gets(hub, repo)] == ["bytes=1000000-"],
          "after freeing space the download resumes", show(r))

    # a disk too small for the weights (a 1 MB tmpfs in a private mount namespace): refused before downloading
    cache = fresh_dir("small-disk")
    script = ('mount -t tmpfs -o size=1m none "$1" && "$2" pull test-org/tiny-gemma --endpoint "$3" --cache "$1"; '
              'echo "exit=$?"; ls "$1"/models--test-org--tiny-gemma/blobs | wc -l')
    try:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", cache, G4_BIN, endpoint], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, HF_HOME=HF_HOME, NO_PROXY="127.0.0.1"))
        usable = "exit=" in r.stdout
    except OSError:
        usable = False
    if usable:
        lines = r.stdout.split()
        check(lines[0] == "exit=1" and "not enough disk space" in r.stderr and "the download needs 2.5 MB" in r.stderr,
              "a full disk is reported before any download", r.stdout + r.stderr)
        check(lines[-1] == "0", "nothing was written", r.stdout)
    else:
        print("SKIPPED (not counted): the disk-space check needs `unshare -rm` to mount a small tmpfs")

    # every transfer stops halfway and Range is ignored: no progress is made, so the retries run out
    r = pull(["test-org/stubborn-gemma", "--endpoint", endpoint, "--cache", fresh_dir("stubborn"), "--retries", "3",
              "--backoff-ms", "10"], timeout=60)
    check(r.returncode == 1 and r.stderr.count("retrying") == 3 and "model.safetensors" in r.stderr.splitlines()[-1],
          "a transfer that never gets further gives up after the retries", show(r))

    # nothing listens: retried, then a clear error
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    r = pull(["test-org/tiny-gemma", "--endpoint", dead, "--cache", fresh_dir("dead"), "--retries", "2",
              "--backoff-ms", "10"])
    check(r.returncode == 1 and r.stderr.count("retrying") == 2 and "connect" in r.stderr.lower(),
          "unreachable hub: two retries, then an error", show(r))

    # gated repo
    cache = fresh_dir("gated")
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 1 and "gated" in r.stderr and "HF_TOKEN" in r.stderr and "accept its license" in r.stderr
          and "HTTP 401" in r.stderr, "gated without a token", show(r))
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache], env={"HF_TOKEN": NO_ACCESS_TOKEN})
    check(r.returncode == 1 and "HTTP 403" in r.stderr and "has no access" in r.stderr,
          "gated with a token of an account without access", show(r))
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache], env={"HF_TOKEN": "hf_wrong"})
    check(r.returncode == 1 and "rejected the access token" in r.stderr, "an invalid token", show(r))
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache],
             env={"HUGGING_FACE_HUB_TOKEN": VALID_TOKEN})
    check(r.returncode == 0, "gated with HUGGING_FACE_HUB_TOKEN", show(r))
    hub.clear_log()
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache], env={"HF_TOKEN": "hf_x\nX-Evil: 1"})
    check(r.returncode == 1 and "control characters" in r.stderr and not hub.requests(),
          "a token that would break the header line is refused before any request", show(r))
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", fresh_dir("gated-padded")],
             env={"HF_TOKEN": "  %s\n" % VALID_TOKEN})
    check(r.returncode == 0, "surrounding whitespace is trimmed from the token", show(r))
    cache = fresh_dir("gated-file")
    with open(os.path.join(HF_HOME, "token"), "w") as f:
        f.write(VALID_TOKEN + "\n")
    r = pull(["test-org/gated-gemma", "--endpoint", endpoint, "--cache", cache])
    os.unlink(os.path.join(HF_HOME, "token"))
    check(r.returncode == 0, "gated with the token file $HF_HOME/token", show(r))
    expect_files(hub, "test-org/gated-gemma", r.stdout.strip(), METADATA + ["model.safetensors"], "gated")

    # unknown repo, revision; a repo without weights
    cache = fresh_dir("missing")
    r = pull(["test-org/nope", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 1 and "repository test-org/nope not found" in r.stderr and "set HF_TOKEN" in r.stderr,
          "unknown repo without a token (the hub says 401)", show(r))
    r = pull(["test-org/nope", "--endpoint", endpoint, "--cache", cache], env={"HF_TOKEN": VALID_TOKEN})
    check(r.returncode == 1 and "HTTP 404" in r.stderr and "not found" in r.stderr and "set HF_TOKEN" not in r.stderr,
          "unknown repo with a token", show(r))
    r = pull(["test-org/tiny-gemma@nope", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 1 and "revision 'nope' not found" in r.stderr, "unknown revision", show(r))
    r = pull(["test-org/no-weights", "--endpoint", endpoint, "--cache", cache])
    check(r.returncode == 1 and "no safetensors weights" in r.stderr, "a repo without weights", show(r))

    # a renamed repo: the hub redirects (relative Location) to the new name
    r = pull(["test-org/old-name", "--endpoint", endpoint, "--cache", fresh_dir("renamed")])
    check(r.returncode == 0 and "models--test-org--old-name" in r.stdout, "renamed repo", show(r))
    if r.returncode == 0:
        expect_files(hub, "test-org/tiny-gemma", r.stdout.strip(), METADATA + ["model.safetensors"], "renamed")

    # usage errors
    for args in ([], ["gemma"], ["a/b/c"], ["test-org/tiny-gemma", "--bogus"],
                 ["test-org/tiny-gemma@main", "--revision", "v1.0"]):
        r = pull(args)
        check(r.returncode == 2, "usage error for %s" % args, show(r))
    r = pull(["--help"])
    check(r.returncode == 0 and "HF_TOKEN" in r.stdout, "--help", show(r))


def main():
    global HF_HOME
    if not os.path.isfile(os.path.join(FIXTURE, "model.safetensors")):
        print("FAIL: fixture %s is not unpacked" % FIXTURE)
        print("0 passed, 1 failed")
        return 1
    shutil.rmtree(TMP, ignore_errors=True)
    HF_HOME = fresh_dir("hf_home")
    hub = FakeHub(FIXTURE, DATA).start()
    try:
        run_basic(hub, hub.hub_url)
        run_sharded(hub, hub.hub_url)
        run_resume(hub, hub.hub_url)
        run_failures(hub, hub.hub_url)
    finally:
        hub.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
