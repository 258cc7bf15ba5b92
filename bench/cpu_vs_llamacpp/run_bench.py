#!/usr/bin/env python3
"""bench/cpu_vs_llamacpp/run_bench.py: CPU prefill and decode speed of hearth (`hearth bench --json`)
against llama.cpp's own llama-bench (`-lm none`, built from llama-cpp-python's vendored source) on the
same GGUF files, same thread count, same prompt length and context (prefill pp512 into an empty cache;
decode tg128 both at 512 context, llama-bench -d 512 against hearth bench -p 512, and at short context,
llama-bench's default empty-cache tg128 against hearth bench -p 1), median of r runs each (by default in interleaved rounds: one run of each engine
per round, alternating which goes first, so both see the same machine); both load weights into anonymous memory (hearth by
design, llama-bench with -lm none; checked through /proc/<pid>/smaps). Writes
bench/results/cpu_vs_llamacpp.md (bench/results_file.py: the table, then the full result as json). A benchmark, not a test: it asserts nothing about speed.
usage: .venv/bin/python bench/cpu_vs_llamacpp/run_bench.py [-p 512] [-n 128] [-t 2] [-r 5] [--hearth BIN]
       [--only ID,ID] [--no-1b] [--out bench/results/cpu_vs_llamacpp]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402
import prepare_models  # noqa: E402  (model list and paths live there)

# llama.cpp's benchmark tool, built by install_llamacpp.sh from the same vendored source
LLAMA_BENCH = REPO / "build" / "llamacpp" / "bin" / "llama-bench"


def cpu_info():
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                       "avx512_bf16", "amx_int8") if f in flags]
    return {"cpu": model, "logical_cpus": os.cpu_count(), "isa": isa}


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?", "?", "?"]


def mem_total_gb():
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 1e6, 1)
    except OSError:
        pass
    return None


def git_describe():
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def bench_prompt(n_tokens, vocab):
    """The same pseudo-random token ids `hearth bench` uses (xorshift64 from a fixed seed, modulo
    the vocabulary), so both engines prefill exactly the same prompt."""
    x, out, mask = 0x9E3779B97F4A7C15, [], (1 << 64) - 1
    for _ in range(n_tokens):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out.append(x % vocab)
    return out


class MapWatcher:
    """Polls /proc/<pid>/smaps of a child while it runs: whether the model file was ever mapped
    and the most of it resident through that mapping (MiB). The issue requires the weights in
    anonymous memory, not page cache behind mmap; hearth keeps the file mapped for its metadata
    (tokenizer, config) and drops the weights' file pages after copying them, so `mapped` alone
    says little: the resident MiB of the mapping is the figure to read."""

    def __init__(self, pid, path):
        self.pid, self.path, self.mapped, self.samples = pid, os.path.realpath(path), False, 0
        self.rss_mib = self.rss_last_mib = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                rss_kb, inside = 0, False
                with open(f"/proc/{self.pid}/smaps") as f:
                    for line in f:
                        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                            inside = line.rstrip("\n").endswith(self.path)
                            self.mapped |= inside
                        elif inside and line.startswith("Rss:"):
                            rss_kb += int(line.split()[1])
                self.rss_mib = max(self.rss_mib, rss_kb / 1024)
                self.rss_last_mib = rss_kb / 1024  # the last poll: while decoding, after loading
                self.samples += 1
            except OSError:
                pass
            self._stop.wait(1.0)

    def stop(self):
        self._stop.set()
        self._t.join()

    def report(self):
        return {"mapped": self.mapped, "rss_mib": round(self.rss_mib, 1), "rss_last_mib": round(self.rss_last_mib, 1)}


def _map_summary(res, who):
    """Max resident MiB of the model file's mapping over the rows (older JSON: a bool per row)."""
    vals = [r.get(f"{who}_file_mapped") for r in res["rows"]]
    if any(isinstance(v, dict) for v in vals):
        d = [v for v in vals if isinstance(v, dict)]
        return "%.1f MiB at the last poll (at most %.1f while loading)" % (
            max(v.get("rss_last_mib", 0.0) for v in d), max(v["rss_mib"] for v in d))
    return "mapped " + str(sorted({str(v) for v in vals}))


