"""Parity: hearth's MLX affine dequantizer (src/io/mlx_quant.c) against mx.dequantize.

The oracle is mlx itself: random matrices are packed with mx.quantize, saved with
mx.save_safetensors, dequantized by mx.dequantize, and compared bit for bit (float32
views) with what the C helper tests/parity/helpers/st_dequant.c reads back through
st_set_open + mlxq_dequantize. A tiny mlx-lm model with mixed per-layer quantization
checks the config conventions against mlx_lm.utils.load_model.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import mlx.core as mx  # a missing mlx must fail loudly, not skip

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")))
HELPER_SRC = [
    "tests/parity/helpers/st_dequant.c",
    "src/io/safetensors.c",
    "src/io/mlx_quant.c",
    "src/io/tensor.c",
    "src/base/err.c",
    "src/base/file.c",
]
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    """Builds the helper from the few sources it needs, so the test does not depend on
    the rest of the tree compiling."""
    out = tmp_path_factory.mktemp("helper") / "st_dequant"
    libs = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson"], capture_output=True, text=True,
                          check=True).stdout.split()
    # ST_HELPER_CFLAGS (e.g. "-O3 -march=native") checks the dequantizer under other
    # code generation, such as FMA contraction, which would break bit-exactness.
    extra = os.environ.get("ST_HELPER_CFLAGS", "-O2").split()
    cmd = ["gcc", "-std=gnu11", *extra, "-Wall", "-Wextra", "-Werror", "-Iinclude", "-Isrc", "-o", str(out),
           *HELPER_SRC, *libs, "-lm"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, f"building st_dequant failed:\n{r.stderr}"
    return out


def run_helper(helper, model_dir, out_dir, specs=()):
    out_dir.mkdir(exist_ok=True)
    r = subprocess.run([str(helper), str(model_dir), str(out_dir), *specs], capture_output=True, text=True)
    assert r.returncode == 0, f"st_dequant failed: {r.stderr}"
    rows = {}
    for line in r.stdout.splitlines():
        prefix, bits, group, nrows, ncols = line.split()
        rows[prefix] = (int(bits), int(group), int(nrows), int(ncols))
    return rows


def load_f32(out_dir, prefix, nrows, ncols):
    return np.fromfile(out_dir / f"{prefix}.f32", dtype="<f4").reshape(nrows, ncols)


def assert_bit_exact(ours, ref, what):
    ref = np.ascontiguousarray(ref, dtype=np.float32)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    a, b = ours.view(np.uint32), ref.view(np.uint32)
    # NaN payloads are not compared (mlx keeps the input NaN's f16 bits, a quirk of
    # its half arithmetic); NaN positions are.
    bad = np.flatnonzero((a != b) & ~(np.isnan(ours) & np.isnan(ref)))
    assert bad.size == 0, (f"{what}: {bad.size} of {a.size} values differ, first at {bad[0]}: "
                           f"hearth {ours.flat[bad[0]]!r} mlx {ref.flat[bad[0]]!r}")


def test_every_bits_group_dtype(helper, tmp_path):
    rng = np.random.default_rng(20240601)
    tensors, specs, refs = {}, [], {}
    for bits in (2, 3, 4, 5, 6, 8):
        for group in (32, 64, 128):
            for dname, dt in DTYPES.items():
                rows = int(rng.choice([1, 3, 7, 13]))
                cols = group * int(rng.integers(1, 4))
                scale = float(rng.choice([1e-3, 0.05, 1.0, 300.0]))
                w = mx.array((rng.standard_normal((rows, cols)) * scale).astype(np.float32)).astype(dt)
                q, s, b = mx.quantize(w, group_size=group, bits=bits)
                assert s.dtype == dt
                prefix = f"q{bits}_g{group}_{dname}"
                tensors.update({f"{prefix}.weight": q, f"{prefix}.scales": s, f"{prefix}.biases": b})
                specs.append(f"{prefix}:{bits}:{group}")
                ref = mx.dequantize(q, s, b, group_size=group, bits=bits).astype(mx.float32)
                refs[prefix] = np.array(ref)
    model = tmp_path / "m"
    model.mkdir()
    mx.save_safetensors(str(model / "model.safetensors"), tensors)
    got = run_helper(helper, model, tmp_path / "out", specs)
    assert set(got) == set(refs)
    for prefix, ref in refs.items():
        _, _, nrows, ncols = got[prefix]
        assert_bit_exact(load_f32(tmp_path / "out", prefix, nrows, ncols), ref, prefix)


def test_extreme_values(helper, tmp_path):
    """Zeros, constant groups, huge and tiny magnitudes: where rounding order shows."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 128)).astype(np.float32)
    base[0] = 0.0
    base[1] = 3.0
    base[2] *= 6e4  # overflows f16: NaN scales, inf biases
    base[3] *= 1e-6
    base[4, ::2] = 1e4
    tensors, specs, refs = {}, [], {}
    for bits in (3, 4, 8):
        for dname, dt in DTYPES.items():
            q, s, b = mx.quantize(mx.array(base).astype(dt), group_size=32, bits=bits)
            prefix = f"x{bits}_{dname}"
            tensors.update({f"{prefix}.weight": q, f"{prefix}.scales": s, f"{prefix}.biases": b})
            specs.append(f"{prefix}:{bits}:32")
            refs[prefix] = np.array(mx.dequantize(q, s, b, group_size=32, bits=bits).astype(mx.float32))
    model = tmp_path / "m"
    model.mkdir()
    mx.save_safetensors(str(model / "model.safetensors"), tensors)
    got = run_helper(helper, model, tmp_path / "out", specs)
    for prefix, ref in refs.items():
        _, _, nrows, ncols = got[prefix]
        assert_bit_exact(load_f32(tmp_path / "out", prefix, nrows, ncols), ref, prefix)


