#!/usr/bin/env python3
"""hearth perplexity's scoring rate against the engine's own prefill rate (hearth bench -p),
same model, same threads, same run, alternating: SmolLM2-135M-Instruct Q4_1 (the real GGUF),
rows of 512 tokens of LoCoMo held-out text (tests/parity/mixed_data.py). Perplexity is timed
plain and with --kl-divergence against saved reference log-probs (the Q8_0 GGUF's, made
once, not timed; the Q8_0 file is bench/cpu_vs_llamacpp's llama-quantize output where that
bench ran, else `hearth convert --outtype q8_0` of the same float weights). With --baseline OTHER_HEARTH, another build's perplexity (an earlier
commit) is timed in the same alternation and listed beside. Writes
bench/results/perplexity.md (bench/results_file.py).

    HEARTH_BIN=build/bin/hearth .venv/bin/python bench/perplexity/run.py [--threads 2] [--repeat 2]
        [--baseline /path/to/older/hearth --baseline-name "main at abc1234"]
"""
import argparse
import json
import os
import platform
import resource
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


CPU_SECONDS = {}  # run kind -> CPU seconds (user + sys) of each process, model load included


def hearth(*args, binary=BIN, kind=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"hearth {' '.join(map(str, args))} failed: {p.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if kind:
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        CPU_SECONDS.setdefault(kind, []).append(cpu)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--num-samples", type=int, default=8)
    ap.add_argument("--baseline", help="another hearth binary whose perplexity is timed beside")
    ap.add_argument("--baseline-name", default="baseline")
    a = ap.parse_args()
    why = mixed_data.missing()
    if why:
        sys.exit(f"perplexity bench: {why}")
    if not REF_GGUF.exists():  # bench/cpu_vs_llamacpp makes it with llama-quantize; hearth's Q8_0 is
        # byte-identical to it (tests/parity/test_convert_gguf.py), made here from the float folder
        _, f16 = mixed_data.smol_folders()
        part = str(REF_GGUF) + ".part.gguf"
        p = subprocess.run([BIN, "convert", str(f16), "--out", part, "--outtype", "q8_0"], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"perplexity bench: making {REF_GGUF}: {p.stderr}")
        os.replace(part, REF_GGUF)
    tmp = tempfile.mkdtemp(prefix="hearth-ppl-bench-")
    _, held = mixed_data.write_text(tmp)
    model, L, t = str(mixed_data.SMOL_GGUF), 512, a.threads
    ppl = ["--data-path", held, "--sequence-length", L, "--num-samples", a.num_samples, "--threads", t, "--json"]
    ref = os.path.join(tmp, "ref.logprobs")
    hearth("perplexity", REF_GGUF, *ppl, "--save-logits", ref)
    runs, loads = {"prefill": [], "perplexity": [], "perplexity_kl": []}, [os.getloadavg()[0]]
    if a.baseline:
        runs.update({"baseline_perplexity": [], "baseline_perplexity_kl": []})
    for _ in range(a.repeat):
        runs["prefill"].append(hearth("bench", model, "-p", L, "-n", 1, "-r", 1, "-t", t, "--json")["prefill_tps"])
        runs["perplexity"].append(hearth("perplexity", model, *ppl, kind="perplexity")["tok_s"])
        runs["perplexity_kl"].append(hearth("perplexity", model, *ppl, "--kl-divergence", "--reference-logits",
                                            ref, kind="perplexity_kl")["tok_s"])
        if a.baseline:
            runs["baseline_perplexity"].append(hearth("perplexity", model, *ppl, binary=a.baseline,
                                                      kind="baseline_perplexity")["tok_s"])
            runs["baseline_perplexity_kl"].append(hearth("perplexity", model, *ppl, "--kl-divergence",
                                                         "--reference-logits", ref, binary=a.baseline,
                                                         kind="baseline_perplexity_kl")["tok_s"])
        loads.append(os.getloadavg()[0])
        print(json.dumps(runs), flush=True)
    best = {k: max(v) for k, v in runs.items()}
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")),
               platform.machine())
    res = {"model": "SmolLM2-135M-Instruct Q4_1 GGUF", "sequence_length": L, "rows": a.num_samples,
           "threads": t, "runs": runs, "best": best, "cpu_seconds": CPU_SECONDS, "baseline": a.baseline_name if a.baseline else None,
           "ratio_perplexity_vs_prefill": best["perplexity"] / best["prefill"],
           "ratio_perplexity_kl_vs_prefill": best["perplexity_kl"] / best["prefill"],
           "machine": f"{cpu}, {os.cpu_count()} cores", "load_average": {"min": min(loads), "max": max(loads)},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    md = ["# hearth perplexity vs the engine's prefill rate, SmolLM2-135M-Instruct Q4_1", "",
          f"Rows of {L} tokens ({a.num_samples} rows, LoCoMo held-out text), {t} threads, best of {a.repeat} "
          "alternating runs (tok/s; every run listed in the json below).", "",
          "The CPU seconds (user + sys of the whole process, model load included, the least of the runs) "
          "move less with other users' load than the rates do.", "",
          "| | tok/s | vs prefill | CPU s |", "| --- | ---: | ---: | ---: |",
          f"| `hearth bench -p {L}` prefill | {best['prefill']:.0f} | 1.00 | |"]
    rows = [("perplexity", "`hearth perplexity`"),
            ("perplexity_kl", "`hearth perplexity --kl-divergence` (saved reference)")]
    if a.baseline:
        rows += [("baseline_perplexity", f"`hearth perplexity`, {a.baseline_name}"),
                 ("baseline_perplexity_kl", f"`hearth perplexity --kl-divergence`, {a.baseline_name}")]
    md += [f"| {label} | {best[k]:.0f} | {best[k] / best['prefill']:.2f} | {min(CPU_SECONDS[k]):.2f} |"
           for k, label in rows]
    md += ["",
          f"Machine: {res['machine']}, load average {min(loads):.1f} .. {max(loads):.1f} (shared by other users: "
          f"the absolute rates move with it, the ratios less). Run {res['date']}: `{res['command']}`.", ""]
    results_file.write("perplexity", "\n".join(md), res)
    shutil.rmtree(tmp)  # the models and the reference log-probs (about 1 GB)
    print("\n".join(md))


if __name__ == "__main__":
    main()
