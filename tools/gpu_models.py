#!/usr/bin/env python3
"""gpu_models.py: writes random-weight benchmark models with the exact shapes of the new
families' real checkpoints, as MLX affine 4-bit safetensors (group 64, the routers at 8 bits
as mlx-lm quantizes them) and as a Q4_K_M-structured GGUF with llama.cpp's tensor names and
keys (qwen35, qwen35moe, qwen3moe, gemma4). numpy only: the GPU machine has no torch, mlx or gguf package. A speed fixture, not a parity
oracle (tools/make_tiny_models.py and its mlx-lm goldens are that).

Models (the shapes are the text part of each real config.json, read from public copies):
  qwen35_9b       Qwen3.5-9B        qwen3_5: 32 layers, 3 Gated DeltaNet : 1 gated attention
  qwen35_0_8b     Qwen3.5-0.8B      qwen3_5: 24 layers, tied embeddings, 16 linear value heads (CPU rows)
  qwen35_35b_a3b  Qwen3.5-35B-A3B   qwen3_5_moe: 40 layers, 256 experts, top 8, shared expert
  qwen3_30b_a3b   Qwen3-30B-A3B     qwen3_moe: 48 layers, 128 experts, top 8
  gemma4_e4b      Gemma-4-E4B       gemma4_text: per-layer inputs, 18 KV-shared layers, 256/512 heads
  gemma4_e2b      Gemma-4-E2B       gemma4_text: 4 sliding : 1 full, 20 KV-shared layers, double-wide MLP (CPU rows)
  gemma4_26b_a4b  Gemma-4-26B-A4B   gemma4_text MoE: 128 experts, top 8, beside a dense MLP
Both read every GGUF here, hearth included (Gemma 4's as llama.cpp's gemma4 architecture).

Weights: MLX 4-bit words are random nibbles with per-group bf16 scales/biases giving mean ~0
and std ~0.02 (tools/cuda_mlx8b.py's recipe); GGUF blocks are random valid blocks of the same
magnitude (tools/cuda_gguf8b.py), Q5_0 where a row is not a multiple of 256 (llama-quantize's
fallback); norms and scalars are ones, A_log and dt_bias zeros (ssm_a -1). Bytes
are tiled from pools of random data with a rotation per tensor and streamed to disk, so a
20 GB model is written at disk speed with little memory. The tokenizer is the tiny model's
(MLX; the config's vocab is larger, as with cuda_mlx8b) or a stand-in vocabulary (GGUF).

  python3 tools/gpu_models.py MODEL mlx OUT_DIR [--tokenizer TINY_DIR] [--scale small] [--sparse] [--mtp]
  python3 tools/gpu_models.py MODEL gguf OUT.gguf [--scale small]
  python3 tools/gpu_models.py --list
  python3 tools/gpu_models.py --stats MODEL [--scale small]   (FLOP-count inputs, json)
--sparse (mlx) writes the header and leaves the data a hole of its size (no disk used, zeros
when read): enough for `hearth fit`, which plans from the header. --scale small writes the same architecture (every kind of layer and tensor) with tiny
dimensions, for checking the writers on a CPU against mlx-lm, gguf-py, llama.cpp and hearth.
--mtp (mlx, dense Qwen3.5) adds the multi-token-prediction head Hugging Face's checkpoints carry
(mtp.*: one gated-attention layer, its MLP, a bf16 fc [hidden, 2 hidden], three norms;
mtp_num_hidden_layers 1), for `--speculate mtp`.
"""
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_gguf8b as g8  # noqa: E402  (its block pools, metadata writer and stand-in vocabulary)
from cuda_mlx8b import bf16_bytes  # noqa: E402

GROUP = 64
HEARTH_GGUF = ("qwen35", "qwen35moe", "qwen3moe", "gemma4")  # the GGUF architectures hearth reads
POOL_BYTES = 96 << 20  # far above the L2; tiles of it repeat inside the big tensors


def _layers(pattern, n):
    return [pattern[i % len(pattern)] for i in range(n)]


QWEN35_ROPE = {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
               "type": "default"}
