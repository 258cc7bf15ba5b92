#!/usr/bin/env python3
"""Constrained decoding under concurrency: `hearth serve` with N concurrent streams, each
asking for the same number of tokens with no constraint, with `response_format`
json_object and with a json_schema (a nested schema), rounds alternated so machine noise
hits all alike; prints the aggregate decode tok/s of each mode, its ratio to no
constraint, and writes bench/results/constrained_serve.md.

  bench/constrained/serve.py --model PATH [--bin build/bin/hearth] [--device cuda]
                             [--concurrency 1,32] [--rounds 3] [--max-tokens 128]

With random weights (the GPU benchmark models) an unconstrained stream runs to
max_tokens; a constrained one may close its JSON earlier, so the rate is counted in
completion tokens per second of each request's own decode time, summed over the streams that
ran together. A request's decode time is its whole time less the time to its first token,
which is measured apart (the same N requests at once with max_tokens 1, median of the rounds):
the GPU models' 8B vocabularies outrun their tiny tokenizers', so most of their tokens have no
text and stream no chunk to time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results_file  # noqa: E402
from serve_util import hearth_serve  # noqa: E402
from overhead import SCHEMA  # noqa: E402  (the same nested schema as the batch-1 bench)
PROMPT = "Write a detailed JSON profile of a fictional person, with a long bio."
MODES = {
    "none": None,
    "json object": {"type": "json_object"},
    "json schema": {"type": "json_schema", "json_schema": {"name": "profile", "schema": SCHEMA, "strict": True}},
}


def stream(port, fmt, max_tokens, out):
    """One streamed chat request: (completion tokens, seconds from sending it to its end)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if fmt:
        body["response_format"] = fmt
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    tokens = 0
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    out.append((tokens, time.perf_counter() - t0))


def run_streams(port, fmt, n, max_tokens):
    got = []
    ts = [threading.Thread(target=stream, args=(port, fmt, max_tokens, got)) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return got


def first_token_time(port, n, rounds):
    """Seconds to the first token of n requests sent at once (max_tokens 1), median of rounds."""
    return statistics.median(statistics.median(sec for _, sec in run_streams(port, None, n, 1)) for _ in range(rounds))


def round_rate(port, fmt, n, max_tokens, ttft):
    """Aggregate decode tok/s of n concurrent streams (tokens after the first over the time after it)."""
    got = run_streams(port, fmt, n, max_tokens)
    rate = sum((tok - 1) / (sec - ttft) for tok, sec in got if tok > 1 and sec > ttft)
    return rate, statistics.median(tok for tok, _ in got)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "hearth"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--extra", default="", help="more serve flags, one string")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "constrained_serve.md"))
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    serve_args = ["--model", args.model, "--device", args.device, "--max-sequences", str(max(levels))]
    rows, data = [], {}
    with hearth_serve(args.bin, serve_args + args.extra.split()) as (_, port):
        run_streams(port, None, 1, 8)  # warm-up (graphs, caches)
        for n in levels:
            ttft = first_token_time(port, n, args.rounds)
            got = {k: [] for k in MODES}
            toks = {k: [] for k in MODES}
            for _ in range(args.rounds):
                for k, fmt in MODES.items():
                    r, t = round_rate(port, fmt, n, args.max_tokens, ttft)
                    got[k].append(r)
                    toks[k].append(t)
            base = statistics.median(got["none"])
            for k in MODES:
                med = statistics.median(got[k])
                rows.append(f"| {n} | {k} | {statistics.median(toks[k]):.0f} | {med:.1f} | {med / base:.3f} |")
                data[f"{n}/{k}"] = {"tok_s": got[k], "tokens": toks[k], "ratio": med / base, "ttft_s": ttft}
    head = ["| streams | constraint | tokens per stream (median) | aggregate decode tok/s (median) | vs none |",
            "| ---: | --- | ---: | ---: | ---: |"]
    table = "\n".join(head + rows)
    print(table)
    gpu = None
    if args.device == "cuda":
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip().splitlines()[0] + f" + {results_file.machine()}"
        except Exception:
            gpu = None
    body = (f"# Constrained decoding under concurrency ({args.device})\n\n"
            f"{os.path.basename(args.model.rstrip('/'))}: `hearth serve --device {args.device}`, N streamed greedy chat "
            f"requests at once per round, {args.rounds} rounds, modes alternated, {args.max_tokens} tokens at most; "
            f"aggregate decode rate = the sum over streams of (tokens - 1) / (request time - time to first token, "
            f"measured apart with max_tokens 1).\n\n"
            f"{table}\n")
    results_file.write(args.out, body, {"model": os.path.basename(args.model.rstrip("/")), "device": args.device,
                                        "rounds": args.rounds, "max_tokens": args.max_tokens, "rows": data},
                       machine_line=gpu)


if __name__ == "__main__":
    main()
