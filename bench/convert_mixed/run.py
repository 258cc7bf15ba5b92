#!/usr/bin/env python3
"""hearth convert -q --target-bpw 4.5 (mixed precision by measured KL sensitivity) against
uniform 4-bit of no fewer bytes, on SmolLM2-135M-Instruct: mean / median / p99 KL and top-1
agreement against the float model on held-out text, with each output's bytes counted from
the file (packed weights + scales + biases of every quantized module).

The float reference and the float16 input come from the real GGUF (tests/parity/mixed_data.py);
calibration is LoCoMo conversations 26/30/41, the held-out text conversations 42/43/44.
Uniform 4-bit at group 64 with float16 scales and biases is 4.5 bits per weight, the
budget the mixed plan gets; uniform 4-bit at group 32 (5.0) is listed for scale. Writes
bench/results/convert_mixed.md (bench/results_file.py).

    HEARTH_BIN=build/bin/hearth .venv/bin/python bench/convert_mixed/run.py
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-bpw", type=float, default=4.5)
    ap.add_argument("--candidate-bits", default="3,4,4:32,5")
    ap.add_argument("--n-calibration", type=int, default=4)
    ap.add_argument("--calibration-length", type=int, default=256)
    ap.add_argument("--num-samples", type=int, default=8, help="held-out rows of --sequence-length")
    ap.add_argument("--sequence-length", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    why = mixed_data.missing()
    if why:
        sys.exit(f"convert_mixed: {why}")
    ref, f16 = mixed_data.smol_folders()
    tmp = tempfile.mkdtemp(prefix="hearth-convert-mixed-")
    calib, held = mixed_data.write_text(tmp)
    loads = [os.getloadavg()[0]]
    recipes = [("uniform 4-bit, group 64", ["--q-bits", "4", "--q-group-size", "64"]),
               ("uniform 4-bit, group 32", ["--q-bits", "4", "--q-group-size", "32"]),
               ("uniform 4-bit, group 64, fitted scales (--target-bpw 4.5 --candidate-bits 4)",
                ["--target-bpw", 4.5, "--candidate-bits", "4", "--calibration-data", calib]),
               (f"--target-bpw {a.target_bpw} (candidates {a.candidate_bits}; group 64 unless :32)",
                ["--target-bpw", a.target_bpw, "--candidate-bits", a.candidate_bits, "--calibration-data", calib,
                 "--n-calibration", a.n_calibration, "--calibration-length", a.calibration_length])]
    rows, report, plan = [], None, None
    ref_logits = os.path.join(tmp, "reference.logprobs")
    for i, (name, flags) in enumerate(recipes):
        out = os.path.join(tmp, f"m{i}")
        text, secs = hearth("convert", f16, "--out", out, "-q", *flags)
        loads.append(os.getloadavg()[0])
        if "--target-bpw" in flags and a.candidate_bits in flags:
            report = text
            q = json.load(open(os.path.join(out, "config.json")))["quantization"]
            plan = {k: {"bits": v["bits"], "group_size": v["group_size"]} for k, v in q.items() if isinstance(v, dict)}
        bits, weights = quantized_bits(out)
        ref_args = ["--reference", ref] if not os.path.exists(ref_logits) else []
        js, ppl_secs = hearth("perplexity", out, "--data-path", held, "--sequence-length", a.sequence_length,
                              "--num-samples", a.num_samples, "--threads", a.threads, "--kl-divergence", *ref_args,
                              "--reference-logits", ref_logits, "--json")
        loads.append(os.getloadavg()[0])
        r = json.loads(js)
        kl = r["kl_divergence"]
        rows.append({"recipe": name, "bytes": bits // 8, "file_bytes": os.path.getsize(os.path.join(out, "model.safetensors")),
                     "bpw": bits / weights, "kl_mean": kl["mean"], "kl_mean_se": kl["standard_error"],
                     "kl_median": kl["median"], "kl_p99": kl["p99"], "top1": kl["top1_agreement"],
                     "perplexity": r["perplexity"], "convert_seconds": secs, "scored_positions": r["tokens"]})
        print(json.dumps(rows[-1]), flush=True)
    uni, mixed = rows[0], rows[-1]
    ratio = mixed["kl_mean"] / uni["kl_mean"]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    res = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized; float16 input, float32 reference)",
           "held_out": f"LoCoMo {'/'.join(mixed_data.HELD_OUT)}: {a.num_samples} rows of {a.sequence_length}",
           "calibration": f"LoCoMo {'/'.join(mixed_data.CALIBRATION)}: {a.n_calibration} rows of {a.calibration_length}",
           "rows": rows, "kl_ratio_mixed_vs_uniform4": ratio, "target_ratio": 0.7,
           "mixed_bytes_le_uniform": mixed["bytes"] <= uni["bytes"], "plan": plan, "report": report,
           "machine": f"{cpu}, {os.cpu_count()} cores", "threads": a.threads,
           "load_average": {"min": min(loads), "max": max(loads)},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    md = ["# Mixed precision (`hearth convert -q --target-bpw`) vs uniform 4-bit, SmolLM2-135M-Instruct", "",
          f"KL(float || quantized) on held-out text ({res['held_out']}); calibration {res['calibration']}. "
          "Bytes: packed weights + scales + biases of the quantized modules, from the file.", "",
          "| recipe | bytes | bits/weight | mean KL | median KL | p99 KL | top-1 | perplexity | convert s |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        md.append(f"| {r['recipe']} | {r['bytes']:,} | {r['bpw']:.4f} | {r['kl_mean']:.4f} ± {r['kl_mean_se']:.4f} | "
                  f"{r['kl_median']:.4f} | {r['kl_p99']:.3f} | {r['top1']:.4f} | {r['perplexity']:.3f} | "
                  f"{r['convert_seconds']:.0f} |")
    md += ["", f"Mean KL of the mixed plan / uniform 4-bit group 64: **{ratio:.3f}** (target at most 0.7; "
           f"mixed bytes {'<=' if res['mixed_bytes_le_uniform'] else '>'} uniform bytes).", "",
           f"Machine: {res['machine']}, {a.threads} threads, load average {min(loads):.1f} .. {max(loads):.1f} "
           f"(shared). Run {res['date']}: `{res['command']}`.", "", "The plan (hearth's report):", "", "```",
           report.strip(), "```", ""]
    results_file.write("convert_mixed", "\n".join(md), res)
    shutil.rmtree(tmp)  # the models and the reference log-probs (about 1 GB)
    print("\n".join(md))


if __name__ == "__main__":
    main()