def run_child(cmd, model_path, timeout, parse=None):
    """Runs one measuring process; returns (parse(stdout), by default its last JSON line, or None,
    error text, {"mapped": bool, "rss_mib": most of the file resident through its mapping})."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    w = MapWatcher(p.pid, model_path)
    try:
        out, errtxt = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, errtxt = p.communicate()
        w.stop()
        return None, f"timed out after {timeout} s", w.report()
    w.stop()
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {errtxt.strip()[-400:]}", w.report()
    if parse:
        try:
            return parse(out), None, w.report()
        except (ValueError, KeyError, StopIteration) as e:
            return None, f"unreadable output ({e!r}): {out.strip()[-200:]}", w.report()
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line), None, w.report()
    return None, f"no JSON in output: {out.strip()[-200:]}", w.report()


def llama_bench_cmd(args, model_path, runs):
    """llama.cpp's own llama-bench, as its users run it (`-lm none`: weights read into anonymous
    memory, no mmap), in one process: prefill of -p tokens into an empty cache, and decode of -n
    tokens both after a -p-token context (what `hearth bench` measures) and from an empty one."""
    return [str(LLAMA_BENCH), "-m", model_path, "-lm", "none", "-t", str(args.threads), "-p", str(args.prompt),
            "-n", str(args.gen), "-d", f"0,{args.prompt}", "-r", str(runs), "-o", "jsonl"]


def parse_llama_bench(out, args):
    """llama-bench's JSON lines (one per test) -> the row's numbers."""
    tests = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    pick = lambda pp, tg, depth: next(t for t in tests if t["n_prompt"] == pp and t["n_gen"] == tg and
                                      t["n_depth"] == depth)
    pre, dec, dec0 = pick(args.prompt, 0, 0), pick(0, args.gen, args.prompt), pick(0, args.gen, 0)
    return {"prefill_tps": pre["avg_ts"], "decode_tps": dec["avg_ts"], "decode_empty_tps": dec0["avg_ts"],
            "prefill_runs_tps": pre["samples_ts"], "decode_runs_tps": dec["samples_ts"],
            "build_commit": pre.get("build_commit"), "cpu_info": pre.get("cpu_info")}


def hearth_pair(hcmd, hshort, model_path, timeout):
    """One hearth measurement: `hcmd` (prefill of -p tokens, decode of -n after them) and `hshort`
    (decode of -n after a 1-token prompt: hearth bench's nearest to llama-bench's tg test from an
    empty cache), each a fresh process; the second's decode becomes decode_short_tps."""
    d, e, mp = run_child(hcmd, model_path, timeout)
    if d and hshort:
        ds, es, mps = run_child(hshort, model_path, timeout)
        mp = {k: max(mp[k], mps[k]) for k in mp}
        if ds:
            d["decode_short_tps"] = ds["decode_tps"]
        else:
            e, d = es, None
    return d, e, mp


