"""hearth pull / rm / ls / evals and the library endpoints, against a fake Hugging Face hub
served on loopback by this module (http.server in a thread): the api/models file list,
resolve/ with ETag / X-Linked-Etag / X-Linked-Size / X-Repo-Commit, 302 redirects to a
"CDN" path (relative and absolute Location), Range, 401 without a token, 404s, a dropped
connection and corrupted content.

Oracles: huggingface_hub itself (snapshot_download / try_to_load_from_cache with
local_files_only, scan_cache_dir) says whether the cache layout is right; hashlib gives
the sha256 / git blob sha1; the safetensors header and config.json (read here in Python)
give parameters, context length and weight bytes; sqlite3 reads the evals database.
"""
import hashlib
import http.server
import json
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import BIN, CACHE, server  # noqa: F401  (server: the shared hearth serve fixture)

SOURCE = CACHE / "tiny" / "llama-bf16"
REPO_ID = "hearth-test/tiny-llama"
GATED_ID = "hearth-test/gated"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT2 = "fedcba9876543210fedcba9876543210fedcba98"
TOKEN = "hf_test_token_123"
LFS = {"model.safetensors", "tokenizer.json"}


def need_source():
    if not SOURCE.is_dir():
        pytest.fail(f"tiny model missing: {SOURCE}; run tools/get_models.sh", pytrace=False)
    if not BIN.exists():
        pytest.fail(f"hearth binary missing: {BIN}; run make (or set HEARTH_BIN)", pytrace=False)


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Serves repos {repo_id: {revision: (commit, {filename: bytes})}}; LFS files redirect
    to /cdn/<sha256> (relative Location) or http://127.0.0.1:<port>/cdn2/<sha256>
    (absolute) which serves the bytes with Range support."""

    def __init__(self):
        self.repos = {}
        self.gated = set()
        self.requests = []  # (method, path, range, authorization)
        self.drop_once = set()  # sha256s whose first full GET is cut halfway
        self.corrupt = set()  # sha256s served with one byte flipped
        self.absolute_redirect = False
        self.cdn_host = "127.0.0.1"  # the host of absolute redirects
        self.lfs_paths = {}  # repo -> files stored through LFS by an upload (test_upload.py)
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.handle_any(head=True)

            def do_GET(self):
                self.handle_any(head=False)

            def do_POST(self):
                hub.on_write(self)

            def do_PUT(self):
                hub.on_write(self)

            def send(self, status, body=b"", headers=(), head=False, length=None):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def handle_any(self, head):
                auth = self.headers.get("Authorization")
                hub.requests.append((self.command, self.path, self.headers.get("Range"), auth))
                parts = self.path.split("?")[0].split("/")
                if self.path.startswith("/api/models/") and len(parts) > 6 and parts[5] == "tree":
                    return self.tree(parts[3] + "/" + parts[4], urllib.parse.unquote(parts[6]), auth, head)
                if self.path.startswith("/api/models/"):
                    return self.api(parts[3] + "/" + parts[4], urllib.parse.unquote(parts[6]), auth, head)
                if parts[1] in ("cdn", "cdn2"):
                    return self.cdn(parts[2], head)
                if len(parts) > 5 and parts[3] == "resolve":
                    rev = urllib.parse.unquote(parts[4])
                    return self.resolve(parts[1] + "/" + parts[2], rev, urllib.parse.unquote("/".join(parts[5:])), auth,
                                        head)
                self.send(404, b"nope", head=head)

            def lookup(self, repo, rev, auth, head):
                if repo not in hub.repos:
                    self.send(404, b'{"error":"Repository not found"}', [("X-Error-Code", "RepoNotFound")], head)
                    return None
                if repo in hub.gated and auth != f"Bearer {TOKEN}":
                    self.send(401, b'{"error":"Access to this model is restricted"}', [("X-Error-Code", "GatedRepo")],
                              head)
                    return None
                revs = hub.repos[repo]
                for name, (commit, files) in revs.items():
                    if rev in (name, commit):
                        return commit, files
                self.send(404, b'{"error":"Revision not found"}', [("X-Error-Code", "RevisionNotFound")], head)
                return None

            def api(self, repo, rev, auth, head):
                found = self.lookup(repo, rev, auth, head)
                if found:
                    commit, files = found
                    body = json.dumps({"id": repo, "sha": commit,
                                       "siblings": [{"rfilename": f} for f in sorted(files)]}).encode()
                    self.send(200, body, [("Content-Type", "application/json")], head)

            def tree(self, repo, rev, auth, head):
                """api/models/{repo}/tree/{rev}: every file (what huggingface_hub's upload_folder
                lists to skip unchanged files)."""
                found = self.lookup(repo, rev, auth, head)
                if found:
                    out = []
                    for name, data in sorted(found[1].items()):
                        e = {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha1(data)}
                        if name in LFS or name in hub.lfs_paths.get(repo, ()):
                            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                        out.append(e)
                    self.send(200, json.dumps(out).encode(), [("Content-Type", "application/json")], head)

            def resolve(self, repo, rev, path, auth, head):
                found = self.lookup(repo, rev, auth, head)
                if not found:
                    return
                commit, files = found
                if path not in files:
                    self.send(404, b"entry not found", [("X-Error-Code", "EntryNotFound")], head)
                    return
                data = files[path]
                if path in LFS or path in hub.lfs_paths.get(repo, ()):
                    sha = hashlib.sha256(data).hexdigest()
                    loc = f"/cdn/{sha}"
                    if hub.absolute_redirect:
                        loc = f"http://{hub.cdn_host}:{hub.port}/cdn2/{sha}"
                    self.send(302, b"", [("Location", loc), ("X-Repo-Commit", commit),
                                         ("X-Linked-Etag", f'"{sha}"'), ("X-Linked-Size", str(len(data))),
                                         ("ETag", f'"{git_blob_sha1(b"pointer " + sha.encode())}"')], head)
                else:
                    self.send(200, data, [("X-Repo-Commit", commit), ("ETag", f'"{git_blob_sha1(data)}"')], head)

            def cdn(self, sha, head):
                data = hub.blobs.get(sha)
                if data is None:
                    self.send(404, b"no blob", head=head)
                    return
                if sha in hub.corrupt:
                    data = bytes([data[0] ^ 1]) + data[1:]
                rng = self.headers.get("Range")
                if rng and not head:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send(206, data[start:], [("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")])
                    return
                if sha in hub.drop_once and not head:
                    hub.drop_once.discard(sha)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.send(200, data, head=head)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def on_write(self, handler):
        """POST / PUT: a read-only hub (WritableHub in test_upload.py takes writes)."""
        handler.send(405, b'{"error":"read-only hub"}', [("Content-Type", "application/json")])

    @property
    def blobs(self):
        out = {}
        for revs in self.repos.values():
            for _, files in revs.values():
                for data in files.values():
                    out[hashlib.sha256(data).hexdigest()] = data
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def repo_files():
    files = {p.name: p.read_bytes() for p in SOURCE.iterdir() if p.is_file()}
    files["extra/notes.txt"] = b"a file in a folder: its symlink needs one more ../\n"
    return files


@pytest.fixture
def hub(tmp_path):
    need_source()
    h = FakeHub()
    h.repos[REPO_ID] = {"main": (COMMIT, repo_files())}
    h.repos[GATED_ID] = {"main": (COMMIT, {"config.json": b'{"a": 1}\n'})}
    h.gated.add(GATED_ID)
    yield h
    h.close()


@pytest.fixture
def env(tmp_path, hub):
    e = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HOME", "HEARTH_MODELS", "HF_HUB_OFFLINE")}
    e.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT=hub.url, HEARTH_CACHE=str(tmp_path / "hearth"))
    return e


def hearth(env, *args, input=None, timeout=120):
    return subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=timeout, input=input)


def hf_hub():
    try:
        import huggingface_hub
    except ImportError:
        pytest.fail("huggingface_hub missing from .venv (transformers depends on it): run tools/deps.sh",
                    pytrace=False)
    return huggingface_hub


# ---- pull ------------------------------------------------------------------------------


def test_pull_writes_the_layout_huggingface_hub_reads(hub, env, tmp_path):
    r = hearth(env, "pull", REPO_ID)
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "hub"
    snap = cache / "models--hearth-test--tiny-llama" / "snapshots" / COMMIT
    assert r.stdout.strip() == str(snap)
    hh = hf_hub()
    # the oracle: huggingface_hub finds every file offline, with the right bytes
    got = hh.snapshot_download(REPO_ID, cache_dir=str(cache), local_files_only=True)
    assert Path(got) == snap
    for name, data in repo_files().items():
        p = hh.try_to_load_from_cache(REPO_ID, name, cache_dir=str(cache))
        assert isinstance(p, str), name
        assert Path(p).read_bytes() == data
        link = snap / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        blob = os.path.basename(os.readlink(link))
        assert blob == (hashlib.sha256(data).hexdigest() if name in LFS else git_blob_sha1(data))
    assert os.readlink(snap / "extra" / "notes.txt").startswith("../../../blobs/")
    assert (cache / "models--hearth-test--tiny-llama" / "refs" / "main").read_text() == COMMIT
    info = hh.scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO_ID and repo.nb_files == len(repo_files())
    assert any(m == "GET" and p.startswith("/cdn/") for m, p, _, _ in hub.requests), "the 302 was not followed"
    assert not list((cache / "models--hearth-test--tiny-llama" / "blobs").glob("*.incomplete"))
    # a second pull downloads nothing again
    n = len([q for q in hub.requests if q[0] == "GET" and q[1].startswith("/cdn/")])
    assert hearth(env, "pull", REPO_ID).returncode == 0
    assert len([q for q in hub.requests if q[0] == "GET" and q[1].startswith("/cdn/")]) == n


def test_pull_absolute_redirect_and_include(hub, env, tmp_path):
    hub.absolute_redirect = True
    r = hearth(env, "pull", REPO_ID, "--include", "*.json", "--exclude", "tokenizer*")
    assert r.returncode == 0, r.stderr
    snap = tmp_path / "hub" / "models--hearth-test--tiny-llama" / "snapshots" / COMMIT
    names = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir())
    want = sorted(n for n in repo_files() if n.endswith(".json") and not n.startswith("tokenizer"))
    assert names == want
    r = hearth(env, "pull", REPO_ID, "--include", "model.safetensors")
    assert r.returncode == 0, r.stderr
    assert (snap / "model.safetensors").read_bytes() == (SOURCE / "model.safetensors").read_bytes()
    assert any(p.startswith("/cdn2/") for _, p, _, _ in hub.requests)


def test_pull_revision_by_name_and_commit(hub, env, tmp_path):
    hub.repos[REPO_ID]["v2"] = (COMMIT2, {"config.json": b'{"v": 2}\n'})
    assert hearth(env, "pull", REPO_ID + "@v2").returncode == 0
    hh = hf_hub()
    p = hh.try_to_load_from_cache(REPO_ID, "config.json", cache_dir=str(tmp_path / "hub"), revision="v2")
    assert Path(p).read_bytes() == b'{"v": 2}\n'
    r = hearth(env, "pull", REPO_ID + "@" + COMMIT2)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(COMMIT2)


def test_pull_not_found(hub, env):
    r = hearth(env, "pull", "hearth-test/no-such-repo")
    assert r.returncode == 1
    assert "not found" in r.stderr and "hearth-test/no-such-repo" in r.stderr
    r = hearth(env, "pull", REPO_ID + "@no-such-branch")
    assert r.returncode == 1 and "no revision 'no-such-branch'" in r.stderr


def test_pull_gated_needs_hf_token(hub, env, tmp_path):
    r = hearth(env, "pull", GATED_ID)
    assert r.returncode == 1
    assert "HF_TOKEN" in r.stderr and "401" in r.stderr
    r = hearth({**env, "HF_TOKEN": TOKEN}, "pull", GATED_ID)
    assert r.returncode == 0, r.stderr
    assert any(a == f"Bearer {TOKEN}" for _, _, _, a in hub.requests)
    r = hearth({**env, "HF_TOKEN": "wrong"}, "pull", GATED_ID)
    assert r.returncode == 1 and "no access" in r.stderr


def test_pull_resumes_a_dropped_transfer(hub, env, tmp_path):
    data = (SOURCE / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    hub.drop_once.add(sha)
    r = hearth(env, "pull", REPO_ID, "--include", "model.safetensors")
    assert r.returncode == 0, r.stderr
    ranges = [rg for m, p, rg, _ in hub.requests if p == f"/cdn/{sha}" and rg]
    assert ranges == [f"bytes={len(data) // 2}-"], hub.requests
    blob = tmp_path / "hub" / "models--hearth-test--tiny-llama" / "blobs" / sha
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha


def test_pull_resumes_an_incomplete_blob_left_on_disk(hub, env, tmp_path):
    data = (SOURCE / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    blobs = tmp_path / "hub" / "models--hearth-test--tiny-llama" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (sha + ".incomplete")).write_bytes(data[:1000])
    r = hearth(env, "pull", REPO_ID, "--include", "model.safetensors")
    assert r.returncode == 0, r.stderr
    assert [rg for _, p, rg, _ in hub.requests if p == f"/cdn/{sha}"] == ["bytes=1000-"]
    assert (blobs / sha).read_bytes() == data


def test_concurrent_pulls_share_one_download(hub, env, tmp_path):
    """Two pulls at once: the per-blob lock (huggingface_hub's .locks/<repo>/<etag>.lock)
    makes the second wait and then find the blob, so the bytes are fetched once."""
    cmd = [str(BIN), "pull", REPO_ID, "--include", "model.safetensors"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    data = (SOURCE / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert len([q for q in hub.requests if q[0] == "GET" and q[1] == f"/cdn/{sha}"]) == 1
    assert (tmp_path / "hub" / ".locks" / "models--hearth-test--tiny-llama" / f"{sha}.lock").exists()
    snap = tmp_path / "hub" / "models--hearth-test--tiny-llama" / "snapshots" / COMMIT
    assert (snap / "model.safetensors").read_bytes() == data


def test_pull_rejects_corrupted_content(hub, env, tmp_path):
    data = (SOURCE / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    hub.corrupt.add(sha)
    r = hearth(env, "pull", REPO_ID, "--include", "model.safetensors")
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr
    repo = tmp_path / "hub" / "models--hearth-test--tiny-llama"
    assert not (repo / "snapshots" / COMMIT / "model.safetensors").exists()
    assert not list((repo / "blobs").glob(sha + "*"))


def test_pull_unreachable_endpoint(env):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = hearth({**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}, "pull", REPO_ID)
    assert r.returncode == 1
    assert "cannot reach the hub" in r.stderr and str(port) in r.stderr


def test_pull_rejects_bad_ids(env):
    for bad in ("noslash", "a/b/c", "../x", "a/..", "org/na--me", "org/name@../../etc"):
        r = hearth(env, "pull", bad)
        assert r.returncode == 1, bad
        assert "not a" in r.stderr, (bad, r.stderr)


# ---- rm ----------------------------------------------------------------------------------


def test_rm_reclaims_blobs_no_other_snapshot_uses(hub, env, tmp_path):
    shared = b'{"shared": true}\n'
    hub.repos[REPO_ID] = {"main": (COMMIT, {"config.json": shared, "a.txt": b"only in main\n"}),
                          "v2": (COMMIT2, {"config.json": shared, "b.txt": b"only in v2\n"})}
    assert hearth(env, "pull", REPO_ID).returncode == 0
    assert hearth(env, "pull", REPO_ID + "@v2").returncode == 0
    repo = tmp_path / "hub" / "models--hearth-test--tiny-llama"
    r = hearth(env, "rm", REPO_ID + "@v2")  # not a terminal and no -y: refuses
    assert r.returncode == 1 and "-y" in r.stderr and (repo / "snapshots" / COMMIT2).exists()
    r = hearth(env, "rm", REPO_ID + "@v2", "-y", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["snapshots"] == [COMMIT2] and report["blobs"] == 1
    assert report["freed_bytes"] == len(b"only in v2\n")
    hh = hf_hub()
    # huggingface_hub still finds main intact; v2 is gone, and so is its ref
    assert Path(hh.try_to_load_from_cache(REPO_ID, "config.json", cache_dir=str(tmp_path / "hub"))).read_bytes() == shared
    assert not (repo / "refs" / "v2").exists() and (repo / "refs" / "main").exists()
    assert not hh.scan_cache_dir(tmp_path / "hub").warnings
    r = hearth(env, "rm", REPO_ID, "-y")
    assert r.returncode == 0, r.stderr
    assert not repo.exists()
    r = hearth(env, "rm", REPO_ID, "-y")
    assert r.returncode == 1 and "not in the Hugging Face cache" in r.stderr


def test_rm_handles_pr_refs(hub, env, tmp_path):
    """A PR revision is cached as refs/refs/pr/N (huggingface_hub's layout). rm of it
    removes that nested ref and only its own blobs; rm of a revision whose snapshot a PR
    ref also names removes that ref too, and never a blob another snapshot links."""
    shared = b'{"shared": true}\n'
    hub.repos[REPO_ID] = {"main": (COMMIT, {"config.json": shared, "a.txt": b"only in main\n"}),
                          "refs/pr/1": (COMMIT2, {"config.json": shared, "b.txt": b"only in the PR\n"})}
    for rev in ("", "@refs/pr/1"):
        r = hearth(env, "pull", REPO_ID + rev)
        assert r.returncode == 0, r.stderr
    repo = tmp_path / "hub" / "models--hearth-test--tiny-llama"
    pr_ref = repo / "refs" / "refs" / "pr" / "1"
    assert pr_ref.read_text() == COMMIT2
    hh = hf_hub()
    refs = {rev.commit_hash: set(rev.refs) for rev in next(iter(hh.scan_cache_dir(tmp_path / "hub").repos)).revisions}
    assert refs == {COMMIT: {"main"}, COMMIT2: {"refs/pr/1"}}  # huggingface_hub reads hearth's refs
    r = hearth(env, "rm", REPO_ID + "@refs/pr/1", "-y", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["snapshots"] == [COMMIT2] and report["blobs"] == 1
    assert report["freed_bytes"] == len(b"only in the PR\n")
    assert not pr_ref.exists() and not (repo / "refs" / "refs").exists() and (repo / "refs" / "main").exists()
    scan = hh.scan_cache_dir(tmp_path / "hub")
    assert not scan.warnings, scan.warnings
    assert Path(hh.try_to_load_from_cache(REPO_ID, "config.json", cache_dir=str(tmp_path / "hub"))).read_bytes() == shared
    # a PR ref naming the same snapshot as main: rm @main takes the snapshot and both refs,
    # but not the blobs of the snapshot that stays
    del hub.repos[REPO_ID]["refs/pr/1"]  # the fake hub serves the first revision a commit matches
    hub.repos[REPO_ID]["refs/pr/2"] = (COMMIT, hub.repos[REPO_ID]["main"][1])
    hub.repos[REPO_ID]["v2"] = (COMMIT2, {"config.json": shared, "b.txt": b"only in v2\n"})
    for rev in ("@refs/pr/2", "@v2"):
        r = hearth(env, "pull", REPO_ID + rev)
        assert r.returncode == 0, r.stderr
    r = hearth(env, "rm", REPO_ID + "@main", "-y", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["snapshots"] == [COMMIT]
    assert not (repo / "refs" / "main").exists() and not (repo / "refs" / "refs").exists()
    assert (repo / "refs" / "v2").read_text() == COMMIT2
    scan = hh.scan_cache_dir(tmp_path / "hub")
    assert not scan.warnings, scan.warnings
    for name, data in (("config.json", shared), ("b.txt", b"only in v2\n")):
        got = hh.try_to_load_from_cache(REPO_ID, name, revision="v2", cache_dir=str(tmp_path / "hub"))
        assert got and Path(got).read_bytes() == data, name


def limit_file_size(limit):
    """preexec_fn: writes past `limit` bytes fail with EFBIG (RLIMIT_FSIZE), as they would
    with ENOSPC on a full disk; SIGXFSZ ignored so that the write fails instead of the
    signal killing the process (an ignored signal stays ignored across exec)."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_pull_on_a_full_disk_fails_clearly_and_resumes(hub, env, tmp_path):
    data = (SOURCE / "model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    limit = 100_000
    assert len(data) > 2 * limit
    r = subprocess.run([str(BIN), "pull", REPO_ID, "--include", "model.safetensors"], env=env, capture_output=True,
                       text=True, timeout=120, preexec_fn=limit_file_size(limit))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "model.safetensors" in r.stderr and "File too large" in r.stderr and "resumes" in r.stderr, r.stderr
    repo = tmp_path / "hub" / "models--hearth-test--tiny-llama"
    # nothing presented as complete: no blob under its final name, no snapshot link, no ref
    assert not (repo / "blobs" / sha).exists()
    assert not (repo / "snapshots" / COMMIT / "model.safetensors").exists()
    assert not (repo / "refs" / "main").exists()
    hh = hf_hub()
    assert hh.try_to_load_from_cache(REPO_ID, "model.safetensors", cache_dir=str(tmp_path / "hub")) is None
    partial = repo / "blobs" / (sha + ".incomplete")
    have = partial.stat().st_size
    assert 0 < have <= limit and partial.read_bytes() == data[:have]  # a true prefix
    # space again: the next pull resumes from the prefix and completes
    hub.requests.clear()
    r = hearth(env, "pull", REPO_ID, "--include", "model.safetensors")
    assert r.returncode == 0, r.stderr
    assert [rg for _, p, rg, _ in hub.requests if p == f"/cdn/{sha}"] == [f"bytes={have}-"]
    got = hh.try_to_load_from_cache(REPO_ID, "model.safetensors", cache_dir=str(tmp_path / "hub"))
    assert got and hashlib.sha256(Path(got).read_bytes()).hexdigest() == sha
    assert not partial.exists()


# ---- ls / library ------------------------------------------------------------------------


def safetensors_params(path):
    """Parameters from the safetensors header (the oracle: the file's own index)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    total = 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        count = 1
        for d in v["shape"]:
            count *= d
        total += count
    return total


def test_ls_json_describes_a_pulled_model(hub, env, tmp_path):
    assert hearth(env, "pull", REPO_ID).returncode == 0
    r = hearth(env, "ls", "--json")
    assert r.returncode == 0, r.stderr
    (m,) = [e for e in json.loads(r.stdout) if e["name"] == REPO_ID]
    config = json.loads((SOURCE / "config.json").read_text())
    assert m["family"] == config["model_type"]
    assert m["parameters"] == safetensors_params(SOURCE / "model.safetensors")
    assert m["context_length"] == config["max_position_embeddings"]
    assert m["quantization"] == "bf16"
    assert m["size_bytes"] == sum(len(d) for d in repo_files().values())
    assert "chat" in m["capabilities"] and "embeddings" not in m["capabilities"]
    assert m["fits"] is True and m["predicted_peak_bytes"] > 0 and m["source"] == "hf-cache"
    # filters
    assert not [e for e in json.loads(hearth(env, "ls", "--json", "--family", "qwen3").stdout) if e["name"] == REPO_ID]
    assert not json.loads(hearth(env, "ls", "--json", "--max-size", "100kB").stdout)
    assert [e["name"] for e in json.loads(hearth(env, "ls", "--json", "--max-size", "1MB").stdout)] == [REPO_ID]
    table = hearth(env, "ls").stdout
    assert REPO_ID in table and "bf16" in table


def get_json(url, data=None):
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_library_fit_and_downloads(hub, env, tmp_path, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_TOKEN", "HF_HOME", "HEARTH_MODELS"):
        monkeypatch.delenv(k, raising=False)
    assert hearth(env, "pull", REPO_ID, "--include", "*.json", "--include", "*.jinja", "--include", "*.safetensors")\
        .returncode == 0
    with server(REPO_ID) as base:
        status, lib = get_json(base + "/library")
        assert status == 200 and [e["name"] for e in lib] == [REPO_ID]
        assert lib[0]["parameters"] == safetensors_params(SOURCE / "model.safetensors")
        status, fit = get_json(base + "/fit?ctx=256")
        assert status == 200
        cli = json.loads(hearth(env, "fit", REPO_ID, "--ctx", "256", "--json").stdout)
        for k in ("context_length", "weights_bytes", "kv_pool_bytes", "scratch_bytes", "model_max_context"):
            assert fit[k] == cli[k], k
        assert fit["context_length"] == 256 and "predicted_peak_bytes" in fit
        status, fit2 = get_json(base + f"/fit?model={SOURCE}&ctx=512")
        assert status == 200 and fit2["context_length"] == 512
        assert get_json(base + "/fit?ctx=-1")[0] == 400
        assert get_json(base + "/fit?model=no-such-model-anywhere")[0] == 404
        status, skus = get_json(base + "/fit?skus=1")
        assert status == 200 and any("H200" in s["name"] for s in skus["skus"]) and "predicted" in skus["prediction"]
        # a download started over HTTP, watched through GET /downloads
        hub.repos["hearth-test/other"] = {"main": (COMMIT2, {"config.json": b"{}\n"})}
        status, started = get_json(base + "/downloads", {"model": "hearth-test/other"})
        assert status == 202 and started["state"] == "downloading"
        deadline = time.time() + 30
        while True:
            _, dl = get_json(base + "/downloads")
            (d,) = [x for x in dl if x["model"] == "hearth-test/other"]
            if d["state"] != "downloading" or time.time() > deadline:
                break
            time.sleep(0.2)
        assert d["state"] == "done", d
        p = hf_hub().try_to_load_from_cache("hearth-test/other", "config.json", cache_dir=env["HF_HUB_CACHE"])
        assert Path(p).read_bytes() == b"{}\n"
        assert get_json(base + "/downloads", {"model": "../bad"})[0] == 400


# ---- evals, fit --skus, the appliance's choice --------------------------------------------


def test_evals_lists_a_recorded_fit(env, tmp_path):
    need_source()
    r = hearth(env, "fit", str(SOURCE), "--ctx", "512", "--record", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    rows = json.loads(hearth(env, "evals", "--json").stdout)
    # fit also recorded the bandwidth probe it ran (no bench row yet): docs/cli.md, hearth fit
    assert sorted(r["kind"] for r in rows) == ["fit", "probe"]
    probe = [r for r in rows if r["kind"] == "probe"][0]
    assert probe["details"]["bandwidth_gbs"] == pytest.approx(report["bandwidth_gbs"], rel=1e-8)
    rows = [r for r in rows if r["kind"] == "fit"]
    assert rows[0]["context"] == 512
    assert rows[0]["predicted_peak_bytes"] == report["predicted_peak_bytes"]
    # the documented schema, read with Python's sqlite3
    db = sqlite3.connect(Path(env["HEARTH_CACHE"]) / "evals.sqlite")
    cols = [c[1] for c in db.execute("PRAGMA table_info(runs)")]
    assert cols[:8] == ["id", "time", "kind", "model", "context", "predicted_peak_bytes", "measured_peak_bytes", "tok_s"]
    assert db.execute("SELECT model, measured_peak_bytes FROM runs WHERE kind = 'fit'").fetchall() == [(str(SOURCE), None)]
    assert str(SOURCE) in hearth(env, "evals").stdout


def test_fit_skus_arithmetic(env):
    need_source()
    r = hearth(env, "fit", str(SOURCE), "--ctx", "1024", "--skus", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    me = out["this_machine"]
    table = json.loads((Path(__file__).resolve().parents[2] / "data" / "skus.json").read_text())["skus"]
    assert [s["name"] for s in out["skus"]] == [s["name"] for s in table]
    for row, spec in zip(out["skus"], table):
        assert row["source"] == spec["source"] and spec["source"]
        if spec["kind"] == "gpu":  # the --device cuda report for that GPU, CUDA runtime included
            g = json.loads(hearth(env, "fit", str(SOURCE), "--ctx", "1024", "--sku", spec["name"], "--json").stdout)
            assert row["predicted_bytes"] == g["predicted_peak_bytes"] and row["fits"] == g["fits"]
            assert row["runtime_overhead_bytes"] == g["runtime_overhead_bytes"] > 0
            assert row["decode_tok_s"] == pytest.approx(g["decode_tok_s"])
            continue
        want = me["predicted_peak_bytes"]
        assert row["predicted_bytes"] == want and row["fits"] == (want <= spec["memory_bytes"])
        assert row["decode_tok_s"] == pytest.approx(me["decode_tok_s"] * spec["bandwidth_gbs"] / me["bandwidth_gbs"])
    assert "predicted" in hearth(env, "fit", str(SOURCE), "--skus").stdout


def test_appliance_serves_the_best_present_catalogue_model(hub, env, tmp_path):
    """With a catalogue naming the pulled tiny repo first, `hearth` (no --model) serves it;
    an absent better entry is only suggested (HEARTH_AUTO_PULL=0), not downloaded."""
    assert hearth(env, "pull", REPO_ID).returncode == 0
    data = tmp_path / "data"
    data.mkdir()
    (data / "catalogue.json").write_text(json.dumps({
        "default": {"name": "default", "local": "models/none.gguf"},
        "models": [
            {"family": "llama", "name": "Absent Better", "hub_id": "hearth-test/absent", "approx_bytes": 1000000},
            {"family": "llama", "name": "Tiny Llama", "hub_id": REPO_ID, "approx_bytes": 400000},
        ]}))
    port = __import__("conftest").free_port()
    e = {**env, "HEARTH_DATA": str(data), "HEARTH_AUTO_PULL": "0"}
    proc = subprocess.Popen([str(BIN), "--no-open", "--port", str(port), "--threads", "1"], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                status, models = get_json(f"http://127.0.0.1:{port}/v1/models")
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200
        assert "snapshots/" + COMMIT in models["data"][0]["id"]
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "serving Tiny Llama" in out and "hearth pull hearth-test/absent" in out
    assert not any("/hearth-test/absent/" in p for _, p, _, _ in hub.requests)


def test_bench_and_evals_add_write_rows(env):
    need_source()
    r = hearth(env, "bench", str(SOURCE), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    r = hearth(env, "evals", "add", "--kind", "fit-check", "--model", "m", "--ctx", "64", "--predicted", "1000",
               "--measured", "990")
    assert r.returncode == 0, r.stderr
    rows = json.loads(hearth(env, "evals", "--json").stdout)
    assert [x["kind"] for x in rows] == ["fit-check", "bench"]
    assert rows[0]["predicted_peak_bytes"] == 1000 and rows[0]["measured_peak_bytes"] == 990
    assert rows[1]["tok_s"] == pytest.approx(bench["decode_tps"]) and rows[1]["measured_peak_bytes"] > 0
    assert rows[1]["details"]["prompt_tokens"] == 8
    assert "+1.01%" in hearth(env, "evals").stdout
    assert hearth(env, "evals", "add", "--kind", "x").returncode == 2
