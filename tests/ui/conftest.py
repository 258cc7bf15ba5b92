"""Fixtures for the chat page tests: start hearth the way a person does, `hearth` with no
command (the appliance: serve the default model, print the chat page URL), on a free
loopback port. A missing binary, model or browser FAILS with what fixes it, never a skip.
"""
import contextlib
import os
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import isolate_cache, free_port, need, running  # noqa: E402

isolate_cache()  # before CACHE below: tests never write into the user's cache

REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(os.environ.get("HEARTH_BIN", REPO / "bin" / "hearth"))
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
SMOLLM2 = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WEB = REPO / "web"
ARTIFACTS = REPO / "build" / "ui-artifacts"
CHROMIUM = Path("/usr/bin/chromium")


@contextlib.contextmanager
def appliance(*flags, ready_timeout=60, env=None, no_open=True):
    """Runs `hearth --no-open --port P --threads 1 <flags>` (no command: the default model)
    and yields (base URL, path of its log). env: variables to set (None values unset)."""
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    need(SMOLLM2, "default model", "run tools/get_models.sh (or `make run`)")
    port = free_port()
    log_path = f"/tmp/hearth-ui-{port}.log"
    full_env = dict(os.environ)
    # never pop a browser on a developer's desktop from a test
    full_env.pop("DISPLAY", None)
    full_env.pop("WAYLAND_DISPLAY", None)
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    cmd = [str(BIN)] + (["--no-open"] if no_open else []) + ["--port", str(port), "--threads", "1", *flags]
    with open(log_path, "w+b") as log, running(cmd, port, log, full_env, ready_timeout, what="hearth") as base:
        yield base, log_path


@pytest.fixture(scope="module")
def hearth_app():
    # DEBUG logs the server's side of a closed connection (the Stop test reads it). No
    # speculation: prompt lookup accepts most of the short greedy answer ("capital of France")
    # in one step, sent in one write, and the page paints once a frame, so whether the
    # streaming test saw a partial answer depended on timing (one clean-clone CI run in three)
    with appliance("--log-level", "DEBUG", "--speculate", "none") as (base, log_path):
        yield base, log_path


@pytest.fixture(scope="session")
def browser():
    """Headless Debian chromium driven by Playwright (tools/deps.sh installs both)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed in .venv; run tools/deps.sh", pytrace=False)
    need(CHROMIUM, "chromium", "run tools/deps.sh (apt-get install chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        except Exception as e:  # noqa: BLE001 - any launch failure is the same message
            pytest.fail(f"could not start {CHROMIUM} through Playwright: {e}", pytrace=False)
        yield b
        b.close()


@contextlib.contextmanager
def chat_page(browser, base, path="/#/chat"):
    """A fresh browser context on a page of base (the chat page unless path says another);
    fails the test if the page threw."""
    ctx = browser.new_context(viewport={"width": 1100, "height": 800})
    pg = ctx.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(base + path)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def chat_url_in_log(log_path, timeout=5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(r"chat page at (\S+)", Path(log_path).read_text(errors="replace"))
        if m:
            return m.group(1)
        time.sleep(0.1)
    return None
