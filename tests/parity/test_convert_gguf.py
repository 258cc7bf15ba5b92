"""hearth convert --outtype: GGUF output, checked with the gguf package.

The gguf package (llama.cpp's own Python library) reads the file; each tensor's bytes must
equal gguf.quants.quantize of the same float input (its numpy ports of ggml's reference
quantizers), the hyperparameters must be config.json's, and the vocabulary must tokenize as
the Hugging Face tokenizer does. Then hearth serves the file: F32 output gives the logits
of the source folder.
"""
import json
import shutil
import os
import sys

import numpy as np
import pytest
from test_convert import hearth  # the same runner: output captured, failure shows stderr

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(CACHE, "tiny")
SRC = os.path.join(TINY, "qwen3-f32")
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
CASES = [("qwen3-f32", t) for t in TYPES] + [("llama-f32", t) for t in ("f32", "q8_0", "q4_0")]
NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, leaf = rest.rsplit(".", 1)
    return f"blk.{layer}.{NAMES[module]}.{leaf}"


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def load_source(name):
    import mlx.core as mx

    src = os.path.join(TINY, name)
    if not os.path.isfile(os.path.join(src, "config.json")):
        pytest.fail(f"{src} missing: run tools/get_models.sh", pytrace=False)
    tensors = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(os.path.join(src, "model.safetensors")).items()}
    return src, tensors, json.load(open(os.path.join(src, "config.json")))


def llama_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half q/k rows to ggml's pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg):
    """convert_hf_to_gguf.py's rope_freqs for rope_type llama3, by the formula the llama.cpp
    benchmark's model maker already writes (bench/cpu_vs_llamacpp/prepare_models.py)."""
    sys.path.insert(0, os.path.join(REPO, "bench", "cpu_vs_llamacpp"))
    from prepare_models import llama3_rope_factors as factors

    rs = cfg["rope_scaling"]
    return np.array(factors({"rope_orig_ctx": rs["original_max_position_embeddings"], "rope_low": rs["low_freq_factor"],
                             "rope_high": rs["high_freq_factor"], "rope_factor": rs["factor"],
                             "rope_theta": cfg["rope_theta"], "head_dim": cfg["head_dim"]}), dtype=np.float32)


