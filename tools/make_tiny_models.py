#!/usr/bin/env python3
"""make_tiny_models.py: builds tiny random-weight models (llama (also with longrope RoPE), qwen3, gemma3_text, minicpm, qwen3_moe, qwen3_5, qwen3_5_moe, gemma4_text) in every
weight form hearth reads (f32, bf16, MLX affine q4/q8 with group 64/32) under
$HEARTH_CACHE/tiny/<family>-<form>/, written by mlx-lm's own save path so the layout is what
mlx-lm produces. Tokenizers are small but real-format, trained offline with HF `tokenizers`.
Deterministic (fixed seeds); must not download anything or write inside the repository.
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests" / "parity" / "templates"
SEED = 20250101  # any fixed value; changing it changes every golden

# Pre-tokenizer regexes of the real models (Qwen2/Qwen3 tokenizer.json and Llama 3's):
# they differ only in how digits group (one at a time vs up to three).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Training text for the tiny tokenizers: enough English, code, CJK and emoji that merges
# exist for each; everything else falls back to bytes, which the tests want to exercise too.
TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A local language model runs on your own
machine: it loads the weights, tokenizes the prompt, and predicts one token at a time.
Greedy decoding always picks the most likely next token; sampling draws from the
distribution after temperature, top-k and top-p have shaped it. The model's answer isn't
magic, it's arithmetic: matrix multiplications, normalization, attention and a softmax.
We'll test the tokenizer on numbers like 3.14159, 2025, 1,000,000 and 42 as well.
Hello, world! How are you today? I'm fine, thanks. They've said we'd arrive by 10:30.

def fibonacci(n: int) -> int:
    \"\"\"Return the n-th Fibonacci number.\"\"\"
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

if __name__ == "__main__":
    print([fibonacci(i) for i in range(10)])

#include <stdio.h>
int main(void) {
    for (int i = 0; i < 10; i++) {
        printf("%d\\n", i * i);
    }
    return 0;
}

{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"role": "user", "content": "What is the capital of France?"}

机器学习是人工智能的一个分支。今天天气很好，我们去公园散步吧。
自然言語処理はとても面白いです。東京は日本の首都です。ありがとうございます。
안녕하세요. 저는 학생입니다. 한국어를 공부하고 있어요.
Emoji: 😀 😂 👍 🎉 ❤️ 🚀 👩‍💻 🇫🇷 👋🏽 — and symbols like © ® ™ € £ ¥ → ← ∑ √ ∞.
Café, naïve, résumé, über, façade, São Paulo, Zürich, Ångström.
"""


