#!/usr/bin/env python3
"""hearth convert --outtype q4_k_m vs llama.cpp's llama_model_quantize (Q4_K_M, no importance
matrix) on the same float model, both on the same thread count, in the same run: wall and
CPU seconds of each.

The model is random floats in Llama-3.2-1B's shape (hidden 2048, 16 layers, ffn 8192, 32/8
heads, vocab 128256, tied embeddings: 1.24B parameters; --layers makes it shorter), written
tensor by tensor as safetensors (the tokenizer files come from the tiny llama). hearth
converts that folder; llama.cpp quantizes hearth's --outtype f32 GGUF of it (the input it
needs; that conversion is not timed). Each side runs --repeat times, best wall time kept;
both outputs are then compared tensor by tensor (they must be byte-identical). Writes
bench/results/convert_gguf.md (bench/results_file.py: tables, then the full result as json).

    HEARTH_BIN=build/bin/hearth .venv/bin/python bench/convert_gguf/run.py [--threads 2] [--layers 16]
"""
import argparse
import json
import os
import platform
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
from kquant_oracle import CACHE, LLAMA_LIB, have_llama_cpp, tensor_bytes  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402

BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "build", "bin", "hearth"))


def write_model(dst, layers, seed=0):
    """A Llama-3.2-1B-shaped float32 safetensors folder, one tensor in memory at a time."""
    tiny = os.path.join(CACHE, "tiny", "llama-f32")
    os.makedirs(dst)
    for f in os.listdir(tiny):
        if "safetensors" not in f and f != "config.json":
            shutil.copy(os.path.join(tiny, f), dst)
    h, ffn, vocab, heads, kv, hd = 2048, 8192, 128256, 32, 8, 64
    cfg = json.load(open(os.path.join(tiny, "config.json")))
    cfg.update(hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=kv, head_dim=hd, vocab_size=vocab, tie_word_embeddings=True)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
                       p + "mlp.down_proj.weight": (h, ffn)})
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(seed)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape in shapes.items():
            x = np.ones(shape, np.float32) if len(shape) == 1 else \
                rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            f.write(x.tobytes())
    return int(sum(np.prod(s) for s in shapes.values()))


def best_of(repeat, cmd):
    """(best wall s, CPU s of that run: user + sys of the child) over repeat runs of cmd."""
    runs = []
    for _ in range(repeat):
        r0, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode:
            sys.exit(f"{cmd[0]} failed: {p.stderr[-2000:]}")
        runs.append((wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime))
    return min(runs)


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where the ~10 GB of model files go (default: a temp dir)")
    a = ap.parse_args()
    if not have_llama_cpp():
        sys.exit(f"llama.cpp libraries not in {LLAMA_LIB}: run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    d = tempfile.mkdtemp(dir=a.workdir)
    try:
        src = os.path.join(d, "model")
        params = write_model(src, a.layers)
        f32 = os.path.join(d, "f32.gguf")
        p = subprocess.run([BIN, "convert", src, "--out", f32, "--outtype", "f32"], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"hearth convert --outtype f32 failed: {p.stderr}")
        ours, theirs = os.path.join(d, "hearth.gguf"), os.path.join(d, "llama.gguf")

        # llama.cpp in a child process too, so both CPU times come from getrusage alike
        llama_cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import kquant_oracle as k; "
                     "k.llama_quantize(sys.argv[2], sys.argv[3], 'q4_k_m', int(sys.argv[4]))",
                     os.path.join(REPO, "tests", "parity"), f32, theirs, str(a.threads)]
        hearth_cmd = ["sh", "-c", 'rm -f "$2" && exec "$0" convert "$1" --out "$2" --outtype q4_k_m --threads "$3"',
                      BIN, src, ours, str(a.threads)]
        load0 = os.getloadavg()
        t_llama, cpu_llama = best_of(a.repeat, llama_cmd)
        t_hearth, cpu_hearth = best_of(a.repeat, hearth_cmd)
        load1 = os.getloadavg()
        got, want = tensor_bytes(ours), tensor_bytes(theirs)
        identical = sorted(got) == sorted(want) and all(got[k] == want[k] for k in want)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    res = {"benchmark": "convert to GGUF Q4_K_M: hearth convert vs llama_model_quantize", "params": params,
           "layers": a.layers, "threads": a.threads, "repeat": a.repeat, "hearth_s": round(t_hearth, 3),
           "llama_cpp_s": round(t_llama, 3), "ratio_llama_over_hearth": round(t_llama / t_hearth, 3),
           "hearth_cpu_s": round(cpu_hearth, 3), "llama_cpp_cpu_s": round(cpu_llama, 3),
           "cpu_ratio_llama_over_hearth": round(cpu_llama / cpu_hearth, 3),
           "byte_identical": identical, "loadavg_before": load0, "loadavg_after": load1,
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}}
    md = (f"# convert to GGUF Q4_K_M: hearth vs llama.cpp\n\n"
          f"Random Llama-3.2-1B-shaped float model, {a.layers} layers, {params / 1e9:.2f}B parameters, "
          f"{a.threads} threads, best of {a.repeat}. Machine: {res['machine']['cpu']}, {os.cpu_count()} cores "
          f"(shared; load average {load0[0]:.1f} before, {load1[0]:.1f} after).\n\n"
          f"| | wall s | wall ratio (llama.cpp / hearth) | CPU s (user + sys) | CPU ratio |\n"
          f"| --- | --- | --- | --- | --- |\n"
          f"| hearth convert (safetensors -> Q4_K_M) | {t_hearth:.2f} | {t_llama / t_hearth:.2f} | "
          f"{cpu_hearth:.2f} | {cpu_llama / cpu_hearth:.2f} |\n"
          f"| llama_model_quantize (F32 GGUF -> Q4_K_M) | {t_llama:.2f} | 1.00 | {cpu_llama:.2f} | 1.00 |\n\n"
          f"On a shared machine the wall times move with the other load; the CPU seconds less so.\n\n"
          f"Outputs byte-identical tensor by tensor: {'yes' if identical else 'NO'}.\n")
    results_file.write("convert_gguf", md, res)
    print(md)


if __name__ == "__main__":
    main()
