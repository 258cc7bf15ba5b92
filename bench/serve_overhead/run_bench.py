#!/usr/bin/env python3
"""run_bench.py: `hearth serve` overhead and hearth vs mlx_lm.server, measured client-side in one run.

Part 1 (real GGUF): the same 128-token greedy generation through the engine (`hearth bench`,
`hearth generate`) and through HTTP streaming (`hearth serve`), N=1 and N=8 concurrent clients;
per-token server overhead and time to first byte. Part 2 (tiny f32 model): hearth serve vs the real
mlx_lm.server on identical requests. Writes bench/results/serve_overhead.md (bench/results_file.py). Standard library
only (plus the venv's mlx-lm, run as a server process); it never reads hearth's answers as expected values.
"""

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import markdown, median, pct, summarize  # noqa: E402
from sse_client import stream_completion  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
# A prompt SmolLM2 continues for well over 128 tokens greedily; EOS ids are banned anyway.
PROMPT = "The history of the city begins in the early medieval period, when"
# End-of-turn token texts hearth stops on besides the declared EOS ids (SmolLM2, Llama 3, Gemma).
END_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|eom_id|>")


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def machine():
    model, cores = "?", os.cpu_count()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "logical_cpus": cores}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- end-of-sequence ids to ban


def eos_ids_gguf(path):
    from gguf import GGUFReader

    r = GGUFReader(path)
    ids = set()
    for key in ("eos", "eot", "eom"):
        f = r.fields.get(f"tokenizer.ggml.{key}_token_id")
        if f is not None:
            ids.add(int(f.contents()))
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    ids.update(i for i, t in enumerate(toks) if t in END_TEXTS)
    return sorted(ids)


def eos_ids_dir(path):
    ids = set()
    for name in ("config.json", "generation_config.json"):
        p = os.path.join(path, name)
        if os.path.exists(p):
            v = json.load(open(p)).get("eos_token_id")
            ids.update(v if isinstance(v, list) else [v] if v is not None else [])
    tok = json.load(open(os.path.join(path, "tokenizer.json")))
    ids.update(t["id"] for t in tok.get("added_tokens", []) if t["content"] in END_TEXTS)
    tc = os.path.join(path, "tokenizer_config.json")
    eos = json.load(open(tc)).get("eos_token") if os.path.exists(tc) else None
    ids.update(t["id"] for t in tok.get("added_tokens", []) if t["content"] == eos)
    return sorted(ids)


# ---------------------------------------------------------------- servers


class Server:
    """A server process on loopback; ready once GET /v1/models answers 200. wait=False returns at once
    (several servers can load side by side); then call wait_ready()."""

    def __init__(self, name, argv, port, log_path, wait=True, deadline_s=300.0):
        self.name, self.port, self.log_path = name, port, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(deadline_s)

    def wait_ready(self, deadline_s=300.0):
        deadline = time.time() + deadline_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return
            except OSError:  # refused while starting; llama-server answers 503 while it loads
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer on port {self.port} within {deadline_s:.0f} s; "
                           f"log: {self.log_path}")

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request_body(n, banned):
    return {
        "model": "default_model",
        "prompt": PROMPT,
        "max_tokens": n,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # OpenAI's bias range is [-100, 100]; -100 makes a token unreachable for greedy decoding
        "logit_bias": {str(i): -100 for i in banned},
    }


