#!/usr/bin/env python3
"""search_speed.py: `hearth memory` on a generated 10,000-article vault: the time to
rebuild the index from the files (`hearth memory reindex`) and the latency of
memory_search (p50/p95/p99 over 300 queries, each a JSON-RPC round trip to one
`hearth memory mcp` process, so the process start and the index's freshness check are
not in it). Targets (issue 37): p95 <= 20 ms, rebuild < 60 s, on 2 cores.

BM25 only by default: embedding 10,000 articles with all-MiniLM-L6-v2 takes about an hour
on 2 CPU cores (a one-time cost; vectors are cached by text, so a rebuild re-embeds
nothing). Writes bench/results/memory_search.md (bench/results_file.py).
usage: search_speed.py [--bin build/bin/hearth] [--articles 10000]
"""
import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402


def words(rng, n_vocab=20000):
    """A Zipf-like vocabulary of made-up words (rank r drawn with weight 1/r)."""
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "vi", "so", "de", "pa", "gu", "ze", "ri", "mo", "fe"]
    vocab = sorted({"".join(rng.choice(syll) for _ in range(rng.randint(2, 4))) for _ in range(n_vocab * 2)})
    rng.shuffle(vocab)
    vocab = vocab[:n_vocab]
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    return vocab, weights


def make_vault(binary, root, n, rng):
    subprocess.run([binary, "memory", "init", "--vault", root], check=True, capture_output=True)
    vocab, weights = words(rng)
    titles = [f"Topic {i} {rng.choice(vocab)}" for i in range(n)]
    art = Path(root) / "articles"
    for i, title in enumerate(titles):
        parts = [f"---\ntitle: {title}\n---\n# {title}\n"]
        for s in range(3):
            text = " ".join(rng.choices(vocab, weights, k=80))
            link = rng.choice(titles)
            parts.append(f"\n## Section {s} {rng.choice(vocab)}\n\n{text} See [[{link}]].[^{s}]\n")
        parts.append("".join(f"\n[^{s}]: [[Conversations/c{i}#m{s}]]" for s in range(3)) + "\n")
        (art / f"topic-{i}.md").write_text("".join(parts))
    return vocab, weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "bin" / "hearth"))
    ap.add_argument("--articles", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "memory_search"))
    ap.add_argument("--keep", help="build the vault here and keep it (for profiling)")
    a = ap.parse_args()
    rng = random.Random(37)
    tmp = a.keep or tempfile.mkdtemp(prefix="memory-speed-")
    root = os.path.join(tmp, "wiki")
    vocab, weights = make_vault(a.bin, root, a.articles, rng)
    common = ["--vault", root, "--embed-model", "none"]
    t = time.perf_counter()
    subprocess.run([a.bin, "memory", "status", *common], check=True, capture_output=True)  # first index
    first = time.perf_counter() - t
    t = time.perf_counter()
    r = subprocess.run([a.bin, "memory", "reindex", *common], check=True, capture_output=True, text=True)
    rebuild_wall = time.perf_counter() - t
    rebuild = json.loads(r.stdout)
    t = time.perf_counter()
    subprocess.run([a.bin, "memory", "search", "kalo mine", *common], check=True, capture_output=True)
    cli_search = time.perf_counter() - t
    p = subprocess.Popen([a.bin, "memory", "mcp", *common], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lat = []
    for i in range(a.queries + 20):
        q = " ".join(rng.choices(vocab, weights, k=rng.randint(2, 5)))
        req = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
               "params": {"name": "memory_search", "arguments": {"query": q, "limit": 5}}}
        t = time.perf_counter()
        p.stdin.write(json.dumps(req) + "\n")
        p.stdin.flush()
        resp = json.loads(p.stdout.readline())
        dt = time.perf_counter() - t
        assert not resp["result"]["isError"], resp
        if i >= 20:  # the first queries warm the page cache and SQLite's
            lat.append(dt * 1000)
    p.stdin.close()
    p.wait()
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    lat.sort()
    pct = {k: round(lat[min(len(lat) - 1, int(len(lat) * f))], 2) for k, f in (("p50", .5), ("p95", .95), ("p99", .99))}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    res = {"benchmark": "memory search latency and index rebuild", "articles": a.articles,
           "documents": rebuild["documents"], "chunks": rebuild["chunks"], "queries": len(lat),
           "search_ms": pct, "rebuild_s": round(rebuild["seconds"], 2), "rebuild_wall_s": round(rebuild_wall, 2),
           "first_index_wall_s": round(first, 2), "cli_search_wall_s": round(cli_search, 3), "ranking": "BM25 only",
           "machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
           "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
           "load_average_1min": round(os.getloadavg()[0], 2)}
    md = (f"# memory search speed\n\n`bench/memory/search_speed.py`, {res['when']}, {res['machine']}, load "
          f"average {res['load_average_1min']} while it ran (a machine shared with other builds).\n\n"
          f"A generated vault of {a.articles} articles ({res['documents']} documents with Reference/ and Meta/, "
          f"{res['chunks']} chunks), BM25 ranking.\n\n"
          "| measure | value | target |\n| --- | ---: | ---: |\n"
          f"| memory_search p50 (MCP round trip) | {pct['p50']} ms | |\n"
          f"| memory_search p95 | {pct['p95']} ms | <= 20 ms |\n"
          f"| memory_search p99 | {pct['p99']} ms | |\n"
          f"| index rebuild (`memory reindex`) | {res['rebuild_s']} s ({res['rebuild_wall_s']} s wall) | < 60 s |\n"
          f"| first index on open | {res['first_index_wall_s']} s | |\n"
          f"| one `hearth memory search` process, start to end | {res['cli_search_wall_s']} s | |\n")
    results_file.write(a.out, md, res)
    print(md)


if __name__ == "__main__":
    main()
