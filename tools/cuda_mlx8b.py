"""cuda_mlx8b.py: writes a random-weight MLX affine 4-bit (group 64) model with the exact
shapes of Llama-3.1-8B or Qwen3-8B, for the GPU benchmark (tools/cuda_check). numpy only
(no torch, no mlx): packed uint32 words of random nibbles, per-group bf16 scales and biases
chosen so each weight has mean ~0 and std ~0.02 like an HF init, bf16 norms of ones. The
layout is mlx-lm's (weight U32 [n, k/8], scales/biases [n, k/64]); a speed fixture, not
a parity oracle (the tiny MLX models and their mlx-lm goldens are that).

  python3 tools/cuda_mlx8b.py llama|qwen3|llama1b OUT_DIR TOKENIZER_DIR
"""
import json
import os
import shutil
import sys

import numpy as np

GROUP = 64
BITS = int(os.environ.get("MLX_BITS", "4"))  # MLX_BITS=2|3|4|6|8 for the CPU kernels' other widths
SHAPES = {
    "llama": dict(arch="LlamaForCausalLM", model_type="llama", vocab=128256, hidden=4096, ffn=14336, layers=32,
                  heads=32, kv_heads=8, head_dim=128, qk_norm=False,
                  extra={"rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    # the CPU benchmark's 1B shape (bench/results/kernel_choices.md, "CPU decode of MLX affine weights"): Llama-3.2-1B, lm_head untied
    "llama1b": dict(arch="LlamaForCausalLM", model_type="llama", vocab=128256, hidden=2048, ffn=8192, layers=16,
                    heads=32, kv_heads=8, head_dim=64, qk_norm=False,
                    extra={"rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    "qwen3": dict(arch="Qwen3ForCausalLM", model_type="qwen3", vocab=151936, hidden=4096, ffn=12288, layers=36,
                  heads=32, kv_heads=8, head_dim=128, qk_norm=True,
                  extra={"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
}


def bf16_bytes(a):
    """float32 array -> bf16 bytes (round to nearest even)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def quantized(rng, n, k):
    """(words, scales, biases) bytes of a random BITS-bit [n, k] matrix."""
    words = rng.bytes(n * k * BITS // 8)
    g = n * (k // GROUP)
    # q uniform in 0..L (L = 2^BITS - 1) has mean L/2 and std ~L/3.46 (4-bit: 7.5 and 4.61):
    # s = 0.02 / std gives std 0.02; the bias centres it; a +-50% jitter per group keeps
    # groups distinct
    top = (1 << BITS) - 1
    std = ((top + 1) ** 2 - 1) ** 0.5 / 12 ** 0.5
    s = (0.02 / std) * (0.5 + rng.random(g, dtype=np.float32))
    return words, bf16_bytes(s), bf16_bytes(-top / 2 * s)


def main(shape, out, tok_dir):
    c = SHAPES[shape]
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    h, f, d = c["hidden"], c["ffn"], c["head_dim"]
    mats = [("model.embed_tokens", c["vocab"], h)]
    norms = [("model.norm.weight", h)]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        mats += [(p + "self_attn.q_proj", c["heads"] * d, h), (p + "self_attn.k_proj", c["kv_heads"] * d, h),
                 (p + "self_attn.v_proj", c["kv_heads"] * d, h), (p + "self_attn.o_proj", h, c["heads"] * d),
                 (p + "mlp.gate_proj", f, h), (p + "mlp.up_proj", f, h), (p + "mlp.down_proj", h, f)]
        norms += [(p + "input_layernorm.weight", h), (p + "post_attention_layernorm.weight", h)]
        if c["qk_norm"]:
            norms += [(p + "self_attn.q_norm.weight", d), (p + "self_attn.k_norm.weight", d)]
    mats.append(("lm_head", c["vocab"], h))
    header, blobs, off = {"__metadata__": {"format": "mlx"}}, [], 0

    def add(name, dtype, shape_, data):
        nonlocal off
        header[name] = {"dtype": dtype, "shape": shape_, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)

    for name, n, k in mats:
        w, s, b = quantized(rng, n, k)
        add(name + ".weight", "U32", [n, k * BITS // 32], w)
        add(name + ".scales", "BF16", [n, k // GROUP], s)
        add(name + ".biases", "BF16", [n, k // GROUP], b)
    for name, n in norms:
        add(name, "BF16", [n], bf16_bytes(np.ones(n, np.float32)))
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as fh:
        fh.write(len(hj).to_bytes(8, "little"))
        fh.write(hj)
        for blob in blobs:
            fh.write(blob)
    q = {"group_size": GROUP, "bits": BITS, "mode": "affine"}
    cfg = {"architectures": [c["arch"]], "model_type": c["model_type"], "vocab_size": c["vocab"], "hidden_size": h,
           "intermediate_size": f, "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
           "num_key_value_heads": c["kv_heads"], "head_dim": d, "max_position_embeddings": 40960,
           "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "bfloat16", "quantization": q, "quantization_config": q, **c["extra"]}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(tok_dir, name)):  # the chat template, where it is its own file
            shutil.copy(os.path.join(tok_dir, name), out)
    print(json.dumps({"model": out, "shape": shape, "bytes": off}))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(__doc__)
    main(*sys.argv[1:])
