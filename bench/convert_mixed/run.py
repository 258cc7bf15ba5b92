#!/usr/bin/env python3
"""hearth convert -q --target-bpw 4.5 (mixed precision by measured KL sensitivity) against
uniform 4-bit of no fewer bytes, on SmolLM2-135M-Instruct and Gemma 3 270M: mean / median /
p99 KL and top-1 agreement against the float model on held-out text, with each output's
bytes counted from the file (packed weights + scales + biases of every quantized module).

The float references and the float16 inputs come from the real GGUFs (tests/parity/mixed_data.py);
calibration is LoCoMo conversations 26/30/41, the held-out text conversations 42/43/44.
Uniform 4-bit at group 64 with float16 scales and biases is 4.5 bits per weight, the
budget the mixed plan gets; uniform 4-bit at group 32 (5.0) is listed for scale. Writes
bench/results/convert_mixed.md (bench/results_file.py).

    HEARTH_BIN=build/bin/hearth .venv/bin/python bench/convert_mixed/run.py [--models smollm2,gemma3]

Gemma 3 270M ties its 262,144-row embedding to the output: 168M of its 268M quantized
weights. It is one unit of the sensitivity pass, counted in the budget by its full size
(as mlx-lm's mixed recipes quantize it with the rest); its held-out rows are fewer (4 of 512:
the reference log-probs are 1 MiB a position at that vocabulary).
"""
import argparse
import glob
import json
import os
import platform
import shutil
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
import mixed_data  # noqa: E402

BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "build", "bin", "hearth"))
MODELS = {
    "smollm2": dict(name="SmolLM2-135M-Instruct", folders=mixed_data.smol_folders, num_samples=8,
                    source="Q4_1 GGUF dequantized; float16 input, float32 reference"),
    "gemma3": dict(name="Gemma 3 270M", folders=mixed_data.gemma_folders, num_samples=4,
                   source="Q4_K_M GGUF dequantized; float16 input, float32 reference"),
}


def hearth(*args):
    t = time.time()
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"hearth {' '.join(map(str, args))} failed: {p.stderr}")
    return p.stdout, time.time() - t


