#!/usr/bin/env python3
"""gguf_to_mlx.py: gives mlx_lm.server the same weights as a llama GGUF that hearth and llama.cpp load.

It owns the conversion for bench/serve_load: mlx reads GGUF Q4_0/Q4_1 blocks as its own affine 4-bit
format with group 32 (scale d, bias m or -8d), which is the same numbers, so the packed tensors are kept
as they are (only renamed, and Q/K rows put back in HF's rotary order). Other block types arrive
dequantized and are re-quantized by mlx (stated in the output's NOTES). It must not write inside the
repository; the output folder is a cache ($HEARTH_CACHE/bench/mlx/<name>), rebuilt when missing.
usage: gguf_to_mlx.py MODEL.gguf OUT_DIR [--chat-template TEXT]
"""

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "bench" / "cpu_vs_llamacpp"))
from make_goldens import LLAMA_NAMES, gguf_config, gguf_field, unpermute_rope  # noqa: E402
from prepare_models import L1B  # noqa: E402

# mlx's GGUF reader keeps these block types packed (mlx/io/gguf_quants.cpp); anything else is dequantized.
PACKED_BITS = 4
GROUP = 32  # GGUF Q4_0/Q4_1 blocks hold 32 weights each
# Bits for tensors mlx hands back as float (e.g. the Q6_K token embedding of llama.cpp's Q4_0 mix):
# 6-bit affine groups of 32 (7 bits/weight with fp16 scale+bias) are the nearest mlx format to Q6_K (6.56).
REQUANT_BITS = 6
# Pre-tokenizer regexes of the GGUF `tokenizer.ggml.pre` values used here (llama.cpp's llama-vocab.cpp
# lists the same regexes; these are the published GPT-2 / Llama-3 patterns).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_name(gguf_name):
    """mlx-lm (HF) module path of a GGUF tensor base name, e.g. blk.3.attn_q -> model.layers.3.self_attn.q_proj."""
    if gguf_name == "token_embd":
        return "model.embed_tokens"
    if gguf_name == "output_norm":
        return "model.norm"
    if gguf_name == "output":
        return "lm_head"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", gguf_name)
    if not m or m.group(2) not in LLAMA_NAMES:
        raise SystemExit(f"gguf_to_mlx: unexpected GGUF tensor {gguf_name}")
    return f"model.layers.{m.group(1)}.{LLAMA_NAMES[m.group(2)]}"


def convert_weights(path, config):
    raw = mx.load(str(path))
    out, quant, notes = {}, {"group_size": GROUP, "bits": PACKED_BITS}, []
    # a 16-bit GGUF (no packed blocks at all): keep every matrix as bf16, no quantization
    # (mlx's reader hands BF16 back as float16, which holds those values exactly at weight magnitudes)
    float_model = not any(k.endswith(".scales") for k in raw)
    if float_model:
        quant = None
        notes.append("16-bit GGUF: matrices kept unquantized, as bf16")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for key in sorted(raw):
        base, kind = key.rsplit(".", 1)
        if base == "rope_freqs":
            continue  # mlx-lm recomputes Llama 3 rope scaling from config.json
        name = hf_name(base)
        arr = raw[key]
        role = base.rsplit(".", 1)[-1]
        if role in heads:
            arr = mx.array(unpermute_rope(np.array(arr), heads[role]))
        if float_model:
            out[f"{name}.{kind}"] = arr.astype(mx.bfloat16) if arr.ndim == 2 else arr
            continue
        if kind == "weight" and arr.dtype in (mx.float16, mx.bfloat16, mx.float32) and arr.ndim == 2:
            # a block type mlx does not keep packed: re-quantize, and say so
            w, s, b = mx.quantize(arr, group_size=GROUP, bits=REQUANT_BITS)
            out[f"{name}.weight"], out[f"{name}.scales"], out[f"{name}.biases"] = w, s, b
            quant[name] = {"group_size": GROUP, "bits": REQUANT_BITS}
            notes.append(f"{base}: dequantized by mlx, re-quantized to mlx {REQUANT_BITS}-bit group {GROUP}")
            continue
        out[f"{name}.{kind}"] = arr
    return out, quant, notes


def hf_tokenizer(reader, chat_template):
    """A transformers fast tokenizer rebuilt from the GGUF vocabulary (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, Regex
    from transformers import PreTrainedTokenizerFast

    if gguf_field(reader, "tokenizer.ggml.model") != "gpt2":
        raise SystemExit("gguf_to_mlx: only byte-level BPE (tokenizer.ggml.model gpt2) vocabularies are handled")
    tokens = [str(t) for t in gguf_field(reader, "tokenizer.ggml.tokens")]
    types = list(gguf_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
    if pre == "smollm":  # single digits, then GPT-2's regex (llama.cpp's "smollm")
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False)])
    elif pre == "llama-bpe":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise SystemExit(f"gguf_to_mlx: no pre-tokenizer mapping for GGUF pre '{pre}'")
    tok.decoder = decoders.ByteLevel()
    # control (3) and user-defined (4) tokens are matched whole in text, as llama.cpp and hearth do
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in (3, 4)])
    bos = tokens[int(gguf_field(reader, "tokenizer.ggml.bos_token_id"))]
    eos = tokens[int(gguf_field(reader, "tokenizer.ggml.eos_token_id"))]
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   chat_template=chat_template or gguf_field(reader, "tokenizer.chat_template"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--chat-template", default=None, help="template text when the GGUF has none")
    a = ap.parse_args()
    out = Path(a.out)
    if (out / "config.json").exists():
        print(f"gguf_to_mlx: {out} exists", file=sys.stderr)
        return
    from gguf import GGUFReader

    reader = GGUFReader(a.gguf)
    arch = gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"gguf_to_mlx: architecture {arch} not handled (llama only)")
    config = gguf_config(reader, arch)
    if "rope_freqs.weight" in [t.name for t in reader.tensors]:
        # the Llama-3.2-1B-shaped bench model: its rope factors come from these config values
        config["rope_scaling"] = {"rope_type": "llama3", "factor": L1B["rope_factor"],
                                  "low_freq_factor": L1B["rope_low"], "high_freq_factor": L1B["rope_high"],
                                  "original_max_position_embeddings": L1B["rope_orig_ctx"]}
    config["tie_word_embeddings"] = "output.weight" not in [t.name for t in reader.tensors]
    weights, quant, notes = convert_weights(a.gguf, config)
    if quant:
        config["quantization"] = quant
    config["bos_token_id"] = int(gguf_field(reader, "tokenizer.ggml.bos_token_id"))
    config["eos_token_id"] = int(gguf_field(reader, "tokenizer.ggml.eos_token_id"))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    hf_tokenizer(reader, a.chat_template).save_pretrained(str(tmp))
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    (tmp / "NOTES").write_text(f"converted from {os.path.abspath(a.gguf)} by bench/serve_load/gguf_to_mlx.py\n"
                               + "".join(n + "\n" for n in notes))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"gguf_to_mlx: wrote {out}" + (f" ({'; '.join(notes)})" if notes else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
