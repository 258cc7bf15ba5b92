#!/usr/bin/env python3
"""load_gen.py: N concurrent streaming /v1/chat/completions clients against any OpenAI-compatible server.

It owns the load pattern and the per-level numbers of bench/serve_load: N client threads released
together, each sending R short chats back to back (closed loop) from a fixed, seeded pool of prompts;
TTFT at the first SSE event with content, per-request decode tok/s, aggregate completion tok/s over the
level's wall time, TTFT p50/p95, errors. The HTTP clock is bench/serve_overhead/sse_client.py (raw
sockets); it must not start or stop servers (run_bench.py does) and never judges the generated text.
usage: load_gen.py --port P [--n 1,4,16] [--max-requests 16] [--max-tokens 64] [--ban 0,1,2] [--model NAME]
"""

import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve_overhead"))
from report import median, pct  # noqa: E402
from run_bench import per_request  # noqa: E402
from sse_client import stream_completion  # noqa: E402

# Short, varied user turns (facts, how-to, code, lists, small creative asks): a chat server's daily mix.
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is to a beginner.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Suggest a name for a small bakery by the sea.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the difference between weather and climate?",
    "Write a short email asking a colleague to reschedule a meeting.",
    "List five fruits that are high in vitamin C.",
    "Why is the sky blue?",
    "How many minutes are there in a week? Show the steps.",
    "Describe a cat to someone who has never seen one.",
    "What are the main parts of a computer?",
    "Give me a simple recipe for pancakes.",
]
SEED = 1234  # fixes which prompt each request of a level gets, so every server sees the same sequence


def request_body(prompt, max_tokens, banned, model=None):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # No "seed": sampling is greedy, and mlx_lm.server (0.32) serves requests that carry a seed one at a
    # time instead of batching them (ResponseGenerator._is_batchable).
    if banned:
        # OpenAI's bias range is [-100, 100]; -100 keeps end-of-turn ids from being chosen, so every
        # stream runs exactly max_tokens on every server and the token counts are comparable
        body["logit_bias"] = {str(i): -100 for i in banned}
    if model:
        body["model"] = model
    return body


