"""Mixed precision on a real model: the plan `hearth convert -q --target-bpw 4.5` chose for
SmolLM2-135M-Instruct (bench/convert_mixed/run.py measured it and recorded it in
bench/results/convert_mixed.md), re-applied with `hearth convert -q --plan` (the same
fitted scales and biases, no measuring), adds at most 0.7x the mean KL of uniform 4-bit at
group 64 (what mlx_lm.convert -q writes, byte for byte) in no more bytes, on held-out text
the calibration never saw. The issue's target is 0.7x; the bench measured the ratio the
results file gives on 8 rows of 512 with hearth's scorer.

The oracle here is mlx-lm: it loads both folders (per-module bits and group sizes from
config.json) and the float32 reference, and computes the logits of 4 rows of 256 held-out
tokens; the KL is numpy's. Skips when the real model or the LoCoMo data is absent."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mixed_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
ROWS, LENGTH = 4, 256


def hearth(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"hearth {' '.join(map(str, args))}: {p.stderr}"
    return p.stdout


def log_probs(folder, tokens):
    """mlx-lm's log-softmax of the logits of every position of every row (float64)."""
    import mlx.core as mx
    from mlx_lm.utils import load

    model, _ = load(str(folder))
    out = []
    for row in tokens:
        x = np.array(model(mx.array(row[None, :])).astype(mx.float32))[0].astype(np.float64)
        x -= x.max(axis=-1, keepdims=True)
        out.append(x - np.log(np.exp(x).sum(axis=-1, keepdims=True)))
    return np.stack(out)


def test_target_bpw_plan_vs_uniform_4bit_on_smollm2(tmp_path):
    why = mixed_data.missing()
    if why:
        pytest.skip(why)
    import mlx.core as mx
    from transformers import AutoTokenizer

    recorded = results_file.read("convert_mixed")
    plan = recorded["plan"]
    ref, f16 = mixed_data.smol_folders()
    _, held = mixed_data.write_text(tmp_path)
    mixed, uniform, plan_file = tmp_path / "mixed", tmp_path / "uniform", tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"quantization": {"bits": 4, "group_size": 64, **plan}}))
    hearth("convert", f16, "--out", mixed, "-q", "--plan", plan_file)
    hearth("convert", f16, "--out", uniform, "-q", "--q-bits", "4", "--q-group-size", "64")

    def stored(folder):  # packed weights + scales + biases, and the weights they hold
        t = mx.load(str(folder / "model.safetensors"))
        q = json.load(open(folder / "config.json"))["quantization"]
        mods = [k[: -len(".scales")] for k in t if k.endswith(".scales")]
        bits = sum(t[m + s].nbytes * 8 for m in mods for s in (".weight", ".scales", ".biases"))
        return bits, sum(t[m + ".weight"].size * 32 // q.get(m, q)["bits"] for m in mods)

    (mb, mw), (ub, uw) = stored(mixed), stored(uniform)
    assert mw == uw and mb <= ub and mb / mw <= 4.5, (mb / mw, ub / uw)
    assert len({(v["bits"], v["group_size"]) for v in plan.values()}) > 1  # a mixed plan, not a uniform one

    tok = AutoTokenizer.from_pretrained(str(ref))
    ids = []
    for line in open(held):
        ids += tok(json.loads(line)["text"])["input_ids"]
        if len(ids) >= ROWS * LENGTH:
            break
    tokens = np.array(ids[: ROWS * LENGTH]).reshape(ROWS, LENGTH)
    p_ref = log_probs(ref, tokens)

    def mean_kl(folder):
        lp = log_probs(folder, tokens)
        return float((np.exp(p_ref) * (p_ref - lp)).sum(axis=-1).mean())

    k_uniform, k_mixed = mean_kl(uniform), mean_kl(mixed)
    ratio = k_mixed / k_uniform
    print(f"mean KL: mixed {k_mixed:.4f}, uniform 4-bit {k_uniform:.4f}, ratio {ratio:.3f}")
    assert ratio <= 0.7, f"mixed KL {k_mixed:.4f} vs uniform 4-bit {k_uniform:.4f}: {ratio:.3f}x"
