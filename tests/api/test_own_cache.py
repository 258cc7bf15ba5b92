"""The tests leave the user's data alone (issue 30): this suite's hearth processes write into
the session's own cache folder (isolate_cache in tests/hearth_process.py, called by the
conftest), never into the user's `$HEARTH_CACHE` (default ~/.cache/hearth). The oracle is the
user's evals database itself, read with Python's sqlite3: a row that hearth records during the
tests must land in the test cache and leave the user's file byte for byte as it was."""
import hashlib
import os
import sqlite3
import subprocess
from pathlib import Path

from conftest import BIN, CACHE


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def test_hearth_writes_into_the_tests_own_cache():
    user = Path(os.environ["HEARTH_TEST_CACHE_OF"])
    assert CACHE.resolve() != user.resolve(), "the tests run in the user's cache"
    assert not (CACHE / "evals.sqlite").is_symlink(), "the test cache links the user's evals database"
    before = digest(user / "evals.sqlite")
    marker = f"own-cache-check-{os.getpid()}"
    p = subprocess.run([str(BIN), "evals", "add", "--kind", "bench", "--model", marker], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with sqlite3.connect(CACHE / "evals.sqlite") as db:
        assert db.execute("SELECT count(*) FROM runs WHERE model = ?", (marker,)).fetchone()[0] == 1
    assert digest(user / "evals.sqlite") == before, "a test wrote into the user's evals database"
