#!/usr/bin/env python3
"""End-to-end cost of constrained decoding: `hearth generate` decode tok/s at batch 1 on
the CPU with no constraint, with --json (free JSON object) and with --json-schema (a
nested schema), runs alternated so machine noise hits all alike; prints the medians and
the constrained/unconstrained ratio and writes its section ("## Batch 1") of
bench/results/constrained_overhead.md (the serving section of serve.py is kept; every run
as json: bench/results_file.py).

  bench/constrained/overhead.py [--bin build/bin/hearth] [--model PATH] [--runs 5] [--threads 1]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results_file  # noqa: E402
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"},
    "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"], "additionalProperties": False},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "bio": {"type": "string"}},
    "required": ["name", "age", "email", "address", "tags", "bio"], "additionalProperties": False}
PROMPT = "Write a detailed JSON profile of a fictional person, with a long bio."


def run(binary, model, threads, extra):
    p = subprocess.run([binary, "generate", model, PROMPT, "--max-tokens", "200", "--threads", str(threads),
                        "--temp", "0"] + extra, capture_output=True, text=True, check=True)
    m = re.search(r"generation: (\d+) tokens, ([\d.]+) tokens/s", p.stderr)
    return int(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "hearth"))
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/hearth/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "constrained_overhead.md"))
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SCHEMA, f)
    modes = {"none": [], "json object": ["--json"], "json schema": ["--json-schema", f.name]}
    got = {k: [] for k in modes}
    for _ in range(args.runs):
        for k, extra in modes.items():
            got[k].append(run(args.bin, args.model, args.threads, extra))
    os.unlink(f.name)
    base = statistics.median(t for _, t in got["none"])
    lines = ["| constraint | tokens (median) | decode tok/s (median) | vs none |", "| --- | ---: | ---: | ---: |"]
    res = {"model": os.path.basename(args.model), "runs": args.runs, "threads": args.threads, "modes": {}}
    for k, v in got.items():
        tps = statistics.median(t for _, t in v)
        lines.append(f"| {k} | {statistics.median(n for n, _ in v):.0f} | {tps:.1f} | {tps / base:.3f} |")
        res["modes"][k] = {"args": modes[k][:1], "runs_tokens_tps": v, "median_tps": tps, "vs_none": tps / base}
    table = "\n".join(lines)
    print(table)
    heading = "## Batch 1: `hearth generate`"
    body = (f"{heading}\n\n{results_file.provenance()}\n\n`bench/constrained/overhead.py --runs {args.runs} "
            f"--threads {args.threads}` with {os.path.basename(args.model)}: `hearth generate` decode speed (200 tokens "
            f"at most, greedy: the sampler costs the same with and without a mask), runs alternated.\n\n{table}\n")
    print("wrote", results_file.write_section(args.out, "# Constrained decoding overhead", heading, body, "batch1", res))

if __name__ == "__main__":
    main()
