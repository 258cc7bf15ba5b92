"""Makes tiny LoRA / DoRA adapters with the reference implementations themselves (mlx-lm's
tuner for the MLX format, PEFT for the PEFT format) and computes the reference logits with
the adapter loaded. Random non-zero A, B (and DoRA magnitudes), so the adapter matters.
Test-time only: nothing here is written into the repository.
"""
import json
from pathlib import Path

import numpy as np

PROJS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


PLE = ("per_layer_input_gate", "per_layer_projection")


MOE = {"qwen3_moe": ("mlp.gate", "mlp.switch_mlp.gate_proj", "mlp.switch_mlp.up_proj", "mlp.switch_mlp.down_proj"),
       "gemma4_text": ("router.proj", "experts.switch_glu.gate_proj", "experts.switch_glu.up_proj",
                       "experts.switch_glu.down_proj")}
MOE["qwen3_5_moe"] = MOE["qwen3_moe"] + ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                                         "mlp.shared_expert.down_proj", "mlp.shared_expert_gate")


GDN = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
       "linear_attn.out_proj")


def train_keys(model_dir):
    """What hearth train adapts, mlx_lm.lora's default keys (every linear layer of the block):
    PROJS, Gemma 4's per-layer input gate and projection where the model has per-layer inputs,
    Qwen3.5's Gated DeltaNet projections, and a mixture-of-experts layer's router, routed
    experts and shared expert."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    top = cfg.get("model_type")
    cfg = cfg.get("text_config", cfg)
    keys = PROJS + PLE if cfg.get("hidden_size_per_layer_input") else PROJS
    if (top or "").startswith("qwen3_5"):
        keys = keys + GDN
    moe = cfg.get("num_experts") and (cfg.get("enable_moe_block", True))
    kind = "qwen3_5_moe" if top == "qwen3_5_moe" or cfg.get("model_type") == "qwen3_5_moe_text" else (
        "gemma4_text" if "gemma4" in (top or "") else "qwen3_moe")
    return keys + MOE[kind] if moe else keys


def _to_float32(model):
    import mlx.core as mx
    from mlx.utils import tree_map
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.bfloat16, mx.float16) else p,
                          model.parameters()))


def make_mlx_adapter(model_dir, out_dir, rank=4, scale=2.0, num_layers=-1, dora=False, keys=PROJS, seed=0):
    """An MLX-format adapter (adapters.safetensors + adapter_config.json, as mlx_lm.lora
    writes them) made by mlx-lm's own linear_to_lora_layers on the model at model_dir."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(str(model_dir))
    n_layers = len(model.layers)
    if num_layers < 0:
        num_layers = n_layers
    cfg = {"rank": rank, "scale": scale, "dropout": 0.0}
    if keys is not None:  # None: mlx-lm's default, every linear layer of the block
        cfg["keys"] = list(keys)
    linear_to_lora_layers(model, num_layers, cfg, use_dora=dora)
    rng = np.random.default_rng(seed)
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lora_a", "lora_b"):
            weights[name] = mx.array(rng.normal(0, 0.2, size=p.shape).astype(np.float32))
        elif leaf == "m" and dora:
            base = np.asarray(p.astype(mx.float32))
            weights[name] = mx.array((base * rng.uniform(0.7, 1.3, size=p.shape)).astype(np.float32))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    (out / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "dora" if dora else "lora", "num_layers": num_layers,
        "lora_parameters": cfg, "model": str(model_dir)}, indent=2))
    return out


def mlx_logits(model_dir, ids, adapter_dir=None, steps=0):
    """mlx-lm's float32 logits for every position of ids (with the adapter loaded through
    mlx_lm.load(adapter_path=...)), and its greedy continuation of `steps` tokens."""
    import mlx.core as mx
    from mlx_lm import load
    model, _ = load(str(model_dir), adapter_path=str(adapter_dir) if adapter_dir else None)
    _to_float32(model)
    logits = np.asarray(model(mx.array([ids]))[0].astype(mx.float32))
    greedy, seq = [], list(ids)
    for _ in range(steps):
        nxt = int(np.argmax(np.asarray(model(mx.array([seq]))[0, -1].astype(mx.float32))))
        greedy.append(nxt)
        seq.append(nxt)
    return logits, greedy


def make_peft_adapter(model_dir, out_dir, rank=4, alpha=8, dora=False, targets=("q_proj", "v_proj", "down_proj"),
                      seed=0):
    """A PEFT adapter (adapter_model.safetensors + adapter_config.json) saved by PEFT itself
    over the HF transformers model at model_dir, with random A, B (and magnitudes)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, use_dora=dora,
                     init_lora_weights=False)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                if "magnitude" in name:
                    p.mul_(torch.empty_like(p).uniform_(0.7, 1.3))
                else:
                    p.normal_(0, 0.2)
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def peft_logits(model_dir, adapter_dir, ids):
    """transformers + PEFT float32 logits for every position of ids."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter_dir)) if adapter_dir else base
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()
