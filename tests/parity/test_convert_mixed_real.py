"""Mixed precision on a real model: the plan `hearth convert -q --target-bpw 4.5` chose for
SmolLM2-135M-Instruct (bench/convert_mixed/run.py measured it and recorded it in
bench/results/convert_mixed.md) adds less mean KL than uniform 4-bit at group 64 in no more
bytes, on held-out text the calibration never saw. The issue's target is at most 0.7x; the
bench measured 0.853x (8 rows of 512), so that is what this test does NOT claim: it asserts
a strict improvement, below 0.95x.

Measuring the plan takes one conversion and one scoring pass per layer and candidate
(minutes), so this test re-applies the recorded plan instead, with mlx-lm's converter (an
independent quantizer: its bytes equal hearth's, tests/parity/test_convert.py) and scores
both models with hearth perplexity --kl-divergence against the float32 reference on 4 rows
of 256 held-out tokens. Skips when the real model or the LoCoMo data is absent."""
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

import mixed_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))


def hearth(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"hearth {' '.join(map(str, args))}: {p.stderr}"
    return p.stdout


def test_target_bpw_plan_beats_uniform_4bit_on_smollm2(tmp_path):
    why = mixed_data.missing()
    if why:
        pytest.skip(why)
    import mlx.core as mx
    from mlx_lm.convert import convert

    plan = results_file.read("convert_mixed")["plan"]
    ref, f16 = mixed_data.smol_folders()
    _, held = mixed_data.write_text(tmp_path)
    mixed, uniform = tmp_path / "mixed", tmp_path / "uniform"

    def predicate(path, module, *_):
        if not hasattr(module, "to_quantized"):
            return False
        assert path in plan, f"{path}: not in the recorded plan"
        return {"bits": plan[path], "group_size": 64}

    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(f16), str(mixed), quantize=True, q_group_size=64, quant_predicate=predicate)
    hearth("convert", f16, "--out", uniform, "-q", "--q-bits", "4", "--q-group-size", "64")

    def stored_bits(folder):  # packed weights + scales + biases, weights
        t = mx.load(str(folder / "model.safetensors"))
        mods = [k[: -len(".scales")] for k in t if k.endswith(".scales")]
        return sum(t[m + s].nbytes * 8 for m in mods for s in (".weight", ".scales", ".biases")), \
            sum(t[m + ".scales"].size * 64 for m in mods)

    (mb, mw), (ub, uw) = stored_bits(mixed), stored_bits(uniform)
    assert mw == uw and mb <= ub and mb / mw <= 4.5, (mb / mw, ub / uw)
    assert len(set(plan.values())) > 1  # a mixed plan, not a uniform one

    logits = tmp_path / "reference.logprobs"

    def kl(model, *ref_args):
        out = hearth("perplexity", model, "--data-path", held, "--sequence-length", 256, "--num-samples", 4,
                     "--kl-divergence", *ref_args, "--reference-logits", logits, "--json")
        return json.loads(out)["kl_divergence"]["mean"]

    k_uniform = kl(uniform, "--reference", ref)
    k_mixed = kl(mixed)
    assert k_mixed < 0.95 * k_uniform, f"mixed KL {k_mixed:.4f} vs uniform 4-bit {k_uniform:.4f}"
