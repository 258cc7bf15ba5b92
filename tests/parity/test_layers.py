"""The layer check (tools/check_layers.py, docs/design.md "Layers"): the tree passes, and
each kind of violation it exists for is caught in a copy of the tree."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(REPO, "tools", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)


def test_the_tree_passes():
    p = run(REPO)
    assert p.returncode == 0, p.stdout


@pytest.mark.parametrize("file, include, why", [
    ("kv/kv_cache.c", "engine/engine_internal.h", "is above layer 4"),            # pointing up
    ("backend/cuda/cuda_plan.c", "backend/cpu/matmul.h", "do not include each other"),  # sibling backends
    ("model/llama.c", "backend/cpu/matmul.h", "never a backend"),                  # a forward pass on a kernel
    ("server/http.c", "engine/engine_internal.h", "a consumer sees only"),          # a consumer on internals
])
def test_each_violation_is_caught(tmp_path, file, include, why):
    shutil.copytree(os.path.join(REPO, "src"), tmp_path / "src")
    with open(tmp_path / "src" / file, "a") as f:
        f.write(f'\n#include "{include}"\n')
    p = run(str(tmp_path))
    assert p.returncode == 1
    assert f"{file}: includes {include}" in p.stdout and why in p.stdout, p.stdout
