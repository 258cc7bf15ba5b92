"""Starting a hearth server process for a test and stopping it: shared by tests/api and
tests/ui (their conftest modules add this folder to sys.path)."""
import contextlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(path, what, fix):
    if not Path(path).exists():
        pytest.fail(f"{what} missing: {path}; {fix}", pytrace=False)
    return Path(path)


@contextlib.contextmanager
def running(cmd, port, log, env, ready_timeout, what="hearth serve"):
    """Runs cmd (writing to the open file `log`), waits until http://127.0.0.1:port/health
    answers 200, yields the base URL, and stops the process afterwards."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + ready_timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read().decode(errors='replace')}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"{what} did not answer /health within {ready_timeout}s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
