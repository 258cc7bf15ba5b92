#!/usr/bin/env python3
"""batching_bench.py: aggregate decode throughput of `hearth serve` with N concurrent
streams (continuous batching) against the same server limited to one sequence at a
time (--max-sequences 1: requests run one after another, as before batching).
Usage: batching_bench.py BIN MODEL [--tokens 64] [--threads 2] [--n 1,4,8]
Writes bench/results/batching.json. Standard library only."""
import argparse, json, os, socket, subprocess, sys, threading, time, urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROMPTS = ["The history of the city begins in the early medieval period, when",
           "In a distant galaxy, a small crew of explorers", "The recipe calls for flour, sugar and",
           "Machine learning models are trained by", "The old lighthouse keeper looked out at",
           "Quantum computers differ from classical ones because", "The river flowed past the village and",
           "Every morning the baker would"]
BAN = {str(i): -100 for i in (0, 1, 2)}  # SmolLM2 EOS / special ids: every stream runs its full length


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(bin_, model, seqs, threads, ns, tokens):
    port = free_port()
    p = subprocess.Popen([bin_, "serve", "--model", model, "--port", str(port), "--threads", str(threads),
                          "--max-sequences", str(seqs), "--ctx", "1024"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except Exception:
                time.sleep(0.1)
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
    finally:
        p.terminate()
        p.wait()


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
    path = os.path.join(REPO, "bench", "results", "batching.json")
    with open(path, "w") as f:
        json.dump(rep, f, indent=2)
    print(json.dumps(rep, indent=2))


if __name__ == "__main__":
    sys.exit(main())
