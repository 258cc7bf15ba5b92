#!/usr/bin/env python3
"""run_bench.py: prompt lookup speculation (hearth serve --speculate lookup) against hearth without
speculation (--speculate none) on prompts that repeat their context (prompts.json: a code edit, a
summary with quotes, a JSON rewrite), greedy, SmolLM2-135M-Instruct Q4_1, 2 threads.

Both servers run side by side on the same file and threads; requests alternate between them (A/B,
then B/A on the next round) so load from other users of the machine hits both alike. Each request
streams; decode tok/s is (completion tokens - 1) over the time from the first to the last token.
Levels: one request at a time, and all prompts at once (plus one more copy of the first) to show
what speculation does inside a batch. The lookup server's /stats gives the proposed and accepted
token counts. The texts of the two servers are compared (greedy: they should be equal; the SIMD
kernels score a verified step's rows in one GEMM instead of one GEMV each, so a near-tie may
break differently; the exact tier, HEARTH_CPU=scalar, is checked in tests/unit/test_spec.c).
llama.cpp peer: its examples/lookup (n-gram speculation) on the same file and threads, compiled
here against the llama-cpp-python sdist build in the bench cache (bench/cpu_vs_llamacpp), run
between the hearth requests of each round.

`hearth generate` (one request from the command line; speculating, it runs through a batch of its
own): the same prompts, `--speculate lookup` against `--speculate none`, alternating, one process
per run; decode tok/s as the command prints it (generated tokens - 1 over the time after the first),
the proposed / accepted counts from its stderr, and whether the texts match.
`--only generate` runs just that part and keeps the serve part of the current result file
(its own date and load stay with it). Writes bench/results/speculative.md (bench/results_file.py).

  .venv/bin/python bench/speculative/run_bench.py [--rounds 3] [--max-tokens 256] [--only serve|generate]
"""

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
MODEL = os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, mode, threads):
    port = free_port()
    cmd = [binary, "serve", MODEL, "--port", str(port), "--threads", str(threads), "--speculate", mode,
           "--max-sequences", "8", "--ctx", "2048", "--no-open"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"hearth serve --speculate {mode} exited: {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("hearth serve did not start")


def render(prompt):
    """SmolLM2-Instruct's chat template for one user message, as text: hearth gets it through
    /v1/completions and llama-lookup through -p, so both start from the same tokens."""
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")


def chat(port, prompt, max_tokens):
    """One streaming greedy completion of the rendered chat: (text, completion tokens, decode seconds,
    total seconds)."""
    body = json.dumps({"prompt": render(prompt), "max_tokens": max_tokens, "stop": ["<|im_end|>"],
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    first = last = None
    text, tokens = [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev.get("choices", []):
                piece = ch.get("text")
                if piece:
                    now = time.monotonic()
                    first = first or now
                    last = now
                    text.append(piece)
    return "".join(text), tokens, (last - first) if first else 0.0, time.monotonic() - t0


LLAMA_LIB = os.path.join(CACHE, "bench", "llamacpp", "lib")
LLAMA_LOOKUP = os.path.join(CACHE, "bench", "llamacpp", "build-lookup", "llama-lookup")


def build_llama_lookup():
    """llama.cpp's own prompt-lookup example (examples/lookup) compiled against the shared libraries
    the pinned llama-cpp-python sdist build left in the bench cache (bench/cpu_vs_llamacpp): one
    C++ file, seconds. None when that build is not there."""
    src = os.path.join(CACHE, "bench", "llamacpp", "llama_cpp_python-0.3.36", "vendor", "llama.cpp")
    if os.path.exists(LLAMA_LOOKUP):
        return LLAMA_LOOKUP
    if not os.path.isdir(src) or not os.path.isdir(LLAMA_LIB):
        return None
    os.makedirs(os.path.dirname(LLAMA_LOOKUP), exist_ok=True)
    inc = [f"-I{src}/{d}" for d in ("include", "common", "ggml/include", "vendor")]
    subprocess.run(["g++", "-O2", "-std=c++17", *inc, f"{src}/examples/lookup/lookup.cpp", "-o", LLAMA_LOOKUP,
                    f"-L{LLAMA_LIB}", "-lllama-common", "-lllama", "-lggml", "-lggml-base"], check=True)
    return LLAMA_LOOKUP


def llama_lookup(binary, prompt, max_tokens, threads, n_draft):
    """llama-lookup's own decode rate (its 'decoded N tokens in S seconds' line) and tokens.
    OMP_WAIT_POLICY=passive: on a machine whose cores other users keep busy, OpenMP's spinning
    workers made it 50x slower (0.9 tok/s); passive is its best case here."""
    env = dict(os.environ, LD_LIBRARY_PATH=LLAMA_LIB, OMP_WAIT_POLICY="passive")
    out = subprocess.run([binary, "-m", MODEL, "-p", render(prompt), "-n", str(max_tokens), "-t", str(threads),
                          "-c", "2048", "--temp", "0", "--spec-draft-n-max", str(n_draft)],
                         capture_output=True, text=True, env=env, timeout=600)
    tps, n, acc = 0.0, 0, None
    for line in (out.stdout + out.stderr).splitlines():
        if "decoded" in line and "speed:" in line:
            n = int(line.split("decoded")[1].split("tokens")[0])
            tps = float(line.rsplit("speed:", 1)[1].split("t/s")[0])
        if "accept" in line and "%" in line and "n_accept" not in line:
            acc = float(line.split("=")[1].strip().rstrip("%")) / 100
    return tps, n, acc


def stats(port):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5))


NOTE = ("Caveat on the peer column: llama.cpp's decode on this shared machine swings 3-8x with other tenants' load (bench/results/cpu_vs_llamacpp.md: 34-93 tok/s for plain SmolLM2 decode at load 1.5, 1.7 tok/s at load 4), much more than hearth's, so at load 8-14 the lookup-vs-llama.cpp ratio overstates what a quiet machine would show; a quiet-machine run is still to do.")


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg_start": os.getloadavg(), "platform": platform.platform()}


def run_concurrent(port, prompts, max_tokens):
    out = [None] * len(prompts)

    def one(i):
        out[i] = chat(port, prompts[i], max_tokens)

    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out, time.monotonic() - t0


GEN_RATE = re.compile(r"generation: (\d+) tokens, ([\d.]+) tokens/s")
GEN_SPEC = re.compile(r"speculative decoding \(\w+\): (\d+) tokens proposed, (\d+) accepted")


def generate_once(binary, prompt, mode, threads, max_tokens):
    """One `hearth generate` run: (decode tok/s, tokens, text, proposed, accepted)."""
    out = subprocess.run([binary, "generate", MODEL, prompt, "--max-tokens", str(max_tokens), "--threads",
                          str(threads), "--ctx", "2048", "--speculate", mode], capture_output=True, timeout=600)
    err = out.stderr.decode()
    m = GEN_RATE.search(err)
    if out.returncode or not m:
        raise SystemExit(f"hearth generate --speculate {mode} failed: {err[-2000:]}")
    sp = GEN_SPEC.search(err)
    return float(m.group(2)), int(m.group(1)), out.stdout, int(sp.group(1)) if sp else 0, int(sp.group(2)) if sp else 0


def bench_generate(a, prompts):
    """`hearth generate` with lookup vs none on every prompt, alternating A/B then B/A per round."""
    t_load = os.getloadavg()
    rows = []
    for p in prompts:
        rec = {"none": [], "lookup": [], "text": {}, "tokens": {}, "same_text": True}
        for r in range(a.rounds):
            for m in (("none", "lookup") if r % 2 == 0 else ("lookup", "none")):
                tps, n, text, prop, acc = generate_once(a.hearth, p["prompt"], m, a.threads, a.max_tokens)
                rec[m].append(tps)
                rec["tokens"][m] = n
                if m in rec["text"] and rec["text"][m] != text:
                    rec["same_text"] = False
                rec["text"][m] = text
                if m == "lookup":
                    rec["proposed"], rec["accepted"] = prop, acc
                print(f"generate round {r + 1} {p['id']:18s} {m:6s}: {n} tokens, {tps:.1f} tok/s", file=sys.stderr)
        none, look = statistics.median(rec["none"]), statistics.median(rec["lookup"])
        rows.append({"prompt": p["id"], "tokens": rec["tokens"], "none_tps": none, "lookup_tps": look,
                     "speedup": look / none if none else 0, "runs_none": rec["none"], "runs_lookup": rec["lookup"],
                     "same_text": rec["same_text"] and rec["text"]["none"] == rec["text"]["lookup"],
                     "proposed": rec.get("proposed", 0), "accepted": rec.get("accepted", 0)})
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_start": t_load, "loadavg_end": os.getloadavg(), "threads": a.threads,
            "max_tokens": a.max_tokens, "rounds": a.rounds, "rows": rows}


# under a table with a "same text: no" row (the SIMD tier's rounding, not a lossy speculation)
DIFFERING_TEXTS = ("A row whose texts differ compares two different answers, not one answer at two speeds: on the "
                   "SIMD kernels a verified step scores its rows in one matrix product, so a greedy near-tie can "
                   "break the other way (docs/server.md); on the reference kernels (HEARTH_CPU=scalar) the texts "
                   "are equal, which tests/parity/test_generate_speculative.py checks.")

def generate_md(g):
    md = [f"## hearth generate: --speculate lookup vs none ({g['date']})", "",
          f"One process per run, {g['threads']} threads, greedy, up to {g['max_tokens']} tokens, median of "
          f"{g['rounds']} alternating rounds; load average {g['loadavg_start'][0]:.1f} at start, "
          f"{g['loadavg_end'][0]:.1f} at the end. Decode tok/s as `hearth generate` prints it; proposed / "
          "accepted: its stderr line (last run).", "",
          "| prompt | tokens (none / lookup) | none tok/s | lookup tok/s | speedup | proposed / accepted | same text |",
          "|---|---|---|---|---|---|---|"]
    for r in g["rows"]:
        md.append(f"| {r['prompt']} | {r['tokens'].get('none')} / {r['tokens'].get('lookup')} | {r['none_tps']:.1f} | "
                  f"{r['lookup_tps']:.1f} | {r['speedup']:.2f}x | {r['proposed']} / {r['accepted']} | "
                  f"{'yes' if r['same_text'] else 'no'} |")
    if not all(r["same_text"] for r in g["rows"]):
        md += ["", DIFFERING_TEXTS]
    return md + [""]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hearth", default=os.environ.get("HEARTH_BIN", os.path.join(REPO, "build", "bin", "hearth")))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "speculative"))
    ap.add_argument("--only", choices=("serve", "generate"), help="one part; the other is kept from the result file")
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        raise SystemExit(f"{MODEL} missing: tools/get_models.sh fetches it")
    prompts = json.load(open(os.path.join(HERE, "prompts.json")))
    if a.only == "generate":
        result = results_file.read(a.out)
        result["generate"] = bench_generate(a, prompts)
        return write(a.out, result)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
            "model": os.path.basename(MODEL), "threads": a.threads, "max_tokens": a.max_tokens, "rounds": a.rounds}
    llama = build_llama_lookup()
    servers = {m: start(a.hearth, m, a.threads) for m in ("none", "lookup")}
    try:
        for m in servers:  # warm-up: pages, kernels
            chat(servers[m][1], "hello", 8)
        single = {p["id"]: {"none": [], "lookup": [], "llama.cpp lookup": [], "tokens": {}, "same_text": True,
                            "text": {}} for p in prompts}
        batch = {"none": [], "lookup": []}
        for r in range(a.rounds):
            order = ("none", "lookup") if r % 2 == 0 else ("lookup", "none")
            for p in prompts:
                for m in order:
                    text, n, dec, _ = chat(servers[m][1], p["prompt"], a.max_tokens)
                    rec = single[p["id"]]
                    rec[m].append((n - 1) / dec if dec > 0 else 0.0)
                    rec["tokens"][m] = n
                    if m in rec["text"] and rec["text"][m] != text:
                        rec["same_text"] = False  # not deterministic run to run: should never happen
                    rec["text"][m] = text
                    print(f"round {r + 1} {p['id']:18s} {m:6s}: {n} tokens, {rec[m][-1]:.1f} tok/s", file=sys.stderr)
                if llama:
                    tps, n, acc = llama_lookup(llama, p["prompt"], a.max_tokens, a.threads, 8)
                    rec = single[p["id"]]
                    rec["llama.cpp lookup"].append(tps)
                    rec["tokens"]["llama.cpp"], rec["llama_accept"] = n, acc
                    print(f"round {r + 1} {p['id']:18s} llama.cpp lookup: {n} tokens, {tps:.1f} tok/s", file=sys.stderr)
            for m in order:
                texts = [p["prompt"] for p in prompts] + [prompts[0]["prompt"]]
                res, wall = run_concurrent(servers[m][1], texts, a.max_tokens)
                batch[m].append(sum(x[1] for x in res) / wall)
                print(f"round {r + 1} 4 at once {m:6s}: {batch[m][-1]:.1f} tok/s aggregate", file=sys.stderr)
        spec = stats(servers["lookup"][1]).get("speculative", {})
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()
    rows = []
    for p in prompts:
        rec = single[p["id"]]
        none, look = statistics.median(rec["none"]), statistics.median(rec["lookup"])
        lc = statistics.median(rec["llama.cpp lookup"]) if rec["llama.cpp lookup"] else 0.0
        rows.append({"prompt": p["id"], "tokens": rec["tokens"], "none_tps": none, "lookup_tps": look,
                     "speedup": look / none if none else 0, "same_text": rec["text"]["none"] == rec["text"]["lookup"],
                     "llamacpp_lookup_tps": lc, "llamacpp_accept": rec.get("llama_accept"),
                     "vs_llamacpp_lookup": look / lc if lc else None})
    bn, bl = statistics.median(batch["none"]), statistics.median(batch["lookup"])
    result = dict(info, single=rows, concurrent4={"none_tps": bn, "lookup_tps": bl, "ratio": bl / bn if bn else 0},
                  lookup_stats=spec, loadavg_end=os.getloadavg(),
                  peer=("llama.cpp's examples/lookup (n-gram cache speculation, --spec-draft-n-max 8, greedy), "
                        "built from the llama-cpp-python 0.3.36 sdist's llama.cpp against its shared libraries, "
                        "OMP_WAIT_POLICY=passive" if llama else "llama.cpp lookup: not measured (no llama.cpp build)"))
    if a.only != "serve":
        result["generate"] = bench_generate(a, prompts)
    else:  # keep the generate part of the current file
        old = results_file.read_if_exists(a.out, {}).get("generate")
        if old:
            result["generate"] = old
    write(a.out, result)