def interleaved(row, hcmd, hshort, lcmd, model_path, runs, timeout, lparse):
    """--interleave: `runs` rounds of one hearth run and one llama.cpp run (each a fresh process with
    -r 1, the first of each round alternating), so both engines see the same neighbours on a shared
    machine whose memory bandwidth drifts by 2-4x within minutes. Each hearth run measures the
    bandwidth right after its decode, so its roofline fraction pairs numbers taken together; the
    row reports medians over rounds (and keeps every round)."""
    one = lambda cmd: [c if c != str(runs) or cmd[i - 1] != "-r" else "1" for i, c in enumerate(cmd)]
    hs, ls, herr, lerr = [], [], None, None
    hmap = lmap = {"mapped": False, "rss_mib": 0.0, "rss_last_mib": 0.0}
    merge = lambda a, b: {"mapped": a["mapped"] or b["mapped"], "rss_mib": max(a["rss_mib"], b["rss_mib"]),
                          "rss_last_mib": max(a["rss_last_mib"], b["rss_last_mib"])}
    for i in range(runs):
        for side in (("h", "l") if i % 2 == 0 else ("l", "h")):
            if side == "h":
                d, e, mp = hearth_pair(one(hcmd), one(hshort), model_path, timeout)
                hmap = merge(hmap, mp)
                if d: hs.append(d)
                else: herr = e
            else:
                d, e, mp = run_child(one(lcmd), model_path, timeout, lparse)
                lmap = merge(lmap, mp)
                if d: ls.append(d)
                else: lerr = e
    med = lambda xs, k: statistics.median(x[k] for x in xs) if xs and all(k in x for x in xs) else None
    h = None
    if hs:
        h = dict(hs[0])
        for k in ("prefill_tps", "decode_tps", "decode_short_tps", "bandwidth_gbs", "roofline_tps",
                  "roofline_fraction"):
            h[k] = med(hs, k)
        h["runs"] = len(hs)
        h["rounds"] = [{k: x.get(k) for k in ("prefill_tps", "decode_tps", "decode_short_tps", "bandwidth_gbs",
                                              "roofline_fraction")}
                       for x in hs]
    l = None
    if ls:
        l = dict(ls[0])
        l["prefill_tps"], l["decode_tps"] = med(ls, "prefill_tps"), med(ls, "decode_tps")
        l["decode_empty_tps"] = med(ls, "decode_empty_tps")
        l["prefill_runs_tps"] = [x["prefill_tps"] for x in ls]
        l["decode_runs_tps"] = [x["decode_tps"] for x in ls]
        l["decode_empty_runs_tps"] = [x["decode_empty_tps"] for x in ls]
        if hs and len(hs) == len(ls):  # each llama.cpp round against the hearth roofline of its round
            row["llamacpp_roofline_fraction"] = statistics.median(
                x["decode_tps"] / y["roofline_tps"] for x, y in zip(ls, hs) if y.get("roofline_tps"))
    row["hearth"], row["hearth_error"], row["hearth_file_mapped"] = h, herr if not hs else None, hmap
    row["llamacpp"], row["llamacpp_error"], row["llamacpp_file_mapped"] = l, lerr if not ls else None, lmap


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a and b else None


