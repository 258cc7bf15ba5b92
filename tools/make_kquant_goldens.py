#!/usr/bin/env python3
"""Writes tests/parity/data/kquant_sha256.json: the sha256 of every tensor llama.cpp's quantizer
(llama_model_quantize through ctypes, no importance matrix) writes for --outtype q6_k and
q4_k_m, for the tiny qwen3 and llama models and the probe model of kquant_oracle.py, with the
sha256 of each source float tensor so the test can tell a changed input from a changed output.

The oracle's input is hearth's own --outtype f32 file (plain float copies of the weights;
test_convert_gguf.py checks those bytes against the gguf package). Needs llama.cpp's
libraries (bench/cpu_vs_llamacpp/install_llamacpp.sh, or LLAMA_CPP_LIB_PATH) and a hearth build:
    HEARTH_BIN=build/bin/hearth .venv/bin/python tools/make_kquant_goldens.py
"""
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
from kquant_oracle import CACHE, FTYPES, digests, have_llama_cpp, kquant_model, llama_quantize  # noqa: E402

BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "build", "bin", "hearth"))
TINY = os.path.join(CACHE, "tiny")
OUT = os.path.join(REPO, "tests", "parity", "data", "kquant_sha256.json")


def main():
    if not have_llama_cpp():
        sys.exit("llama.cpp libraries not found: run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    out = {}
    with tempfile.TemporaryDirectory() as d:
        models = {"qwen3-f32": os.path.join(TINY, "qwen3-f32"), "llama-f32": os.path.join(TINY, "llama-f32"),
                  "probe": kquant_model(os.path.join(d, "probe"), os.path.join(TINY, "qwen3-f32"))}
        for name, src in models.items():
            f32 = os.path.join(d, name + ".gguf")
            subprocess.run([BIN, "convert", src, "--out", f32, "--outtype", "f32"], check=True)
            out[name] = {"source": digests(f32)}
            for outtype in FTYPES:
                q = os.path.join(d, f"{name}-{outtype}.gguf")
                llama_quantize(f32, q, outtype)
                out[name][outtype] = digests(q)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