def per_client(n, max_requests):
    """Requests each of n clients sends: 2 (so a level holds more than one wave), fewer once n * 2
    passes max_requests (N=16 sends 16), keeping the slowest peers' levels within minutes."""
    return max(1, min(2, max_requests // n))


def tokens_of(r, max_tokens):
    """Completion tokens of one stream: usage when the server sends it, else max_tokens when it stopped
    for length (EOS is banned), else the content events (a lower bound: held-back partial UTF-8)."""
    if r.usage and r.usage.get("completion_tokens") is not None:
        return r.usage["completion_tokens"], "usage"
    if r.finish_reason == "length":
        return max_tokens, "finish_reason=length"
    return len(r.token_times), "content events"


def cached_tokens(r):
    """Prompt tokens the server took from its prefix cache (usage.prompt_tokens_details), None if unsaid."""
    return ((r.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def run_level(port, n, per_client, max_tokens, banned, model=None, path="/v1/chat/completions", make_body=None,
              timeout=900.0):
    """n clients x per_client requests; returns the per-request records and the level summary.
    make_body(k) gives request k's body (k < n * per_client; default: a chat from PROMPTS); timeout is
    each socket's (a stalled server fails the level instead of hanging it)."""
    order = list(range(n * per_client))
    random.Random(SEED + n).shuffle(order)
    results = [[None] * per_client for _ in range(n)]
    gate = threading.Barrier(n)

    def client(i):
        gate.wait()
        for j in range(per_client):
            k = order[i * per_client + j]
            body = make_body(k) if make_body else request_body(PROMPTS[k % len(PROMPTS)], max_tokens, banned, model)
            results[i][j] = stream_completion(port, path, body, timeout=timeout)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [r for row in results for r in row]
    reqs, sources = [], set()
    for r in flat:
        toks, src = tokens_of(r, max_tokens)
        sources.add(src)
        if not r.usage or r.usage.get("completion_tokens") is None:
            r.usage = dict(r.usage or {}, completion_tokens=toks)  # per_request reads the count from usage
        d = per_request(r)
        d["decode_tps"] = 1.0 / d["decode_s_per_token"] if d["decode_s_per_token"] else None
        d["cached_tokens"] = cached_tokens(r)
        reqs.append(d)
    ok = [d for d, r in zip(reqs, flat) if not d["error"] and r.status == 200]
    start = min(r.t_send for r in flat)
    end = max(r.t_send + (r.t_done or 0) for r in flat)
    tokens = sum(d["completion_tokens"] or 0 for d in ok)
    ttfts = [d["ttft_s"] for d in ok if d["ttft_s"] is not None]
    summary = {
        "n": n, "requests": len(flat), "errors": len(flat) - len(ok),
        "error_samples": [d["error"] for d in reqs if d["error"]][:3],
        "short_streams": sum(1 for d in ok if (d["completion_tokens"] or 0) < max_tokens),
        "token_count_from": sorted(sources),
        "completion_tokens": tokens, "wall_s": end - start,
        "aggregate_tps": tokens / (end - start) if end > start else None,
        # nearest-rank percentiles over every request of the level (2N samples by default)
        "ttft_p50_ms": None if not ttfts else median(ttfts) * 1e3,
        "ttft_p95_ms": None if not ttfts else pct(ttfts, 0.95) * 1e3,
        "decode_tps_median": median([d["decode_tps"] for d in ok]),
        "prompt_tokens_median": median([d["prompt_tokens"] for d in ok]),
        "cached_tokens_median": median([d["cached_tokens"] for d in ok]),
    }
    return reqs, summary


def warm_up(port, banned, model=None, max_requests=3, max_seconds=60.0):
    """8-token requests before measuring: first-request costs (lazy compilation, page faults, a cold
    prompt path) stay out of the levels, and the best decode rate seen lets a caller project how long a
    level takes. Up to max_requests, stopping once two in a row agree within 25% or max_seconds passed
    (some servers' first request is many times slower than the next, others are slow throughout)."""
    rates, t0, first = [], time.monotonic(), None
    for k in range(max_requests):
        r = stream_completion(port, "/v1/chat/completions", request_body(PROMPTS[k % len(PROMPTS)], 8, banned, model))
        if r.error or r.status != 200:
            raise RuntimeError(f"warm-up request failed: {r.error}")
        first = first or r.text[:60]
        rates.append(7 / (r.t_done - r.ttft) if r.ttft is not None and r.t_done > r.ttft else None)
        stable = len(rates) >= 2 and rates[-1] and rates[-2] and abs(rates[-1] / rates[-2] - 1) < 0.25
        if stable or time.monotonic() - t0 > max_seconds:
            break
    seen = [x for x in rates if x]
    return {"requests": len(rates), "seconds": time.monotonic() - t0, "decode_tps_each": rates,
            "decode_tps": max(seen) if seen else None, "text_prefix": first}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", default="1,4,16", help="concurrency levels")
    ap.add_argument("--max-requests", type=int, default=16, help="requests per level: 2 per client up to this")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ban", default="", help="token ids to ban with logit_bias (end-of-turn ids)")
    ap.add_argument("--model", default=None, help="'model' field of the requests (omitted by default)")
    a = ap.parse_args()
    banned = [int(x) for x in a.ban.split(",") if x]
    warm_up(a.port, banned, a.model)
    out = []
    for n in (int(x) for x in a.n.split(",")):
        t0 = time.time()
        _, s = run_level(a.port, n, per_client(n, a.max_requests), a.max_tokens, banned, a.model)
        out.append(s)
        print(f"N={n}: {s['aggregate_tps']:.1f} tok/s aggregate, TTFT p50 {s['ttft_p50_ms']:.0f} ms p95 "
              f"{s['ttft_p95_ms']:.0f} ms, errors {s['errors']} ({time.time() - t0:.1f} s)", file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
