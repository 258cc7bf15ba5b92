"""K-quant GGUF output: the oracle (llama.cpp's llama_model_quantize through ctypes) and the
deterministic float model that test_convert_gguf_kquant.py and tools/make_kquant_goldens.py
share.

kquant_model(dir) writes a qwen3-shaped float safetensors folder whose rows are made to probe
the quantizers: pseudo-random rows at many magnitudes (from an integer hash, so the floats
are the same on every machine and numpy version), all-zero rows, constant rows, rows below
ggml's 1e-15 group threshold, one huge outlier in a row, all-positive and all-negative rows,
rows of exact half-step values (rounding ties). Rows are 256 or 512 wide: every tensor is
K-quantized, none falls back (the tiny models cover the fallbacks).
"""
import ctypes
import hashlib
import json
import os
import shutil

import numpy as np

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
LLAMA_LIB = os.path.realpath(os.environ.get("LLAMA_CPP_LIB_PATH", os.path.join(CACHE, "bench", "llamacpp", "lib")))
FTYPES = {"q6_k": 18, "q4_k_m": 15}  # llama.h's LLAMA_FTYPE_MOSTLY_Q6_K, _Q4_K_M


def have_llama_cpp():
    return os.path.isfile(os.path.join(LLAMA_LIB, "libllama.so"))


class QuantizeParams(ctypes.Structure):
    """llama.h's llama_model_quantize_params (llama-cpp-python 0.3.36's vendor tree)."""
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


_lib = None


def llama_quantize(f32_gguf, out, outtype, nthread=1):
    """llama.cpp's quantizer on an F32 GGUF, default parameters (no importance matrix)."""
    global _lib
    if _lib is None:
        for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so", "libllama.so"):
            _lib = ctypes.CDLL(os.path.join(LLAMA_LIB, name), mode=ctypes.RTLD_GLOBAL)
        _lib.llama_model_quantize_default_params.restype = QuantizeParams
        _lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
        _lib.llama_model_quantize.restype = ctypes.c_uint32
        _lib.llama_backend_init()
    p = _lib.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPES[outtype], nthread
    rc = _lib.llama_model_quantize(f32_gguf.encode(), out.encode(), ctypes.byref(p))
    assert rc == 0, f"llama_model_quantize({f32_gguf}, {outtype}) returned {rc}"


def tensor_bytes(path):
    """{name: (ggml type name, bytes)} of a GGUF file (llama.cpp's gguf package reads it)."""
    import gguf

    return {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(path).tensors}


def digests(path):
    return {name: [kind, hashlib.sha256(data).hexdigest()] for name, (kind, data) in tensor_bytes(path).items()}


def _uniform(seed, n):
    """n floats in [-1, 1) from a 64-bit integer hash (splitmix64) of seed and the index."""
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(40)).astype(np.float64) / float(1 << 23) - 1.0).astype(np.float32)


def _matrix(seed, rows, cols):
    x = _uniform(seed, rows * cols).reshape(rows, cols)
    x *= np.float32(0.05) * (np.float32(2.0) ** ((np.arange(rows) % 9) - 4)).astype(np.float32)[:, None]
    special = [np.zeros(cols), np.full(cols, 0.37), 1e-17 * _uniform(seed + 1, cols), np.abs(x[0]) + 0.01,
               -np.abs(x[1]) - 0.01, np.round(x[2] * 64) / 128, np.where(np.arange(cols) == 5, 40.0, x[3])]
    mixed = x[4].copy()
    mixed[: cols // 2] *= 1000.0  # one half of each super-block a thousand times the other
    special.append(mixed)
    for i, row in enumerate(special):
        if i < rows:
            x[rows - 1 - i] = row
    return x.astype(np.float32)


def kquant_model(dst, tiny_qwen3):
    """Writes the probe model to dst (config and tokenizer from the tiny qwen3 folder)."""
    from safetensors.numpy import save_file

    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(tiny_qwen3):
        if "safetensors" not in f and f != "config.json" and os.path.isfile(os.path.join(tiny_qwen3, f)):
            shutil.copy(os.path.join(tiny_qwen3, f), dst)
    cfg = json.load(open(os.path.join(tiny_qwen3, "config.json")))
    cfg.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
    h, f, v, L, hd = 256, 512, cfg["vocab_size"], 4, 64
    t, seed = {}, 1
    shapes = {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (4 * hd, h), p + "self_attn.k_proj.weight": (2 * hd, h),
                       p + "self_attn.v_proj.weight": (2 * hd, h), p + "self_attn.o_proj.weight": (h, 4 * hd),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    for name, (r, c) in shapes.items():
        t[name] = _matrix(seed, r, c)
        seed += 7
    norms = ["model.norm.weight"] + [f"model.layers.{i}.{n}" for i in range(L) for n in
                                     ("input_layernorm.weight", "post_attention_layernorm.weight")]
    for n in norms:
        t[n] = np.ones(h, np.float32)
    for i in range(L):
        for n in ("q_norm", "k_norm"):
            t[f"model.layers.{i}.self_attn.{n}.weight"] = np.ones(hd, np.float32)
    save_file(t, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst
