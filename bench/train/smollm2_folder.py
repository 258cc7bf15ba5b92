#!/usr/bin/env python3
"""smollm2_folder.py: the SmolLM2-135M-Instruct GGUF of tools/get_models.sh as a float32
safetensors folder that both hearth train and mlx_lm.lora read (mlx-lm trains no GGUF):
MLX loads the Q4_1 tensors, each is dequantized to float32, q/k rows go back from ggml's
adjacent-pair RoPE order to HF's, names become HF's; the tokenizer is rebuilt from the GGUF
by transformers. Writes outside the repository (default ~/.cache/hearth/bench/).

    .venv/bin/python bench/train/smollm2_folder.py [gguf] [out_dir]
"""
import json
import os
import sys
import types

import mlx.core as mx
import numpy as np

GGUF = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/hearth/models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/hearth/bench/smollm2-135m-f32")

w, meta = mx.load(GGUF, return_metadata=True)
g = lambda k: meta[k].item() if hasattr(meta[k], "item") else meta[k]  # noqa: E731
D, L = int(g("llama.embedding_length")), int(g("llama.block_count"))
H, KV = int(g("llama.attention.head_count")), int(g("llama.attention.head_count_kv"))


def tensor(name):
    if name + ".scales" in w:  # MLX affine from the GGUF's Q4_1 / Q8_0 blocks
        bits = 32 * w[name + ".weight"].shape[1] // (w[name + ".scales"].shape[1] * 32)
        gs = w[name + ".weight"].shape[1] * 32 // bits // w[name + ".scales"].shape[1]
        return mx.dequantize(w[name + ".weight"], w[name + ".scales"], w[name + ".biases"], group_size=gs, bits=bits)
    return w[name + ".weight"].astype(mx.float32)


def unpermute(x, heads):
    """ggml row (h, i, j) of [heads, half, 2] is HF row (h, j, i) of [heads, 2, half]."""
    n, k = x.shape
    return x.reshape(heads, n // heads // 2, 2, k).swapaxes(1, 2).reshape(n, k)


out = {"model.embed_tokens.weight": tensor("token_embd"), "model.norm.weight": tensor("output_norm")}
names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
for i in range(L):
    for a, b in names.items():
        t = tensor(f"blk.{i}.{a}")
        if a == "attn_q":
            t = unpermute(t, H)
        elif a == "attn_k":
            t = unpermute(t, KV)
        out[f"model.layers.{i}.{b}.weight"] = t.astype(mx.float32)
tied = "output.weight" not in w and "output.scales" not in w
if not tied:
    out["lm_head.weight"] = tensor("output")
os.makedirs(OUT, exist_ok=True)
mx.save_safetensors(os.path.join(OUT, "model.safetensors"), out, metadata={"format": "mlx"})
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "num_hidden_layers": L,
       "num_attention_heads": H, "num_key_value_heads": KV, "intermediate_size": int(g("llama.feed_forward_length")),
       "vocab_size": int(out["model.embed_tokens.weight"].shape[0]),
       "rms_norm_eps": float(g("llama.attention.layer_norm_rms_epsilon")),
       "rope_theta": float(g("llama.rope.freq_base")), "max_position_embeddings": int(g("llama.context_length")),
       "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
       "torch_dtype": "float32", "bos_token_id": int(g("tokenizer.ggml.bos_token_id")),
       "eos_token_id": int(g("tokenizer.ggml.eos_token_id"))}
with open(os.path.join(OUT, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
# transformers' GGUF tokenizer reader imports torch only for its weight loader: without
# torch, an empty module stands in for it while the tokenizer is read
from importlib.machinery import ModuleSpec  # noqa: E402
from unittest import mock  # noqa: E402

try:
    import torch  # noqa: F401
    fake = {}
except ImportError:
    stand_in = types.ModuleType("torch")
    stand_in.__spec__, stand_in.__getattr__ = ModuleSpec("torch", None), lambda name: object()
    fake = {"torch": stand_in}
with mock.patch.dict(sys.modules, fake):
    import transformers.modeling_gguf_pytorch_utils as mg
    from transformers import AutoTokenizer
    with mock.patch.object(mg, "is_torch_available", lambda: True):
        tok = AutoTokenizer.from_pretrained(os.path.dirname(GGUF), gguf_file=os.path.basename(GGUF))
tok.save_pretrained(OUT)  # model_max_length int(1e30): hearth reads it as Python does
print(f"wrote {OUT}: {sum(int(np.prod(v.shape)) for v in out.values()) / 1e6:.1f}M parameters")