def markdown(res):
    s = res["settings"]
    lines = [f"# hearth vs llama.cpp (llama-bench -lm none) on CPU ({s['threads']} threads, prompt {s['prompt_tokens']}, "
             f"generate {s['gen_tokens']}, median of {s['runs']} runs, {s['runs_1b']} for the 1B-shaped models"
             f"{', interleaved rounds' if s.get('interleaved') else ''})", "",
             f"Context: prefill (llama-bench pp{s['prompt_tokens']}) is {s['prompt_tokens']} tokens into an empty cache; "
             f"decode at {s['prompt_tokens']} context (tg{s['gen_tokens']} @ d{s['prompt_tokens']}) is {s['gen_tokens']} tokens "
             f"after a {s['prompt_tokens']}-token prompt (hearth bench -p {s['prompt_tokens']}; llama-bench "
             f"-d {s['prompt_tokens']}); decode at short context (tg{s['gen_tokens']}) is {s['gen_tokens']} tokens from an "
             f"empty cache (llama-bench's default tg test, -d 0) against hearth bench -p 1 -n {s['gen_tokens']} (a "
             "1-token prompt, then the same decode). Load: the 1-minute "
             "load average of this shared machine before and after each row (2 threads per engine; other tenants' "
             "work shares the cores).", "",
             "Ratios are hearth / llama.cpp (above 1: hearth faster). Roofline fractions divide decode tok/s by "
             "hearth's roofline for the model (bandwidth measured by hearth in the same run / bytes read per "
             "decode token)." + (" Interleaved: each round runs hearth once and llama.cpp once (fresh processes, "
             "alternating which goes first); every hearth run measures the bandwidth right after its decode, and "
             "both engines' fractions use that round's roofline; medians over rounds." if s.get("interleaved")
                                 else ""), "",
             f"| model | format | hearth prefill tok/s | llama.cpp prefill tok/s | ratio | hearth decode @{s['prompt_tokens']} "
             f"tok/s | llama.cpp decode @{s['prompt_tokens']} tok/s | ratio | hearth decode, short ctx | llama.cpp decode, "
             "short ctx | ratio | hearth roofline frac | llama.cpp roofline frac | bandwidth GB/s | runs | "
             "load 1 min before -> after |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        h, l = r.get("hearth") or {}, r.get("llamacpp") or {}
        lines.append(f"| {r['model']} | {r['format']} | {fmt(h.get('prefill_tps'), '.1f')} | "
                     f"{fmt(l.get('prefill_tps'), '.1f')} | {fmt(r['prefill_ratio'], '.2f')} | "
                     f"{fmt(h.get('decode_tps'), '.1f')} | {fmt(l.get('decode_tps'), '.1f')} | "
                     f"{fmt(r['decode_ratio'], '.2f')} | {fmt(h.get('decode_short_tps'), '.1f')} | "
                     f"{fmt(l.get('decode_empty_tps'), '.1f')} | {fmt(r.get('decode_short_ratio'), '.2f')} | "
                     f"{fmt(h.get('roofline_fraction'), '.2f')} | "
                     f"{fmt(r['llamacpp_roofline_fraction'], '.2f')} | {fmt(h.get('bandwidth_gbs'), '.1f')} | {r['runs']} | "
                     f"{r['load_before'][0]} -> {r['load_after'][0]} |")
    errs = [f"- {r['model']} {r['format']}: {side}: {r[side + '_error']}" for r in res["rows"]
            for side in ("hearth", "llamacpp") if r.get(side + "_error")]
    m = res["machine"]
    lines += ["", f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, {m['mem_total_gb']} GB RAM, ISA "
              f"{' '.join(m['isa'])}; shared with other workers: /proc/loadavg (1/5/15 min) before "
              f"{' '.join(m['loadavg_before'])}, after {' '.join(m['loadavg_after'])}.",
              f"hearth {res['hearth']['commit']} ({res['hearth']['binary']}); llama.cpp's llama-bench (build "
              f"{res['llamacpp'].get('build_commit', '?')}) built by install_llamacpp.sh from llama-cpp-python "
              f"{res['llamacpp']['version']}'s vendored source into build/llamacpp: GGML_NATIVE=ON with AMX off (ggml "
              f"AMX kernels crash here), CPU only, OpenMP; `{res['llamacpp'].get('command', '')}`.",
              "Weights in anonymous memory: the model file resident through a file mapping (MiB, polled "
              "/proc/<pid>/smaps once a second, the largest over the rows; hearth keeps the file mapped for its metadata "
              "and drops each tensor's file pages after copying it): hearth " + _map_summary(res, "hearth") + ", llama.cpp "
              + _map_summary(res, "llamacpp") + ".",
              f"Run {res['started']} .. {res['finished']}; command: `{res['command']}`."]
    if errs:
        lines += ["", "Errors:"] + errs
    return "\n".join(lines) + "\n"


def save(args, started, machine, rows):
    """Writes <out>.md from the rows measured so far; returns the path stem."""
    llama_cpp = prepare_models.import_llama_cpp()
    machine = dict(machine, loadavg_after=machine.get("loadavg_after", loadavg()))
    first = next((r["llamacpp"] for r in rows if r["llamacpp"]), {})
    command = " ".join(llama_bench_cmd(args, "MODEL", args.runs))
    res = {"benchmark": "cpu_vs_llamacpp", "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "settings": {"prompt_tokens": args.prompt, "gen_tokens": args.gen, "threads": args.threads,
                        "runs": args.runs, "runs_1b": args.runs_1b or args.runs, "interleaved": args.interleave,
                        "llamacpp": {"tool": "llama-bench", "load_mode": "none"}},
           "machine": machine, "hearth": {"binary": args.hearth, "commit": git_describe()},
           "llamacpp": {"version": llama_cpp.__version__, "build_commit": first.get("build_commit"),
                        "command": command}, "rows": rows}
    return Path(results_file.write(args.out, markdown(res), res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-p", "--prompt", type=int, default=512)
    ap.add_argument("-n", "--gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--runs", type=int, default=5)
    ap.add_argument("--runs-1b", type=int, default=0,
                    help="runs for the Llama-3.2-1B-shaped models (default: -r); each takes minutes on 2 cores")
    ap.add_argument("--hearth", default=os.environ.get("HEARTH_BIN", str(REPO / "bin" / "hearth")))
    ap.add_argument("--only", default="", help="comma-separated model ids (see prepare_models.py --list)")
    ap.add_argument("--no-1b", action="store_true")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per engine per model")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="one process per engine with -r runs (default: rounds of one run each, alternating)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_vs_llamacpp"))
    args = ap.parse_args()

    llama_cpp = prepare_models.import_llama_cpp()
    if not os.access(LLAMA_BENCH, os.X_OK):
        sys.exit(f"run_bench: no {LLAMA_BENCH}; run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    if not os.access(args.hearth, os.X_OK):
        sys.exit(f"run_bench: no hearth binary at {args.hearth} (build it or pass --hearth)")
    models = prepare_models.model_list(not args.no_1b)
    if args.only:
        want = set(args.only.split(","))
        models = [m for m in models if m["id"] in want]
    missing = [m["path"] for m in models if not Path(m["path"]).exists()]
    if missing:
        sys.exit(f"run_bench: models missing (run prepare_models.py): {missing}")

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine = {**cpu_info(), "mem_total_gb": mem_total_gb(), "kernel": platform.release(),
               "loadavg_before": loadavg()}
    rows = []
    for m in models:
        print(f"== {m['model']} {m['format']}  (load {' '.join(loadavg())})", file=sys.stderr, flush=True)
        runs = str(args.runs_1b or args.runs) if m["id"].startswith("llama1b") else str(args.runs)
        row = dict(m, runs=int(runs), load_before=loadavg())
        hcmd = [args.hearth, "bench", m["path"], "-p", str(args.prompt), "-n", str(args.gen), "-t", str(args.threads),
                "-r", runs, "--json"]
        hshort = hcmd[:3] + ["-p", "1"] + hcmd[5:]
        lcmd, lparse = llama_bench_cmd(args, m["path"], runs), lambda out: parse_llama_bench(out, args)
        if args.interleave:
            interleaved(row, hcmd, hshort, lcmd, m["path"], int(runs), args.timeout, lparse)
        else:
            row["hearth"], row["hearth_error"], row["hearth_file_mapped"] = hearth_pair(hcmd, hshort, m["path"],
                                                                                         args.timeout)
            row["llamacpp"], row["llamacpp_error"], row["llamacpp_file_mapped"] = run_child(lcmd, m["path"],
                                                                                            args.timeout, lparse)
        row["load_after"] = loadavg()
        h, l = row["hearth"] or {}, row["llamacpp"] or {}
        row["prefill_ratio"] = ratio(h.get("prefill_tps"), l.get("prefill_tps"))
        row["decode_ratio"] = ratio(h.get("decode_tps"), l.get("decode_tps"))
        row["decode_short_ratio"] = ratio(h.get("decode_short_tps"), l.get("decode_empty_tps"))
        row["llamacpp_roofline_fraction"] = row.get("llamacpp_roofline_fraction") or ratio(l.get("decode_tps"),
                                                                                           h.get("roofline_tps"))
        for side in ("hearth", "llamacpp"):
            d = row[side] or {}
            short = d.get("decode_short_tps", d.get("decode_empty_tps"))
            print(f"   {side:9s} prefill {fmt(d.get('prefill_tps'), '8.1f')} decode {fmt(d.get('decode_tps'), '7.1f')}"
                  f" short ctx {fmt(short, '7.1f')}"
                  f"{'  ERROR ' + row[side + '_error'] if row[side + '_error'] else ''}", file=sys.stderr, flush=True)
        rows.append(row)
        save(args, started, machine, rows)  # after every model: an interrupted run keeps what it measured
    machine["loadavg_after"] = loadavg()
    out = save(args, started, machine, rows)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