@pytest.mark.parametrize("name,outtype", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_gguf_tensors_match_gguf_quantizers(name, outtype, tmp_path):
    import gguf
    from gguf.quants import quantize

    src, source, cfg = load_source(name)
    arch = cfg["model_type"]
    out = str(tmp_path / "m.gguf")
    hearth("convert", src, "--out", out, "--outtype", outtype)
    r = gguf.GGUFReader(out)
    qtype = gguf.GGMLQuantizationType[outtype.upper()]
    got = {t.name: t for t in r.tensors}
    extra = ["rope_freqs.weight"] if arch == "llama" else []
    assert sorted(got) == sorted([gguf_name(k) for k in source] + extra)
    for hf, x in source.items():
        t = got[gguf_name(hf)]
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            x = llama_permute(x, cfg["num_attention_heads"] if "q_proj" in hf else cfg["num_key_value_heads"])
        want_type = qtype if x.ndim == 2 else gguf.GGMLQuantizationType.F32
        assert t.tensor_type == want_type, hf
        assert list(t.shape) == list(reversed(x.shape)), hf
        assert np.asarray(t.data).tobytes() == quantize(x, want_type).tobytes(), hf
    if extra:
        # the formula in double vs hearth's float32 frequencies (as torch computes them)
        assert np.allclose(np.asarray(got["rope_freqs.weight"].data), llama3_rope_factors(cfg), rtol=1e-6)
    assert field(r, "general.architecture") == arch
    for key, ck in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
                    ("feed_forward_length", "intermediate_size"), ("attention.head_count", "num_attention_heads"),
                    ("attention.head_count_kv", "num_key_value_heads"), ("attention.key_length", "head_dim"),
                    ("context_length", "max_position_embeddings")):
        assert field(r, f"{arch}.{key}") == cfg[ck], key
    assert field(r, f"{arch}.rope.freq_base") == pytest.approx(cfg["rope_theta"])
    assert field(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(cfg["rms_norm_eps"])


@pytest.mark.parametrize("name", ["qwen3-f32", "llama-f32"])
def test_gguf_serves_as_the_source(name, tmp_path):
    """The F32 file is the same model: the same logits and the same tokens (checked against
    the HF tokenizer of the source)."""
    from tokenizers import Tokenizer

    src = os.path.join(TINY, name)
    out = str(tmp_path / "m.gguf")
    hearth("convert", src, "--out", out, "--outtype", "f32")
    ids = "[1, 5, 9, 200, 17, 3]"
    want = json.loads(hearth("trace", src, "--ids", ids, "--steps", "4").stdout)
    got = json.loads(hearth("trace", out, "--ids", ids, "--steps", "4").stdout)
    for a, b in zip(want["prompt"] + want["steps"], got["prompt"] + got["steps"]):
        assert [t for t, _ in a["top"]] == [t for t, _ in b["top"]]
        # same weights; the RoPE frequencies come from rope_freqs (float32) instead of the
        # config, a few 1e-7 relative in the logits
        assert np.allclose([v for _, v in a["top"]], [v for _, v in b["top"]], rtol=1e-5, atol=1e-5)
    tok = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
    for text in ["Hello world, the cat<|im_end|> runs", "  spaces\tand\nnewlines 123 4567", "ünïcödé 日本語 🙂"]:
        assert json.loads(hearth("tokenize", out, text).stdout) == tok.encode(text).ids, text
    assert hearth("generate", out, "hi", "--max-tokens", "3").returncode == 0


def test_gguf_pre_tokenizer_follows_the_tokenizer(tmp_path):
    """tokenizer.ggml.pre names how the source's tokenizer.json splits text, not the family:
    the tiny llama with SmolLM2's pre-tokenizer as transformers converts SmolLM2's GGUF
    (ByteLevel with its own GPT-2 regex) writes "gpt-2" (gguf reads it) and tokenizes as the
    HF tokenizer of that folder, spaces before newlines included (the llama-3 split
    "llama-bpe" gave other tokens there); SmolLM2's own pre-tokenizer (numerals one at a
    time, then ByteLevel) writes "smollm" and tokenizes as that folder's HF tokenizer; a
    pre-tokenizer no GGUF name covers is refused."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer

    src = tmp_path / "src"
    shutil.copytree(os.path.join(TINY, "llama-f32"), src)
    tj = json.load(open(src / "tokenizer.json"))
    bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    cases = [(bytelevel, "gpt-2", ["a  \n\n b", "Nate: hey!  \n \nJoanna: 12345 ok", "  spaces\tand\nnewlines 123 4567"]),
             ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bytelevel]},
              "smollm", ["x² + y² = z², ½ ⅻ ٣ 123", "Nate: hey!  \n \nJoanna: 12345 ok"])]
    for i, (pre, name, texts) in enumerate(cases):
        tj["pre_tokenizer"] = pre
        json.dump(tj, open(src / "tokenizer.json", "w"))
        out = str(tmp_path / f"m{i}.gguf")
        hearth("convert", str(src), "--out", out, "--outtype", "f32")
        f = GGUFReader(out).fields["tokenizer.ggml.pre"]
        assert bytes(f.parts[f.data[0]]).decode() == name
        tok = Tokenizer.from_file(str(src / "tokenizer.json"))
        for text in texts:
            assert json.loads(hearth("tokenize", out, text).stdout) == tok.encode(text).ids, (name, text)
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+|\\w+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    json.dump(tj, open(src / "tokenizer.json", "w"))
    p = hearth("convert", str(src), "--out", str(tmp_path / "x.gguf"), "--outtype", "f32", check=False)
    assert p.returncode == 1 and "pre-tokenizer" in p.stderr.decode() and not (tmp_path / "x.gguf").exists()


def test_gguf_refuses_other_families(tmp_path):
    p = hearth("convert", os.path.join(TINY, "gemma3-f32"), "--out", str(tmp_path / "x.gguf"), "--outtype", "q8_0",
               check=False)
    assert p.returncode == 1 and "not 'gemma3_text'" in p.stderr.decode() and not (tmp_path / "x.gguf").exists()
    p = hearth("convert", SRC, "--out", str(tmp_path / "y.gguf"), "--outtype", "q3_k", check=False)
    assert p.returncode == 1 and "--outtype q3_k" in p.stderr.decode()
