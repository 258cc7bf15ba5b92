#!/usr/bin/env python3
"""agent_loop.py: the suffix index (hearth serve --speculate suffix) on an agent-like loop: the
same kind of request again and again with one thing changed (a tool-call step that describes
another file, as an agent walking a repository asks), so each answer repeats the structure of
the ones before it. Three servers side by side on the same model file and threads: no
speculation, prompt lookup (the request's own context only) and the suffix index (prompt lookup
plus the server's recent outputs); every request goes to all three, in rotating order (A/B/C,
B/C/A, ...) so load from other users hits each alike.

Each request streams; decode tok/s is (completion tokens - 1) over the time from the first to
the last token; a row is the median over the passes. Also: tokens per second over the whole
loop (the sum of tokens over the sum of decode times), /stats' proposed / accepted counts, and
whether each server's texts equal the no-speculation server's (greedy; on the SIMD kernels a
verified step scores its rows in one GEMM, so a near-tie may break differently: the exact tier
is checked in tests/unit/test_spec.c and tests/api/test_speculative.py). No peer has a
cross-request proposer to run beside it (llama.cpp's lookup keeps its n-gram cache per
process, over its own prompt and output); the ratio is against hearth without speculation and
with prompt lookup, measured in the same run.

  .venv/bin/python bench/speculative/agent_loop.py [--passes 3] [--files 8] [--max-tokens 160]
"""

import argparse
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_bench import MODEL, REPO, chat, machine, results_file, start, stats  # noqa: E402

FILES = ["src/main.c", "src/util.py", "README.md", "server/handler.go", "lib/parser.rs", "web/app.js",
         "tests/test_api.py", "docs/setup.md", "tools/build.sh", "include/config.h", "db/schema.sql",
         "Makefile"]
TASK = ("You are a coding agent exploring a repository. Step {i}: call the read_file tool on `{path}`. "
        "Answer with only the tool call as JSON: {{\"tool\": \"read_file\", \"arguments\": {{\"path\": ...}}, "
        "\"reason\": ...}}, then one line saying what you expect the file to contain.")
MODES = ("none", "lookup", "suffix")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=3, help="fresh servers, each running the loop twice")
    ap.add_argument("--files", type=int, default=8, help="steps of the loop (files asked about)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hearth", default=os.environ.get("HEARTH_BIN", os.path.join(REPO, "build", "bin", "hearth")))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "speculative_suffix"))
    a = ap.parse_args()
    info = machine()
    rows = [{"step": i + 1, "path": FILES[i % len(FILES)], "tps": {m: [] for m in MODES}, "tokens": {}}
            for i in range(a.files)]
    first, again, texts, st = [], [], {m: {} for m in MODES}, None
    for p in range(a.passes):  # fresh servers: an empty index and prefix cache
        servers = {m: start(a.hearth, m, a.threads) for m in MODES}
        try:
            for r in range(2):  # the loop, then the loop again
                tot = {m: [0, 0.0] for m in MODES}
                for i in range(a.files):
                    prompt = TASK.format(i=i + 1, path=FILES[i % len(FILES)])
                    k = (p + r + i) % 3
                    for m in MODES[k:] + MODES[:k]:
                        text, tokens, dec, _ = chat(servers[m][1], prompt, a.max_tokens)
                        if r == 0:
                            rows[i]["tps"][m].append((tokens - 1) / dec if dec > 0 and tokens > 1 else 0.0)
                            rows[i]["tokens"][m] = tokens
                            texts[m].setdefault(i, text)
                        tot[m][0] += max(tokens - 1, 0)
                        tot[m][1] += dec
                (first if r == 0 else again).append({m: tot[m][0] / tot[m][1] if tot[m][1] else 0.0 for m in MODES})
            st = {m: stats(servers[m][1])["speculative"] for m in MODES}
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait()
    loop = {m: statistics.median(x[m] for x in first) for m in MODES}
    again_m = {m: statistics.median(x[m] for x in again) for m in MODES}
    same = {m: sum(texts[m][i] == texts["none"][i] for i in texts["none"]) for m in MODES}
    for row in rows:
        row["first"] = {m: statistics.median(row["tps"][m]) for m in MODES}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "model": os.path.basename(MODEL), "threads": a.threads, "passes": a.passes, "steps": a.files,
              "max_tokens": a.max_tokens, "machine": info, "loadavg_end": os.getloadavg(), "rows": rows,
              "loop_tps": loop, "loop_again_tps": again_m, "passes_first": first, "passes_again": again, "same_text_as_none": same, "stats": st}
    md = [f"# The suffix index on an agent-like loop ({result['date']})", "",
          f"{result['model']}, {a.threads} threads, greedy, up to {a.max_tokens} tokens, {a.files} steps of one "
          f"loop (the same tool-call request for another file), then the loop again (an agent run repeated: every "
          f"request seen before); {a.passes} passes, each on fresh servers (empty index and prefix cache), medians "
          f"over the passes; the three servers in rotating order; {info['cpu']} ({info['cores']} cores; load {info['loadavg_start'][0]:.1f} at start, "
          f"{result['loadavg_end'][0]:.1f} at the end). `.venv/bin/python bench/speculative/agent_loop.py "
          f"--passes {a.passes} --files {a.files} --max-tokens {a.max_tokens}`", "",
          "The loop's first pass (each request new to the servers; the suffix index holds the earlier steps' "
          "answers):", "",
          "| step | file | tokens (none / lookup / suffix) | none tok/s | lookup tok/s | suffix tok/s | suffix vs none "
          "| suffix vs lookup |", "|---:|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        md_ = row["first"]
        md.append(f"| {row['step']} | {row['path']} | {row['tokens']['none']} / {row['tokens']['lookup']} / "
                  f"{row['tokens']['suffix']} | {md_['none']:.1f} | {md_['lookup']:.1f} | {md_['suffix']:.1f} | "
                  f"{md_['suffix'] / md_['none'] if md_['none'] else 0:.2f}x | "
                  f"{md_['suffix'] / md_['lookup'] if md_['lookup'] else 0:.2f}x |")
    again = again_m
    md += ["", f"First pass, whole loop (tokens over decode time): none {loop['none']:.1f}, lookup "
           f"{loop['lookup']:.1f}, suffix {loop['suffix']:.1f} tok/s: **suffix {loop['suffix'] / loop['none']:.2f}x "
           f"none, {loop['suffix'] / loop['lookup']:.2f}x lookup**.", "",
           f"The loop again (the same requests, answered before): none {again['none']:.1f}, "
           f"lookup {again['lookup']:.1f}, suffix {again['suffix']:.1f} tok/s: **suffix "
           f"{again['suffix'] / again['none'] if again['none'] else 0:.2f}x none, "
           f"{again['suffix'] / again['lookup'] if again['lookup'] else 0:.2f}x lookup**.", "",
           f"Same text as no speculation (of {a.files} steps): lookup {same['lookup']}, suffix {same['suffix']}.", "",
           f"/stats of the lookup server: {json.dumps(st['lookup'])}", "",
           f"/stats of the suffix server: {json.dumps(st['suffix'])}", ""]
    print("\n".join(md))
    results_file.write(a.out, "\n".join(md), result)


if __name__ == "__main__":
    main()
