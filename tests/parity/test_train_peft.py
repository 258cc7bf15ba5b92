"""hearth train's PEFT-format output (<adapter-path>/peft/: adapter_model.safetensors and
adapter_config.json). The oracles:

- PEFT itself (torch, on the CPU): PeftModel.from_pretrained on the transformers model loads
  the folder hearth wrote, every tensor lands in its LoRA module unchanged, and its float32
  logits match hearth serving the same folder within the LoRA parity tolerance
  (test_lora.REF_TOL);
- the layout PEFT documents for a LoRA checkpoint (docs/source/developer_guides/checkpoint.md
  and LoraConfig): keys `base_model.model.<module path>.lora_A.weight` [r, in] and
  `lora_B.weight` [out, r] with the module paths and in/out sizes of the transformers model
  (read here from the model's config.json, not from hearth), `peft_type` LORA, `task_type`
  CAUSAL_LM, `lora_alpha / r` equal to the --lora-scale the run was given, `target_modules`,
  `layers_to_transform` for the last N layers, `fan_in_fan_out` false, `bias` none; this
  also covers a quantized (MLX 4-bit) base, which transformers does not load;
- the tensors themselves: the MLX file's pairs transposed (mlx-lm names, A [in, r]);
- mlx-lm: the MLX output loaded by mlx_lm.load(adapter_path=) gives reference logits; hearth
  serving the PEFT folder gives the same logits as hearth serving the MLX folder, and both
  match mlx-lm within the LoRA parity tolerance;
- hearth fuse: the PEFT folder fuses to the same bytes as the MLX folder, and those equal
  mlx_lm.fuse's with the MLX folder.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_helpers import mlx_logits, peft_logits  # noqa: E402
from test_lora import REF_TOL, safetensors_bytes, trace, worst_diff  # noqa: E402
from test_train import BIN, IDS, REPO, hearth_train, make_data, model_dir  # noqa: E402

KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\."
                 r"lora_(A|B)\.weight$")


def io_sizes(model):
    """(in, out) of each projection of the transformers model, from its config.json."""
    c = json.load(open(os.path.join(model, "config.json")))
    d, f = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    return c["num_hidden_layers"], {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f),
                                    "up": (d, f), "down": (f, d)}


def load(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


# (model, --num-layers, --lora-rank, --lora-scale): a float base with the last 2 layers
# trained, a 4-bit base with every layer, rank and scale giving a fractional alpha
CASES = [("llama-f32", 2, 8, 20.0), ("qwen3-q4g64", -1, 4, 0.3), ("gemma3-q4g64", 2, 8, 2.0)]


@pytest.mark.parametrize("name,num_layers,rank,scale", CASES)
def test_peft_output_layout_logits_and_fuse(tmp_path, name, num_layers, rank, scale):
    model = model_dir(name)
    data = make_data(str(tmp_path / "data"), "text")
    out = tmp_path / "ad"
    hearth_train(model, data, out, None, ["--iters", "4", "--batch-size", "2", "--learning-rate", "1e-2",
                                          "--num-layers", str(num_layers), "--lora-rank", str(rank),
                                          "--lora-scale", str(scale)])
    peft = out / "peft"
    assert sorted(os.listdir(peft)) == ["adapter_config.json", "adapter_model.safetensors"]

    # the config, as PEFT's LoraConfig names its fields
    cfg = json.loads((peft / "adapter_config.json").read_text())
    n_layers, sizes = io_sizes(model)
    trained = list(range(n_layers - num_layers, n_layers)) if num_layers > 0 else list(range(n_layers))
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["r"] == rank and abs(cfg["lora_alpha"] / cfg["r"] - scale) < 1e-12
    assert sorted(cfg["target_modules"]) == sorted(f"{p}_proj" for p in sizes)
    assert cfg["layers_to_transform"] == (trained if num_layers > 0 else None)
    assert cfg["fan_in_fan_out"] is False and cfg["bias"] == "none" and cfg["use_dora"] is False
    assert cfg["base_model_name_or_path"] == model and cfg["lora_dropout"] == 0

    # the tensors: PEFT's names and shapes, every trained projection, and the MLX pairs transposed
    w, mlx = load(peft / "adapter_model.safetensors"), load(out / "adapters.safetensors")
    seen = set()
    for k, v in w.items():
        m = KEY.match(k)
        assert m, f"{k}: not a PEFT LoRA key"
        layer, parent, proj, part = int(m[1]), m[2], m[3], m[4]
        assert parent == ("mlp" if proj in ("gate", "up", "down") else "self_attn"), k
        fan_in, fan_out = sizes[proj]
        assert v.dtype == np.float32 and v.shape == ((rank, fan_in) if part == "A" else (fan_out, rank)), (k, v.shape)
        twin = f"model.layers.{layer}.{parent}.{proj}_proj.lora_{part.lower()}"
        assert np.array_equal(v, mlx[twin].T), k
        seen.add((layer, proj, part))
    assert seen == {(l, p, x) for l in trained for p in sizes for x in "AB"}
    assert any(np.abs(v).max() > 0 for k, v in w.items() if k.endswith("lora_B.weight"))  # it trained

    # logits: mlx-lm with the MLX folder is the reference; hearth serves both folders alike
    ref, greedy = mlx_logits(model, IDS, out, steps=6)
    base, _ = mlx_logits(model, IDS)
    assert np.abs(ref - base).max() > 10 * REF_TOL  # the adapter matters
    from_mlx, from_peft = trace(model, out), trace(model, peft)
    assert from_peft == from_mlx  # the same float32 pairs and the same scale: bit for bit
    assert worst_diff(ref, from_peft) < REF_TOL
    assert [s["token"] for s in from_peft["steps"]] == greedy

    # fuse: either folder, the same bytes, and those are mlx_lm.fuse's
    for src, dst in ((out, "fused_mlx"), (peft, "fused_peft")):
        p = subprocess.run([BIN, "fuse", model, "--adapter-path", str(src), "--save-path", str(tmp_path / dst)],
                           capture_output=True, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
    py = os.path.join(REPO, ".venv", "bin", "python")
    p = subprocess.run([py, "-m", "mlx_lm", "fuse", "--model", model, "--adapter-path", str(out), "--save-path",
                        str(tmp_path / "fused_ref")], capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                       timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    a, b, r = (safetensors_bytes(tmp_path / d) for d in ("fused_mlx", "fused_peft", "fused_ref"))
    assert a == b
    assert sorted(a) == sorted(r) and [k for k in r if r[k] != a[k]] == []


# (model, --num-layers, --lora-rank, --lora-scale): the last 2 layers (layers_to_transform
# set) and every layer (none), a fractional alpha
PEFT_CASES = [("llama-f32", 2, 8, 20.0), ("qwen3-f32", -1, 4, 0.3), ("gemma3-f32", -1, 4, 0.3),
              ("gemma4-f32", -1, 4, 0.3)]


@pytest.mark.parametrize("name,num_layers,rank,scale,dora", [c + (False,) for c in PEFT_CASES] +
                         [("llama-f32", -1, 4, 2.0, True)])
def test_peft_loads_the_output(tmp_path, name, num_layers, rank, scale, dora):
    """PeftModel.from_pretrained (transformers model, float32, CPU) on <adapter-path>/peft:
    every tensor of the file is loaded into its module as written, and PEFT's logits are
    hearth's serving the folder. DoRA (--fine-tune-type dora): PEFT's use_dora, with the
    trained magnitudes (lora_magnitude_vector) loaded too."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = model_dir(name)
    out = tmp_path / "ad"
    hearth_train(model, make_data(str(tmp_path / "data"), "text"), out, None,
                 ["--iters", "4", "--batch-size", "2", "--learning-rate", "1e-2", "--num-layers", str(num_layers),
                  "--lora-rank", str(rank), "--lora-scale", str(scale)] + (["--fine-tune-type", "dora"] if dora else []))
    assert json.load(open(out / "peft" / "adapter_config.json"))["use_dora"] is dora
    peft = out / "peft"
    w = load(peft / "adapter_model.safetensors")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), str(peft))
    state = {k.replace(".default.weight", ".weight"): v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert sorted(state) == sorted(w)  # nothing left at PEFT's initial values, nothing unused
    for k, v in w.items():
        assert np.array_equal(state[k].numpy(), v), k
    ref = peft_logits(model, peft, IDS)
    base = peft_logits(model, None, IDS)
    assert np.abs(ref - base).max() > 10 * REF_TOL  # the adapter matters
    ours = trace(model, peft, steps=0)
    worst = worst_diff(ref, ours)
    print(f"{name}: worst |logit - PEFT| {worst:.2e}")
    assert worst < REF_TOL


def test_gguf_base_writes_hf_order(tmp_path):
    """A GGUF llama trains with q/k rows permuted for adjacent-pair RoPE; the PEFT file, like
    the MLX one, holds B in the transformers model's row order: the same run on the same
    weights as a safetensors folder writes the same PEFT tensors."""
    model = model_dir("llama-f32")
    gguf = tmp_path / "llama.gguf"
    p = subprocess.run([BIN, "convert", model, "--out", str(gguf), "--outtype", "f32"], capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    data = make_data(str(tmp_path / "data"), "text")
    # test_train.py's GGUF case: at this rate both runs keep to the same Adam steps
    flags = ["--iters", "6", "--batch-size", "2", "--learning-rate", "1e-4", "--num-layers", "-1"]
    hearth_train(model, data, tmp_path / "st", None, flags)
    hearth_train(str(gguf), data, tmp_path / "gguf", None, flags)
    a, b = load(tmp_path / "st" / "peft" / "adapter_model.safetensors"), load(tmp_path / "gguf" / "peft" /
                                                                              "adapter_model.safetensors")
    assert sorted(a) == sorted(b)
    q = [k for k in a if ".q_proj.lora_B" in k]
    assert q and all(np.abs(a[k]).max() > 0 for k in q)
    for k in a:  # a wrong row order would move whole rows: differences the size of the values
        assert np.abs(a[k] - b[k]).max() <= 0.02 * np.abs(a[k]).max(), k


def test_qwen3_5_peft_loads_in_the_checkpoints_class(tmp_path):
    """Qwen3.5 as Hugging Face ships it (tests/parity/test_config_formats.py hf_layout_copy of the
    tiny model, with a small vision tower in its config): hearth trains it and writes PEFT keys
    under the checkpoint's own module path (model.language_model.layers.N), which
    Qwen3_5ForConditionalGeneration (AutoModelForImageTextToText) loads: every tensor lands
    unchanged and its logits (the Gated DeltaNet layers run by transformers' own reference
    code) match hearth serving the folder. transformers' text-only class (AutoModelForCausalLM)
    names its modules model.layers.N: PEFT finds none of the keys there (docs/lora.md says so)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    from test_config_formats import hf_layout_copy
    model = tmp_path / "qwen3_5_hf"
    model.mkdir()
    hf_layout_copy(model_dir("qwen3_5-f32"), str(model))
    cfg = json.load(open(model / "config.json"))
    cfg["vision_config"] = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                            "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}
    json.dump(cfg, open(model / "config.json", "w"))
    out = tmp_path / "ad"
    hearth_train(str(model), make_data(str(tmp_path / "data"), "text"), out, None,
                 ["--iters", "4", "--batch-size", "2", "--learning-rate", "1e-2", "--num-layers", "-1",
                  "--lora-rank", "4", "--lora-scale", "2.0"])
    w = load(out / "peft" / "adapter_model.safetensors")
    assert all(k.startswith("base_model.model.model.language_model.layers.") for k in w), list(w)[:3]
    loaded = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(str(model), dtype=torch.float32),
                                       str(out / "peft"))
    state = {k.replace(".default.weight", ".weight"): v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert sorted(state) == sorted(w)
    for k, v in w.items():
        assert np.array_equal(state[k].numpy(), v), k
    loaded.eval()
    with torch.no_grad():
        ref = loaded(input_ids=torch.tensor([IDS])).logits[0].float().numpy()
        with loaded.disable_adapter():
            base = loaded(input_ids=torch.tensor([IDS])).logits[0].float().numpy()
    assert np.abs(ref - base).max() > 10 * REF_TOL  # the adapter matters
    worst = worst_diff(ref, trace(str(model), out / "peft", steps=0))
    print(f"qwen3_5 (HF layout): worst |logit - PEFT| {worst:.2e}")
    assert worst < REF_TOL