GEMMA4_ROPE = {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
               "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}
LIN3 = ["linear_attention"] * 3 + ["full_attention"]
SLIDE5 = ["sliding_attention"] * 5 + ["full_attention"]
SLIDE4 = ["sliding_attention"] * 4 + ["full_attention"]  # Gemma-4-E2B

# the real configs (text part), and the small stand-ins: same features, tiny dimensions
# (multiples of 256 where a GGUF k-quant row needs it)
MODELS = {
    "qwen35_9b": dict(tok="qwen3_5-bf16", gguf="qwen35", config=dict(
        architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5", vocab_size=248320, hidden_size=4096,
        intermediate_size=12288, num_hidden_layers=32, layer_types=_layers(LIN3, 32), full_attention_interval=4,
        num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, linear_value_head_dim=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=262144, rope_parameters=QWEN35_ROPE),
        small=dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                   layer_types=_layers(LIN3, 8), num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   linear_key_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_value_head_dim=64, max_position_embeddings=4096,
                   rope_parameters=dict(QWEN35_ROPE, mrope_section=[3, 3, 2]))),
    # CPU rows of issue 33 (bench/cpu_vs_llamacpp/newfam.sh): tied embeddings, 16 linear value heads
    "qwen35_0_8b": dict(tok="qwen3_5-bf16", gguf="qwen35", config=dict(
        architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5", vocab_size=248320, hidden_size=1024,
        intermediate_size=3584, num_hidden_layers=24, layer_types=_layers(LIN3, 24), full_attention_interval=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16, linear_value_head_dim=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=262144, rope_parameters=QWEN35_ROPE),
        small=dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                   layer_types=_layers(LIN3, 4), num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   linear_key_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=2,
                   linear_value_head_dim=64, max_position_embeddings=4096,
                   rope_parameters=dict(QWEN35_ROPE, mrope_section=[3, 3, 2]))),
    "qwen35_35b_a3b": dict(tok="qwen3_5-bf16", gguf="qwen35moe", config=dict(
        architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe", vocab_size=248320,
        hidden_size=2048, intermediate_size=512, num_hidden_layers=40, layer_types=_layers(LIN3, 40),
        full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_value_head_dim=128, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, norm_topk_prob=True, decoder_sparse_step=1, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=262144, rope_parameters=QWEN35_ROPE),
        small=dict(vocab_size=1024, hidden_size=256, intermediate_size=256, num_hidden_layers=8,
                   layer_types=_layers(LIN3, 8), num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   linear_key_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                   shared_expert_intermediate_size=256, max_position_embeddings=4096,
                   rope_parameters=dict(QWEN35_ROPE, mrope_section=[3, 3, 2]))),
    "qwen3_30b_a3b": dict(tok="qwen3_moe-f32", gguf="qwen3moe", config=dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, max_position_embeddings=40960),
        small=dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                   moe_intermediate_size=256, max_position_embeddings=4096)),
    "gemma4_e4b": dict(tok="gemma4-bf16", gguf="gemma4", config=dict(
        architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", vocab_size=262144, hidden_size=2560,
        intermediate_size=10240, num_hidden_layers=42, layer_types=_layers(SLIDE5, 42), num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, global_head_dim=512, num_global_key_value_heads=None,
        attention_k_eq_v=False, num_kv_shared_layers=18, hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144, use_double_wide_mlp=False, enable_moe_block=False, sliding_window=512,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=131072,
        rope_parameters=GEMMA4_ROPE, pad_token_id=0),
        # as in the real one, the last layer with its own KV is a full one: llama.cpp's KV-sharing
        # map needs it (the shared layers reuse the last of each kind)
        small=dict(vocab_size=1024, vocab_size_per_layer_input=1024, hidden_size=256, intermediate_size=512,
                   num_hidden_layers=12, layer_types=_layers(SLIDE5, 12), num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, global_head_dim=128, num_kv_shared_layers=6,
                   hidden_size_per_layer_input=64, sliding_window=64, max_position_embeddings=4096)),
    "gemma4_e2b": dict(tok="gemma4-bf16", gguf="gemma4", config=dict(
        architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", vocab_size=262144, hidden_size=1536,
        intermediate_size=6144, num_hidden_layers=35, layer_types=_layers(SLIDE4, 35), num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, num_global_key_value_heads=None,
        attention_k_eq_v=False, num_kv_shared_layers=20, hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144, use_double_wide_mlp=True, enable_moe_block=False, sliding_window=512,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=131072,
        rope_parameters=GEMMA4_ROPE, pad_token_id=0),
        small=dict(vocab_size=1024, vocab_size_per_layer_input=1024, hidden_size=256, intermediate_size=512,
                   num_hidden_layers=10, layer_types=_layers(SLIDE4, 10), num_attention_heads=4,
                   num_key_value_heads=1, head_dim=64, global_head_dim=128, num_kv_shared_layers=5,
                   hidden_size_per_layer_input=64, sliding_window=64, max_position_embeddings=4096)),
    "gemma4_26b_a4b": dict(tok="gemma4-bf16", gguf="gemma4", config=dict(
        architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", vocab_size=262144, hidden_size=2816,
        intermediate_size=2112, num_hidden_layers=30, layer_types=_layers(SLIDE5, 30), num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
        attention_k_eq_v=True, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=262144, use_double_wide_mlp=False, enable_moe_block=True, num_experts=128,
        top_k_experts=8, moe_intermediate_size=704, sliding_window=1024, final_logit_softcapping=30.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=262144, rope_parameters=GEMMA4_ROPE,
        pad_token_id=0),
        small=dict(vocab_size=1024, vocab_size_per_layer_input=1024, hidden_size=256, intermediate_size=192,
                   num_hidden_layers=6, layer_types=_layers(SLIDE5, 6), num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, global_head_dim=128, num_global_key_value_heads=1,
                   num_experts=8, top_k_experts=2, moe_intermediate_size=128, sliding_window=64,
                   max_position_embeddings=4096)),
}


