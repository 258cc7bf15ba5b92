#!/usr/bin/env python3
"""ttft.py: time to first token of `hearth serve` for a chat request whose ~2k-token system
prompt is already in the prefix cache, against the same request with a system prompt never
seen before (nothing cached). Streams each request and stops the clock at the first SSE
content chunk. Alternates cold and warm runs and reports medians of --repeat each.
Usage: ttft.py BIN MODEL [--threads 2] [--repeat 5]
Writes bench/results/prefix_cache.md (bench/results_file.py). Standard library only."""
import argparse, json, os, platform, statistics, sys, time, urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
from serve_util import hearth_serve  # noqa: E402
WORDS = ("river stone lantern harbor meadow copper violet engine orchard signal canyon "
         "thunder pebble marble falcon glacier saffron timber compass").split()


def system_prompt(seed, n_words=680):
    """A distinct long system prompt per seed (about 2k SmolLM2 tokens)."""
    return " ".join(f"{WORDS[(i * 7 + seed) % len(WORDS)]}{(i + seed) % 97}" for i in range(n_words))


def ttft(port, system, question):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, usage = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            d = json.loads(line[6:])
            if first is None and d.get("choices"):
                first = time.perf_counter() - t0
            if d.get("usage"):
                usage = d["usage"]
    return first, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    cold, warm = [], []
    with hearth_serve(a.bin, ["--model", a.model, "--threads", str(a.threads), "--ctx", "4096",
                              "--max-sequences", "4"]) as (_, port):
        ttft(port, "warm up", "hi")
        for r in range(a.repeat):
            system = system_prompt(r)
            t, n, c = ttft(port, system, "Summarize the list.")  # a prefix never seen: computed in full
            cold.append({"ttft_s": t, "prompt_tokens": n, "cached_tokens": c})
            t, n, c = ttft(port, system, "Name the first word.")  # same system prompt: from the cache
            warm.append({"ttft_s": t, "prompt_tokens": n, "cached_tokens": c})
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10).read())
    mc = statistics.median(x["ttft_s"] for x in cold)
    mw = statistics.median(x["ttft_s"] for x in warm)
    out = {"model": a.model, "threads": a.threads, "repeat": a.repeat, "host": platform.node(),
           "date": time.strftime("%Y-%m-%d"), "cold": cold, "warm": warm, "median_cold_s": mc, "median_warm_s": mw,
           "speedup": mc / mw, "stats_at_end": stats}
    md = [
        "# Prefix cache: time to first token with a cached long prefix",
        "",
        f"`bench/prefix_cache/ttft.py` on {out['date']}: `hearth serve` with {os.path.basename(a.model)}, "
        f"{a.threads} threads, `--ctx 4096`. Each round sends a chat request with a new long system prompt "
        "(nothing cached: cold), then the same system prompt with another question (warm: the system prompt's "
        f"full blocks come from the prefix cache). Streaming; TTFT = first content chunk. Medians of {a.repeat} "
        "rounds. The machine is shared by several builds and test runs (2 cores; 1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end of this run), so absolute times are noisy and slow; "
        "the ratio is the point.",
        "",
        "| | prompt tokens | cached tokens | TTFT median (s) | all runs (s) |",
        "|---|---|---|---|---|",
        f"| cold | {cold[0]['prompt_tokens']} | {cold[0]['cached_tokens']} | {mc:.3f} | "
        + ", ".join(f"{x['ttft_s']:.3f}" for x in cold) + " |",
        f"| warm | {warm[0]['prompt_tokens']} | {warm[0]['cached_tokens']} | {mw:.3f} | "
        + ", ".join(f"{x['ttft_s']:.3f}" for x in warm) + " |",
        "",
        f"Speedup of TTFT: **{mc / mw:.1f}x**. Prefix-cache hit rate over the whole run (from `/stats`): "
        f"{stats['prefix_cache']['hit_rate']:.3f}.",
        "",
    ]
    results_file.write("prefix_cache", "\n".join(md), out)
    print("\n".join(md))


if __name__ == "__main__":
    main()
