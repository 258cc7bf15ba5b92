#!/usr/bin/env python3
"""cuda_kv_quality.py: what int8 and fp8 KV cost in prediction quality on the GPU. For each
model and quant, tests/parity/helpers/kvq_helper.c (built here against libhearth.so) runs
one engine with float32 KV and one with the quantized KV on the same device, teacher-forces
the same text through both (every position's logits) and reports KL(f32 || quant) of the
next-token distributions (mean, p99, max), argmax agreement, and greedy agreement from a few
prompts. Prints a markdown table (the rows of bench/results/kv_quant.md) and writes the JSON.

usage: cuda_kv_quality.py --lib DIR --out FILE.json [--device cuda] [--tokens N] [--steps N]
                          [--budget S] MODEL[:quant,quant] ...
A model without :quants runs f16, int8 and fp8. Models run in order; one that would start after
--budget seconds is reported as not run."""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "parity" / "corpus" / "tokenizer"
TEXT_FILES = ["english.txt", "markdown_urls.txt", "numbers.txt", "code.txt"]  # as test_kv_quant.py


def build_helper(lib, tmp):
    exe = Path(tmp) / "kvq_helper"
    cmd = ["cc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-I", str(ROOT / "include"),
           str(ROOT / "tests/parity/helpers/kvq_helper.c"), "-L", str(lib), "-lhearth", f"-Wl,-rpath,{lib}", "-lm",
           "-o", str(exe)]
    deps = ROOT / "build-gpudeps" / "lib"  # a GPU machine without the -dev packages (tools/cuda_check_deps)
    if deps.is_dir():
        cmd[-2:-2] = [f"-Wl,-rpath-link,{deps}", f"-Wl,-rpath,{deps}"]
    subprocess.run(cmd, check=True)
    return exe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="folder holding libhearth.so")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--budget", type=float, default=1e9)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    t0 = time.time()
    results, failed = [], False
    # rows are printed as they complete: a run cut short by the caller's timeout keeps them
    print(f"KV quality on {a.device} (f32 KV is the oracle; KL in nats over every teacher-forced position):")
    print("| model | KV | positions | mean KL | p99 KL | argmax agreement | greedy identical prefix / same position |")
    print("|---|---|---:|---:|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_helper(a.lib, tmp)
        text = Path(tmp) / "text.txt"
        text.write_text("".join((CORPUS / f).read_text() for f in TEXT_FILES))
        for spec in a.models:
            model, _, qs = spec.partition(":")
            for q in (qs.split(",") if qs else ["f16", "int8", "fp8"]):
                name = Path(model).name
                if time.time() - t0 > a.budget:
                    print(f"| {name} | {q} | not run (budget) | | | | |", flush=True)
                    continue
                t = time.time()
                p = subprocess.run([str(exe), model, str(text), str(a.tokens), str(a.steps), "8", q, a.device],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    failed = True
                    print(f"| {name} | {q} | FAILED: {p.stderr.strip()[-160:]} | | | | |", flush=True)
                    continue
                r = json.loads(p.stdout)
                r.update(model=str(model), seconds=round(time.time() - t, 1))
                results.append(r)
                Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
                print(f"| {name} | {q} | {r['tokens']} | {r['kl_mean']:.3g} | {r['kl_p99']:.3g} | "
                      f"{r['argmax_agreement']:.3f} | {r['greedy_identical_prefix_fraction']:.3f} / "
                      f"{r['greedy_same_position_fraction']:.3f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
