#!/usr/bin/env python3
"""Constrained decoding under concurrency: `hearth serve` with N concurrent streams, each
asking for the same number of tokens with no constraint, with `response_format`
json_object and with a json_schema (a nested schema), rounds alternated so machine noise
hits all alike; prints the aggregate decode tok/s of each mode, its ratio to no
constraint, and writes its section ("## Serving ... (DEVICE)") of
bench/results/constrained_overhead.md (the batch-1 `overhead.py` section is kept).

  bench/constrained/serve.py --model PATH [--bin build/bin/hearth] [--device cuda]
                             [--concurrency 1,32] [--rounds 3] [--max-tokens 128]

With random weights (the GPU benchmark models) an unconstrained stream runs to
max_tokens; a constrained one may close its JSON earlier, so the rate is counted in
completion tokens per second of each request's own decode time (its first answer chunk to its
last; chunks, not their text: the GPU models' 8B vocabularies outrun their tiny tokenizers', so
most of their tokens have no text), summed over the streams that ran together ("stream").
The same requests are also sent unstreamed ("whole": tokens over each answer's own time),
the engine's rate without the per-chunk delivery, which on a small shared CPU machine
competes with the forward pass for the cores.

Each row also gives the server's own count (/stats) of what speculation did: completion
tokens per engine step (each request's prefill step included; at one stream, the tokens a
verified step emits) and the proposed tokens accepted, so a constrained mode that is slower
because its text repeats less (prompt lookup accepts less of it) shows as fewer tokens per
step, not as a cost of the mask.
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
# each mode: the request fields it adds (a forced tool call is left out: a stream sends
# nothing while the model writes a call, so its decode span cannot be timed from chunks)
MODES = {
    "none": {},
    "json object": {"response_format": {"type": "json_object"}},
    "json schema": {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "profile", "schema": SCHEMA, "strict": True}}},
}


def stream(port, fmt, max_tokens, out):
    """One streamed chat request: (completion tokens, seconds from first to last token)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    body.update(fmt or {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev.get("choices"):  # any chunk of the answer: a random-weight model's tokens may have no text
                now = time.perf_counter()
                first = first or now
                last = now
    out.append((tokens - 1, (last - first) if first and last and last > first else 0.0))


def whole(port, fmt, max_tokens, out):
    """One chat request answered whole: (completion tokens, seconds from sending it to its
    answer: the prompt's prefill, a cached prefix after the first round, included)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0}
    body.update(fmt or {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        tokens = json.load(r)["usage"]["completion_tokens"]
    out.append((tokens, time.perf_counter() - t))


def engine_counts(port):
    """(engine steps, proposed tokens, accepted tokens) so far, from /stats."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=60) as r:
        s = json.load(r)
    spec = s.get("speculative", {}).values()
    return (s["steps"]["count"], sum(v["proposed_tokens"] for v in spec), sum(v["accepted_tokens"] for v in spec))


def round_rate(port, fmt, n, max_tokens, how=stream):
    """Aggregate tok/s of n concurrent requests (each one's tokens over its own span), their
    median tokens, and (completion tokens, engine steps, proposed, accepted) of the round."""
    got = []
    before = engine_counts(port)
    ts = [threading.Thread(target=how, args=(port, fmt, max_tokens, got)) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = engine_counts(port)
    rate = sum(tok / span for tok, span in got if span > 0 and tok > 0)
    # stream() counts tokens - 1 (the first chunk starts its span): the usage's count is one more
    total = sum(tok + (how is stream) for tok, _ in got)
    return rate, statistics.median(tok for tok, _ in got), (total, *(a - b for a, b in zip(after, before)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "hearth"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--extra", default="", help="more serve flags, one string")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "constrained_overhead.md"))
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    serve_args = ["--model", args.model, "--device", args.device, "--max-sequences", str(max(levels))]
    rows, data = [], {}
    load = [os.getloadavg()[0]]
    with hearth_serve(args.bin, serve_args + args.extra.split()) as (_, port):
        round_rate(port, None, 1, 8)  # warm-up (graphs, caches)
        for n in levels:
            for how in (stream, whole):
                got = {k: [] for k in MODES}
                toks = {k: [] for k in MODES}
                counts = {k: [0, 0, 0, 0] for k in MODES}  # tokens, steps, proposed, accepted
                for _ in range(args.rounds):
                    for k, fmt in MODES.items():
                        r, t, c = round_rate(port, fmt, n, args.max_tokens, how)
                        got[k].append(r)
                        toks[k].append(t)
                        counts[k] = [a + b for a, b in zip(counts[k], c)]
                load.append(os.getloadavg()[0])
                base = statistics.median(got["none"])
                for k in MODES:
                    med = statistics.median(got[k])
                    # no chunk to time (a random-weight GPU model's tokens mostly have no text):
                    # the streamed rate is unknown, the whole row still measures
                    ratio = med / base if base > 0 else None
                    total, steps, proposed, accepted = counts[k]
                    per_step = total / steps if steps else 0.0
                    rows.append(f"| {n} | {how.__name__} | {k} | {statistics.median(toks[k]):.0f} | {med:.1f} | "
                                f"{'-' if ratio is None else f'{ratio:.3f}'} | {per_step:.2f} | {accepted} / {proposed} |")
                    data[f"{n}/{how.__name__}/{k}"] = {"tok_s": got[k], "tokens": toks[k], "ratio": ratio,
                                                       "completion_tokens": total, "steps": steps,
                                                       "proposed": proposed, "accepted": accepted}
    head = ["| streams | measured | constraint | tokens per stream (median) | aggregate tok/s (median) | vs none "
            "| tokens per step | accepted / proposed |",
            "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    table = "\n".join(head + rows)
    print(table)
    gpu = None
    if args.device == "cuda":
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip().splitlines()[0] + f" + {results_file.machine()}"
        except Exception:
            gpu = None
    extra = f", {args.extra}" if args.extra else ""
    heading = f"## Serving: N concurrent streams ({args.device}{extra})"
    body = (f"{heading}\n\n{results_file.provenance(machine_line=gpu, load=' / '.join(f'{x:.1f}' for x in load))}\n\n"
            f"{os.path.basename(args.model.rstrip('/'))}: `hearth serve --device {args.device}`, N streamed greedy chat "
            f"requests at once per round, {args.rounds} rounds, modes alternated, {args.max_tokens} tokens at most; "
            f"`stream`: streamed requests, aggregate decode rate = the sum over streams of (tokens - 1) / (last "
            f"answer chunk's time - first's); `whole`: the same requests answered whole, the sum of tokens / "
            f"(answer time - send time), the cached prompt's prefill included; `tokens per step`: completion "
            f"tokens over engine steps, all rounds (prefill steps included), `accepted / proposed`: speculative "
            f"tokens, all rounds (/stats). Load average: before the run, then after each measurement.\n\n{table}\n")
    path = results_file.write_section(args.out, "# Constrained decoding overhead", heading, body, f"serve_{args.device}{extra}",
                                      {"model": os.path.basename(args.model.rstrip("/")), "rounds": args.rounds,
                                       "max_tokens": args.max_tokens, "loadavg": load, "rows": data})
    print("wrote", path)

if __name__ == "__main__":
    main()
