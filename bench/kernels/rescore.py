#!/usr/bin/env python3
"""bench/kernels/rescore.py: what the fast tier's exact parts cost a decoded token.

Runs rescore_bench (the output projection of SmolLM2-135M and Gemma 3 270M, one token row: the
fast matmul and the rescoring of its 16 largest logits; SmolLM2's last layer on float
activations against the int8 kernels; min over rounds) and, in the same run, `hearth bench` on
the two real GGUFs (decode tok/s); prints each part's time per token against the measured
decode time per token. Writes bench/results/logits_rescore.md. Run through
bench/kernels/rescore.sh (it builds both).
usage: rescore.py BUILD_DIR [--threads 2]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402

CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
MODELS = [("SmolLM2-135M lm_head", "SmolLM2-135M-Instruct Q4_1", CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
          ("Gemma 3 270M lm_head", "Gemma 3 270M Q4_K_M", CACHE / "models" / "gemma-3-270m-q4_k_m.gguf")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    build = Path(a.build)
    load0, started = results_file.load_average(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = subprocess.run([str(build / "rescore_bench"), str(a.threads), "200"], capture_output=True, text=True,
                         check=True).stdout
    print(out, end="")
    kern = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(.*?) \(\S+ x \S+ Q8_0\): matmul ([\d.]+) us, rescoring ([\d.]+) us", out, re.M)}
    last = re.search(r"last layer \(Q4_1, 4 calls\): int8 ([\d.]+) us, float activations ([\d.]+) us", out, re.M)
    rows = []
    for shape, label, path in MODELS:
        if not path.exists():
            sys.exit(f"rescore: {path} missing (tools/get_models.sh)")
        b = json.loads(subprocess.run([str(build / "bin" / "hearth"), "bench", str(path), "-p", "512", "-n", "128",
                                       "-t", str(a.threads), "-r", "3", "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        mm, rs = kern[shape]
        tok_us = 1e6 / b["decode_tps"]
        rows.append({"model": label, "lm_head_us": mm, "rescore_us": rs, "decode_tps": b["decode_tps"],
                     "decode_token_us": tok_us, "rescore_share_of_token": rs / tok_us})
    smol = rows[0]
    layer = {"int8_us": float(last.group(1)), "f32_us": float(last.group(2))}
    layer["added_share_of_token"] = (layer["f32_us"] - layer["int8_us"]) / smol["decode_token_us"]
    body = ["# The fast tier's exact parts: their cost per decoded token", "",
            f"{results_file.machine()}; {a.threads} threads; load average {load0} -> {results_file.load_average()}; "
            f"{started}. Made by `bench/kernels/rescore.sh`.", "",
            "Rescoring: the 16 largest logits of a row recomputed by the reference kernel on float activations "
            "(`cpu_matmul_rescore_top`, on the calling thread). lm_head and rescoring: `rescore_bench` on the model's "
            "output projection shape (random Q8_0 weights), min of 200 rounds; decode: `hearth bench -p 512 -n 128 "
            "-r 3` on the real file in the same run (under load the decode time is longer, so the share is a lower "
            "bound on a busy machine and about right on a quiet one).", "",
            "| model | lm_head matmul (us) | rescoring (us) | decode tok/s | decode us/token | rescoring / token |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        body.append(f"| {r['model']} | {r['lm_head_us']:.1f} | {r['rescore_us']:.1f} | {r['decode_tps']:.1f} | "
                    f"{r['decode_token_us']:.0f} | {100 * r['rescore_share_of_token']:.2f}% |")
    body += ["", "The last layer on float activations (`cpu_matmul_precise`, Q4_0 / Q4_1 / Q8_0 weights): SmolLM2-135M's "
             "last layer (Q4_1; q/k/v fused, o, gate/up fused, down, one token row, random weights), the int8 kernels "
             "against the float-activation ones, min of 200 rounds; its decode time per token from the row above. "
             "(A prompt step runs the last layer's o projection and MLP only for the rows whose logits it returns, "
             "so prefill pays for q/k/v alone.)", "",
             "| model | last layer, int8 activations (us) | float activations (us) | added (us) | added / token |",
             "| --- | ---: | ---: | ---: | ---: |",
             f"| {smol['model']} | {layer['int8_us']:.1f} | {layer['f32_us']:.1f} | "
             f"{layer['f32_us'] - layer['int8_us']:.1f} | {100 * layer['added_share_of_token']:.2f}% |"]
    text = "\n".join(body) + "\n"
    print(text)
    results_file.write("logits_rescore", text, {"threads": a.threads, "rows": rows, "last_layer": layer,
                                                "kernel_output": out})


if __name__ == "__main__":
    main()
