"""The chat page as HTTP sees it, without a browser: `hearth` with no command serves it
at / from the binary, byte for byte the files in web/, with the right Content-Type,
an ETag that revalidates, and no reference to anything outside the server."""
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

from conftest import BIN, WEB, chat_url_in_log, need

ASSETS = {
    "/": ("index.html", "text/html"),
    "/index.html": ("index.html", "text/html"),
    "/app.js": ("app.js", "text/javascript"),
    "/style.css": ("style.css", "text/css"),
}


def get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_prints_chat_page_url(hearth_app):
    base, log_path = hearth_app
    assert chat_url_in_log(log_path) == base + "/#/chat"


def test_assets_served_from_binary(hearth_app):
    base, _ = hearth_app
    for path, (name, ctype) in ASSETS.items():
        status, headers, body = get(base + path)
        assert status == 200, path
        assert headers["Content-Type"].split(";")[0] == ctype, path
        assert "charset=utf-8" in headers["Content-Type"]
        assert body == (WEB / name).read_bytes(), f"{path} differs from web/{name}: rebuild hearth"
        assert headers.get("Cache-Control") == "no-cache"
        assert re.fullmatch(r'"[0-9a-f]{16}"', headers["ETag"])


def test_etag_revalidates(hearth_app):
    base, _ = hearth_app
    _, headers, _ = get(base + "/app.js")
    status, _, body = get(base + "/app.js", {"If-None-Match": headers["ETag"]})
    assert status == 304 and body == b""
    status, _, _ = get(base + "/app.js", {"If-None-Match": '"0000000000000000"'})
    assert status == 200
    _, other, _ = get(base + "/style.css")
    assert other["ETag"] != headers["ETag"]


def test_unknown_paths_still_404(hearth_app):
    base, _ = hearth_app
    assert get(base + "/nope.js")[0] == 404
    assert get(base + "/web/app.js")[0] == 404
    assert get(base + "/../web/app.js")[0] == 404


def test_page_references_nothing_external(hearth_app):
    base, _ = hearth_app
    index = get(base + "/")[2].decode()
    assert re.search(r'<script src="app\.js"></script>', index)
    assert re.search(r'<link rel="stylesheet" href="style\.css">', index)
    for path in ASSETS:
        text = get(base + path)[2].decode()
        # any scheme-qualified or protocol-relative URL would be a fetch off this machine
        assert not re.search(r"\b(https?|wss?|ftp):", text, re.I), path
        assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*//""", text, re.I), path
        assert not re.search(r"url\(\s*['\"]?\s*(//|[a-z]+:)", text, re.I), path
        assert "@import" not in text and "@font-face" not in text, path
    # the only addresses the script fetches are this server's own paths
    js = (WEB / "app.js").read_text()
    assert sorted(set(re.findall(r'fetch\("([^"]*)"', js))) == ["/v1/chat/completions", "/v1/memory/changes?limit=",
                                                               "/v1/memory/synthesize", "/v1/memory/tools",
                                                               "/v1/memory/tools/", "/v1/models"]


def test_page_is_public_under_api_key(hearth_app):
    """With --api-key the page must still load (it asks for the key); the API must not."""
    from conftest import appliance
    with appliance("--api-key", "sekrit") as (base, _):
        assert get(base + "/")[0] == 200
        assert get(base + "/v1/models")[0] == 401
        assert get(base + "/v1/models", {"Authorization": "Bearer sekrit"})[0] == 200


def test_help_still_prints_usage():
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    r = subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "usage: hearth" in r.stdout
    r = subprocess.run([str(BIN), "--no-such-flag"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--no-such-flag" in r.stderr


def fake_xdg_open(tmp_path):
    """An xdg-open that records its arguments, first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "called"
    script = bindir / "xdg-open"
    script.write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    script.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}, record


def test_opens_browser_only_with_a_display(tmp_path):
    from conftest import appliance
    env, record = fake_xdg_open(tmp_path)
    # a display and no --no-open: xdg-open gets the chat page address
    with appliance(env={**env, "DISPLAY": ":99"}, no_open=False) as (base, _):
        deadline = time.time() + 5
        while not record.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert record.exists(), "xdg-open was not run"
        assert record.read_text().strip() == base + "/#/chat"
    record.unlink()
    # --no-open, or no display: nothing is opened and the server still runs
    with appliance(env={**env, "DISPLAY": ":99"}) as (base, _):
        assert get(base + "/")[0] == 200
    with appliance(env=env, no_open=False) as (base, _):
        assert get(base + "/")[0] == 200
    time.sleep(0.5)
    assert not record.exists()