def model_config(name, scale="full"):
    """The config.json (without quantization) of a model at a scale."""
    c = json.loads(json.dumps(MODELS[name]["config"]))
    if scale == "small":
        c.update(json.loads(json.dumps(MODELS[name]["small"])))
    return c


# ---- MLX: tensor list ---------------------------------------------------------------------------

def mlx_tensors(c):
    """[(name, kind, shape)]: kind "q4" / "q8" a quantized matrix [..., n, k] (bits), "one" /
    "zero" / "rand" a bf16 tensor of ones, zeros or N(0, 0.02)."""
    out = []
    q = lambda n, *s, bits=4: out.append((n, "q%d" % bits, list(s)))  # noqa: E731
    v = lambda n, *s, fill="one": out.append((n, fill, list(s)))  # noqa: E731
    H, L, mt = c["hidden_size"], c["num_hidden_layers"], c["model_type"]
    if mt in ("qwen3_5", "qwen3_5_moe"):
        root, head = "language_model.model.", "language_model.lm_head"
    else:
        root, head = "model.", "lm_head"
    q(root + "embed_tokens", c["vocab_size"], H)
    v(root + "norm.weight", H)
    if not c.get("tie_word_embeddings"):
        q(head, c["vocab_size"], H)
    E, Fm = c.get("num_experts"), c.get("moe_intermediate_size")

    def experts(p):
        q(p + "gate_proj", E, Fm, H)
        q(p + "up_proj", E, Fm, H)
        q(p + "down_proj", E, H, Fm)

    def mlp(p, F):
        q(p + "gate_proj", F, H)
        q(p + "up_proj", F, H)
        q(p + "down_proj", H, F)

    def attention(p, heads, kv, hd, gated=False, has_kv=True, has_v=True):
        q(p + "q_proj", heads * hd * (2 if gated else 1), H)
        if has_kv:
            q(p + "k_proj", kv * hd, H)
            if has_v:
                q(p + "v_proj", kv * hd, H)
            v(p + "k_norm.weight", hd)
        q(p + "o_proj", H, heads * hd)
        v(p + "q_norm.weight", hd)

    if mt == "gemma4_text":
        P = c["hidden_size_per_layer_input"]
        if P:
            q(root + "embed_tokens_per_layer", c["vocab_size_per_layer_input"], L * P)
            q(root + "per_layer_model_projection", L * P, H)
            v(root + "per_layer_projection_norm.weight", P)
        first_shared = L - c["num_kv_shared_layers"]
    for i in range(L):
        p = f"{root}layers.{i}."
        v(p + "input_layernorm.weight", H)
        v(p + "post_attention_layernorm.weight", H)
        if mt in ("qwen3_5", "qwen3_5_moe"):
            if c["layer_types"][i] == "linear_attention":
                a = p + "linear_attn."
                nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
                dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
                v(a + "A_log", nv, fill="zero")
                v(a + "conv1d.weight", 2 * nk * dk + nv * dv, c["linear_conv_kernel_dim"], 1, fill="rand")
                v(a + "dt_bias", nv, fill="zero")
                q(a + "in_proj_a", nv, H)
                q(a + "in_proj_b", nv, H)
                q(a + "in_proj_qkv", 2 * nk * dk + nv * dv, H)
                q(a + "in_proj_z", nv * dv, H)
                v(a + "norm.weight", dv)
                q(a + "out_proj", H, nv * dv)
            else:
                attention(p + "self_attn.", c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                          gated=True)
            if mt == "qwen3_5_moe":
                m = p + "mlp."
                q(m + "gate", E, H, bits=8)
                experts(m + "switch_mlp.")
                mlp(m + "shared_expert.", c["shared_expert_intermediate_size"])
                q(m + "shared_expert_gate", 1, H, bits=8)
            else:
                mlp(p + "mlp.", c["intermediate_size"])
        elif mt == "qwen3_moe":
            attention(p + "self_attn.", c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"])
            if i in c.get("mlp_only_layers", []):
                mlp(p + "mlp.", c["intermediate_size"])
            else:
                q(p + "mlp.gate", E, H, bits=8)
                experts(p + "mlp.switch_mlp.")
        elif mt == "gemma4_text":
            full = c["layer_types"][i] == "full_attention"
            hd = c["global_head_dim"] if full else c["head_dim"]
            kv = (c["num_global_key_value_heads"] or c["num_key_value_heads"]) if full else c["num_key_value_heads"]
            shared = i >= first_shared
            attention(p + "self_attn.", c["num_attention_heads"], kv, hd, has_kv=not shared,
                      has_v=not (full and c["attention_k_eq_v"]))
            mlp(p + "mlp.", c["intermediate_size"] * (2 if shared and c["use_double_wide_mlp"] else 1))
            v(p + "pre_feedforward_layernorm.weight", H)
            v(p + "post_feedforward_layernorm.weight", H)
            v(p + "layer_scalar", 1)
            if P:
                # a linear whose row length is not a multiple of the group stays bf16 (mlx-lm)
                q(p + "per_layer_input_gate", P, H)
                if P % GROUP == 0:
                    q(p + "per_layer_projection", H, P)
                else:
                    v(p + "per_layer_projection.weight", H, P, fill="rand")
                v(p + "post_per_layer_input_norm.weight", H)
            if c["enable_moe_block"]:
                experts(p + "experts.switch_glu.")
                q(p + "router.proj", E, H, bits=8)
                v(p + "router.scale", H)
                v(p + "router.per_expert_scale", E)
                for n in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                          "pre_feedforward_layernorm_2"):
                    v(p + n + ".weight", H)
        else:
            raise ValueError(f"no tensor list for {mt}")
    if c.get("mtp_num_hidden_layers"):  # Qwen3.5's multi-token-prediction head (mtp.*, as Hugging Face ships it)
        p = "mtp.layers.0."
        v(p + "input_layernorm.weight", H)
        v(p + "post_attention_layernorm.weight", H)
        attention(p + "self_attn.", c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], gated=True)
        mlp(p + "mlp.", c["intermediate_size"])
        v("mtp.fc.weight", H, 2 * H, fill="rand")  # bf16 in real checkpoints
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            v(f"mtp.{n}.weight", H)
    return out


