#!/usr/bin/env python3
"""hearth perplexity's scoring rate against the engine's own prefill rate (hearth bench -p),
same model, same threads, same run, alternating: SmolLM2-135M-Instruct Q4_1 (the real GGUF),
rows of 512 tokens of LoCoMo held-out text (tests/parity/mixed_data.py). Perplexity is timed
plain and with --kl-divergence against saved reference log-probs (the Q8_0 GGUF's, made
once, not timed). Writes bench/results/perplexity.md (bench/results_file.py).

    HEARTH_BIN=build/bin/hearth .venv/bin/python bench/perplexity/run.py [--threads 2] [--repeat 2]
"""
import argparse
import json
import os
import platform
import shutil
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
REF_GGUF = mixed_data.CACHE / "bench" / "smollm2-135m-instruct-q8_0.gguf"


def hearth(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"hearth {' '.join(map(str, args))} failed: {p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--num-samples", type=int, default=8)
    a = ap.parse_args()
    why = mixed_data.missing() or (None if REF_GGUF.exists() else f"{REF_GGUF} missing: run bench/cpu_vs_llamacpp")
    if why:
        sys.exit(f"perplexity bench: {why}")
    tmp = tempfile.mkdtemp(prefix="hearth-ppl-bench-")
    _, held = mixed_data.write_text(tmp)
    model, L, t = str(mixed_data.SMOL_GGUF), 512, a.threads
    ppl = ["--data-path", held, "--sequence-length", L, "--num-samples", a.num_samples, "--threads", t, "--json"]
    ref = os.path.join(tmp, "ref.logprobs")
    hearth("perplexity", REF_GGUF, *ppl, "--save-logits", ref)
    runs, loads = {"prefill": [], "perplexity": [], "perplexity_kl": []}, [os.getloadavg()[0]]
    for _ in range(a.repeat):
        runs["prefill"].append(hearth("bench", model, "-p", L, "-n", 1, "-r", 1, "-t", t, "--json")["prefill_tps"])
        runs["perplexity"].append(hearth("perplexity", model, *ppl)["tok_s"])
        runs["perplexity_kl"].append(hearth("perplexity", model, *ppl, "--kl-divergence", "--reference-logits",
                                            ref)["tok_s"])
        loads.append(os.getloadavg()[0])
        print(json.dumps(runs), flush=True)
    best = {k: max(v) for k, v in runs.items()}
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")),
               platform.machine())
    res = {"model": "SmolLM2-135M-Instruct Q4_1 GGUF", "sequence_length": L, "rows": a.num_samples,
           "threads": t, "runs": runs, "best": best,
           "ratio_perplexity_vs_prefill": best["perplexity"] / best["prefill"],
           "ratio_perplexity_kl_vs_prefill": best["perplexity_kl"] / best["prefill"],
           "machine": f"{cpu}, {os.cpu_count()} cores", "load_average": {"min": min(loads), "max": max(loads)},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    md = ["# hearth perplexity vs the engine's prefill rate, SmolLM2-135M-Instruct Q4_1", "",
          f"Rows of {L} tokens ({a.num_samples} rows, LoCoMo held-out text), {t} threads, best of {a.repeat} "
          "alternating runs (tok/s; every run listed in the json below).", "",
          "| | tok/s | vs prefill |", "| --- | ---: | ---: |",
          f"| `hearth bench -p {L}` prefill | {best['prefill']:.0f} | 1.00 |",
          f"| `hearth perplexity` | {best['perplexity']:.0f} | {res['ratio_perplexity_vs_prefill']:.2f} |",
          f"| `hearth perplexity --kl-divergence` (saved reference) | {best['perplexity_kl']:.0f} | "
          f"{res['ratio_perplexity_kl_vs_prefill']:.2f} |", "",
          f"Machine: {res['machine']}, load average {min(loads):.1f} .. {max(loads):.1f} (shared by other users: "
          f"the absolute rates move with it, the ratios less). Run {res['date']}: `{res['command']}`.", ""]
    results_file.write("perplexity", "\n".join(md), res)
    shutil.rmtree(tmp)  # the models and the reference log-probs (about 1 GB)
    print("\n".join(md))


if __name__ == "__main__":
    main()
