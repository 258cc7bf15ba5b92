"""--expert-offload N (expert weights in pinned host memory, a device pool of N slots): what
runs without a GPU. The flag is refused with a message that says why on the CPU, for a
model without experts and for fewer than 3 slots; `hearth fit --device cuda --sku h200`
plans it without a device: the device side holds the pool instead of the experts, the
host side the experts' bytes, and those bytes equal the expert tensors of the model file
(safetensors header, read here in Python: the device layout of MLX 4-bit, f32 and bf16 keeps
the file's bytes). The GPU runs themselves are tests/parity/test_cuda_device.py
(test_cuda_expert_offload_*) and tests/unit/test_cuda_moe_offload.c."""
import json
import struct
import subprocess

import pytest

MOE = ["qwen3_moe-q4g64", "qwen3_moe-f32", "gemma4_moe-q4g64", "qwen3_5_moe-q4g64"]


def run(hearth_bin, *args):
    return subprocess.run([str(hearth_bin), *map(str, args)], capture_output=True, text=True, timeout=120)


def generate(hearth_bin, model, *args):
    return run(hearth_bin, "generate", model, "Hello", "--max-tokens", "2", "--temp", "0", *args)


def test_cpu_refuses_expert_offload(hearth_bin, tiny_models):
    p = generate(hearth_bin, tiny_models["qwen3_moe-q4g64"], "--device", "cpu", "--expert-offload", "4")
    assert p.returncode != 0 and "--expert-offload needs --device cuda" in p.stderr, p.stderr
    f = run(hearth_bin, "fit", tiny_models["qwen3_moe-q4g64"], "--device", "cpu", "--expert-offload", "4")
    assert f.returncode != 0 and "--expert-offload needs --device cuda" in f.stderr, f.stderr


def test_model_without_experts_refused(hearth_bin, tiny_models):
    for device in ("cpu", "cuda"):
        p = generate(hearth_bin, tiny_models["llama-f32"], "--device", device, "--expert-offload", "4")
        assert p.returncode != 0 and "this model has no experts" in p.stderr, p.stderr


@pytest.mark.parametrize("value", ["2", "0x5", "many", "-3"])
def test_bad_slot_counts_refused(hearth_bin, tiny_models, value):
    p = generate(hearth_bin, tiny_models["qwen3_moe-q4g64"], "--device", "cuda", "--expert-offload", value)
    assert p.returncode != 0 and "--expert-offload takes the number of device slots" in p.stderr, p.stderr


def expert_file_bytes(model_dir):
    """Bytes of the routed experts' tensors (switch_mlp / switch_glu: weight, scales, biases)
    in the model's safetensors files, and the largest one expert's slice of one of them."""
    total, slice_max = 0, 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        stacks = {}
        for name, t in header.items():
            if name == "__metadata__" or not (".switch_mlp." in name or ".switch_glu." in name):
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size
            stem = name.rsplit(".", 1)[0]  # ...gate_proj: its weight, scales and biases make one slice layout
            n_experts = t["shape"][0]
            stacks.setdefault(stem, [0, n_experts])[0] += size
        for size, n_experts in stacks.values():
            slice_max = max(slice_max, size // n_experts)
    return total, slice_max


def fit(hearth_bin, model, *args):
    p = run(hearth_bin, "fit", model, "--device", "cuda", "--sku", "h200", "--ctx", "256", "--json", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("name", MOE)
def test_fit_counts_offloaded_experts(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    want, slice_max = expert_file_bytes(m)
    assert want > 0
    resident, off = fit(hearth_bin, m), fit(hearth_bin, m, "--expert-offload", "16")
    assert resident["experts"] == {"offloaded": False, "bytes": want, "device_slots": 0, "slot_bytes": slice_max}
    assert off["experts"] == {"offloaded": True, "bytes": want, "device_slots": 16, "slot_bytes": slice_max}
    # the device: the experts leave, 16 slots come (each of the largest slice's planes);
    # the host: the experts' bytes pinned. Page rounding moves small allocations by at most
    # one 2 MiB page either way.
    moved = want - 16 * slice_max
    page = 2 << 20
    assert abs((resident["weights_bytes"] - off["weights_bytes"]) - moved) <= page
    assert off["host"]["pinned_bytes"] - resident["host"]["pinned_bytes"] == want
    # and the human table says so
    p = run(hearth_bin, "fit", m, "--device", "cuda", "--sku", "h200", "--ctx", "256", "--expert-offload", "16")
    assert p.returncode == 0 and "pinned on the host (--expert-offload), 16 device slots" in p.stdout, p.stdout


def test_fit_without_experts_has_no_experts_entry(hearth_bin, tiny_models):
    r = fit(hearth_bin, tiny_models["llama-f32"])
    assert "experts" not in r
    p = run(hearth_bin, "fit", tiny_models["llama-f32"], "--device", "cuda", "--sku", "h200", "--expert-offload", "4")
    assert p.returncode != 0 and "this model has no experts" in p.stderr, p.stderr
