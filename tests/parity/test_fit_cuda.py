"""`hearth fit --device cuda`: the GPU half of the memory contract. Without a GPU (here)
the prediction for a named GPU (--sku) is checked against the device layout computed
independently from config.json and the format rules (bf16: 2 bytes per weight; a format
without a CUDA kernel: 4), for determinism, parts summing to the total, the KV pool growing
with the context, and the error messages. With a GPU, tools/cuda_fit_check holds it
against nvidia-smi's count of a real `hearth serve --device cuda` (skipped elsewhere).
"""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import CACHE

PAGE = 2 << 20  # src/backend/cuda/cuda_plan.c CUDA_ALLOC_PAGE
KV_BLOCK = 16
REPO = Path(__file__).resolve().parents[2]


def has_gpu():
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def tiny(name):
    path = CACHE / "tiny" / name
    if not path.exists():
        pytest.fail(f"model missing: {path}; run tools/get_models.sh (or `make parity`)", pytrace=False)
    return path


def fit(hearth_bin, model, *args, ok=True):
    """hearth fit --json for one sequence (the arithmetic below is per sequence) unless the
    arguments say how many."""
    seqs = [] if any(a in ("--max-sequences", "--batch") for a in args) else ["--max-sequences", "1"]
    p = subprocess.run([str(hearth_bin), "fit", str(model), "--json", *seqs, *args], capture_output=True, text=True,
                       timeout=120)
    if not ok:
        return p
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def config(model):
    c = json.loads((model / "config.json").read_text())
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c, hd, c.get("num_key_value_heads", c["num_attention_heads"])


def matrix_elems(c, hd, kvh):
    h, f, nh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    per_layer = h * nh * hd * 2 + h * kvh * hd * 2 + 3 * h * f  # q, o; k, v; gate, up, down
    return per_layer * c["num_hidden_layers"] + c["vocab_size"] * h  # + lm_head (tied: a copy)


def test_sku_prediction_parts_and_determinism(hearth_bin):
    model = tiny("llama-bf16")
    a = fit(hearth_bin, model, "--sku", "h200", "--ctx", "2048")
    b = fit(hearth_bin, model, "--sku", "h200", "--ctx", "2048")
    # a named GPU: the device side reads nothing from this machine; the host side's
    # resident baseline is this process's now (as the CPU report's is)
    ha, hb = a.pop("host"), b.pop("host")
    assert a == b and ha["engine_bytes"] == hb["engine_bytes"]
    assert a["device"] == "cuda" and a["device_present"] is False and "H200" in a["gpu"]
    assert a["compute_capability"] == "9.0"
    parts = ("weights_bytes", "kv_pool_bytes", "scratch_bytes", "buffers_bytes", "runtime_overhead_bytes")
    assert sum(a[k] for k in parts) == a["predicted_peak_bytes"]
    assert a["engine_bytes"] == a["predicted_peak_bytes"] - a["runtime_overhead_bytes"]
    assert a["runtime_overhead_bytes"] > 100 << 20  # a CUDA context is hundreds of MiB
    assert a["fits"] is True and a["available_bytes"] == 141000000000
    assert a["decode_tok_s"] > 0 and a["bandwidth_source"] == "sku"


def test_bf16_weights_two_bytes_each_and_mlx8_nine_bits(hearth_bin):
    """bf16 matrices stay bf16 (2 bytes); MLX 8-bit in groups of 64 goes to the generic affine
    layout (cuda_affine.h: one byte per code plus an f32 scale and bias per 64 weights, 9/8
    bytes), nothing expanded to f32: computed from config.json, the device layout rules."""
    for name, per_weight, expanded in (("llama-bf16", 2, 0), ("llama-q8g64", 1 + 8 / 64, 0)):
        model = tiny(name)
        c, hd, kvh = config(model)
        r = fit(hearth_bin, model, "--sku", "h200", "--ctx", "256")
        matrices = int(matrix_elems(c, hd, kvh) * per_weight)
        n = r["device_allocations"]["count"]
        # every allocation rounds up by less than a page; small vectors add under a page
        assert matrices <= r["weights_bytes"] <= matrices + (n + 1) * PAGE, (name, matrices, r["weights_bytes"])
        assert (r["weights_expanded_to_f32"] > 0) == bool(expanded), r["weights_expanded_to_f32"]
        if expanded:
            assert r["weights_expanded_to_f32"] == 7 * c["num_hidden_layers"] + 1


