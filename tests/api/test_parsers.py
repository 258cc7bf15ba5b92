"""hearth's reasoning/tool-call text state machine and tool parsers against mlx-lm's.

Oracle: tests/api/parser_cases.json, recorded by make_parser_cases.py from mlx-lm's own
TextStateMachine, tool_parsers and ToolCallFormatter (version in the file). The cases
are replayed through src/server/textstate.c + toolparse.c by tests/api/ts_helper.c,
compiled here against libhearth.a (env HEARTH_LIB, else lib/libhearth.a).

Allowed differences (each with its reason):
- tool_calls ids that are random uuid4 on both sides are compared as "<uuid>".
- Where mlx-lm raises an uncaught exception while formatting (a json_tools body that
  is not an object, or lacks "arguments"), the real server drops the connection;
  hearth drops only that tool call (logged), so the expected value is "no calls".
"""

import json
import subprocess
from pathlib import Path

import pytest
from hearth_process import compile_helper

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("parser_cases.json")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = compile_helper("tests/api/ts_helper.c", tmp_path_factory.mktemp("ts") / "ts_helper")
    run = subprocess.run([str(out), str(CASES)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"ts_helper failed: {run.stderr[-2000:]}"
    return json.loads(run.stdout)


def _expected(x):
    if isinstance(x, dict):
        if set(x) == {"crash"}:
            return []  # see the module docstring: hearth drops the call instead
        return {k: _expected(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_expected(v) for v in x]
    return x


DOC = json.loads(CASES.read_text())


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_case_matches_mlx_lm(case, results):
    got = results["cases"][case["name"]]
    want = _expected(case["expect"])
    assert got["full"] == want["full"], f"chunks={case['chunks']!r}"
    assert got["stream"] == want["stream"], f"chunks={case['chunks']!r}"


@pytest.mark.parametrize("case", DOC["inference"], ids=[c["name"] for c in DOC["inference"]])
def test_inference_matches_mlx_lm(case, results):
    got = results["inference"][case["name"]]
    assert got["tool"] == case["tool"]
    assert got["think"] == case["think"]


def test_fixture_is_current():
    """The fixture must come from the pinned mlx-lm (re-run make_parser_cases.py after a bump)."""
    import mlx_lm

    assert DOC["generated_by"].endswith(mlx_lm.__version__), (
        f"{CASES.name} was made by {DOC['generated_by']}; installed mlx-lm is {mlx_lm.__version__}")
