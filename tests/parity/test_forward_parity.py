"""Forward-pass parity with mlx-lm: logits and greedy continuations.

Goldens in tests/parity/goldens/ were recorded by tools/make_goldens.py with mlx-lm
(float32 activations) for the tiny random-weight models of each family and form, and for
the real SmolLM2 / Gemma 3 GGUFs (dequantized with the gguf package and loaded into
mlx-lm). `hearth trace` prints hearth's logits for the same token ids.

Two tiers (DESIGN.md, "Parity tiers"):
- reference (HEARTH_CPU=scalar: f32 activations, weights dequantized exactly): greedy
  tokens identical; logits within REF_TOL.
- fast (the kernels this CPU selects: int8-quantized activations for quantized weights):
  logits within a looser FAST_TOL relative to the logit range, greedy agreement measured.
"""
import glob
import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
GOLDENS = sorted(glob.glob(os.path.join(REPO, "tests", "parity", "goldens", "*.json")))

# f32 sums of a few hundred to a few thousand products in a different order than mlx:
# relative rounding ~1e-6 per op, logits of magnitude ~30 -> 1e-4 typical; 2e-3 leaves
# room for 30-layer models (SmolLM2) where differences compound through the residual.
REF_TOL = 2e-3
# int8 activations (per 32 values, scale amax/127) add ~0.4% relative error per dot
# product; through the layers of a random-weight model this reaches a few percent of the
# logit range. Bound: 6% of the golden's logit spread at that step.
FAST_TOL = 0.06


def trace(model, ids, steps, level):
    env = dict(os.environ)
    if level:
        env["HEARTH_CPU"] = level
    p = subprocess.run([BIN, "trace", model, "--ids", json.dumps(ids), "--last", "4", "--top", "20",
                        "--steps", str(steps), "--step-top", "5", "--threads", "2"],
                       capture_output=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def compare(golden_top_ids, golden_top_logits, ours_top, tol):
    ours = {i: v for i, v in ours_top}
    worst = 0.0
    for i, v in zip(golden_top_ids, golden_top_logits):
        if i in ours:
            worst = max(worst, abs(ours[i] - v))
    assert ours_top[0][0] == golden_top_ids[0] or abs(ours_top[0][1] - golden_top_logits[0]) < tol
    return worst


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: os.path.basename(p)[:-5])
@pytest.mark.parametrize("level", ["scalar", None], ids=["reference", "fast"])
def test_logits_and_greedy_match_mlx_lm(golden, level):
    g = json.load(open(golden))
    model = os.path.join(CACHE, g["model"])
    assert os.path.exists(model), f"{model} missing: run tools/get_models.sh"
    agree = total = 0
    for p in g["prompts"]:
        steps = len(p["greedy_ids"])
        out = trace(model, p["ids"], steps - 1, level)
        spread = max(s["top_logits"][0] - s["top_logits"][-1] for s in p["greedy_steps"]) or 1.0
        tol = REF_TOL if level else FAST_TOL * spread
        for gl, ol in zip(p["last_logits"], out["prompt"]):
            assert gl["position"] == ol["pos"]
            worst = compare(gl["top_ids"], gl["top_logits"], ol["top"], tol)
            assert worst < tol, (p["name"], gl["position"], worst)
        ours = [s["token"] for s in out["steps"]]
        ours.append(max(out["steps"][-1]["top"] if out["steps"] else out["prompt"][-1]["top"],
                        key=lambda t: (t[1], -t[0]))[0])
        # golden step i holds the logits that chose greedy_ids[i]: the last prompt
        # position for i = 0, then the logits after each appended token
        step_tops = [out["prompt"][-1]["top"]] + [s["top"] for s in out["steps"]]
        if level == "scalar":
            assert ours == p["greedy_ids"], (p["name"], ours, p["greedy_ids"])
            for i, gs in enumerate(p["greedy_steps"]):
                worst = compare(gs["top_ids"], gs["top_logits"], step_tops[i], tol)
                assert worst < tol, (p["name"], i, worst)
        else:
            n = next((i for i, (a, b) in enumerate(zip(ours, p["greedy_ids"])) if a != b), len(ours))
            agree += n
            total += len(ours)
    if level is None:
        print(f"{os.path.basename(golden)}: fast kernels follow the greedy golden for {agree}/{total} tokens")
