#!/usr/bin/env python3
"""bench/cpu_vs_llamacpp/prepare_models.py: puts the CPU benchmark's GGUF models into
$HEARTH_CACHE/bench (default ~/.cache/hearth/bench), idempotently: links to the real models that
tools/get_models.sh fetched, requantizes SmolLM2 to Q8_0, and writes a random-weight model with the
exact Llama-3.2-1B shapes (F16) that llama.cpp then quantizes to Q4_K_M / Q4_0 / Q8_0.
Quantization is llama.cpp's own (llama_cpp.llama_model_quantize), so both engines read the very same
files. Every output is written to a temporary name and renamed, so an interrupted run leaves no
half-written model behind. Never writes inside the repository.
usage: .venv/bin/python bench/cpu_vs_llamacpp/prepare_models.py [--no-1b] [--list]
"""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
BENCH = CACHE / "bench"
MODELS = CACHE / "models"

# install_llamacpp.sh builds llama.cpp's libraries here; the pip-installed bindings load them from
# LLAMA_CPP_LIB_PATH (an explicit setting of it wins).
LLAMACPP_LIB = BENCH / "llamacpp" / "lib"

SMOL_SRC = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_SRC = MODELS / "gemma-3-270m-q4_k_m.gguf"

# Llama-3.2-1B config.json (meta-llama/Llama-3.2-1B), the numbers that fix the shapes and the
# per-token work; the weight values do not change decode or prefill speed.
L1B = dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256,
           rope_theta=500000.0, rms_eps=1e-5, ctx=131072,
           # rope_scaling of Llama 3.2: llama3 type, factor 32, low/high freq factors 1/4, 8192 original ctx
           rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig_ctx=8192,
           bos=128000, eos=128001)
SEED = 1234  # fixed: the same file on every machine
STD = 0.02   # initializer_range of the Llama configs


def log(msg):
    print(f"prepare_models: {msg}", file=sys.stderr, flush=True)


