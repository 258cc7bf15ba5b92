#!/usr/bin/env python3
"""train_cpu.py: LoRA training speed on the CPU: hearth train against mlx_lm.lora (the
peer: MLX's CPU backend; PyTorch + PEFT is not installable here) in the same run, on
SmolLM2-135M-Instruct (float32 weights from the tools/get_models.sh GGUF, made by
bench/train/smollm2_folder.py), rank 8, the last 16 layers (both tools' default),
batch 1, sequences of 512 tokens (511 targets), Adam, 2 threads (the machine's cores).
Both train the same folder on the same data; the first step's loss must agree (B starts
at zero, so it is the base model's loss). Prints and writes
bench/results/train_cpu.md (bench/results_file.py): tokens/s of each (median of the steps after the
first), the ratio, peak memory, the machine and its load average.

--preference measures hearth's dpo and orpo instead (same model, rank 8, last 16 layers,
batch 1: one pair a step, each sequence cut to 512 tokens, tokens/s counting both
sequences) next to its sft in the same run; no peer runs here (PyTorch + TRL is not
installable, mlx-lm-lora defines other losses). It adds a "preference" entry to
the json of train_cpu.md and a section to its text, keeping the sft comparison. With
--baseline BIN (another build of hearth) each of the three also runs with BIN right after,
for a before/after table from the same minutes.

    .venv/bin/python bench/train/train_cpu.py [--steps 4] [--preference [--baseline BIN --baseline-label L]]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
MODEL = os.path.expanduser("~/.cache/hearth/bench/smollm2-135m-f32")
WORDS = ("the quick brown fox jumps over a lazy dog while the local language model runs on your own machine "
         "and predicts one token at a time from the weights it loaded").split()


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_hearth(data, out, steps, method="sft", binary=None):
    cmd = [binary or BIN, "train", MODEL, "--data", data, "--adapter-path", out, "--iters", str(steps), "--batch-size", "1",
           "--max-seq-length", "512", "--lora-rank", "8", "--num-layers", "16", "--steps-per-report", "1",
           "--threads", "2", "--method", method]
    subprocess.run(cmd, check=True, capture_output=True)
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in line]


def run_mlx(data, out, steps):
    from mlx_lm import lora as L
    from mlx_lm.tuner.callbacks import TrainingCallback
    args = dict(L.CONFIG_DEFAULTS)
    args.update(model=MODEL, train=True, data=data, adapter_path=out, iters=steps, batch_size=1, max_seq_length=512,
                num_layers=16, steps_per_report=1, steps_per_eval=10 ** 6)
    args = types.SimpleNamespace(**args)
    rows = []

    class Keep(TrainingCallback):
        def on_train_loss_report(self, info):
            rows.append({"step": info["iteration"], "loss": info["train_loss"],
                         "tokens_per_second": info["tokens_per_second"], "peak_memory_gb": info["peak_memory"]})

    np.random.seed(args.seed)
    m, tok = L.load(args.model)
    train, valid, _ = L.load_dataset(args, tok)
    L.train_model(args, m, train, valid, Keep())
    return rows


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tps(rows):
    return statistics.median(r["tokens_per_second"] for r in rows[1:])


def preference(a, rng, tmp):
    """hearth's sft, dpo and orpo in one run; returns the "preference" entry"""
    text, pairs = os.path.join(tmp, "text"), os.path.join(tmp, "pairs")
    os.makedirs(text), os.makedirs(pairs)
    with open(os.path.join(text, "train.jsonl"), "w") as f:
        for _ in range(8):
            f.write(json.dumps({"text": words(rng, 600)}) + "\n")
    with open(os.path.join(pairs, "train.jsonl"), "w") as f:
        for _ in range(8):  # a ~100-token prompt, ~500-token responses: each sequence cut to 512
            f.write(json.dumps({"prompt": words(rng, 100), "chosen": " " + words(rng, 500),
                                "rejected": " " + words(rng, 500)}) + "\n")
    load0 = os.getloadavg()
    out = {}
    for method, data in (("sft", text), ("dpo", pairs), ("orpo", pairs)):
        runs = [("", BIN)] + ([("baseline_", a.baseline)] if a.baseline else [])
        for prefix, binary in runs:  # the baseline right after, on the same data, in the same minutes
            t0 = time.time()
            rows = run_hearth(data, os.path.join(tmp, prefix + method), a.steps, method, binary)
            out[prefix + method] = {"tokens_per_second": tps(rows), "first_loss": rows[0]["loss"],
                                    "peak_memory_gb": max(r["peak_memory_gb"] for r in rows),
                                    "wall_s": time.time() - t0}
            print(prefix + method, json.dumps(out[prefix + method]), flush=True)
    if a.baseline:
        out["baseline"] = a.baseline_label or a.baseline
    out.update(benchmark="hearth train --method sft|dpo|orpo on the CPU: SmolLM2-135M-Instruct f32, rank 8, last 16 "
               "layers, batch 1 (one text or one pair), every sequence 512 tokens, Adam",
               machine=f"{cpu_name()}, {os.cpu_count()} cores", threads=2, steps=a.steps,
               date=time.strftime('%Y-%m-%d', time.gmtime()), load_average_before=load0,
               load_average_after=os.getloadavg())
    return out


