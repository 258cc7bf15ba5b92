"""Mixed precision on a real model: the plan `hearth convert -q --target-bpw 4.5` chose for
SmolLM2-135M-Instruct (bench/convert_mixed/run.py measured it and recorded it in
bench/results/convert_mixed.md), re-applied with `hearth convert -q --plan` (the same
fitted scales and biases, no measuring), adds at most 0.62x the mean KL of uniform 4-bit at
group 64 (what mlx_lm.convert -q writes, byte for byte) in no more bytes, on held-out text
the calibration never saw. The issue's target is 0.7x; the bound here is 0.62x (measured
0.572x on these rows, 0.553x on the bench's 8 rows of 512).

mlx-lm loads the re-applied folder with every module at its recorded bits and group size
(config.json as mlx-lm records mixed precision), and its dequantizer reads the fitted scales
(tests/parity/test_convert.py checks them against mx.quantize's). Both models are scored
with hearth perplexity --kl-divergence against the float32 reference on 4 rows of 256
held-out tokens (hearth's KL statistics equal numpy's on the saved log-probs,
tests/parity/test_perplexity.py); computing the logits with mlx-lm instead takes mlx's CPU
quantized matmul over ten minutes here. Skips when the real model or the LoCoMo data is
absent."""
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
ROWS, LENGTH = 4, 256


def hearth(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"hearth {' '.join(map(str, args))}: {p.stderr}"
    return p.stdout


def test_target_bpw_plan_vs_uniform_4bit_on_smollm2(tmp_path):
    why = mixed_data.missing()
    if why:
        pytest.skip(why)
    import mlx.core as mx

    recorded = results_file.read("convert_mixed")
    plan = next(m for m in recorded["models"] if m["name"].startswith("SmolLM2"))["plan"]
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

    from mlx_lm.utils import load

    model, _ = load(str(mixed))
    loaded = {k: {"bits": m.bits, "group_size": m.group_size} for k, m in model.named_modules() if hasattr(m, "bits")}
    assert loaded == plan
    del model

    logits = tmp_path / "reference.logprobs"

    def mean_kl(folder, *ref_args):
        out = hearth("perplexity", folder, "--data-path", held, "--sequence-length", LENGTH, "--num-samples", ROWS,
                     "--kl-divergence", *ref_args, "--reference-logits", logits, "--json")
        return json.loads(out)["kl_divergence"]["mean"]

    k_uniform, k_mixed = mean_kl(uniform, "--reference", ref), mean_kl(mixed)
    ratio = k_mixed / k_uniform
    print(f"mean KL: mixed {k_mixed:.4f}, uniform 4-bit {k_uniform:.4f}, ratio {ratio:.3f}")
    # the target is 0.7; this plan measured 0.572 here (0.553 on the bench's 8 rows of 512)
    assert ratio <= 0.62, f"mixed KL {k_mixed:.4f} vs uniform 4-bit {k_uniform:.4f}: {ratio:.3f}x"