def run_clients(port, body, n_clients):
    """n_clients concurrent streams released together; returns their results and aggregate numbers."""
    results = [None] * n_clients
    gate = threading.Barrier(n_clients)

    def one(i):
        gate.wait()
        results[i] = stream_completion(port, "/v1/completions", body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(r.t_send for r in results)
    end = max(r.t_send + (r.t_done or 0) for r in results)
    tokens = sum((r.usage or {}).get("completion_tokens") or len(r.token_times) for r in results)
    return results, {"wall_s": end - start, "tokens": tokens, "aggregate_tps": tokens / (end - start)}


def per_request(r):
    """Client-side numbers of one stream: TTFB, TTFT, decode seconds per token, inter-arrival."""
    gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
    d = r.to_dict()
    toks = d["completion_tokens"] or len(r.token_times)
    if gaps and len(r.token_times) == toks:
        d["decode_s_per_token"] = (r.token_times[-1] - r.token_times[0]) / len(gaps)
    elif toks > 1 and r.ttft is not None:
        # some tokens carried no visible text (partial UTF-8): time from the first text to the end instead
        d["decode_s_per_token"] = (r.t_done - r.ttft) / (toks - 1)
    else:
        d["decode_s_per_token"] = None
    d["gap_median_s"] = median(gaps)
    d["gap_p90_s"] = pct(gaps, 0.9)
    d["gap_max_s"] = max(gaps) if gaps else None
    d["e2e_tps"] = toks / r.t_done if r.t_done else None
    d["text_prefix"] = r.text[:80]
    return d


def check(d, n, who):
    if d["error"] or d["completion_tokens"] != n:
        raise RuntimeError(f"{who}: expected {n} tokens, got {d['completion_tokens']} "
                           f"(finish {d['finish_reason']}, error {d['error']})")


def measure_http(port, body, n_clients, n, who):
    results, agg = run_clients(port, body, n_clients)
    reqs = [per_request(r) for r in results]
    for d in reqs:
        check(d, n, who)
    return {"requests": reqs, **agg}


# ---------------------------------------------------------------- engine (no HTTP)


def engine_bench(hearth, model, p, n, threads, runs=3):
    out = subprocess.run([hearth, "bench", model, "-p", str(p), "-n", str(n), "-t", str(threads), "-r", str(runs), "--json"],
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    return {"decode_tps": j["decode_tps"], "prefill_tps": j["prefill_tps"], "s_per_token": 1.0 / j["decode_tps"]}


def engine_generate(hearth, model, n, threads):
    """`hearth generate` prints 'generation: N tokens, X tokens/s' and 'time to first token: T s'."""
    out = subprocess.run([hearth, "generate", model, PROMPT, "--no-chat-template", "--max-tokens", str(n),
                          "--threads", str(threads)], capture_output=True, text=True, check=True)
    got = {}
    for part in out.stderr.replace("|", "\n").splitlines():
        words = part.replace(",", " ").split()
        if part.strip().startswith("generation:"):
            got["tokens"], got["decode_tps"] = int(words[1]), float(words[3])
        elif part.strip().startswith("time to first token:"):
            got["ttft_s"] = float(words[4])
        elif part.strip().startswith("finish:"):
            got["finish"] = words[1]
    if got.get("tokens") != n:
        raise RuntimeError(f"hearth generate produced {got.get('tokens')} tokens, not {n} (stopped at EOS?): {out.stderr}")
    got["s_per_token"] = 1.0 / got["decode_tps"]
    got["text_prefix"] = out.stdout[:80]
    return got


def prompt_len(hearth, model):
    out = subprocess.run([hearth, "tokenize", model, PROMPT], capture_output=True, text=True, check=True)
    return len(json.loads(out.stdout))


# ---------------------------------------------------------------- the two parts


def part_overhead(a, log_dir, model, threads, reps8, tag):
    n = a.n
    banned = eos_ids_gguf(model) if model.endswith(".gguf") else eos_ids_dir(model)
    p = prompt_len(a.hearth, model)
    body = request_body(n, banned)
    out = {"model": model, "threads": threads, "prompt_tokens": p, "gen_tokens": n, "banned_ids": banned, "reps": []}
    out["loadavg_before"] = loadavg()
    port = free_port()
    srv = Server("hearth serve", [a.hearth, "serve", "--model", model, "--port", str(port), "--threads",
                                  str(threads), "--log-level", "WARNING"], port, os.path.join(log_dir, f"hearth-{tag}.log"))
    try:
        stream_completion(port, "/v1/completions", request_body(8, banned))  # warm-up
        for rep in range(a.reps):
            # interleaved so that load changes on the shared box hit engine and HTTP alike
            bench = engine_bench(a.hearth, model, p, n, threads)
            gen = engine_generate(a.hearth, model, n, threads)
            http = measure_http(port, body, 1, n, "hearth serve N=1")
            out["reps"].append({"bench": bench, "generate": gen, "http": http})
            log(f"{tag} rep {rep + 1}/{a.reps}: bench {bench['s_per_token'] * 1e3:.2f} ms/tok, generate "
                f"{gen['s_per_token'] * 1e3:.2f} ms/tok, http {http['requests'][0]['decode_s_per_token'] * 1e3:.2f} ms/tok")
        out["n8"] = []
        for rep in range(reps8):
            out["n8"].append(measure_http(port, body, 8, n, "hearth serve N=8"))
            log(f"{tag} N=8 rep {rep + 1}/{reps8}: {out['n8'][-1]['aggregate_tps']:.1f} tok/s aggregate")
    finally:
        srv.stop()
    out["loadavg_after"] = loadavg()
    return out


def part_vs_mlx(a, log_dir):
    model, n = a.tiny, a.n
    banned = eos_ids_dir(model)
    body = request_body(n, banned)
    out = {"model": model, "gen_tokens": n, "banned_ids": banned, "loadavg_before": loadavg()}
    ph, pm = free_port(), free_port()
    hs = Server("hearth serve", [a.hearth, "serve", "--model", model, "--port", str(ph), "--threads", str(a.threads),
                                 "--log-level", "WARNING"], ph, os.path.join(log_dir, "hearth-tiny.log"))
    ms = None
    try:
        ms = Server("mlx_lm.server", [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--port", str(pm),
                                      "--log-level", "WARNING"], pm, os.path.join(log_dir, "mlx-tiny.log"))
        servers = {"hearth": (hs, ph), "mlx_lm": (ms, pm)}
        for name, (s, port) in servers.items():
            stream_completion(port, "/v1/completions", request_body(8, banned))  # warm-up (mlx compiles lazily)
        # an idle server must not steal CPU from the one being measured
        before = {k: s.cpu_seconds() for k, (s, _) in servers.items()}
        time.sleep(2)
        out["idle_cpu_s_per_s"] = {k: (s.cpu_seconds() - before[k]) / 2 for k, (s, _) in servers.items()}
        for N, reps in ((1, a.reps_mlx), (8, a.reps_mlx)):
            runs = {k: [] for k in servers}
            for rep in range(reps):
                for name, (s, port) in servers.items():
                    runs[name].append(measure_http(port, body, N, n, f"{name} N={N}"))
                log(f"vs mlx N={N} rep {rep + 1}/{reps}: " + ", ".join(
                    f"{k} {v[-1]['aggregate_tps']:.1f} tok/s" for k, v in runs.items()))
            out[f"n{N}"] = runs
        t_h = out["n1"]["hearth"][0]["requests"][0]["text_prefix"]
        t_m = out["n1"]["mlx_lm"][0]["requests"][0]["text_prefix"]
        out["same_text_prefix"] = t_h == t_m
    finally:
        hs.stop()
        if ms:
            ms.stop()
    out["loadavg_after"] = loadavg()
    return out


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hearth", default=os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth")))
    ap.add_argument("--gguf", default=os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tiny", default=os.path.join(CACHE, "tiny", "llama-f32"))
    ap.add_argument("-n", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--threads", type=int, default=2, help="hearth compute threads")
    ap.add_argument("--reps", type=int, default=7, help="repetitions of the N=1 overhead measurements")
    ap.add_argument("--reps8", type=int, default=3, help="repetitions of the N=8 overhead measurements")
    ap.add_argument("--reps-mlx", type=int, default=7, help="repetitions of each hearth vs mlx_lm measurement")
    ap.add_argument("--skip-floor", action="store_true", help="skip the tiny-model 1-thread overhead floor")
    ap.add_argument("--skip-mlx", action="store_true")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "serve_overhead"))
    a = ap.parse_args()
    for path in (a.hearth, a.gguf, a.tiny):
        if not os.path.exists(path):
            sys.exit(f"run_bench.py: {path} does not exist")
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="hearth-serve-bench.")
    res = {"machine": machine(), "hearth": a.hearth, "command": " ".join(sys.argv[1:]), "threads": a.threads,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "loadavg_before": loadavg(), "logs": log_dir}
    res["overhead"] = part_overhead(a, log_dir, a.gguf, a.threads, a.reps8, "gguf")
    if not a.skip_floor:
        # compute per token is ~0.1 ms here, so the HTTP path's own cost is most of what is measured;
        # one thread because a 2-thread fan-out of a 64-wide model is dominated by wake-ups on a loaded box
        res["overhead_floor"] = part_overhead(a, log_dir, a.tiny, 1, 0, "floor")
    if not a.skip_mlx:
        import mlx_lm

        res["mlx_lm_version"] = mlx_lm.__version__
        res["vs_mlx"] = part_vs_mlx(a, log_dir)
    res["loadavg_after"] = loadavg()
    res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    res["summary"] = summarize(res)
    md = markdown(res)
    results_file.write(a.out, md, res)
    print(md)


if __name__ == "__main__":
    main()
