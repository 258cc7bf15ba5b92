"""Gemma 4 (dense with per-layer inputs and shared KV, and MoE) from GGUF, as llama.cpp's
converter writes it (architecture gemma4).

The tiny gemma4-f32 / gemma4_moe-f32 models (mlx-lm's weights) are written to GGUF here with
the `gguf` package, doing what llama.cpp's convert_hf_to_gguf.py (conversion/gemma.py
Gemma4Model in the llama.cpp vendored by llama-cpp-python 0.3.36) does to the Hugging Face
checkpoint: llama.cpp's tensor names (gguf-py's tensor_mapping for MODEL_ARCH.GEMMA4), the
norms as they are (no offset), layer_scalar as layer_output_scale, router.scale as
ffn_gate_inp.scale, per_expert_scale as ffn_down_exps.scale, the experts' gate and up fused
[experts, 2 * moe_intermediate_size, hidden] (Hugging Face's gate_up_proj, which mlx-lm
splits), no K / V on the KV-shared layers and no V where K is V, one rope_freqs tensor for
the full layers' proportional RoPE (1 for the rotated pairs, 1e30 for the rest), tied
output; the keys of Gemma3Model / Gemma4Model.set_gguf_parameters (key_length = the full
layers' head dim, key_length_swa, head_count_kv per layer, sliding_window_pattern per layer,
shared_kv_layers, feed_forward_length per layer when double-wide, ...); the vocabulary as
its set_vocab writes it (tokenizer model "gemma4", LlamaHfVocab). F32 stays for 1-D
tensors, norms, the router and non-".weight" tensors (conversion/base.py); Q8_0 for the rest
with --outtype q8_0.

Oracles: mlx-lm's golden logits (tests/parity/goldens), which llama.cpp itself
(llama-cpp-python on the libraries bench/cpu_vs_llamacpp builds) must reproduce from the f32
files, showing each file is what llama.cpp means by gemma4; then hearth must give the same
logits and greedy tokens from the file, equal hearth's logits on the safetensors model, and
agree with llama.cpp on the Q8_0 files. Without llama.cpp's libraries those tests skip.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_gguf_qwen35 import (BIN, CACHE, REF_TOL, gguf_maker, golden_prompts, hearth_beside_golden,
                              hearth_beside_llama_cpp, hearth_on_bad_file, hearth_trace, llama_cpp_beside_goldens,
                              llama_cpp_run)

MODELS = ["gemma4-f32", "gemma4_moe-f32"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# hearth on the GGUF against hearth on the safetensors folder: the same weights in the same
# reference kernels, only the file differs (measured 0 on both models); bound for summation
# order should a kernel pick another path for GGUF-typed F32 matrices
SAME_TOL = 1e-4
# llama.cpp's CPU GELU (ggml-cpu/vec.h, GGML_GELU_FP16) rounds its input to f16 and reads
# the result from an f16 table, so its f32 logits are not mlx-lm's to 1e-4 as on qwen35:
# measured 5.1e-3 (dense) and 4.4e-2 (MoE: the error moves the router's softmax weights)
# from the goldens, best token equal everywhere; emulating that GELU in mlx-lm halves the
# dense gap (4.7e-3 -> 2.1e-3 over llama.cpp's top 10)
LLAMA_TOL = {"gemma4-f32": 1e-2, "gemma4_moe-f32": 0.1}
# Q8_0 on these random tiny models moves the logits far (llama.cpp's own Q8_0 vs f32 file:
# 0.61 dense, 3.3 MoE, as hearth's: 0.33 / 3.3), so llama.cpp's int8 activations and f16
# GELU put it 0.50 (hearth's reference tier) / 0.29 (fast tier, int8 activations as
# llama.cpp) from hearth on the dense file, same best token at every position; the MoE file
# flips near-tied experts between the two (its check is mlx-lm on the dequantized weights)
Q8_LLAMA_TOL = 1.0


def converter_tensors(model):
    """[(gguf name, float32 array)] as the converter writes the model's tensors."""
    import mlx.core as mx

    src = os.path.join(CACHE, "tiny", model)
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(os.path.join(src, "model.safetensors")).items()}
    out = [("token_embd.weight", w["model.embed_tokens.weight"]), ("output_norm.weight", w["model.norm.weight"])]
    if "lm_head.weight" in w:
        out.append(("output.weight", w["lm_head.weight"]))
    hd_full = cfg["global_head_dim"]
    rot = int(hd_full * cfg["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    out.append(("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (hd_full // 2 - rot), np.float32)))
    if cfg.get("hidden_size_per_layer_input"):
        out += [("per_layer_token_embd.weight", w["model.embed_tokens_per_layer.weight"]),
                ("per_layer_model_proj.weight", w["model.per_layer_model_projection.weight"]),
                ("per_layer_proj_norm.weight", w["model.per_layer_projection_norm.weight"])]
    names = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
             "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
             "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
             "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
             "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
             "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "router.proj.weight": "ffn_gate_inp.weight",
             "router.scale": "ffn_gate_inp.scale", "router.per_expert_scale": "ffn_down_exps.scale",
             "experts.switch_glu.down_proj.weight": "ffn_down_exps.weight",
             "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
             "post_per_layer_input_norm.weight": "post_norm.weight", "layer_scalar": "layer_output_scale.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf, gg in names.items():
            if p + hf in w:
                out.append((f"blk.{i}.{gg}", w[p + hf]))
        if p + "experts.switch_glu.gate_proj.weight" in w:  # Hugging Face's fused gate_up_proj
            sg = p + "experts.switch_glu."
            out.append((f"blk.{i}.ffn_gate_up_exps.weight",
                        np.concatenate([w[sg + "gate_proj.weight"], w[sg + "up_proj.weight"]], axis=1)))
    return cfg, out


def write_gguf(path, outtype, model="gemma4-f32", tweak=None):
    """outtype f32, f16 or q8_0 (the converter's --outtype). tweak(what, value) -> value
    changes the file for the bad-input cases ("kv": the metadata dict, "tensors": the list)."""
    import gguf

    tweak = tweak or (lambda what, value: value)
    src = os.path.join(CACHE, "tiny", model)
    cfg, tensors = converter_tensors(model)
    L, shared = cfg["num_hidden_layers"], cfg["num_kv_shared_layers"]
    swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    g = gguf.GGUFWriter(path, "gemma4")
    # TextModel.set_gguf_parameters, then Gemma3Model's, then Gemma4Model's (which rewrite some)
    g.add_block_count(L)
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    g.add_rope_freq_base_swa(cfg["rope_parameters"]["sliding_attention"]["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("enable_moe_block"):
        g.add_expert_count(cfg["num_experts"])
        g.add_expert_used_count(cfg["top_k_experts"])
        g.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    g.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    g.add_sliding_window(cfg["sliding_window"])
    g.add_shared_kv_layers(shared)
    g.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    g.add_sliding_window_pattern(swa)
    g.add_key_length(cfg["global_head_dim"])
    g.add_value_length(cfg["global_head_dim"])
    g.add_key_length_swa(cfg["head_dim"])
    g.add_value_length_swa(cfg["head_dim"])
    n_ff = cfg["intermediate_size"]
    if cfg.get("use_double_wide_mlp"):
        g.add_feed_forward_length([n_ff if i < L - shared else 2 * n_ff for i in range(L)])
    else:
        g.add_feed_forward_length(n_ff)
    if cfg.get("num_global_key_value_heads") is not None:
        g.add_head_count_kv([cfg["num_key_value_heads"] if s else cfg["num_global_key_value_heads"] for s in swa])
    else:
        g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_rope_dimension_count(cfg["global_head_dim"])
    g.add_rope_dimension_count_swa(cfg["head_dim"])
    g.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
    # Gemma4Model.set_vocab
    vocab = gguf.LlamaHfVocab(__import__("pathlib").Path(src))
    visible = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>",
               '<|"|>'}
    toks, scores, types = [], [], []
    for text, score, ty in vocab.all_tokens():
        toks.append(text)
        scores.append(score)
        types.append(gguf.TokenType.USER_DEFINED if text.decode() in visible else ty)
    g.add_tokenizer_model("gemma4")
    g.add_token_list(toks)
    g.add_token_scores(scores)
    g.add_token_types(types)
    gguf.SpecialVocab(__import__("pathlib").Path(src), load_merges=True).add_to_gguf(g)
    g.add_add_space_prefix(False)
    g.add_add_bos_token(True)

    qt = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}.get(outtype)
    for name, arr in tweak("tensors", tensors):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        keep = arr.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name or not name.endswith(".weight")
        if qt is None or keep:
            g.add_tensor(name, arr)
        elif qt == gguf.GGMLQuantizationType.F16:
            g.add_tensor(name, arr.astype(np.float16))
        else:
            g.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
    tweak("kv", g.kv_data[0])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """{(model, outtype): path}, written on first use."""
    return gguf_maker(tmp_path_factory, write_gguf)


@pytest.mark.parametrize("model", MODELS)
def test_llama_cpp_reads_the_file_as_mlx_lm_computes(gguf_files, model):
    """The oracle for the file: llama.cpp's logits at the golden prompts' last positions."""
    worst = llama_cpp_beside_goldens(gguf_files(model, "f32"), golden_prompts(model))
    print(f"\n{model} f32 GGUF: worst |llama.cpp - mlx-lm golden| {worst:.2e}")
    assert worst < LLAMA_TOL[model]


@pytest.mark.parametrize("model", MODELS)
def test_hearth_reads_the_file_as_mlx_lm_computes(gguf_files, model):
    """hearth on the f32 GGUF: the golden's logits (reference tier) and its greedy tokens,
    and exactly what hearth gives on the safetensors folder."""
    worst = worst_same = 0.0
    for q in golden_prompts(model):
        out, gap = hearth_beside_golden(gguf_files(model, "f32"), q)
        worst = max(worst, gap)
        folder = hearth_trace(os.path.join(CACHE, "tiny", model), q)
        for fl, ol in zip(folder["prompt"], out["prompt"]):
            theirs = dict(fl["top"])
            worst_same = max([worst_same] + [abs(theirs[i] - v) for i, v in ol["top"] if i in theirs])
        assert [s["token"] for s in folder["steps"]] == [s["token"] for s in out["steps"]]
    print(f"\n{model} f32 GGUF: worst |hearth - mlx-lm golden| {worst:.2e}, |GGUF - safetensors| {worst_same:.2e}")
    assert worst < REF_TOL
    assert worst_same < SAME_TOL


def rounded_mlx_model(model, outtype):
    """mlx-lm's model with the weights the outtype file holds: every tensor the converter
    stores as F16 / Q8_0 rounded through that type (gguf.quants), the rest as they are."""
    import gguf
    import mlx.core as mx
    from mlx_lm import load

    qt = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    m, _ = load(os.path.join(CACHE, "tiny", model))
    weights = []
    for k, v in mx.load(os.path.join(CACHE, "tiny", model, "model.safetensors")).items():
        a = np.array(v.astype(mx.float32))
        if a.ndim >= 2 and "router.proj" not in k:  # the converter keeps the router (ffn_gate_inp) F32
            a = gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt).reshape(a.shape)
        weights.append((k, mx.array(a)))
    m.load_weights(weights)
    return m


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
@pytest.mark.parametrize("model", MODELS)
def test_hearth_reads_rounded_files_as_mlx_lm_computes(gguf_files, model, outtype):
    """F16 and Q8_0 files: hearth's reference tier (the exact dequantized weights) against
    mlx-lm running those same weights: logits at the prompts' last 4 positions within the
    reference bound, and the greedy tokens identical."""
    import mlx.core as mx

    m, worst = rounded_mlx_model(model, outtype), 0.0
    for q in golden_prompts(model):
        out = hearth_trace(gguf_files(model, outtype), q)
        ids = list(q["ids"])
        ref = np.array(m(mx.array([ids]))[0].astype(mx.float32))
        for ol in out["prompt"]:
            worst = max([worst] + [abs(ref[ol["pos"]][i] - v) for i, v in ol["top"]])
        greedy = []
        for _ in range(len(out["steps"])):
            greedy.append(int(np.argmax(np.array(m(mx.array([ids + greedy]))[0, -1].astype(mx.float32)))))
        assert [s["token"] for s in out["steps"]] == greedy, (q["name"], outtype)
    print(f"\n{model} {outtype} GGUF: worst |hearth - mlx-lm on the same rounded weights| {worst:.2e}")
    assert worst < REF_TOL


@pytest.mark.parametrize("level", ["scalar", None], ids=["reference", "fast"])
def test_q8_0_file_hearth_equals_llama_cpp(gguf_files, level):
    """A dense Q8_0 file: hearth's logits (both tiers) beside llama.cpp's on the same file,
    same best token at every compared position."""
    model = "gemma4-f32"
    worst = hearth_beside_llama_cpp(gguf_files(model, "q8_0"), golden_prompts(model), level)
    print(f"\n{model} Q8_0 GGUF, {level or 'fast'} tier: worst |hearth - llama.cpp| over the top-5 logits {worst:.2e}")
    assert worst < Q8_LLAMA_TOL


# Q4_K_M-structured files with the real models' layouts at small sizes (tools/gpu_models.py:
# Q4_K, Q6_K where llama-quantize gives more bits, Q5_0 where a row is not a multiple of 256,
# random blocks, unit norms). Random weights make some positions chaotic (llama.cpp's own f32
# and Q4_K readings of the E4B-shaped file differ by 4.4 there: its int8 activations), so
# each tier is held to llama.cpp computing as it does: the reference tier (exact weights,
# float activations) to llama.cpp on the file dequantized to F32, the fast tier (int8
# activations per block, as llama.cpp's Q4_K / Q6_K / Q5_0 dot products) to llama.cpp on
# the file itself. Measured worst over the top-5: reference 3.2e-2 / 1.9e-5 (E4B / 26B-A4B
# shape; llama.cpp's f16-table GELU on the E4B's chaotic positions), fast 2.9e-1 / 1.3e-3
# (one chaotic position of E4B: 4.79 against 4.51), same best token everywhere
Q4K_REF_TOL = 5e-2
Q4K_FAST_TOL = 0.5


def dequantized_copy(src, dst):
    """src with every tensor dequantized to F32 (gguf.quants), the metadata as it is."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a.reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("level", ["scalar", None], ids=["reference", "fast"])
@pytest.mark.parametrize("name", ["gemma4_e4b", "gemma4_26b_a4b"])
def test_q4_k_m_file_hearth_equals_llama_cpp(tmp_path_factory, name, level):
    """The Gemma-4-E4B-shaped (per-layer inputs, KV-shared layers, 64-token window) and
    26B-A4B-shaped (MoE, K = V on full layers) files of tools/gpu_models.py at small scale:
    hearth (both tiers) beside llama.cpp on prompts shorter and longer than the window."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import gpu_models

    folder = tmp_path_factory.mktemp("q4k")
    path, f32 = str(folder / f"{name}.gguf"), str(folder / f"{name}-f32.gguf")
    gpu_models.write_gguf(name, path, "small", 1 << 20)
    rng = np.random.default_rng(4)
    prompts = [{"name": f"{n} tokens", "ids": [2] + [int(i) for i in rng.integers(20, 1000, n - 1)],
                "greedy_ids": [0, 0]} for n in (9, 40, 100)]
    if level == "scalar":
        dequantized_copy(path, f32)
    worst = hearth_beside_llama_cpp(path, prompts, level, f32 if level == "scalar" else None)
    print(f"\n{name} small Q4_K_M GGUF, {level or 'fast'} tier: worst |hearth - llama.cpp| over the top-5 logits "
          f"{worst:.2e}")
    assert worst < (Q4K_REF_TOL if level == "scalar" else Q4K_FAST_TOL)


def split_experts(tensors):
    """The experts' gate and up as two tensors (ffn_gate_exps, ffn_up_exps), which llama.cpp
    reads where a file has no fused ffn_gate_up_exps."""
    out = []
    for name, a in tensors:
        if name.endswith("ffn_gate_up_exps.weight"):
            f = a.shape[1] // 2
            out += [(name.replace("gate_up", "gate"), a[:, :f]), (name.replace("gate_up", "up"), a[:, f:])]
        else:
            out.append((name, a))
    return out


def test_split_experts_read_as_the_fused_ones(gguf_files, tmp_path):
    """A MoE file with ffn_gate_exps + ffn_up_exps gives hearth the same logits as the fused
    ffn_gate_up_exps file (the same weights)."""
    model = "gemma4_moe-f32"
    path = str(tmp_path / "split.gguf")
    write_gguf(path, "f32", model, lambda what, v: split_experts(v) if what == "tensors" else v)
    for q in golden_prompts(model)[:2]:
        split, fused = hearth_trace(path, q), hearth_trace(gguf_files(model, "f32"), q)
        assert split["prompt"] == fused["prompt"] and split["steps"] == fused["steps"], q["name"]


def drop(kv, key):
    kv.pop(key)


def set_int(kv, key, value):
    kv[key] = type(kv[key])(value, kv[key].type)


def set_array(kv, key, values):
    kv[key] = type(kv[key])(values, kv[key].type, kv[key].sub_type)


def set_str(kv, key, value):
    import gguf

    kv[key] = type(kv[key])(value, gguf.GGUFValueType.STRING)


BAD = {  # name: (model, {what: change}, the words the error must hold)
    "head_count_kv a string": ("gemma4-f32", {"kv": lambda kv: set_str(kv, "gemma4.attention.head_count_kv", "2")},
                               "'gemma4.attention.head_count_kv' is a STRING, not a number"),
    "key_length_swa a string": ("gemma4-f32", {"kv": lambda kv: set_str(kv, "gemma4.attention.key_length_swa", "16")},
                                "gemma4.attention.key_length_swa"),
    "block_count against the tensors": ("gemma4-f32", {"kv": lambda kv: set_int(kv, "gemma4.block_count", 5)},
                                        "the config says 5 layers but the tensors hold 6"),
    "no sliding_window_pattern": ("gemma4-f32", {"kv": lambda kv: drop(kv, "gemma4.attention.sliding_window_pattern")},
                                  "gemma4.attention.sliding_window_pattern"),
    "pattern of the wrong length": ("gemma4-f32", {"kv": lambda kv: set_array(
        kv, "gemma4.attention.sliding_window_pattern", [True] * 5)}, "gemma4.attention.sliding_window_pattern"),
    "no key_length_swa": ("gemma4-f32", {"kv": lambda kv: drop(kv, "gemma4.attention.key_length_swa")},
                          "gemma4.attention.key_length_swa"),
    "no per-layer input size": ("gemma4-f32", {"kv": lambda kv: drop(kv, "gemma4.embedding_length_per_layer_input")},
                                "gemma4.embedding_length_per_layer_input"),
    "head_count_kv array too short": ("gemma4-f32", {"kv": lambda kv: set_array(
        kv, "gemma4.attention.head_count_kv", [2, 2, 2])}, "gemma4.attention.head_count_kv"),
    "kv heads vary within a type": ("gemma4-f32", {"kv": lambda kv: set_array(
        kv, "gemma4.attention.head_count_kv", [2, 1, 2, 1, 2, 1])}, "head_count_kv[1]"),
    "kv heads not dividing the heads": ("gemma4-f32", {"kv": lambda kv: set_array(
        kv, "gemma4.attention.head_count_kv", [3, 3, 3, 1, 3, 1])}, "a divisor of head_count 4"),
    "ffn width not double-wide": ("gemma4-f32", {"kv": lambda kv: set_array(
        kv, "gemma4.feed_forward_length", [64, 64, 96, 64, 128, 128])}, "feed_forward_length[2]"),
    "shared layers as many as all": ("gemma4-f32", {"kv": lambda kv: set_int(
        kv, "gemma4.attention.shared_kv_layers", 6)}, "shared_kv_layers 6"),
    "sharing llama.cpp reads otherwise": ("gemma4-f32", {"kv": lambda kv: set_int(
        kv, "gemma4.attention.shared_kv_layers", 3)}, "as llama.cpp reads them"),
    "partial sliding RoPE": ("gemma4-f32", {"kv": lambda kv: set_int(kv, "gemma4.rope.dimension_count_swa", 8)},
                             "dimension_count_swa"),
    "no rope_freqs": ("gemma4-f32", {"tensors": lambda ts: [t for t in ts if t[0] != "rope_freqs.weight"]},
                      "rope_freqs.weight"),
    "a missing per-layer gate": ("gemma4-f32", {"tensors": lambda ts: [t for t in ts if t[0] != "blk.2.inp_gate.weight"]},
                                 "blk.2.inp_gate.weight"),
    "q_proj of the wrong shape": ("gemma4-f32", {"tensors": lambda ts: [
        (n, a[:-16] if n == "blk.3.attn_q.weight" else a) for n, a in ts]}, "blk.3.attn_q.weight"),
    "no expert_count": ("gemma4_moe-f32", {"kv": lambda kv: drop(kv, "gemma4.expert_count")}, "gemma4.expert_count"),
    "too many experts used": ("gemma4_moe-f32", {"kv": lambda kv: set_int(kv, "gemma4.expert_used_count", 9)},
                              "experts are inconsistent"),
    "fused attn_qkv": ("gemma4-f32", {"tensors": lambda ts: ts + [("blk.1.attn_qkv.weight", np.zeros((96, 64)))]},
                       "blk.1.attn_qkv.weight"),
    "a missing router scale": ("gemma4_moe-f32", {"tensors": lambda ts: [
        t for t in ts if t[0] != "blk.4.ffn_gate_inp.scale"]}, "blk.4.ffn_gate_inp.scale"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_gemma4_gguf_is_refused(tmp_path, name):
    """A gemma4 GGUF hearth cannot run names what is wrong (the key or the tensor)."""
    model, changes, expect = BAD[name]
    if not os.path.isfile(os.path.join(CACHE, "tiny", model, "config.json")):
        pytest.fail(f"{model} missing: run tools/make_tiny_models.py", pytrace=False)

    p = hearth_on_bad_file(str(tmp_path / "bad.gguf"), write_gguf, changes, model=model)
    assert p.returncode != 0 and expect in p.stderr, p.stderr


TEXTS = ["Hello world", "  two  spaces and a trailing one ", "line one\nline two\n\n\tindented",
         "unicode: héllo wörld, 日本語, emoji 🙂🚀", "numbers 1234567 and punctuation!?.,;:", "<bos>a control token"]


LLAMA_TOKENIZE = r"""
import json, sys
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print(json.dumps([m.tokenize(t.encode(), add_bos=True, special=True) for t in json.loads(sys.stdin.read())]))
"""


def test_gguf_vocabulary_tokenizes_as_llama_cpp(gguf_files):
    """llama.cpp's tokenizer on the same file gives hearth's ids."""
    path = gguf_files("gemma4-f32", "f32")
    theirs = llama_cpp_run(LLAMA_TOKENIZE, path, TEXTS)
    for text, ids in zip(TEXTS, theirs):
        p = subprocess.run([BIN, "tokenize", path, text], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and json.loads(p.stdout) == ids, text


def test_gguf_vocabulary_tokenizes_as_tokenizer_json(gguf_files):
    """The converter's gemma4 vocabulary (tokenizer model "gemma4": tokens, types, merges)
    gives hearth the ids Hugging Face tokenizers gives from the model's tokenizer.json (BOS
    included), and those ids decode back to the text."""
    from tokenizers import Tokenizer

    path = gguf_files("gemma4-f32", "f32")
    hf = Tokenizer.from_file(os.path.join(CACHE, "tiny", "gemma4-f32", "tokenizer.json"))
    for text in TEXTS:
        p = subprocess.run([BIN, "tokenize", path, text], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        ids = json.loads(p.stdout)
        assert ids == hf.encode(text).ids, text
        p = subprocess.run([BIN, "detokenize", path, json.dumps(ids[1:])], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.rstrip("\n") == hf.decode(ids[1:], skip_special_tokens=False), text
