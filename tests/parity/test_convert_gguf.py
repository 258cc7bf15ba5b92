"""hearth convert --outtype: GGUF output, checked with the gguf package.

The gguf package (llama.cpp's own Python library) reads the file; each tensor's bytes must
equal gguf.quants.quantize of the same float input (its numpy ports of ggml's reference
quantizers), the hyperparameters must be config.json's, and the vocabulary must tokenize as
the Hugging Face tokenizer does. Then hearth serves the file: F32 output gives the logits
of the source folder.
"""
import json
import os

import numpy as np
import pytest
from test_convert import hearth  # the same runner: output captured, failure shows stderr

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
SRC = os.path.join(CACHE, "tiny", "qwen3-f32")
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
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


@pytest.fixture(scope="module")
def source():
    import mlx.core as mx

    if not os.path.isfile(os.path.join(SRC, "config.json")):
        pytest.fail(f"{SRC} missing: run tools/get_models.sh", pytrace=False)
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(os.path.join(SRC, "model.safetensors")).items()}


@pytest.mark.parametrize("outtype", TYPES)
def test_gguf_tensors_match_gguf_quantizers(outtype, source, tmp_path):
    import gguf
    from gguf.quants import quantize

    out = str(tmp_path / "m.gguf")
    hearth("convert", SRC, "--out", out, "--outtype", outtype)
    r = gguf.GGUFReader(out)
    qtype = gguf.GGMLQuantizationType[outtype.upper()]
    got = {t.name: t for t in r.tensors}
    assert sorted(got) == sorted(gguf_name(k) for k in source)
    for hf, x in source.items():
        t = got[gguf_name(hf)]
        want_type = qtype if x.ndim == 2 else gguf.GGMLQuantizationType.F32
        assert t.tensor_type == want_type, hf
        assert list(t.shape) == list(reversed(x.shape)), hf
        assert np.asarray(t.data).tobytes() == quantize(x, want_type).tobytes(), hf
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    assert field(r, "general.architecture") == "qwen3"
    for key, ck in (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
                    ("feed_forward_length", "intermediate_size"), ("attention.head_count", "num_attention_heads"),
                    ("attention.head_count_kv", "num_key_value_heads"), ("attention.key_length", "head_dim"),
                    ("context_length", "max_position_embeddings")):
        assert field(r, f"qwen3.{key}") == cfg[ck], key
    assert field(r, "qwen3.rope.freq_base") == pytest.approx(cfg["rope_theta"])
    assert field(r, "qwen3.attention.layer_norm_rms_epsilon") == pytest.approx(cfg["rms_norm_eps"])


def test_gguf_serves_as_the_source(tmp_path):
    """The F32 file is the same model: the same logits and the same tokens (checked against
    the HF tokenizer of the source)."""
    from tokenizers import Tokenizer

    out = str(tmp_path / "m.gguf")
    hearth("convert", SRC, "--out", out, "--outtype", "f32")
    ids = "[1, 5, 9, 200, 17, 3]"
    want = json.loads(hearth("trace", SRC, "--ids", ids, "--steps", "4").stdout)
    got = json.loads(hearth("trace", out, "--ids", ids, "--steps", "4").stdout)
    for a, b in zip(want["prompt"] + want["steps"], got["prompt"] + got["steps"]):
        assert [t for t, _ in a["top"]] == [t for t, _ in b["top"]]
        # same weights and ops; the loaders may order a sum differently
        assert np.allclose([v for _, v in a["top"]], [v for _, v in b["top"]], rtol=1e-5, atol=1e-5)
    tok = Tokenizer.from_file(os.path.join(SRC, "tokenizer.json"))
    for text in ["Hello world, the cat<|im_end|> runs", "  spaces\tand\nnewlines 123 4567", "ünïcödé 日本語 🙂"]:
        assert json.loads(hearth("tokenize", out, text).stdout) == tok.encode(text).ids, text
    chat = hearth("generate", out, "hi", "--max-tokens", "3")
    assert chat.returncode == 0


def test_gguf_refuses_other_families(tmp_path):
    p = hearth("convert", os.path.join(CACHE, "tiny", "llama-f32"), "--out", str(tmp_path / "x.gguf"),
               "--outtype", "q8_0", check=False)
    assert p.returncode == 1 and "qwen3" in p.stderr.decode() and not (tmp_path / "x.gguf").exists()
    p = hearth("convert", SRC, "--out", str(tmp_path / "y.gguf"), "--outtype", "q3_k", check=False)
    assert p.returncode == 1 and "--outtype q3_k" in p.stderr.decode()