def import_llama_cpp():
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LLAMACPP_LIB))
    # Libraries copied out of an older build may carry a RUNPATH to a build folder that is gone:
    # loading their dependencies first, by path, lets the dynamic loader match them by soname.
    lib_dir = Path(os.environ["LLAMA_CPP_LIB_PATH"])
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        if (lib_dir / name).exists():
            try:
                ctypes.CDLL(str(lib_dir / name), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass  # the bindings' own load below reports what is missing
    try:
        import llama_cpp
    except Exception as e:  # the bindings raise plain Exceptions when the library is missing
        sys.exit(f"prepare_models: cannot load llama.cpp ({e}); run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    return llama_cpp


def link(src, dst):
    """dst -> src symlink (the real models are already in the cache; no second copy)."""
    if not src.exists():
        log(f"{src} missing; running tools/get_models.sh")
        subprocess.run([str(REPO / "tools" / "get_models.sh")], check=True)
    if not src.exists():
        sys.exit(f"prepare_models: {src} still missing after tools/get_models.sh")
    if dst.is_symlink() or dst.exists():
        if dst.resolve() == src.resolve():
            return
        dst.unlink()
    dst.symlink_to(src)


def quantize(src, dst, ftype_name, requantize=False):
    """Quantizes src into dst with llama.cpp's quantizer (its standard mixes, e.g. Q4_K_M keeps some
    tensors in Q6_K), unless dst already exists."""
    if dst.exists():
        return
    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.nthread = int(os.environ.get("BENCH_THREADS", "2"))
    params.allow_requantize = requantize
    tmp = dst.with_name(dst.name + ".tmp")
    log(f"quantizing {src.name} -> {dst.name} ({ftype_name})")
    t0 = time.time()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        sys.exit(f"prepare_models: llama_model_quantize {src} -> {dst} failed with {rc}")
    tmp.rename(dst)
    log(f"  done in {time.time() - t0:.0f} s")


def gpt2_byte_chars():
    """The 256 printable characters byte-level BPE uses for raw bytes (GPT-2's byte -> unicode
    table): printable Latin-1 bytes stand for themselves, the others map to U+0100 upwards."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def synthetic_tokenizer(vocab, bos, eos):
    """A byte-level BPE vocabulary both engines accept: the 256 byte tokens (so any text encodes),
    a handful of merged tokens with their merges (GGUF writers drop empty arrays, and llama.cpp
    requires the merges key), synthetic filler tokens, and Llama-3-style control tokens at the top."""
    from gguf import TokenType
    byte_tokens = gpt2_byte_chars()
    space = byte_tokens[ord(" ")]
    merged_pairs = [(space, "t"), (space, "a"), ("h", "e"), ("i", "n"), ("r", "e"), ("o", "n")]
    tokens = byte_tokens + [a + b for a, b in merged_pairs]
    merges = [f"{a} {b}" for a, b in merged_pairs]
    n_special = 256  # Llama 3 reserves ids 128000..128255 for special tokens
    n_normal = vocab - n_special
    tokens += [f"<tok{i}>" for i in range(len(tokens), n_normal)]
    types = [TokenType.NORMAL] * n_normal
    tokens += ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(n_special - 2)]
    types += [TokenType.CONTROL] * n_special
    assert len(tokens) == vocab and tokens[bos] == "<|begin_of_text|>" and tokens[eos] == "<|end_of_text|>"
    return tokens, types, merges


def llama3_rope_factors(c):
    """rope_freqs.weight: the divisor per frequency pair that Llama 3's rope scaling applies
    (long wavelengths divided by factor, short ones kept, a smooth blend in between)."""
    low_wavelen = c["rope_orig_ctx"] / c["rope_low"]
    high_wavelen = c["rope_orig_ctx"] / c["rope_high"]
    out = []
    for i in range(0, c["head_dim"], 2):
        freq = 1.0 / (c["rope_theta"] ** (i / c["head_dim"]))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(c["rope_factor"])
        else:
            smooth = (c["rope_orig_ctx"] / wavelen - c["rope_low"]) / (c["rope_high"] - c["rope_low"])
            out.append(1.0 / ((1 - smooth) / c["rope_factor"] + smooth))
    return out


def write_random_llama_1b(dst):
    """F16 GGUF with Llama-3.2-1B shapes and N(0, 0.02) weights (norms 1), tied embeddings. Tensors
    are generated and streamed one at a time so peak memory stays near one tensor (~1 GB f32)."""
    if dst.exists():
        return
    import numpy as np
    import gguf
    c = L1B
    tmp = dst.with_name(dst.name + ".tmp")
    log(f"writing random-weight Llama-3.2-1B-shaped F16 model -> {dst}")
    t0 = time.time()
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("random-llama-3.2-1b-shape")
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_eps"])
    w.add_vocab_size(c["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, types, merges = synthetic_tokenizer(c["vocab"], c["bos"], c["eos"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(c["bos"])
    w.add_eos_token_id(c["eos"])
    w.add_add_bos_token(True)

    h, kvd, ffn = c["hidden"], c["kv_heads"] * c["head_dim"], c["ffn"]
    # (name, numpy shape [rows, cols]; GGUF stores it as ne = [cols, rows]); tied: no output.weight
    specs = [("token_embd.weight", (c["vocab"], h)), ("rope_freqs.weight", (c["head_dim"] // 2,))]
    for b in range(c["layers"]):
        p = f"blk.{b}."
        specs += [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (c["heads"] * c["head_dim"], h)),
                  (p + "attn_k.weight", (kvd, h)), (p + "attn_v.weight", (kvd, h)),
                  (p + "attn_output.weight", (h, c["heads"] * c["head_dim"])), (p + "ffn_norm.weight", (h,)),
                  (p + "ffn_gate.weight", (ffn, h)), (p + "ffn_up.weight", (ffn, h)), (p + "ffn_down.weight", (h, ffn))]
    specs.append(("output_norm.weight", (h,)))
    one_d = lambda shape: len(shape) == 1  # norms and rope factors stay F32, as converters write them
    for name, shape in specs:
        dt = np.float32 if one_d(shape) else np.float16
        w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(SEED)
    for name, shape in specs:
        if name == "rope_freqs.weight":
            arr = np.array(llama3_rope_factors(c), dtype=np.float32)
        elif one_d(shape):
            arr = np.ones(shape, dtype=np.float32)
        else:
            arr = (rng.standard_normal(shape, dtype=np.float32) * STD).astype(np.float16)
        w.write_tensor_data(arr)
        del arr
    w.close()
    tmp.rename(dst)
    log(f"  done in {time.time() - t0:.0f} s")


# (id, model label, format label, file name in $HEARTH_CACHE/bench); the order of the table.
def model_list(with_1b=True):
    rows = [("smollm2-135m-q4_1", "SmolLM2-135M-Instruct", "Q4_1", "smollm2-135m-instruct-q4_1.gguf"),
            ("smollm2-135m-q8_0", "SmolLM2-135M-Instruct", "Q8_0 (requant of Q4_1)", "smollm2-135m-instruct-q8_0.gguf"),
            ("gemma3-270m-q4_k_m", "Gemma 3 270M", "Q4_K_M", "gemma-3-270m-q4_k_m.gguf")]
    if with_1b:
        rows += [("llama1b-q4_0", "Llama-3.2-1B shape (random)", "Q4_0", "random-llama-3.2-1b-q4_0.gguf"),
                 ("llama1b-q4_k_m", "Llama-3.2-1B shape (random)", "Q4_K_M", "random-llama-3.2-1b-q4_k_m.gguf"),
                 ("llama1b-q8_0", "Llama-3.2-1B shape (random)", "Q8_0", "random-llama-3.2-1b-q8_0.gguf"),
                 # not asked for by the issue: the low-RAM quant many users pick (Q3_K with Q4_K/Q5_K/Q6_K)
                 ("llama1b-q3_k_m", "Llama-3.2-1B shape (random)", "Q3_K_M", "random-llama-3.2-1b-q3_k_m.gguf")]
    return [dict(id=i, model=m, format=f, path=str(BENCH / n)) for i, m, f, n in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-1b", action="store_true", help="skip the random Llama-3.2-1B-shaped models")
    ap.add_argument("--list", action="store_true", help="print the model list as JSON and exit")
    args = ap.parse_args()
    models = model_list(not args.no_1b)
    if args.list:
        print(json.dumps(models))
        return
    BENCH.mkdir(parents=True, exist_ok=True)
    link(SMOL_SRC, BENCH / "smollm2-135m-instruct-q4_1.gguf")
    link(GEMMA_SRC, BENCH / "gemma-3-270m-q4_k_m.gguf")
    quantize(SMOL_SRC, BENCH / "smollm2-135m-instruct-q8_0.gguf", "LLAMA_FTYPE_MOSTLY_Q8_0", requantize=True)
    # not a row of this table: bench/serve_load's 16-bit row (the batching target is for bf16)
    quantize(SMOL_SRC, BENCH / "smollm2-135m-instruct-bf16.gguf", "LLAMA_FTYPE_MOSTLY_BF16", requantize=True)
    if not args.no_1b:
        f16 = BENCH / "random-llama-3.2-1b-f16.gguf"
        write_random_llama_1b(f16)
        quantize(f16, BENCH / "random-llama-3.2-1b-q4_k_m.gguf", "LLAMA_FTYPE_MOSTLY_Q4_K_M")
        quantize(f16, BENCH / "random-llama-3.2-1b-q4_0.gguf", "LLAMA_FTYPE_MOSTLY_Q4_0")
        quantize(f16, BENCH / "random-llama-3.2-1b-q8_0.gguf", "LLAMA_FTYPE_MOSTLY_Q8_0")
        quantize(f16, BENCH / "random-llama-3.2-1b-q3_k_m.gguf", "LLAMA_FTYPE_MOSTLY_Q3_K_M")
    for m in models:
        if not Path(m["path"]).exists():
            sys.exit(f"prepare_models: {m['path']} was not produced")
    log(f"{len(models)} models ready in {BENCH}")


if __name__ == "__main__":
    main()
