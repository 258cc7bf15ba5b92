"""MaskBench subset: the grammar engine on every 11th schema of maskbench-dev (about 200,
every category) with the default model's tokenizer. Each valid instance must be accepted
token by token (every token in the mask, the end accepted) and each invalid one refused:
0 wrong decisions, and at least the measured number of schemas passing (a drop is a
regression; the full table is bench/results/maskbench.md). Skips when the data set is
absent (HEARTH_SHARED_DATA)."""
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench" / "maskbench"))
import maskbench  # noqa: E402

MODEL = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth")) / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
# measured on this subset when the test was written; raise it when the engine improves
MIN_PASSING = 176


def test_maskbench_subset():
    if not MODEL.exists():
        pytest.fail(f"{MODEL} missing: run tools/get_models.sh")
    with tempfile.TemporaryDirectory() as tmp:
        cases = maskbench.load_cases(tmp, stride=11)
        if cases is None:
            pytest.skip("maskbench-dev.tar.xz not found (set HEARTH_SHARED_DATA to the shared data folder)")
        results = maskbench.run_hearth(maskbench.build_driver(), str(MODEL), cases, tmp)
    passing, errors, wrong_accept, wrong_reject = maskbench.verdicts(results)
    assert len(results) == len(cases)
    wrong = [(r["name"], t) for r in results if not r["error"] for t in r["tests"] if t["valid"] != t["accepted"]]
    assert wrong_accept == 0 and wrong_reject == 0, wrong[:5]
    assert passing >= MIN_PASSING, f"{passing} of {len(cases)} schemas pass ({errors} refused)"
