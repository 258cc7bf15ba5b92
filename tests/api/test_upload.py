"""hearth upload against the loopback hub of test_hub.py, made writable here: the hub's
repo-create, preupload, LFS batch (basic PUT and multipart with completion, verify) and
NDJSON commit endpoints.

Oracles: huggingface_hub itself. Its own upload_folder must work against this fake hub
(so the fake speaks the protocol the real client speaks), and its snapshot_download must
read back, byte for byte, what hearth uploaded; hashlib gives the sha256 oids.
"""
import base64
import hashlib
import json
import os
import socket
import subprocess
import urllib.parse

import pytest

from test_hub import BIN, SOURCE, TOKEN, FakeHub, hf_hub, need_source  # noqa: F401

NEW_COMMIT = iter(range(1, 1 << 30))


class WritableHub(FakeHub):
    """FakeHub plus the write half of the hub API. Files of at least lfs_min bytes (or
    *.safetensors) go through LFS; objects of at least multipart_min bytes are sent in
    parts of chunk bytes. drop_put_once: oids whose first PUT is cut off halfway."""

    def __init__(self):
        super().__init__()
        # LFS files redirect to a "CDN" on another host name, as on the real hub
        # (huggingface_hub reads a file's metadata from the hub's answer, not the CDN's)
        self.absolute_redirect = True
        self.cdn_host = "localhost"
        self.lfs_min = 4096
        self.multipart_min = 1 << 40
        self.chunk = 1 << 20
        self.store = {}  # oid -> bytes (LFS objects received)
        self.parts = {}  # oid -> {part number: bytes}
        self.puts = []  # oids of completed PUTs (basic) and completions (multipart)
        self.drop_put_once = set()
        self.commits = []  # (repo, summary, [paths])
        self.created = []  # create-repo bodies

    def on_write(self, h):
        auth = h.headers.get("Authorization")
        path = urllib.parse.urlsplit(h.path).path
        n = int(h.headers.get("Content-Length") or 0)
        parts = path.split("/")
        self.requests.append((h.command, h.path, None, auth))
        if h.command == "PUT" and parts[1] in ("lfs-put", "lfs-part"):
            return self.put(h, parts, n)
        body = h.rfile.read(n)
        if path == "/api/repos/create":
            if auth != f"Bearer {TOKEN}":
                return h.send(401, b'{"error":"Invalid credentials in Authorization header"}')
            j = json.loads(body)
            self.created.append(j)
            repo = f'{j["organization"]}/{j["name"]}'
            if repo in self.repos:
                return h.send(409, json.dumps({"error": "You already created this model repo",
                                               "url": f"{self.url}/{repo}"}).encode())
            self.repos[repo] = {"main": ("0" * 40, {})}
            return h.send(200, json.dumps({"url": f"{self.url}/{repo}"}).encode(), [("Content-Type", "application/json")])
        if auth != f"Bearer {TOKEN}":
            return h.send(401, b'{"error":"Invalid credentials in Authorization header"}')
        if path == "/api/validate-yaml":  # huggingface_hub checks a README.md's metadata first
            return h.send(200, b'{"errors":[],"warnings":[]}', [("Content-Type", "application/json")])
        if path.startswith("/api/models/") and parts[5] == "preupload":
            files = json.loads(body)["files"]
            out = [{"path": f["path"], "uploadMode": "lfs" if f["size"] >= self.lfs_min or
                    f["path"].endswith(".safetensors") else "regular", "shouldIgnore": False} for f in files]
            return h.send(200, json.dumps({"files": out}).encode(), [("Content-Type", "application/json")])
        if path.endswith(".git/info/lfs/objects/batch"):
            assert h.headers.get("Content-Type") == "application/vnd.git-lfs+json"
            j = json.loads(body)
            assert j["operation"] == "upload" and j["hash_algo"] == "sha256"
            objs = []
            for o in j["objects"]:
                if o["oid"] in self.store:
                    objs.append({"oid": o["oid"], "size": o["size"]})
                    continue
                verify = {"href": f"{self.url}/lfs-verify", "header": {}}
                if o["size"] >= self.multipart_min:
                    k = -(-o["size"] // self.chunk)
                    header = {"chunk_size": str(self.chunk)}
                    header.update({f"{i:05d}": f"{self.url}/lfs-part/{o['oid']}/{i}" for i in range(1, k + 1)})
                    up = {"href": f"{self.url}/lfs-complete/{o['oid']}", "header": header}
                else:
                    up = {"href": f"{self.url}/lfs-put/{o['oid']}"}
                objs.append({"oid": o["oid"], "size": o["size"], "authenticated": True,
                             "actions": {"upload": up, "verify": verify}})
            return h.send(200, json.dumps({"transfer": "basic", "objects": objs}).encode(),
                          [("Content-Type", "application/vnd.git-lfs+json")])
        if parts[1] == "lfs-complete":
            j = json.loads(body)
            oid = parts[2]
            got = self.parts.pop(oid, {})
            nums = [p["partNumber"] for p in j["parts"]]
            if nums != sorted(got) or any(p["etag"] != f"etag-{oid[:8]}-{p['partNumber']}" for p in j["parts"]):
                return h.send(400, b'{"error":"bad parts"}')
            data = b"".join(got[i] for i in nums)
            if hashlib.sha256(data).hexdigest() != oid:
                return h.send(400, b'{"error":"sha256 mismatch"}')
            self.store[oid] = data
            self.puts.append(oid)
            return h.send(200, b"{}")
        if parts[1] == "lfs-verify":
            j = json.loads(body)
            ok = j["oid"] in self.store and len(self.store[j["oid"]]) == j["size"]
            return h.send(200 if ok else 404, b"{}")
        if path.startswith("/api/models/") and parts[5] == "commit":
            repo, rev = parts[3] + "/" + parts[4], urllib.parse.unquote(parts[6])
            assert h.headers.get("Content-Type") == "application/x-ndjson"
            lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
            assert lines[0]["key"] == "header"
            old = self.repos[repo].get(rev, self.repos[repo]["main"])[1]
            files = dict(old)
            lfs = set(self.lfs_paths.get(repo, ()))
            for x in lines[1:]:
                v = x["value"]
                if x["key"] == "file":
                    assert v["encoding"] == "base64"
                    files[v["path"]] = base64.b64decode(v["content"])
                    lfs.discard(v["path"])
                elif x["key"] == "lfsFile":
                    assert v["algo"] == "sha256"
                    if v["oid"] not in self.store:
                        return h.send(422, json.dumps({"error": f"LFS object {v['oid']} not uploaded"}).encode())
                    files[v["path"]] = self.store[v["oid"]]
                    lfs.add(v["path"])
                else:
                    return h.send(400, json.dumps({"error": f"unknown key {x['key']}"}).encode())
            sha = hashlib.sha1(b"commit %d" % next(NEW_COMMIT)).hexdigest()
            self.repos[repo][rev] = (sha, files)
            self.lfs_paths[repo] = lfs
            self.commits.append((repo, lines[0]["value"]["summary"], sorted(x["value"]["path"] for x in lines[1:])))
            return h.send(200, json.dumps({"commitUrl": f"{self.url}/{repo}/commit/{sha}", "commitOid": sha,
                                           "success": True}).encode(), [("Content-Type", "application/json")])
        h.send(404, b'{"error":"no such endpoint"}')

    def put(self, h, parts, n):
        oid = parts[2]
        if oid in self.drop_put_once:  # the connection drops halfway through the body
            self.drop_put_once.discard(oid)
            h.rfile.read(n // 2)
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        data = h.rfile.read(n)
        if parts[1] == "lfs-part":
            num = int(parts[3])
            self.parts.setdefault(oid, {})[num] = data
            return h.send(200, b"", [("ETag", f'"etag-{oid[:8]}-{num}"')])
        if hashlib.sha256(data).hexdigest() != oid:
            return h.send(400, b'{"error":"sha256 mismatch"}')
        self.store[oid] = data
        self.puts.append(oid)
        h.send(200, b"")


def folder(tmp_path):
    """The tiny model's files, one of them in a sub-folder, an empty file, a .git folder
    that must stay home."""
    d = tmp_path / "model"
    d.mkdir()
    for p in SOURCE.iterdir():
        if p.is_file():
            (d / p.name).write_bytes(p.read_bytes())
    (d / "extra").mkdir()
    (d / "extra" / "notes.txt").write_bytes(b"a file in a folder\n")
    (d / "empty.txt").write_bytes(b"")
    (d / ".git").mkdir()
    (d / ".git" / "config").write_bytes(b"[core]\n")
    return d


def expected(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file() and ".git" not in p.parts}


@pytest.fixture
def whub(monkeypatch):
    need_source()
    # huggingface_hub uploads through Xet storage when it can; the fake hub (like hearth)
    # speaks the git LFS protocol, which the client uses with Xet off
    hf_hub()
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    h = WritableHub()
    yield h
    h.close()


def env_for(h, tmp_path, token=TOKEN):
    e = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HOME", "HF_HUB_OFFLINE")}
    e.update(HF_ENDPOINT=h.url, HF_HUB_CACHE=str(tmp_path / "hfcache"), HEARTH_CACHE=str(tmp_path / "hearth"))
    if token:
        e["HF_TOKEN"] = token
    return e


def upload(env, *args):
    return subprocess.run([str(BIN), "upload", *args], env=env, capture_output=True, text=True, timeout=120)


def download(h, repo, tmp_path, name):
    """huggingface_hub's snapshot_download of the repo: {relative path: bytes}."""
    hf = hf_hub()
    out = hf.snapshot_download(repo, endpoint=h.url, cache_dir=str(tmp_path / name), token=TOKEN)
    return {str(p.relative_to(out)): p.read_bytes() for p in __import__("pathlib").Path(out).rglob("*") if p.is_file()}


def test_fake_hub_takes_huggingface_hub_upload_folder(whub, tmp_path):
    """The oracle for the fake itself: huggingface_hub's own create_repo + upload_folder
    succeed against it and snapshot_download reads the same bytes back."""
    hf = hf_hub()
    d = folder(tmp_path)
    api = hf.HfApi(endpoint=whub.url, token=TOKEN)
    api.create_repo("hf-client/tiny", exist_ok=True)
    api.upload_folder(folder_path=str(d), repo_id="hf-client/tiny", commit_message="from huggingface_hub")
    assert download(whub, "hf-client/tiny", tmp_path, "a") == expected(d)
    assert whub.lfs_paths["hf-client/tiny"] >= {"model.safetensors", "tokenizer.json"}


def test_upload_round_trip_reads_back_with_huggingface_hub(whub, tmp_path):
    d = folder(tmp_path)
    env = env_for(whub, tmp_path)
    r = upload(env, str(d), "--repo", "me/tiny", "--private", "--message", "first upload")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(f"{whub.url}/me/tiny/commit/")
    assert whub.created[-1]["name"] == "tiny" and whub.created[-1]["organization"] == "me"
    assert whub.created[-1].get("visibility") == "private"
    assert download(whub, "me/tiny", tmp_path, "b") == expected(d)
    # the same LFS split huggingface_hub's upload makes against the same hub
    api = hf_hub().HfApi(endpoint=whub.url, token=TOKEN)
    api.create_repo("me/tiny-ref", exist_ok=True)
    api.upload_folder(folder_path=str(d), repo_id="me/tiny-ref", commit_message="ref")
    assert whub.lfs_paths["me/tiny"] == whub.lfs_paths["me/tiny-ref"]
    assert whub.commits[0] == ("me/tiny", "first upload", sorted(expected(d)))
    assert "empty.txt" not in whub.lfs_paths["me/tiny"]  # empty files never go through LFS


def test_upload_twice_sends_no_object_again(whub, tmp_path):
    d = folder(tmp_path)
    env = env_for(whub, tmp_path)
    assert upload(env, str(d), "--repo", "me/tiny").returncode == 0
    first = list(whub.puts)
    assert first, "no LFS object was sent"
    r = upload(env, str(d), "--repo", "me/tiny")  # the repo exists (409) and the hub has every object
    assert r.returncode == 0, r.stderr
    assert whub.puts == first and len(whub.commits) == 2


def test_upload_resumes_after_a_dropped_transfer(whub, tmp_path):
    d = folder(tmp_path)
    env = env_for(whub, tmp_path)
    big = hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    whub.drop_put_once.add(big)
    r = upload(env, str(d), "--repo", "me/tiny")
    assert r.returncode != 0 and "model.safetensors" in r.stderr and "again" in r.stderr, r.stderr
    assert not whub.commits  # nothing half-committed
    sent_before = list(whub.puts)
    r = upload(env, str(d), "--repo", "me/tiny")
    assert r.returncode == 0, r.stderr
    # the objects the first run completed are not sent again; the dropped one (and those
    # after it) are
    again = whub.puts[len(sent_before):]
    assert sent_before and not set(again) & set(sent_before) and big in again, (sent_before, again)
    assert download(whub, "me/tiny", tmp_path, "c") == expected(d)


def test_upload_multipart(whub, tmp_path):
    d = folder(tmp_path)
    size = (d / "model.safetensors").stat().st_size
    whub.multipart_min = 1
    whub.chunk = max(1, size // 3 + 1)  # three parts, the last one shorter
    r = upload(env_for(whub, tmp_path), str(d), "--repo", "me/parts")
    assert r.returncode == 0, r.stderr
    assert download(whub, "me/parts", tmp_path, "d") == expected(d)


def test_upload_errors_are_clear(whub, tmp_path):
    d = folder(tmp_path)
    r = upload(env_for(whub, tmp_path, token=None), str(d), "--repo", "me/tiny")
    assert r.returncode != 0 and "HF_TOKEN" in r.stderr
    r = upload(env_for(whub, tmp_path, token="hf_wrong"), str(d), "--repo", "me/tiny")
    assert r.returncode != 0 and "401" in r.stderr and "write token" in r.stderr, r.stderr
    r = upload(env_for(whub, tmp_path), str(tmp_path / "nope"), "--repo", "me/tiny")
    assert r.returncode != 0 and "nope" in r.stderr
    r = upload(env_for(whub, tmp_path), str(d), "--repo", "bad..name/x")
    assert r.returncode != 0 and r.stderr.strip()
    r = upload(env_for(whub, tmp_path), str(d))
    assert r.returncode == 2 and "--repo" in r.stderr
    assert not whub.commits
