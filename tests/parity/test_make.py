"""`make test` hygiene (issue 30): the sanitizer sub-makes share the parent's jobserver. They
are reached through a variable (ASAN_MAKE), so make only treats their recipe lines as
recursive, and hands them the jobserver, when the lines are marked `+`; unmarked, the
sub-make warned "jobserver unavailable: using -j1" and built the whole sanitizer tree on one
core. make itself is the oracle: under `make -n` it runs exactly the recipe lines it treats
as recursive (and the sub-make, inheriting -n, only prints), so the sub-make's own commands
appear in the output only for a `+` line. -B prints every command whatever is built already.
"""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("target", ["asan-build", "soak-bin"])
def test_sanitizer_sub_make_shares_the_jobserver(target):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    p = subprocess.run(["make", "-n", "-B", "-j2", "NVCC=", target], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "jobserver unavailable" not in p.stderr, p.stderr[-2000:]
    assert "-o build/asan/" in p.stdout, f"make did not run the {target} sub-make as a recursive make"