def quantized_bits(folder):
    """(bits, weights) of the quantized modules as stored: packed words + scales + biases."""
    import mlx.core as mx

    t = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        t.update(mx.load(f))
    mods = [k[: -len(".scales")] for k in t if k.endswith(".scales")]
    bits = sum(t[m + s].nbytes * 8 for m in mods for s in (".weight", ".scales", ".biases"))
    cfg = json.load(open(os.path.join(folder, "config.json")))["quantization"]
    weights = sum(t[m + ".weight"].size * 32 // cfg.get(m, cfg)["bits"] for m in mods)
    return bits, weights


def run_model(key, a, tmp, calib, held, loads):
    """The four recipes on one model; its part of the result."""
    spec = MODELS[key]
    ref, f16 = spec["folders"]()
    recipes = [("uniform 4-bit, group 64", ["--q-bits", "4", "--q-group-size", "64"]),
               ("uniform 4-bit, group 32", ["--q-bits", "4", "--q-group-size", "32"]),
               ("uniform 4-bit, group 64, fitted scales (--target-bpw 4.5 --candidate-bits 4)",
                ["--target-bpw", 4.5, "--candidate-bits", "4", "--calibration-data", calib]),
               (f"--target-bpw {a.target_bpw} (candidates {a.candidate_bits}; group 64 unless :G)",
                ["--target-bpw", a.target_bpw, "--candidate-bits", a.candidate_bits, "--calibration-data", calib,
                 "--n-calibration", a.n_calibration, "--calibration-length", a.calibration_length])]
    rows, report, plan = [], None, None
    ref_logits = os.path.join(tmp, f"{key}-reference.logprobs")
    for i, (name, flags) in enumerate(recipes):
        out = os.path.join(tmp, f"{key}-m{i}")
        text, secs = hearth("convert", f16, "--out", out, "-q", *flags)
        loads.append(os.getloadavg()[0])
        if "--target-bpw" in flags and a.candidate_bits in flags:
            report = text
            q = json.load(open(os.path.join(out, "config.json")))["quantization"]
            plan = {k: {"bits": v["bits"], "group_size": v["group_size"]} for k, v in q.items() if isinstance(v, dict)}
        bits, weights = quantized_bits(out)
        ref_args = ["--reference", ref] if not os.path.exists(ref_logits) else []
        js, ppl_secs = hearth("perplexity", out, "--data-path", held, "--sequence-length", a.sequence_length,
                              "--num-samples", spec["num_samples"], "--threads", a.threads, "--kl-divergence",
                              *ref_args, "--reference-logits", ref_logits, "--json")
        loads.append(os.getloadavg()[0])
        r = json.loads(js)
        kl = r["kl_divergence"]
        rows.append({"recipe": name, "bytes": bits // 8, "file_bytes": os.path.getsize(os.path.join(out, "model.safetensors")),
                     "bpw": bits / weights, "kl_mean": kl["mean"], "kl_mean_se": kl["standard_error"],
                     "kl_median": kl["median"], "kl_p99": kl["p99"], "top1": kl["top1_agreement"],
                     "perplexity": r["perplexity"], "convert_seconds": secs, "scored_positions": r["tokens"]})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(out)
    os.remove(ref_logits)
    uni, mixed = rows[0], rows[-1]
    return {"key": key, "model": f"{spec['name']} ({spec['source']})", "name": spec["name"],
            "held_out": f"LoCoMo {'/'.join(mixed_data.HELD_OUT)}: {spec['num_samples']} rows of {a.sequence_length}",
            "rows": rows, "kl_ratio_mixed_vs_uniform4": mixed["kl_mean"] / uni["kl_mean"], "target_ratio": 0.7,
            "mixed_bytes_le_uniform": mixed["bytes"] <= uni["bytes"], "plan": plan, "report": report}


def model_md(m):
    md = [f"## {m['name']}", "", f"{m['model']}. KL(float || quantized) on held-out text ({m['held_out']}). "
          "Bytes: packed weights + scales + biases of the quantized modules, from the file. "
          "`convert s`: the whole `hearth convert` (for --target-bpw: the reference pass, every unit at every "
          "candidate, the knapsack and the final write).", "",
          "| recipe | bytes | bits/weight | mean KL | median KL | p99 KL | top-1 | perplexity | convert s |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in m["rows"]:
        md.append(f"| {r['recipe']} | {r['bytes']:,} | {r['bpw']:.4f} | {r['kl_mean']:.4f} ± {r['kl_mean_se']:.4f} | "
                  f"{r['kl_median']:.4f} | {r['kl_p99']:.3f} | {r['top1']:.4f} | {r['perplexity']:.3f} | "
                  f"{r['convert_seconds']:.0f} |")
    ratio = m["kl_ratio_mixed_vs_uniform4"]
    md += ["", f"Mean KL of the mixed plan / uniform 4-bit group 64: **{ratio:.3f}** (target at most 0.7: "
           f"{'met' if ratio <= 0.7 else 'not met'}; mixed bytes {'<=' if m['mixed_bytes_le_uniform'] else '>'} "
           "uniform bytes).", "", "The plan (hearth's report):", "", "```", m["report"].strip(), "```", ""]
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3", help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--target-bpw", type=float, default=4.5)
    ap.add_argument("--candidate-bits", default="3,4:128,4,4:32,5")
    ap.add_argument("--n-calibration", type=int, default=4)
    ap.add_argument("--calibration-length", type=int, default=256)
    ap.add_argument("--sequence-length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    why = mixed_data.missing()
    if why:
        sys.exit(f"convert_mixed: {why}")
    tmp = tempfile.mkdtemp(prefix="hearth-convert-mixed-")
    calib, held = mixed_data.write_text(tmp)
    loads = [os.getloadavg()[0]]
    models = [run_model(k, a, tmp, calib, held, loads) for k in a.models.split(",")]
    models.sort(key=lambda m: list(MODELS).index(m["key"]))  # the same order whichever ran first
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    res = {"models": models,
           "calibration": f"LoCoMo {'/'.join(mixed_data.CALIBRATION)}: {a.n_calibration} rows of {a.calibration_length}",
           "machine": f"{cpu}, {os.cpu_count()} cores", "threads": a.threads,
           "load_average": {"min": min(loads), "max": max(loads)},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    md = ["# Mixed precision (`hearth convert -q --target-bpw`) vs uniform 4-bit", "",
          f"Calibration {res['calibration']}. Machine: {res['machine']}, {a.threads} threads, load average "
          f"{min(loads):.1f} .. {max(loads):.1f} (shared). Run {res['date']}: `{res['command']}`.", ""]
    for m in models:
        md += model_md(m)
    results_file.write("convert_mixed", "\n".join(md), res)
    shutil.rmtree(tmp)
    print("\n".join(md))


if __name__ == "__main__":
    main()
