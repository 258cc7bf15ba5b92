#!/usr/bin/env python3
"""train_ceiling.py: how far `hearth train` (LoRA SFT, train_cpu.py's setup: SmolLM2-135M f32,
rank 8, the last 16 layers, batch 1, sequences of 512, 2 threads) is from this machine's
float32 ceiling, all measured in one run: the floating-point work of one step per trained
token, counted from the model's shapes (the arithmetic is printed and written out); the
AVX-512 FMA issue rate of 2 threads and tr_gemm's rate on the projection shapes and on a
2048^3 square product (bench/train/gemm_bench.c, built here against --lib); numpy's BLAS
on the same square product with 2 threads; and hearth's tokens/s (median of the steps after
the first). From these: the GFLOP/s hearth reaches, its fraction of each ceiling, the
tokens/s each ceiling allows, and what 400 tokens/s (issue 36) asks of the machine. Writes
bench/results/train_ceiling.md.

    .venv/bin/python bench/train/train_ceiling.py [--lib build/libhearth.a] [--steps 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
import train_cpu  # noqa: E402

RANK, LORA_LAYERS, SEQ = 8, 16, 512
NUMPY_SQUARE = """
import sys, time
import numpy as np
n = 2048
a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
a @ b
best = min((lambda t0: (a @ b, time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))
print(2 * n ** 3 / best / 1e9)
"""


def step_flops(cfg, T):
    """The floating-point operations (2 per multiply-add) of one sft step on a sequence of T
    positions, by part: what hearth's step computes, no more (causal attention counts the
    T (T + 1) / 2 unmasked scores; the frozen layers below the LoRA ones get no backward; the
    lowest LoRA layer's input gradient through q, k, v is not computed)."""
    D, L, Hq, Hkv, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size", "vocab_size"))
    hd = D // Hq
    qd, kd = Hq * hd, Hkv * hd
    proj = D * qd + 2 * D * kd + qd * D + 3 * D * F  # multiply-adds per token: q, k, v, o, gate, up, down
    sides = (D + qd) + 2 * (D + kd) + (qd + D) + 2 * (D + F) + (F + D)  # sum of in + out over the 7
    attn = 2 * Hq * hd * T * (T + 1) // 2  # Q K^T and P V, causal: per sequence
    parts = {
        "forward projections, all layers": 2 * L * proj * T,
        "forward attention, all layers": 2 * L * attn,
        "forward LoRA (x A, then B)": 2 * LORA_LAYERS * RANK * sides * T,
        "LM head forward (logits)": 2 * D * V * T,
        "LM head backward (input gradient)": 2 * D * V * T,
        "backward projections (input gradients), LoRA layers": 2 * (LORA_LAYERS * proj - (D * qd + 2 * D * kd)) * T,
        "backward attention (4 products), LoRA layers": 2 * LORA_LAYERS * 2 * attn,
        "backward LoRA (4 products each)": 2 * LORA_LAYERS * 2 * RANK * sides * T,
    }
    arithmetic = (f"D {D}, layers {L} ({LORA_LAYERS} with LoRA), heads {Hq} / {Hkv} kv of {hd}, ffn {F}, vocab {V}, "
                  f"rank {RANK}, T {T}: a projection pass is {proj:,} multiply-adds a token (q {D}x{qd}, k and v "
                  f"{D}x{kd}, o {qd}x{D}, gate and up {D}x{F}, down {F}x{D}); LoRA {RANK} x {sides:,} per pass; "
                  f"causal attention {attn:,} per sequence and layer (2 x {Hq} heads x {hd} x T(T+1)/2); "
                  f"the LM head {D * V:,} each way")
    return parts, arithmetic


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libhearth.a"),
                    help="libhearth.a to build gemm_bench with")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(train_cpu.MODEL, "config.json")))
    T = SEQ - 1  # 512 tokens: 511 positions predict the next one
    parts, arithmetic = step_flops(cfg, T)
    total = sum(parts.values())
    per_token = total / T
    tmp = tempfile.mkdtemp(prefix="hearth-train-ceiling-")
    libs = subprocess.run(["pkg-config", "--libs", "jansson", "libpcre2-8", "libutf8proc"], check=True,
                          capture_output=True, text=True).stdout.split()
    gb = os.path.join(tmp, "gemm_bench")
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-I" + os.path.join(REPO, "include"), "-I" + os.path.join(REPO, "src"),
                    os.path.join(HERE, "gemm_bench.c"), a.lib] + libs + ["-lm", "-pthread", "-o", gb], check=True)
    load0 = os.getloadavg()
    out = subprocess.run([gb, "2"], check=True, capture_output=True, text=True).stdout
    print(out, end="", flush=True)
    gemm = json.loads(out.strip().split("\n")[-1])
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2")
    numpy_sq = float(subprocess.run([sys.executable, "-c", NUMPY_SQUARE], check=True, capture_output=True, text=True,
                                    env=env).stdout)
    print(f"numpy {np.__version__} matmul 2048^3, 2 threads: {numpy_sq:.1f} GFLOP/s", flush=True)
    rng = np.random.default_rng(0)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        for _ in range(8):
            f.write(json.dumps({"text": train_cpu.words(rng, 600)}) + "\n")
    t0 = time.time()
    rows = train_cpu.run_hearth(data, os.path.join(tmp, "hearth"), a.steps)
    wall = time.time() - t0
    tps = statistics.median(r["tokens_per_second"] for r in rows[1:])
    load1 = os.getloadavg()
    reached = tps * per_token / 1e9
    ceilings = {"AVX-512 FMA issue rate": gemm["fma_peak_gflops"], "tr_gemm 2048^3": gemm["square_2048_gflops"],
                "tr_gemm best projection shape": gemm["best_projection_gflops"], "numpy BLAS 2048^3": numpy_sq}
    res = {
        "benchmark": "hearth train sft (SmolLM2-135M-Instruct f32, rank 8, last 16 layers, batch 1, seq 512, "
                     "2 threads) against this machine's float32 rates measured in the same run",
        "machine": results_file.machine(), "threads": 2, "steps": a.steps, "tokens_per_step": T,
        "flops_per_step": parts, "flops_per_token": per_token, "arithmetic": arithmetic,
        "hearth_tokens_per_second": tps, "hearth_gflops": reached, "hearth_first_loss": rows[0]["loss"],
        "hearth_wall_s": wall, "ceilings_gflops": ceilings, "gemm_bench": gemm, "numpy": np.__version__,
        "load_average_before": load0, "load_average_after": load1,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    print(json.dumps(res, indent=1))
    md = f"""# LoRA training on the CPU: hearth train against the machine's float32 ceiling

`bench/train/train_ceiling.py`: {res['benchmark']}; {res['machine']}; load average {load0[0]:.1f} before,
{load1[0]:.1f} after (a shared machine: every rate below, the ceilings included, is what 2
threads got in these minutes).

Work of one step, counted from the shapes ({arithmetic}):

| part | GFLOP a step |
|---|---|
"""
    for k, v in parts.items():
        md += f"| {k} | {v / 1e9:.1f} |\n"
    md += f"""| **total** ({T} tokens) | **{total / 1e9:.1f}** ({per_token / 1e6:.0f} MFLOP a token) |

hearth train: **{tps:.1f} tokens/s** = {reached:.1f} GFLOP/s (first loss {rows[0]['loss']:.4f}).

| ceiling, 2 threads, same run | GFLOP/s | hearth's fraction | tokens/s it allows | 400 tokens/s needs |
|---|---|---|---|---|
"""
    for k, v in ceilings.items():
        md += (f"| {k} | {v:.1f} | {reached / v:.0%} | {v * 1e9 / per_token:.0f} | "
               f"{400 * per_token / 1e9 / v:.0%} of it |\n")
    md += f"""
400 tokens/s is {400 * per_token / 1e9:.0f} GFLOP/s of this work.
"""
    path = results_file.write("train_ceiling", md, res)
    print("wrote", path)


if __name__ == "__main__":
    main()