def test_kv_pool_per_dtype_and_linear_in_context(hearth_bin):
    """The device pool stores what --kv-quant says (cuda_kv.cu): float32 by default, one
    byte per element plus a float scale per (position, KV head) row for int8 and fp8, two
    bytes per element for f16; K and V per layer in 16-position blocks."""
    model = tiny("llama-f32")
    c, hd, kvh = config(model)
    rows = {}
    for ctx in (8192, 16384, 32768):
        r = fit(hearth_bin, model, "--sku", "h200", "--ctx", str(ctx))
        planes = 2 * c["num_hidden_layers"] * (-(-ctx // KV_BLOCK)) * KV_BLOCK * kvh * hd * 4
        assert planes <= r["kv_pool_bytes"] <= planes + 3 * PAGE, (ctx, planes, r["kv_pool_bytes"])
        assert r["kv_device_dtype"] == "f32"
        rows[ctx] = r["kv_pool_bytes"]
    # doubling the context doubles the pool (up to the page rounding of three buffers)
    assert abs((rows[32768] - rows[16384]) - 2 * (rows[16384] - rows[8192])) <= 6 * PAGE
    for quant in ("int8", "fp8"):
        q = fit(hearth_bin, model, "--sku", "h200", "--ctx", "8192", "--kv-quant", quant)
        n_rows = 2 * c["num_hidden_layers"] * (-(-8192 // KV_BLOCK)) * KV_BLOCK * kvh  # K and V rows
        planes = n_rows * (hd + 4)
        assert q["kv_device_dtype"] == quant, q["kv_device_dtype"]
        assert planes <= q["kv_pool_bytes"] <= planes + 5 * PAGE, (quant, planes, q["kv_pool_bytes"])
    # f16: two bytes per element, no scales (three buffers as for float32)
    h = fit(hearth_bin, model, "--sku", "h200", "--ctx", "8192", "--kv-quant", "f16")
    planes = 2 * c["num_hidden_layers"] * (-(-8192 // KV_BLOCK)) * KV_BLOCK * kvh * hd * 2
    assert h["kv_device_dtype"] == "f16" and h["kv_quant"] == "f16", (h["kv_device_dtype"], h["kv_quant"])
    assert planes <= h["kv_pool_bytes"] <= planes + 3 * PAGE, (planes, h["kv_pool_bytes"])


def test_largest_context_fits_on_a_small_gpu(hearth_bin):
    model = tiny("llama-f32")
    r = fit(hearth_bin, model, "--sku", "L4", "--ctx", "1024")
    assert 0 < r["max_context_that_fits"] <= r["model_max_context"]
    big = fit(hearth_bin, model, "--sku", "L4", "--ctx", str(r["max_context_that_fits"]))
    assert big["predicted_peak_bytes"] <= big["available_bytes"]


def test_skus_gpu_rows_include_the_runtime(hearth_bin):
    model = tiny("qwen3-q4g64")
    p = subprocess.run([str(hearth_bin), "fit", str(model), "--skus", "--json", "--ctx", "1024", "--max-sequences", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)["skus"]}
    h200 = rows["NVIDIA H200 (141 GB HBM3e)"]
    one = fit(hearth_bin, model, "--sku", "NVIDIA H200 (141 GB HBM3e)", "--ctx", "1024")
    assert h200["predicted_bytes"] == one["predicted_peak_bytes"]
    assert h200["runtime_overhead_bytes"] == one["runtime_overhead_bytes"] > 0
    assert all(r["runtime_overhead_bytes"] > 0 for r in rows.values() if r["kind"] == "gpu")


def test_errors(hearth_bin):
    model = tiny("llama-bf16")
    p = fit(hearth_bin, model, "--sku", "no-such-gpu", ok=False)
    assert p.returncode == 1 and "matches none of" in p.stderr and "H200" in p.stderr
    p = fit(hearth_bin, model, "--sku", "NVIDIA", ok=False)  # every GPU row
    assert p.returncode == 1 and "matches several" in p.stderr
    p = fit(hearth_bin, model, "--device", "tpu", ok=False)
    assert p.returncode == 2 and "--device takes cpu, cuda or auto" in p.stderr
    p = fit(hearth_bin, model, "--sku", "h200", "--device", "cpu", ok=False)
    assert p.returncode == 2 and "does not combine" in p.stderr
    if not has_gpu():
        p = fit(hearth_bin, model, "--device", "cuda", ok=False)
        assert p.returncode == 1 and "no CUDA device is present here" in p.stderr and "--sku" in p.stderr
        auto = fit(hearth_bin, model, "--device", "auto")  # auto without a GPU: the CPU report
        assert "device" not in auto and auto["threads"] >= 1


@pytest.mark.skipif(not has_gpu(), reason="no GPU here (nvidia-smi -L fails): the device measurement runs on the GPU machine")
def test_device_prediction_within_2_percent_of_nvidia_smi(hearth_bin, tmp_path):
    model = tiny("llama-bf16")
    p = subprocess.run(["python3", str(REPO / "tools" / "cuda_fit_check"), str(hearth_bin), str(tmp_path), "50",
                        f"{model}:512,4096"], capture_output=True, text=True, timeout=120)
    print(p.stdout)
    rows = json.loads((tmp_path / "cuda_fit_check.json").read_text())
    assert all("error_pct" in r for r in rows), rows
    assert max(abs(r["error_pct"]) for r in rows) <= 2.0, rows


def test_gpu_host_side_maps_the_weights(hearth_bin):
    """On the GPU the weights are used in place in the file mapping by default (each one's
    pages leave the process once uploaded), so the host engine holds no copy of the
    matrices: --no-mmap's engine is larger by exactly the matrices' bf16 bytes (from
    config.json), and the mapped part is the embedding table the host reads plus one layer
    matrix in flight."""
    model = tiny("llama-bf16")
    c, hd, kvh = config(model)
    mapped = fit(hearth_bin, model, "--sku", "h200", "--ctx", "2048")["host"]
    copied = fit(hearth_bin, model, "--sku", "h200", "--ctx", "2048", "--no-mmap")["host"]
    assert mapped["weights_mapped"] is True and copied["weights_mapped"] is False
    assert copied["mapped_pages_bytes"] == 0
    want = 2 * matrix_elems(c, hd, kvh)  # bf16; a tied lm_head is the embedding table itself
    if not c.get("tie_word_embeddings", False):
        want += 2 * c["vocab_size"] * c["hidden_size"]
    diff = copied["engine_bytes"] - mapped["engine_bytes"]
    assert abs(diff - want) <= 64 * 16 * c["num_hidden_layers"] + 4096, (diff, want)  # 64-byte arena alignment
    table = 2 * c["vocab_size"] * c["hidden_size"]
    h, f = c["hidden_size"], c["intermediate_size"]
    largest = 2 * max(h * f, c["num_attention_heads"] * hd * h)
    assert table <= mapped["mapped_pages_bytes"] <= table + largest + (128 << 10) + 4096, mapped
    # (no peak comparison here: on a model this small the fault-around windows counted for the
    # weight in flight outweigh the matrices, and each fit measures its own process's RSS)
