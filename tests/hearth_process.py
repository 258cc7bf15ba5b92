"""Starting a hearth server process for a test and stopping it, the test session's own
cache folder, and C helpers compiled against libhearth.a: shared by tests/api, tests/parity
and tests/ui (their conftest modules add this folder to sys.path)."""
import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest


def isolate_cache():
    """Points HEARTH_CACHE of this process (and so of every hearth it starts, and of pytest-
    xdist workers) at a fresh folder whose entries link to the user's cache (models, tiny
    models, oracles), so tests read the models but write what hearth writes (the evals
    database, bandwidth probes, download state) there, never into the user's cache. Called
    by each conftest at import; once per session (a worker reuses its controller's)."""
    if os.environ.get("HEARTH_TEST_CACHE_OF"):
        return
    # absolute: the links below are made from another folder, so a relative HEARTH_CACHE
    # (tools/cuda_check passes one) would leave them dangling
    user = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth")).absolute()
    own = Path(tempfile.mkdtemp(prefix="hearth-test-cache-"))
    atexit.register(shutil.rmtree, own, True)
    if user.is_dir():
        # the oracles' own cache (tokenizers converted from GGUF, tests/parity/conftest.py)
        # persists across sessions there, as it did before: it is the tests', not the user's
        (user / "oracle").mkdir(exist_ok=True)
        for entry in user.iterdir():
            if entry.name != "evals.sqlite":
                (own / entry.name).symlink_to(entry)
    os.environ["HEARTH_TEST_CACHE_OF"] = str(user)
    os.environ["HEARTH_CACHE"] = str(own)


ROOT = Path(__file__).resolve().parents[1]


def compile_helper(source, out):
    """Compiles a test's C helper (source, relative to the repo) against the library `make`
    built, $HEARTH_LIB or lib/libhearth.a, into out; returns out. The tests never run make
    themselves: pytest-xdist workers would run it at once in the same build folder (`make
    test` builds the library before the suites)."""
    lib = Path(os.environ.get("HEARTH_LIB") or ROOT / "lib" / "libhearth.a")
    if not lib.is_file():
        pytest.fail(f"{lib} is missing: run `make lib` first (or set HEARTH_LIB)", pytrace=False)
    pkgs = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson", "libpcre2-8", "libutf8proc"],
                          capture_output=True, text=True, check=True).stdout.split()
    cmd = ["gcc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-I", str(ROOT / "include"), "-I", str(ROOT / "src"),
           str(ROOT / source), str(lib), *pkgs, "-lm", "-pthread", "-o", str(out)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"building {source} against {lib} failed:\n{build.stderr[-3000:]}", pytrace=False)
    return Path(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(path, what, fix):
    if not Path(path).exists():
        pytest.fail(f"{what} missing: {path}; {fix}", pytrace=False)
    return Path(path)


def log_tail(log, limit=4000):
    """The last `limit` characters of an open log file, for failure messages."""
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


@contextlib.contextmanager
def server_process(cmd, log, env, ready, ready_timeout, what, poll=0.1):
    """Runs cmd (stdout and stderr into the open file `log`) and yields the process once
    ready() returns true; stops it afterwards (SIGTERM, then SIGKILL after 20 s). Fails the
    test, with the log's tail, if the process exits first or is not ready within
    ready_timeout seconds. ready() may raise OSError (not listening yet: try again)."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + ready_timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{what} exited with {proc.returncode}:\n{log_tail(log)}")
            try:
                if ready():
                    break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"{what} was not ready within {ready_timeout}s:\n{log_tail(log)}")
            time.sleep(poll)
        yield proc
        # a server that ended on its own while the tests used it crashed or exited: say
        # how, with its log (the test that met it only saw a dropped connection)
        if proc.poll() is not None:
            pytest.fail(f"{what} ended during the tests with {proc.returncode}:\n{log_tail(log)}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answers_health(base):
    """A readiness probe: GET base/health answers 200."""
    def ready():
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            return r.status == 200
    return ready


@contextlib.contextmanager
def running(cmd, port, log, env, ready_timeout, what="hearth serve"):
    """Runs cmd (writing to the open file `log`), waits until http://127.0.0.1:port/health
    answers 200, yields the base URL, and stops the process afterwards."""
    base = f"http://127.0.0.1:{port}"
    with server_process(cmd, log, env, answers_health(base), ready_timeout, what):
        yield base