def train_byte_level(regex, vocab_size, specials, added, ignore_merges):
    """Byte-level BPE like Llama 3 / Qwen2: Split(regex) + ByteLevel without its own regex."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    # Special tokens go after the learned vocab, as in the real models (ids near the top).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in added])
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = ignore_merges  # Llama 3 sets it, Qwen2 does not
    return Tokenizer.from_str(json.dumps(spec))


def train_sentencepiece_bpe(vocab_size, specials):
    """SentencePiece-style BPE like Gemma's tokenizer.json: spaces become U+2581, unknown
    characters fall back to <0xXX> byte tokens; specials first, then the 256 bytes."""
    tmp = Tokenizer(models.BPE())
    tmp.normalizer = normalizers.Replace(" ", "\u2581")
    # Training only: keep merges from crossing word starts, like SentencePiece pieces.
    tmp.pre_tokenizer = pre_tokenizers.Split("\u2581", behavior="merged_with_next")
    tmp.train_from_iterator([TRAIN_TEXT], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    learned = json.loads(tmp.to_str())["model"]
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B:1",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    return tok


def template(name):
    path = TEMPLATES / f"{name}.jinja"
    if not path.exists():
        sys.exit(f"make_tiny_models: missing chat template {path}")
    return path.read_text()


def family_specs():
    """Per family: tokenizer, tokenizer_config, generation_config, model config."""
    specs = {}

    llama_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"]
    tok = train_byte_level(LLAMA3_REGEX, 600, llama_specials, [], ignore_merges=True)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    ids = {s: tok.token_to_id(s) for s in llama_specials}
    eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
    specs["llama"] = dict(
        tokenizer=tok,
        tokenizer_config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                          "chat_template": template("llama3.1")},
        generation_config={"bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": eos, "do_sample": False},
        config={"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 3, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                "max_position_embeddings": 131072, "tie_word_embeddings": True, "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False,
                "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": eos})

    # MiniCPM (mlx-lm models/minicpm.py) on the llama tokenizer and template: what the tiny
    # model checks is the forward pass (scale_emb, the scaled residual, the lm_head divisor;
    # tie_word_embeddings false, so the divisor applies). head_dim = hidden / heads.
    specs["minicpm"] = dict(
        tokenizer=specs["llama"]["tokenizer"],
        tokenizer_config=dict(specs["llama"]["tokenizer_config"]),
        generation_config=dict(specs["llama"]["generation_config"]),
        config={"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 3, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "max_position_embeddings": 4096, "scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 256,
                "tie_word_embeddings": False, "hidden_act": "silu",
                "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": eos})

    # Llama with "longrope" RoPE scaling (mlx-lm's SuScaledRoPE: per-frequency long_factor, q and
    # k scaled by sqrt(1 + ln(4096 / 1024) / ln(1024))), MiniCPM5-1B's 8:1 grouped-query shape
    # (16 query / 2 KV heads there). MiniCPM4 pairs longrope with the minicpm family; transformers'
    # generic config, which mlx-lm's tokenizer loading builds for model types it does not know,
    # cannot read a longrope minicpm config, so the llama family carries the test.
    specs["llama_longrope"] = dict(specs["llama"], config=dict(
        specs["llama"]["config"], num_attention_heads=8, num_key_value_heads=1, max_position_embeddings=4096,
        rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 1024,
                      "long_factor": [1.0, 1.1, 1.3, 1.7, 2.4, 3.5, 5.0, 7.0],
                      "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]}))

    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    qwen_added = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # not special in Qwen3
    tok = train_byte_level(QWEN2_REGEX, 700, qwen_specials, qwen_added, ignore_merges=False)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    ids = {s: tok.token_to_id(s) for s in qwen_specials}
    specs["qwen3"] = dict(
        tokenizer=tok,
        tokenizer_config={"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                          "chat_template": template("qwen3")},
        generation_config={"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                           "pad_token_id": ids["<|endoftext|>"], "do_sample": False},
        config={"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 128,
                "num_hidden_layers": 2, "intermediate_size": 256, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "max_position_embeddings": 40960, "tie_word_embeddings": False, "hidden_act": "silu",
                "attention_bias": False, "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": ids["<|im_end|>"]})

    # Qwen3-MoE on the qwen3 tokenizer and template: 8 experts, 2 per token, layer 1 dense
    # (mlp_only_layers) so both MLP kinds run; mlx-lm keeps the router at 8 bits when quantizing.
    specs["qwen3_moe"] = dict(
        tokenizer=specs["qwen3"]["tokenizer"],
        tokenizer_config=dict(specs["qwen3"]["tokenizer_config"]),
        generation_config=dict(specs["qwen3"]["generation_config"]),
        config={"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 3, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True,
                "max_position_embeddings": 40960, "tie_word_embeddings": False, "hidden_act": "silu",
                "bos_token_id": specs["qwen3"]["config"]["bos_token_id"],
                "eos_token_id": specs["qwen3"]["config"]["eos_token_id"]})

    # ---- qwen3_5 (hybrid Gated DeltaNet; mlx-lm models/qwen3_5.py) ----
    # Six layers, full attention every third (linear, linear, full, linear, linear, full), so
    # several Gated DeltaNet layers run before each gated-attention one; 4 value heads over 2
    # key heads (the repeat), head_dim 32 with partial RoPE on its first 8 dims. The config is
    # flat (no text_config), as mlx-lm's qwen3_5.ModelArgs.from_dict accepts it.
    qwen35 = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "hidden_size": 64,
              "num_hidden_layers": 6, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
              "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
              "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 3,
              "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 2,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                  "mrope_section": [2, 1, 1]},
              "max_position_embeddings": 40960, "tie_word_embeddings": False,
              "bos_token_id": specs["qwen3"]["config"]["bos_token_id"],
              "eos_token_id": specs["qwen3"]["config"]["eos_token_id"]}
    specs["qwen3_5"] = dict(tokenizer=specs["qwen3"]["tokenizer"],
                            tokenizer_config=dict(specs["qwen3"]["tokenizer_config"]),
                            generation_config=dict(specs["qwen3"]["generation_config"]), config=qwen35)
    # qwen3_5_moe (mlx-lm models/qwen3_5_moe.py): the same hybrid with every MLP a mixture of
    # 8 experts, 2 per token, plus a shared expert behind its sigmoid gate (128 wide, not the
    # routed experts' 64, so mixing the two widths up shows; both multiples of 64 so that every
    # expert matrix quantizes at group 64: mlx's CPU gather_mm takes float32 only).
    specs["qwen3_5_moe"] = dict(tokenizer=specs["qwen3"]["tokenizer"],
                                tokenizer_config=dict(specs["qwen3"]["tokenizer_config"]),
                                generation_config=dict(specs["qwen3"]["generation_config"]),
                                config={**json.loads(json.dumps(qwen35)), "model_type": "qwen3_5_moe",
                                        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                        "shared_expert_intermediate_size": 128, "norm_topk_prob": True,
                                        "decoder_sparse_step": 1})
    # ---- end qwen3_5 ----

    gemma_specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    tok = train_sentencepiece_bpe(500, gemma_specials)
    ids = {s: tok.token_to_id(s) for s in gemma_specials}
    specs["gemma3"] = dict(
        tokenizer=tok,
        tokenizer_config={"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                          "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
                          "chat_template": template("gemma3")},
        generation_config={"bos_token_id": ids["<bos>"], "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]],
                           "pad_token_id": ids["<pad>"], "do_sample": False},
        # sliding_window 16 with pattern 2: layers 0 and 2 slide, 1 and 3 are global, and
        # the goldens' prompts + 32 generated tokens run past the window.
        # query_pre_attn_scalar differs from head_dim on purpose, so using the wrong one shows.
        config={"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 4, "intermediate_size": 128, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 48, "sliding_window": 16,
                "sliding_window_pattern": 2,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
                "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
                "final_logit_softcapping": None, "attn_logit_softcapping": None,
                "tie_word_embeddings": True, "bos_token_id": ids["<bos>"],
                "eos_token_id": [ids["<eos>"], ids["<end_of_turn>"]], "pad_token_id": ids["<pad>"]})

    # --- gemma4_text (mlx-lm models/gemma4_text.py).
    # Six layers: three sliding (head_dim 16, 2 KV heads) before a full one (global_head_dim
    # 32, 1 KV head, values = keys, proportional RoPE on a quarter of the dims), then two
    # that read the KV of the last sliding / full layer before them (num_kv_shared_layers 2)
    # with double-wide MLPs; per-layer inputs of 32 per layer; window 16, so the goldens'
    # prompts run past it; final softcap 30.
    # Its tokenizer has Gemma 4's control tokens (turns, the thought channel, tool sentinels)
    # and its template is Gemma 4's own, so mlx-lm infers thinking and the gemma4 tool parser.
    g4_specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|channel>", "<channel|>",
                   "<|tool_call>", "<tool_call|>", "<|tool>", "<tool|>", "<|tool_response>", "<tool_response|>",
                   '<|"|>', "<|think|>", "<|image|>", "<|audio|>", "<|video|>"]
    tok = train_sentencepiece_bpe(500, g4_specials)
    g4 = {s: tok.token_to_id(s) for s in g4_specials}
    specs["gemma4"] = dict(
        tokenizer=tok,
        tokenizer_config={"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                          "add_bos_token": True, "add_eos_token": False,
                          "chat_template": template("google-gemma-4-31B-it")},
        generation_config={"bos_token_id": g4["<bos>"], "eos_token_id": [g4["<eos>"], g4["<turn|>"]],
                           "pad_token_id": g4["<pad>"], "do_sample": False},
        config={"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 6, "intermediate_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
                "num_global_key_value_heads": 1, "attention_k_eq_v": True, "num_kv_shared_layers": 2,
                "hidden_size_per_layer_input": 32, "use_double_wide_mlp": True, "sliding_window": 16,
                "layer_types": ["sliding_attention"] * 3 + ["full_attention", "sliding_attention",
                                                            "full_attention"],
                "rope_parameters": {
                    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                       "rope_type": "proportional"},
                    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
                "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
                "enable_moe_block": False, "tie_word_embeddings": True,
                "bos_token_id": g4["<bos>"], "eos_token_id": [g4["<eos>"], g4["<turn|>"]],
                "pad_token_id": g4["<pad>"]})
    # The 26B-A4B form: every layer's dense MLP plus 8 experts (2 per token), values = keys on
    # full layers, no shared KV and no per-layer inputs.
    moe = dict(specs["gemma4"]["config"], enable_moe_block=True, num_experts=8, top_k_experts=2,
               moe_intermediate_size=64, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
               use_double_wide_mlp=False)
    specs["gemma4_moe"] = dict(tokenizer=specs["gemma4"]["tokenizer"],
                               tokenizer_config=dict(specs["gemma4"]["tokenizer_config"]),
                               generation_config=dict(specs["gemma4"]["generation_config"]), config=moe)
    # --- end gemma4_text

    for spec in specs.values():
        spec["config"]["vocab_size"] = spec["tokenizer"].get_vocab_size(with_added_tokens=True)
        if spec["config"]["model_type"] == "gemma4_text":
            spec["config"]["vocab_size_per_layer_input"] = spec["config"]["vocab_size"]
        spec["tokenizer_config"].update({"tokenizer_class": "PreTrainedTokenizerFast",
                                         "model_max_length": 4096, "clean_up_tokenization_spaces": False})
    return specs


def build_model(family, config, init):
    """Random weights from a fixed seed, then rescaled (see INIT) so the tiny model's greedy
    output varies and its logits have top-1/top-2 gaps well above rounding noise."""
    import importlib
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(SEED + sum(map(ord, family)))
    model = module.Model(module.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name, w in params.items():
        if "norm" in name:
            center = init["final_norm"] if name == "model.norm.weight" else \
                init["post_norm"] if ".post_" in name else init["norm"]
            params[name] = center + 0.2 * mx.random.normal(w.shape)
        elif "embed_tokens" in name:
            params[name] = init["embed_std"] * mx.random.normal(w.shape)
        elif name == "lm_head.weight":
            params[name] = init["lm_head_scale"] * w
        elif "proj" in name:
            params[name] = init["proj_scale"] * w
        elif name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):  # gemma4_text: ones by default
            params[name] = 0.5 + mx.random.uniform(shape=w.shape)
    if config.get("tie_word_embeddings", True) and "lm_head.weight" in params:
        del params["lm_head.weight"]
    model.load_weights(list(params.items()), strict=False)
    if hasattr(model, "sanitize") and "lm_head.weight" not in params:
        model.sanitize(params)  # gemma3_text drops its lm_head when the weights have none
    mx.eval(model.parameters())
    return model


# Weight rescaling per family, found by trying a few values and looking at greedy output:
# with mlx's default init, tied models just echo their input token (the embedding dominates
# the residual) and untied ones have logits ~0.6 wide with near-ties. Gemma normalizes each
# block's output (post_*_layernorm, scale 1+w) and multiplies embeddings by sqrt(hidden), so
# it needs small embeddings and large post-norm scales instead of larger projections.
INIT = {
    "llama": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=4.0, lm_head_scale=1.0),
    "qwen3": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=4.0, lm_head_scale=6.0),
    "gemma3": dict(norm=0.0, post_norm=5.0, final_norm=3.0, embed_std=0.125, proj_scale=1.0, lm_head_scale=1.0),
    # scale_emb 12 multiplies the embeddings: small ones keep the residual from drowning the
    # blocks; projections at 2x (not 4x) keep the int8-activation tier near the golden (q4g64)
    "minicpm": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=0.25, proj_scale=2.0, lm_head_scale=1.0),
    "llama_longrope": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=4.0, lm_head_scale=1.0),
    "qwen3_moe": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=4.0, lm_head_scale=6.0),
    # qwen3_5 / qwen3_5_moe at mlx's own projection init (1x): at 2x-4x their int8-activation
    # tier drifted 15-117% from the golden (mlx-lm itself, its matmul inputs rounded to int8 per
    # 32 values, did too: expert routing and the delta rule amplify it); at 1x, about 1%
    "qwen3_5": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=1.0, lm_head_scale=6.0),
    "qwen3_5_moe": dict(norm=1.0, post_norm=1.0, final_norm=1.0, embed_std=1.0, proj_scale=1.0, lm_head_scale=6.0),
    # Gemma 4's norms scale by w (not 1 + w): centred on 1, the post-norms larger as gemma3's
    "gemma4": dict(norm=1.0, post_norm=3.0, final_norm=3.0, embed_std=0.125, proj_scale=1.0, lm_head_scale=1.0),
    "gemma4_moe": dict(norm=1.0, post_norm=3.0, final_norm=3.0, embed_std=0.125, proj_scale=1.0, lm_head_scale=1.0),
}


FORMS = {"f32": None, "bf16": None, "q4g64": (4, 64), "q4g32": (4, 32), "q8g64": (8, 64), "q8g32": (8, 32)}
# One more width per family for MLX's other affine widths (5, 3 and 6 bits), whose bit streams
# cross byte boundaries: quantized from the same seeded bf16 weights, so adding them changes no
# other model's bytes.
EXTRA_FORMS = {"llama": {"q5g64": (5, 64)}, "qwen3": {"q3g32": (3, 32)}, "gemma3": {"q6g64": (6, 64)},
               # mixed precision as `mlx_lm.convert --quant-predicate mixed_4_6` writes it: per-module
               # bits in config.json (v_proj / down_proj of some layers at 6 bits, the rest at 4)
               "gemma4": {"mixed46": "mixed_4_6"}}


def qwen3_5_mixed(path, module):
    """Mixed precision as mlx-lm's recipes write it (per-module bits in config.json): the Gated
    DeltaNet projections at 8 bits, the MLPs at 4 bits in groups of 32, the rest 4-bit g64."""
    if "linear_attn" in path:
        return {"group_size": 64, "bits": 8}
    if ".mlp." in path:
        return {"group_size": 32, "bits": 4}
    return True


EXTRA_FORMS["qwen3_5"] = {"mixed": (4, 64, qwen3_5_mixed)}


# Families added later take few forms (float, bf16, one quantization): the formats
# themselves are covered by the families above. qwen3_moe has no bf16 form: mlx's CPU
# gather_mm (the experts' matmul) takes float32 only, so mlx-lm could not be its oracle.
FEW_FORMS = {"minicpm": ("f32", "bf16", "q4g64"), "llama_longrope": ("f32",), "qwen3_moe": ("f32", "q4g64"),
             "qwen3_5": ("f32", "bf16", "q4g64", "q8g64", "mixed"), "qwen3_5_moe": ("f32", "q4g64"),
             "gemma4": ("f32", "bf16", "q4g64", "q8g64", "mixed46"), "gemma4_moe": ("f32", "q4g64")}



def family_forms(family):
    forms = {**FORMS, **EXTRA_FORMS.get(family, {})}
    if family in FEW_FORMS:
        forms = {k: v for k, v in forms.items() if k in FEW_FORMS[family]}
    return forms


def save_form(family, spec, form, src_dir, out_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer_wrapper
    from mlx_lm.utils import quantize_model, save

    config = json.loads(json.dumps(spec["config"]))
    model = build_model(family, config, INIT[family])
    if form == "f32":
        config["torch_dtype"] = "float32"
    else:
        # Quantized forms start from bf16 weights, as mlx_lm.convert does for bf16 checkpoints,
        # so scales/biases and the unquantized norms are bf16 too.
        model.set_dtype(mx.bfloat16)
        config["torch_dtype"] = "bfloat16"
    if isinstance(family_forms(family)[form], str):
        from mlx_lm.convert import mixed_quant_predicate_builder
        predicate = mixed_quant_predicate_builder(family_forms(family)[form], model, group_size=64)
        model, config = quantize_model(model, config, group_size=64, bits=4, quant_predicate=predicate)
    elif family_forms(family)[form]:
        bits, group, *predicate = family_forms(family)[form]
        model, config = quantize_model(model, config, group_size=group, bits=bits,
                                       quant_predicate=predicate[0] if predicate else None)
    tokenizer = load_tokenizer_wrapper(src_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    save(out_dir, src_dir, model, tokenizer, config, donate_model=False)


def self_check(path):
    from mlx_lm import generate, load
    model, tokenizer = load(str(path))
    text = generate(model, tokenizer, prompt="Hello world", max_tokens=4, verbose=False)
    if not isinstance(text, str):
        raise RuntimeError(f"{path}: generate returned {type(text)}")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="default: $HEARTH_CACHE/tiny (HEARTH_CACHE=~/.cache/hearth)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated families")
    args = ap.parse_args()
    cache = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
    out = Path(args.out) if args.out else cache / "tiny"
    out.mkdir(parents=True, exist_ok=True)
    log = (lambda *a: None) if args.quiet else print
    specs = family_specs()
    for family, spec in specs.items():
        if args.only and family not in args.only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp)
            # The "source checkpoint" folder mlx-lm's save() copies tokenizer and
            # generation_config from, as if converting from a Hugging Face download.
            spec["tokenizer"].save(str(src / "tokenizer.json"))
            (src / "tokenizer_config.json").write_text(json.dumps(spec["tokenizer_config"], indent=2))
            (src / "generation_config.json").write_text(json.dumps(spec["generation_config"], indent=2))
            (src / "config.json").write_text(json.dumps(spec["config"], indent=2))
            for form in family_forms(family):
                dst = out / f"{family}-{form}"
                sink = io.StringIO()
                with contextlib.redirect_stdout(sink):  # quantize_model prints [INFO] lines
                    save_form(family, spec, form, src, dst)
                    sample = self_check(dst)
                size = sum(f.stat().st_size for f in dst.iterdir() if f.is_file())
                log(f"{dst.name}: vocab {spec['config']['vocab_size']}, {size / 1024:.0f} KiB, "
                    f"mlx-lm generates {sample!r}")


if __name__ == "__main__":
    main()
