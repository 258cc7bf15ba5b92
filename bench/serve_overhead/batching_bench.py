#!/usr/bin/env python3
"""batching_bench.py: aggregate decode throughput of `hearth serve` with N concurrent
streams (continuous batching) against the same server limited to one sequence at a
time (--max-sequences 1: requests run one after another, as before batching).
Usage: batching_bench.py BIN MODEL [--tokens 64] [--threads 2] [--n 1,4,8]
Writes its result into the HTTP-overhead benchmark's file, bench/results/serve_overhead.md
(bench/results_file.py): the "Continuous batching" section and the "batching" key of its json
(both replaced on each run; the rest of the file is kept). Standard library only."""
import argparse, json, os, sys, threading, time, urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
from serve_util import hearth_serve  # noqa: E402
PROMPTS = ["The history of the city begins in the early medieval period, when",
           "In a distant galaxy, a small crew of explorers", "The recipe calls for flour, sugar and",
           "Machine learning models are trained by", "The old lighthouse keeper looked out at",
           "Quantum computers differ from classical ones because", "The river flowed past the village and",
           "Every morning the baker would"]
BAN = {str(i): -100 for i in (0, 1, 2)}  # SmolLM2 EOS / special ids: every stream runs its full length


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(bin_, model, seqs, threads, ns, tokens):
    with hearth_serve(bin_, ["--model", model, "--threads", str(threads), "--max-sequences", str(seqs),
                             "--ctx", "1024"]) as (_, port):
        post(port, {"prompt": "warm up", "max_tokens": 4, "temperature": 0})
        out = {}
        for n in ns:
            res = [None] * n
            def one(i):
                res[i] = post(port, {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 0,
                                     "logit_bias": BAN})
            ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            t0 = time.monotonic()
            for t in ts: t.start()
            for t in ts: t.join()
            wall = time.monotonic() - t0
            toks = sum(r["usage"]["completion_tokens"] for r in res)
            out[n] = {"tokens": toks, "seconds": round(wall, 3), "tok_per_s": round(toks / wall, 2)}
            print(f"max_sequences={seqs} N={n}: {toks} tokens in {wall:.2f}s = {toks / wall:.1f} tok/s", flush=True)
        return out


def main():
    a = argparse.ArgumentParser()
    a.add_argument("bin"); a.add_argument("model")
    a.add_argument("--tokens", type=int, default=64); a.add_argument("--threads", type=int, default=2)
    a.add_argument("--n", default="1,4,8")
    o = a.parse_args()
    ns = [int(x) for x in o.n.split(",")]
    before = run(o.bin, o.model, 1, o.threads, ns, o.tokens)
    after = run(o.bin, o.model, max(ns), o.threads, ns, o.tokens)
    rep = {"model": o.model, "tokens_per_request": o.tokens, "threads": o.threads,
           "loadavg": open("/proc/loadavg").read().split()[:3],
           "sequential_max_sequences_1": before, "batched": after}
    write_results(rep)
    print(json.dumps(rep, indent=2))


SECTION = "## Continuous batching"


def section_md(rep):
    """The markdown section for serve_overhead.md from one batching_bench result."""
    seq, bat = rep["sequential_max_sequences_1"], rep["batched"]
    rows = "\n".join(f"| {n} | {seq[n]['tok_per_s']} | {bat[n]['tok_per_s']} | {bat[n]['tok_per_s'] / seq[n]['tok_per_s']:.2f} |"
                     for n in seq if n in bat)
    return (f"{SECTION}: N concurrent streams, batched vs one sequence at a time (`batching_bench.py`)\n\n"
            f"{os.path.basename(rep['model'])}, --threads {rep['threads']}, {rep['tokens_per_request']} greedy tokens per "
            f"request (end-of-sequence ids banned), load average {' / '.join(rep['loadavg'])}. Aggregate tok/s of "
            f"`hearth serve --max-sequences 1` (requests run one after another) and of `--max-sequences N`.\n\n"
            "| N | one at a time tok/s | batched tok/s | ratio |\n|---:|---:|---:|---:|\n" + rows + "\n")


def write_results(rep):
    if not os.path.exists(results_file.path_of("serve_overhead")):
        md, doc = "# hearth serve: per-token overhead and hearth vs mlx_lm.server\n", {"batching": rep}
        return results_file.write("serve_overhead", md + "\n" + section_md(rep), doc)
    doc = results_file.read("serve_overhead")
    doc["batching"] = rep
    md = results_file.body_of("serve_overhead")
    at = md.find(SECTION)
    if at >= 0:  # replace the old section, up to the next "## " heading
        nxt = md.find("\n## ", at + len(SECTION))
        md = md[:at] + section_md(rep) + (md[nxt:] if nxt >= 0 else "")
    else:
        at = md.find("\n## Notes")
        md = (md[:at + 1] + section_md(rep) + "\n" + md[at + 1:]) if at >= 0 else md.rstrip("\n") + "\n\n" + section_md(rep)
    results_file.rewrite("serve_overhead", md, doc)


if __name__ == "__main__":
    sys.exit(main())
