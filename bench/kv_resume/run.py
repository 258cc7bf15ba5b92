#!/usr/bin/env python3
"""run.py: resuming a saved prompt (`hearth generate --prompt-cache-file`) against
prefilling it again, on the CPU. A ~4k-token prompt (no chat template) is prefilled once
to write the KV file; then, alternating, R runs prefill it from scratch and R runs load the
file (the page cache warm, as on a machine that saved it recently) and compute only the
last prompt token. Time to the first token = file load + the computed part of the prompt.
Prints the absolute times, the ratio, and the machine; writes bench/results/kv_resume.md (bench/results_file.py).
Usage: run.py BIN MODEL [--tokens 4096] [--rounds 3] [--threads 2]"""
import argparse, json, os, re, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import results_file  # noqa: E402
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "every jolly box of figs near the old stone bridge").split()


sys.path.insert(0, os.path.join(HERE, "..", "serve_overhead"))
from run_bench import machine  # noqa: E402


def run(args, cache):
    cmd = [args.bin, "generate", args.model, args.prompt, "--no-chat-template", "--max-tokens", "1", "--temp", "0",
           "--threads", str(args.threads), "--ctx", str(args.tokens + 512)]
    if cache:
        cmd += ["--prompt-cache-file", cache]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    n = int(re.search(r"prompt: (\d+) tokens", err).group(1))
    load = float(re.search(r"loaded from .* in ([0-9.]+) s", err).group(1)) if cache else 0.0
    computed = re.search(r"(\d+) computed in ([0-9.]+) s", err)
    prefill = float(computed.group(2)) if cache else n / float(re.search(r"prompt: \d+ tokens, ([0-9.]+) tokens/s",
                                                                         err).group(1))
    loaded = int(re.search(r"prompt cache: (\d+) tokens loaded", err).group(1)) if cache else 0
    return {"prompt_tokens": n, "loaded_tokens": loaded, "load_s": load, "prefill_s": prefill,
            "ttft_s": load + prefill}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin"), ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=4096), ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    # about 1.3 tokens per word with SmolLM2's tokenizer; the run reports the exact count
    args.prompt = " ".join(WORDS[i % len(WORDS)] + (str(i) if i % 7 == 0 else "") for i in range(int(args.tokens / 1.6)))
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "prompt.hkv")
        first = run(args, cache)  # writes the file
        size = os.path.getsize(cache)
        fresh, resumed = [], []
        for _ in range(args.rounds):
            fresh.append(run(args, None))
            resumed.append(run(args, cache))
    best_fresh = min(r["ttft_s"] for r in fresh)
    best_resumed = min(r["ttft_s"] for r in resumed)
    out = {"bench": "kv_resume", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": "{cpu}, {logical_cpus} cores".format(**machine()), "load_avg": os.getloadavg()[0],
           "model": os.path.basename(args.model.rstrip("/")), "threads": args.threads,
           "prompt_tokens": first["prompt_tokens"], "file_bytes": size,
           "fresh": fresh, "resumed": resumed,
           "prefill_ttft_s": best_fresh, "resume_ttft_s": best_resumed, "speedup": best_fresh / best_resumed}
    print(f"machine: {out['machine']} (load {out['load_avg']:.1f}), {args.threads} threads, {out['model']}")
    print(f"prompt: {out['prompt_tokens']} tokens, KV file {size / 2**20:.1f} MiB")
    print(f"prefill again: {best_fresh:.3f} s | resume from file: {best_resumed:.4f} s "
          f"(load {min(r['load_s'] for r in resumed):.4f} s + last token) | speed-up {out['speedup']:.1f}x")
    results_file.write("kv_resume",
                       f"# Resuming a saved prompt vs prefilling it again (`bench/kv_resume/run.py`)\n\n"
                       f"{out['date']}, {out['machine']}, load {out['load_avg']:.1f}, {args.threads} threads, "
                       f"{out['model']}, float KV, best of {args.rounds} alternating runs, page cache warm.\n\n"
                       f"| prompt tokens | KV file | prefill again (TTFT) | resume from file (TTFT) | speed-up |\n"
                       f"|---:|---:|---:|---:|---:|\n"
                       f"| {out['prompt_tokens']} | {size / 2**20:.1f} MiB | {best_fresh:.3f} s | {best_resumed:.4f} s | "
                       f"{out['speedup']:.1f}x |\n", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