def write_results(res):
    h, m = res["hearth"], res["mlx_lm"]
    load0, load1 = res["load_average_before"], res["load_average_after"]
    md = f"""# LoRA training on the CPU: hearth train vs mlx_lm.lora

`bench/train/train_cpu.py` ({res.get('date', '2026-12-05')}): {res['benchmark']}; {res['machine']},
{res['threads']} threads; {res['steps']} steps each, tokens/s the median of the steps after the first. Load average
{load0[0]:.1f} before, {load1[0]:.1f} after (a shared machine: absolute numbers move with it; both ran in the
same minutes). The peer is mlx_lm.lora 0.32.2 on MLX's CPU backend (PyTorch + PEFT, the issue's peer,
is not installable here).

| | tokens/s | first loss | peak memory |
|---|---|---|---|
| hearth train | {h['tokens_per_second']:.1f} | {h['first_loss']:.4f} | {h['peak_memory_gb']:.2f} GB |
| mlx_lm.lora | {m['tokens_per_second']:.1f} | {m['first_loss']:.4f} | {m['peak_memory_gb']:.2f} GB |

hearth / mlx-lm: **{res['ratio_hearth_over_mlx_lm']:.2f}x**. (Issue target: 2x PyTorch + PEFT and 400 tokens/s.)
"""
    p = res.get("preference")
    if p:
        pl0, pl1 = p["load_average_before"], p["load_average_after"]
        md += f"""
## DPO and ORPO (`--preference`, {p['date']})

{p['benchmark']}; {p['machine']}, {p['threads']} threads; {p['steps']} steps each, tokens/s the median
of the steps after the first, counting every position run with the adapter (a pair's chosen
and rejected sequences: 1022 a step; sft: 511 targets a step). Load average {pl0[0]:.1f} before,
{pl1[0]:.1f} after. No peer in this run: PyTorch + TRL cannot be installed here and
mlx-lm-lora defines both losses differently; sft is the same run's yardstick.

| hearth train | tokens/s | first loss | peak memory | wall |
|---|---|---|---|---|
"""
        for k in ("sft", "dpo", "orpo"):
            r = p[k]
            md += (f"| --method {k} | {r['tokens_per_second']:.1f} | {r['first_loss']:.4f} | "
                   f"{r['peak_memory_gb']:.2f} GB | {r['wall_s']:.0f} s |\n")
        if "baseline" in p:
            md += f"""
The same three runs of the baseline binary ({p['baseline']}), each right after hearth's on the
same data:

| --method | baseline tokens/s | this build tokens/s | speed-up | baseline first loss |
|---|---|---|---|---|
"""
            for k in ("sft", "dpo", "orpo"):
                b, r = p["baseline_" + k], p[k]
                md += (f"| {k} | {b['tokens_per_second']:.1f} | {r['tokens_per_second']:.1f} | "
                       f"{r['tokens_per_second'] / b['tokens_per_second']:.2f}x | {b['first_loss']:.4f} |\n")
        md += """
A pair costs two forwards and two backwards (both sequences' activations kept: twice
sft's activation memory), so orpo's tokens/s should sit near sft's; dpo's steps here all
see a new pair, so each also runs the frozen base's two forwards (cached per example for
later epochs).
"""
    results_file.write("train_cpu", md, res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--preference", action="store_true")
    ap.add_argument("--baseline", help="with --preference: another hearth binary (an older build) run on the "
                    "same data right after each of this build's runs, for a before/after in one run")
    ap.add_argument("--baseline-label", help="how the results name --baseline (e.g. its commit)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(MODEL, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "train", "smollm2_folder.py")], check=True)
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp(prefix="hearth-train-bench-")
    prev = results_file.read_if_exists("train_cpu", {})
    if a.preference:
        prev["preference"] = preference(a, rng, tmp)
        print(json.dumps(prev["preference"], indent=2))
        write_results(prev)
        return
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with open(os.path.join(data, "train.jsonl"), "w") as f:
        for _ in range(8):  # ~650 tokens each: every sequence is cut to 512
            f.write(json.dumps({"text": words(rng, 600)}) + "\n")
    load0 = os.getloadavg()
    t0 = time.time()
    ours = run_hearth(data, os.path.join(tmp, "hearth"), a.steps)
    t1 = time.time()
    peer = run_mlx(data, os.path.join(tmp, "mlx"), a.steps)
    t2 = time.time()
    load1 = os.getloadavg()
    res = {
        "benchmark": "LoRA SFT on the CPU: SmolLM2-135M-Instruct f32, rank 8, last 16 layers, batch 1, seq 512, Adam",
        "machine": f"{cpu_name()}, {os.cpu_count()} cores", "threads": 2, "steps": a.steps,
        "hearth": {"tokens_per_second": tps(ours), "first_loss": ours[0]["loss"],
                   "peak_memory_gb": max(r["peak_memory_gb"] for r in ours), "wall_s": t1 - t0},
        "mlx_lm": {"tokens_per_second": tps(peer), "first_loss": peer[0]["loss"],
                   "peak_memory_gb": max(r["peak_memory_gb"] for r in peer), "wall_s": t2 - t1},
        "load_average_before": load0, "load_average_after": load1,
    }
    res["ratio_hearth_over_mlx_lm"] = res["hearth"]["tokens_per_second"] / res["mlx_lm"]["tokens_per_second"]
    assert abs(res["hearth"]["first_loss"] - res["mlx_lm"]["first_loss"]) < 1e-3 * res["mlx_lm"]["first_loss"], res
    print(json.dumps(res, indent=2))
    res["date"] = time.strftime('%Y-%m-%d', time.gmtime())
    if "preference" in prev:
        res["preference"] = prev["preference"]
    write_results(res)


if __name__ == "__main__":
    main()