def check_model_dir(helper, model_dir, out_dir):
    """Every quantized module of an mlx-lm model, with bits/group_size as hearth reads
    them from config.json, against the modules mlx_lm.utils.load_model builds."""
    import mlx.nn as nn
    from mlx_lm.utils import load_model

    model, _ = load_model(pathlib.Path(model_dir))
    expected = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or hasattr(m, "scales"):
            if getattr(m, "mode", "affine") != "affine" or getattr(m, "biases", None) is None:
                continue
            ref = mx.dequantize(m.weight, m.scales, m.biases, group_size=m.group_size, bits=m.bits)
            expected[name] = (m.bits, m.group_size, np.array(ref.astype(mx.float32)))
    assert expected, f"{model_dir}: mlx-lm found no quantized modules"
    got = run_helper(helper, model_dir, out_dir)
    assert set(got) == set(expected), f"modules differ: {sorted(set(got) ^ set(expected))}"
    for name, (bits, group, ref) in expected.items():
        gb, gg, nrows, ncols = got[name]
        assert (gb, gg) == (bits, group), f"{name}: hearth config says {gb} bits/{gg}, mlx-lm {bits}/{group}"
        assert_bit_exact(load_f32(out_dir, name, nrows, ncols), ref.reshape(nrows, ncols), name)
    return len(expected)


def test_mixed_quant_model(helper, tmp_path):
    """A tiny llama quantized by mlx_lm.utils.quantize_model with per-layer overrides:
    some layers 8-bit/group 32, one layer left in float, the rest 4-bit/64."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model, save_config

    config = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 96,
              "tie_word_embeddings": False}
    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs.from_dict(config))

    def predicate(path, module):
        if path.endswith("down_proj"):
            return {"group_size": 32, "bits": 8}
        if path == "model.layers.1.self_attn.v_proj":
            return {"group_size": 128, "bits": 3}
        if path == "model.layers.0.self_attn.o_proj":
            return False
        return True

    model, qconfig = quantize_model(model, config, group_size=64, bits=4, quant_predicate=predicate)
    out = tmp_path / "tiny"
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    save_config(qconfig, out / "config.json")
    saved = json.loads((out / "config.json").read_text())
    assert "quantization" in saved and "quantization_config" in saved
    n = check_model_dir(helper, out, tmp_path / "out")
    assert n >= 10


def tiny_quantized_models():
    root = CACHE / "tiny"
    if not root.is_dir():
        return []
    found = []
    for cfg in sorted(root.glob("*/config.json")):
        c = json.loads(cfg.read_text())
        q = c.get("quantization") or c.get("quantization_config")
        if isinstance(q, dict) and q.get("mode", "affine") == "affine" and "bits" in q:
            found.append(cfg.parent)
    return found


@pytest.mark.parametrize("model_dir", tiny_quantized_models() or [None], ids=lambda p: p.name if p else "none")
def test_cache_tiny_models(helper, tmp_path, model_dir):
    """Quantized tiny models made by tools/ (optional: another worker produces them)."""
    if model_dir is None:
        pytest.skip(f"no MLX-quantized models under {CACHE / 'tiny'} (made by tools/, optional here)")
    check_model_dir(helper, model_dir, tmp_path / "out")
