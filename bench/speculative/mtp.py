#!/usr/bin/env python3
"""mtp.py: speculative decoding with the model's own multi-token-prediction head
(`--speculate mtp`) at known acceptance. `hearth bench --speculate mtp --spec-accept A` runs
the head as usual (its cost is paid: its layer and lm_head every proposal, the model's hidden
rows handed over every step) and replaces its proposals by the model's own greedy text, each
token kept with probability A, so the acceptance is set, not hoped for (a random-weight
model's head predicts nothing); the engine verifies as usual and every speculative text must
equal the one without speculation (the bench checks it per request). Each row is
speculation against no speculation on the same model in the same process, runs alternating,
median of -r runs; the ideal is the expected tokens a verification step yields,
(1 - A^(K+1)) / (1 - A), with nothing paid for proposing.

The model: a Qwen3.5 folder with mtp.* weights, e.g. a random-weight Qwen3.5-0.8B shape from
`python3 tools/gpu_models.py qwen35_0_8b mlx DIR --mtp`. Standard library only (the GPU
machine's bare python3). Writes --out (default bench/results/speculative_mtp.md) through
bench/results_file.py.

  python3 bench/speculative/mtp.py HEARTH MODEL [--device cpu|cuda] [-t 2] [-n 64] [-r 3]
      [--accept 0.6,0.8,0.9] [--depths 1,2,3] [--batch 1] [--label TEXT] [--out FILE.md]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import results_file  # noqa: E402

# any text: the model has random weights; about 220 tokens with the tiny tokenizer
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog and then it runs away into the forest."] * 6)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hearth")
    ap.add_argument("model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--accept", default="0.6,0.8,0.9")
    ap.add_argument("--depths", default="1,2,3")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--label", default="", help="the model's description for the report")
    ap.add_argument("--out", default="speculative_mtp")
    ap.add_argument("--timeout", type=int, default=3000)
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(PROMPT)
        prompt = f.name
    cmd = [args.hearth, "bench", args.model, "--prompt-file", prompt, "--speculate", "mtp", "--device", args.device,
           "--batch", args.batch, "--num-draft-tokens", args.depths, "--spec-accept", args.accept,
           "-n", str(args.n), "-r", str(args.r), "--json"]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    os.unlink(prompt)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode or not rows:
        sys.exit(f"hearth bench failed (rc {p.returncode}):\n{p.stderr[-2000:]}")
    table = ["| streams | A | K | none tok/s | mtp tok/s | speedup | tokens / step | measured A | ideal | of ideal | "
             "text equal |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for o in rows:
        table.append("| %d | %.2f | %d | %.1f | %.1f | %.2fx | %.2f | %.3f | %.2fx | %.2f | %s |" % (
            o["batch"], o["spec_accept"], o["num_draft_tokens"], o["none_decode_tps"], o["spec_decode_tps"],
            o["speedup"], o["tokens_per_step"], o["measured_accept"], o["ideal_speedup"], o["fraction_of_ideal"],
            "yes" if o["texts_equal"] else "**no**"))
    o = rows[0]
    body = "\n".join([
        "# Speculative decoding with the model's multi-token-prediction head at known acceptance",
        "",
        f"Model `{args.model}`{' (' + args.label + ')' if args.label else ''}, `--device {o['device']}`, "
        f"{o['threads']} threads; one prompt of {o['prompt_tokens']} tokens, {o['gen_tokens']} generated a request, "
        f"greedy, median of {o['runs']} runs alternating with no speculation in the same process. The head runs and "
        "pays its cost; its proposals are replaced by the model's recorded greedy text, each token kept with "
        "probability A (`hearth bench --spec-accept`). Ideal: (1 - A^(K+1)) / (1 - A) tokens a verified step, "
        "nothing paid for proposing.",
        "",
    ] + table)
    path = results_file.write(args.out, body, {"model": args.model, "label": args.label, "device": args.device,
                                               "rows": rows})
    print(body)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