def mlx_layout(tensors):
    """[(safetensors name, dtype, shape, source)] with source (kind, bits) for the writer."""
    rows = []
    for name, kind, shape in tensors:
        if kind.startswith("q"):
            bits, *lead, k = int(kind[1:]), *shape
            rows.append((name + ".weight", "U32", lead + [k * bits // 32], ("words", bits)))
            rows.append((name + ".scales", "BF16", lead + [k // GROUP], ("scales", bits)))
            rows.append((name + ".biases", "BF16", lead + [k // GROUP], ("biases", bits)))
        else:
            rows.append((name, "BF16", shape, (kind, 0)))
    return rows


def quantization_block(c, tensors):
    """config.json's quantization entry as mlx-lm writes it: the default, and each 8-bit module."""
    qb = {"group_size": GROUP, "bits": 4, "mode": "affine"}
    for name, kind, _ in tensors:
        if kind == "q8":
            qb[name] = {"group_size": GROUP, "bits": 8}
    return qb


class MlxPools:
    """Random words and matching (scale, bias) group pairs for each width, made once."""

    def __init__(self, rng, pool_bytes):
        self.rng, self.n, self.p = rng, pool_bytes, {}

    def get(self, bits):
        if bits not in self.p:
            top = (1 << bits) - 1
            std = ((top + 1) ** 2 - 1) ** 0.5 / 12 ** 0.5  # of q uniform in 0..top
            g = self.n // 64
            s = (0.02 / std) * (0.5 + self.rng.random(g, dtype=np.float32))
            self.p[bits] = (np.frombuffer(self.rng.bytes(self.n), np.uint8),
                            np.frombuffer(bf16_bytes(s), np.uint8), np.frombuffer(bf16_bytes(-top / 2 * s), np.uint8))
        return self.p[bits]


def tile(fo, pool, nbytes, rot, unit):
    """Write nbytes taken from pool starting at a whole-unit rotation, wrapping around."""
    rot = (rot % (len(pool) // unit)) * unit
    done = 0
    while done < nbytes:
        start = (rot + done) % len(pool)
        take = min(nbytes - done, len(pool) - start)
        fo.write(pool[start:start + take].data)
        done += take


def write_mlx(name, out, tok_dir, scale="full", pool_bytes=POOL_BYTES, sparse=False, mtp=False):
    c = model_config(name, scale)
    if mtp:
        if c["model_type"] != "qwen3_5":
            raise ValueError("--mtp: the multi-token-prediction head is dense Qwen3.5's")
        c["mtp_num_hidden_layers"] = 1
    ts = mlx_tensors(c)
    rows = mlx_layout(ts)
    size = {"U32": 4, "BF16": 2}
    header, off = {"__metadata__": {"format": "mlx"}}, 0
    for n, dt, shape, _ in rows:
        nb = int(np.prod(shape)) * size[dt]
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(33)
    pools = MlxPools(rng, pool_bytes)
    with open(os.path.join(out, "model.safetensors"), "wb") as fo:
        fo.write(len(hj).to_bytes(8, "little"))
        fo.write(hj)
        if sparse:  # the header and a hole of the data's size: for hearth fit, which reads no weight
            fo.truncate(8 + len(hj) + off)
            rows = []
        for idx, (n, dt, shape, (kind, bits)) in enumerate(rows):
            nb = header[n]["data_offsets"][1] - header[n]["data_offsets"][0]
            rot = idx // 3 * 7919  # the scales and biases of one matrix share a rotation: each group's pair matches
            if kind in ("words", "scales", "biases"):
                w, s, b = pools.get(bits)
                tile(fo, {"words": w, "scales": s, "biases": b}[kind], nb, rot, 2)
            elif kind == "rand":
                fo.write(bf16_bytes(rng.normal(0, 0.02, int(np.prod(shape))).astype(np.float32)))
            else:
                fo.write(bf16_bytes(np.full(int(np.prod(shape)), 1.0 if kind == "one" else 0.0, np.float32)))
    qb = quantization_block(c, ts)
    cfg = dict(c, quantization=qb, quantization_config=qb, torch_dtype="bfloat16")
    tok_cfg = json.load(open(os.path.join(tok_dir, "config.json")))
    for k in ("bos_token_id", "eos_token_id"):  # the tokenizer's own ids (the vocabulary is the tiny model's)
        if k in tok_cfg:
            cfg[k] = tok_cfg[k]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(tok_dir, f)):  # the chat template, where it is its own file
            shutil.copy(os.path.join(tok_dir, f), out)
    return len(hj) + 8 + off


# ---- GGUF: tensor list (llama.cpp's names; ggml shapes [ne0 = row length, ne1, ne2]) ------------

def gguf_tensors(c, arch):
    """[(name, ggml shape, role)]: role "f32[:fill]" stays F32 (norms, routers, the conv kernel,
    the recurrence's scalars, as the converter and llama-quantize leave them; filled with ones,
    or -1, zeros, N(0, 0.02)), "v" / "down" are
    the tensors Q4_K_M gives more bits on some layers, "m" every other matrix, "out" output."""
    if arch == "gemma4":
        return gemma4_gguf_tensors(c)
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    # tied embeddings (Qwen3.5-0.8B): no output.weight; llama-quantize gives token_embd the output's type
    tied = c.get("tie_word_embeddings")
    out = [("token_embd.weight", [H, V], "out" if tied else "m"), ("output_norm.weight", [H], "f32")]
    if not tied:
        out.append(("output.weight", [H, V], "out"))
    E, Fm = c.get("num_experts"), c.get("moe_intermediate_size")
    hybrid = arch in ("qwen35", "qwen35moe")
    for i in range(L):
        b = f"blk.{i}."
        t = lambda n, s, r="m": out.append((b + n, s, r))  # noqa: E731
        t("attn_norm.weight", [H], "f32")
        t(("post_attention_norm" if hybrid else "ffn_norm") + ".weight", [H], "f32")
        if hybrid and c["layer_types"][i] == "linear_attention":
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            conv = 2 * nk * dk + nv * dv
            t("attn_qkv.weight", [H, conv])
            t("attn_gate.weight", [H, nv * dv])
            t("ssm_beta.weight", [H, nv])
            t("ssm_alpha.weight", [H, nv])
            t("ssm_a", [nv], "f32:neg")  # -exp(A_log) with A_log 0
            t("ssm_dt.bias", [nv], "f32:zero")
            t("ssm_conv1d.weight", [c["linear_conv_kernel_dim"], conv], "f32:rand")
            t("ssm_norm.weight", [dv], "f32")
            t("ssm_out.weight", [nv * dv, H])
        else:
            hd, heads, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
            t("attn_q.weight", [H, heads * hd * (2 if hybrid else 1)])  # qwen35: the query and its gate
            t("attn_k.weight", [H, kv * hd])
            t("attn_v.weight", [H, kv * hd], "v")
            t("attn_output.weight", [heads * hd, H])
            t("attn_q_norm.weight", [hd], "f32")
            t("attn_k_norm.weight", [hd], "f32")
        if E:
            t("ffn_gate_inp.weight", [H, E], "f32:rand")
            t("ffn_gate_exps.weight", [H, Fm, E])
            t("ffn_up_exps.weight", [H, Fm, E])
            t("ffn_down_exps.weight", [Fm, H, E], "down")
            if c.get("shared_expert_intermediate_size"):
                Fs = c["shared_expert_intermediate_size"]
                t("ffn_gate_shexp.weight", [H, Fs])
                t("ffn_up_shexp.weight", [H, Fs])
                t("ffn_down_shexp.weight", [Fs, H], "down")
                t("ffn_gate_inp_shexp.weight", [H], "f32:rand")
        else:
            F = c["intermediate_size"]
            t("ffn_gate.weight", [H, F])
            t("ffn_up.weight", [H, F])
            t("ffn_down.weight", [F, H], "down")
    return out


def gemma4_gguf_tensors(c):
    """Gemma 4 as llama.cpp's converter (conversion/gemma.py Gemma4Model) and loader
    (src/models/gemma4.cpp) name it: tied output, the per-layer input tables, no K/V on the
    KV-shared layers, no V where K is V, one rope_freqs (the full layers' proportional RoPE),
    the MoE block beside the dense MLP."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    P, E, Fm = c["hidden_size_per_layer_input"], c.get("num_experts"), c.get("moe_intermediate_size")
    out = [("token_embd.weight", [H, V], "m"), ("output_norm.weight", [H], "f32"),
           ("rope_freqs.weight", [c["global_head_dim"] // 2], "f32:rope_freqs")]
    if P:
        out += [("per_layer_token_embd.weight", [P * L, V], "m"), ("per_layer_model_proj.weight", [H, P * L], "m"),
                ("per_layer_proj_norm.weight", [P], "f32")]
    first_shared = L - c["num_kv_shared_layers"]
    for i in range(L):
        b = f"blk.{i}."
        t = lambda n, s, r="m": out.append((b + n, s, r))  # noqa: E731
        full = c["layer_types"][i] == "full_attention"
        hd = c["global_head_dim"] if full else c["head_dim"]
        kv = (c["num_global_key_value_heads"] or c["num_key_value_heads"]) if full else c["num_key_value_heads"]
        heads = c["num_attention_heads"]
        t("attn_norm.weight", [H], "f32")
        t("attn_q.weight", [H, heads * hd])
        if i < first_shared:
            t("attn_k.weight", [H, kv * hd])
            if not (full and c["attention_k_eq_v"]):
                t("attn_v.weight", [H, kv * hd], "v")
            t("attn_k_norm.weight", [hd], "f32")
        t("attn_output.weight", [heads * hd, H])
        t("attn_q_norm.weight", [hd], "f32")
        t("post_attention_norm.weight", [H], "f32")
        t("layer_output_scale.weight", [1], "f32")
        F = c["intermediate_size"] * (2 if i >= first_shared and c["use_double_wide_mlp"] else 1)
        t("ffn_norm.weight", [H], "f32")
        t("ffn_gate.weight", [H, F])
        t("ffn_up.weight", [H, F])
        t("ffn_down.weight", [F, H], "down")
        t("post_ffw_norm.weight", [H], "f32")
        if c["enable_moe_block"]:
            t("ffn_gate_inp.weight", [H, E], "f32:rand")
            t("ffn_gate_inp.scale", [H], "f32")
            t("pre_ffw_norm_2.weight", [H], "f32")
            t("post_ffw_norm_1.weight", [H], "f32")
            t("post_ffw_norm_2.weight", [H], "f32")
            t("ffn_gate_up_exps.weight", [H, 2 * Fm, E])
            t("ffn_down_exps.weight", [Fm, H, E], "down")
            t("ffn_down_exps.scale", [E], "f32")
        if P:
            t("inp_gate.weight", [H, P])
            t("proj.weight", [P, H])
            t("post_norm.weight", [H], "f32")
    return out


def gguf_types(c, tensors):
    """Q4_K_M's choice per role (tools/cuda_gguf8b.py: Q6_K for output, and for attn_v and the
    down projections on the layers llama.cpp's use_more_bits picks; Q4_K for the rest)."""
    L = c["num_hidden_layers"]
    typed = []
    rng = np.random.default_rng(35)
    fills = {"f32": 1.0, "f32:neg": -1.0, "f32:zero": 0.0}
    for name, shape, role in tensors:
        i = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if role.startswith("f32"):
            n = int(np.prod(shape))
            if role == "f32:rope_freqs":  # 1 for the rotated pairs, 1e30 (no rotation) for the rest
                rot = int(c["global_head_dim"] * c["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
                data = np.array([1.0] * rot + [1e30] * (n - rot))
            else:
                data = rng.normal(0, 0.02, n) if role == "f32:rand" else np.full(n, fills[role])
            typed.append((name, shape, g8.T_F32, data.astype(np.float32).tobytes()))
            continue
        if role == "out" or (role in ("v", "down") and g8.use_more_bits(i, L)):
            t = g8.T_Q6_K
        else:
            t = g8.T_Q4_K
        if shape[0] % 256:  # a row k-quants cannot split: llama-quantize falls back to Q5_0
            t = g8.T_Q5_0
        typed.append((name, shape, t))
    return typed


def gguf_meta(c, arch, name):
    m = g8.Meta()
    m.str("general.architecture", arch)
    m.str("general.name", f"random-{name}-q4_k_m")
    m.u32("general.file_type", g8.FILE_TYPE["q4_k_m"])
    m.u32("general.quantization_version", 2)
    m.u32("general.alignment", g8.GGUF_ALIGN)
    m.u32(f"{arch}.block_count", c["num_hidden_layers"])
    m.u32(f"{arch}.context_length", c["max_position_embeddings"])
    m.u32(f"{arch}.embedding_length", c["hidden_size"])
    gemma = arch == "gemma4"
    if gemma and c.get("use_double_wide_mlp"):  # one per layer: the KV-shared layers' MLP is twice as wide
        first_shared, F = c["num_hidden_layers"] - c["num_kv_shared_layers"], c["intermediate_size"]
        ff = [F * (2 if i >= first_shared else 1) for i in range(c["num_hidden_layers"])]
        m.arr(f"{arch}.feed_forward_length", 4, np.array(ff, np.uint32).tobytes(), len(ff))
    else:
        m.u32(f"{arch}.feed_forward_length", c["intermediate_size"])
    m.u32(f"{arch}.attention.head_count", c["num_attention_heads"])
    if not (gemma and c.get("num_global_key_value_heads")):  # else an array per layer (gemma4_meta)
        m.u32(f"{arch}.attention.head_count_kv", c["num_key_value_heads"])
    hd = c["global_head_dim"] if gemma else c["head_dim"]
    m.u32(f"{arch}.attention.key_length", hd)
    m.u32(f"{arch}.attention.value_length", hd)
    rp = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0)}
    m.f32(f"{arch}.rope.freq_base", (rp["full_attention"] if gemma else rp)["rope_theta"])
    m.f32(f"{arch}.attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    m.u32(f"{arch}.vocab_size", c["vocab_size"])
    if c.get("num_experts") and not gemma:
        m.u32(f"{arch}.expert_count", c["num_experts"])
        m.u32(f"{arch}.expert_used_count", c["num_experts_per_tok"])
        m.u32(f"{arch}.expert_feed_forward_length", c["moe_intermediate_size"])
        if c.get("shared_expert_intermediate_size"):
            m.u32(f"{arch}.expert_shared_feed_forward_length", c["shared_expert_intermediate_size"])
    if arch == "gemma4":
        gemma4_meta(m, c)
    if arch in ("qwen35", "qwen35moe"):
        nv = c["linear_num_value_heads"]
        m.u32(f"{arch}.ssm.conv_kernel", c["linear_conv_kernel_dim"])
        m.u32(f"{arch}.ssm.state_size", c["linear_key_head_dim"])
        m.u32(f"{arch}.ssm.group_count", c["linear_num_key_heads"])
        m.u32(f"{arch}.ssm.time_step_rank", nv)
        m.u32(f"{arch}.ssm.inner_size", c["linear_value_head_dim"] * nv)
        m.u32(f"{arch}.full_attention_interval", c["full_attention_interval"])
        m.u32(f"{arch}.rope.dimension_count", int(c["head_dim"] * rp["partial_rotary_factor"]))
        secs = list(rp["mrope_section"]) + [0]
        m.arr(f"{arch}.rope.dimension_sections", 5, np.array(secs, np.int32).tobytes(), len(secs))
    g8.standin_vocab(m, c["vocab_size"])
    return m


def gemma4_meta(m, c):
    """The keys Gemma4Model.set_gguf_parameters adds (the generic ones are gguf_meta's, with the
    full layers' head dim as key/value length, as the converter corrects them)."""
    a = "gemma4"
    swa = [t == "sliding_attention" for t in c["layer_types"]]
    m.u32(f"{a}.attention.key_length_swa", c["head_dim"])
    m.u32(f"{a}.attention.value_length_swa", c["head_dim"])
    m.u32(f"{a}.rope.dimension_count", c["global_head_dim"])
    m.u32(f"{a}.rope.dimension_count_swa", c["head_dim"])
    m.f32(f"{a}.rope.freq_base_swa", c["rope_parameters"]["sliding_attention"]["rope_theta"])
    m.u32(f"{a}.attention.sliding_window", c["sliding_window"])
    m.arr(f"{a}.attention.sliding_window_pattern", 7, bytes(swa), len(swa))
    m.u32(f"{a}.attention.shared_kv_layers", c["num_kv_shared_layers"])
    m.u32(f"{a}.embedding_length_per_layer_input", c["hidden_size_per_layer_input"])
    m.f32(f"{a}.final_logit_softcapping", c["final_logit_softcapping"])
    if c.get("num_global_key_value_heads"):
        kv = [c["num_key_value_heads"] if s else c["num_global_key_value_heads"] for s in swa]
        m.arr(f"{a}.attention.head_count_kv", 4, np.array(kv, np.uint32).tobytes(), len(kv))
    if c.get("enable_moe_block"):
        m.u32(f"{a}.expert_count", c["num_experts"])
        m.u32(f"{a}.expert_used_count", c["top_k_experts"])
        m.u32(f"{a}.expert_feed_forward_length", c["moe_intermediate_size"])


def write_gguf(name, path, scale="full", pool_bytes=POOL_BYTES):
    arch = MODELS[name]["gguf"]
    c = model_config(name, scale)
    ts = gguf_types(c, gguf_tensors(c, arch))
    return g8.write_file(path, gguf_meta(c, arch, name), ts, np.random.default_rng(34), pool_bytes)


def stats(name, scale="full"):
    """What a prefill's FLOP count needs: the matmul weights one token multiplies (experts as
    top_k of them; embedding tables are looked up, not multiplied) and, per softmax-attention
    layer, (query heads, head dim, window or 0). The Gated DeltaNet recurrence is not counted."""
    c = model_config(name, scale)
    E = c.get("num_experts") or 0
    top = c.get("num_experts_per_tok") or c.get("top_k_experts") or 0
    active = 0.0
    for n, kind, shape in mlx_tensors(c):
        if not kind.startswith("q") and "per_layer_projection." not in n:
            continue
        if n.endswith(("embed_tokens", "embed_tokens_per_layer")):
            continue
        active += float(np.prod(shape)) * (top / E if len(shape) == 3 else 1)
    if c.get("tie_word_embeddings"):
        active += c["vocab_size"] * c["hidden_size"]  # the output projection is the embedding
    attn = []
    for i in range(c["num_hidden_layers"]):
        kind = (c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"])[i]
        if kind == "linear_attention":
            continue
        hd = c["global_head_dim"] if kind == "full_attention" and c.get("global_head_dim") else c["head_dim"]
        attn.append((c["num_attention_heads"], hd, c["sliding_window"] if kind == "sliding_attention" else 0))
    return {"active_matmul_params": active, "attention_layers": attn}


def main(argv):
    if argv[:1] == ["--stats"]:
        print(json.dumps(stats(argv[1], argv[argv.index("--scale") + 1] if "--scale" in argv else "full")))
        return
    if argv[:1] == ["--list"]:
        for n, s in MODELS.items():
            gguf = f"gguf ({s['gguf']}{'' if s['gguf'] in HEARTH_GGUF else ', llama.cpp only'})"
            print(f"{n:16s} {s['config']['model_type']:12s} mlx {gguf}")
        return
    if len(argv) < 3 or argv[0] not in MODELS or argv[1] not in ("mlx", "gguf"):
        sys.exit(__doc__)
    name, fmt, out = argv[:3]
    scale = argv[argv.index("--scale") + 1] if "--scale" in argv else "full"
    if scale not in ("full", "small"):
        sys.exit("--scale is full or small")
    pool = POOL_BYTES if scale == "full" else 1 << 20
    t0 = time.time()
    if fmt == "mlx":
        here = os.path.dirname(os.path.abspath(__file__))
        tiny = os.environ.get("TINY") or os.path.join(os.path.expanduser("~/.cache/hearth"), "tiny")
        tok = argv[argv.index("--tokenizer") + 1] if "--tokenizer" in argv else os.path.join(tiny, MODELS[name]["tok"])
        if not os.path.isfile(os.path.join(tok, "tokenizer.json")):
            sys.exit(f"{tok}: no tokenizer.json (make the tiny models: {here}/make_tiny_models.py)")
        nbytes = write_mlx(name, out, tok, scale, pool, sparse="--sparse" in argv, mtp="--mtp" in argv)
    else:
        nbytes = write_gguf(name, out, scale, pool)
    print(json.dumps({"model": name, "format": fmt, "scale": scale, "path": out, "bytes": nbytes,
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