def write(out, result):
    """The result file: the serve part, then the generate part, then the json."""
    info, rows, a_threads = result, result["single"], result["threads"]
    bn, bl, spec = result["concurrent4"]["none_tps"], result["concurrent4"]["lookup_tps"], result["lookup_stats"]
    md = [f"# Prompt lookup speculation vs none ({result['date']})", "",
          f"{info['model']}, {a_threads} threads, greedy, up to {result['max_tokens']} tokens, median of "
          f"{result['rounds']} alternating A/B rounds; {info['machine']['cpu']} ({info['machine']['cores']} cores "
          f"shared with other users: load {info['machine']['loadavg_start'][0]:.1f} at start, timings are noisy). "
          "`.venv/bin/python bench/speculative/run_bench.py`", "", "## hearth serve", "",
          *([result["serve_note"], ""] if result.get("serve_note") else []),
          "| prompt | tokens (none / lookup / llama.cpp) | none tok/s | lookup tok/s | speedup | same text "
          "| llama.cpp lookup tok/s (accept) | lookup vs llama.cpp |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f" ({r['llamacpp_accept']:.2f})" if r["llamacpp_accept"] is not None else ""
        vs = f"{r['vs_llamacpp_lookup']:.2f}x" if r["vs_llamacpp_lookup"] else "-"
        md.append(f"| {r['prompt']} | {r['tokens'].get('none')} / {r['tokens'].get('lookup')} / "
                  f"{r['tokens'].get('llama.cpp', '-')} | {r['none_tps']:.1f} | {r['lookup_tps']:.1f} | "
                  f"{r['speedup']:.2f}x | {'yes' if r['same_text'] else 'no'} | {r['llamacpp_lookup_tps']:.1f}{acc} | "
                  f"{vs} |")
    if not all(r["same_text"] for r in rows):
        md += ["", DIFFERING_TEXTS]
    md += ["", f"4 requests at once (aggregate tok/s): none {bn:.1f}, lookup {bl:.1f} ({bl / bn if bn else 0:.2f}x; "
           "speculation stays on up to 4 decoding requests).", "",
           f"Lookup server /stats: {json.dumps(spec)}", "", f"Peer: {result['peer']}.", "", NOTE, ""]
    if "generate" in result:
        md += generate_md(result["generate"])
    results_file.write(out, "\n".join(md), result)
    print("\n".join(md))



if __name__ == "__main__":
    main()
