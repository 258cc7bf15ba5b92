#!/usr/bin/env python3
"""serve_load.py: hearth serve vs mlx_lm.server vs llama.cpp's llama-server under N concurrent chats.

It owns the run: for each model, each server in turn on the same weights and threads, a warm-up request,
then N = 1, 4, 16 concurrent streaming chats through load_gen.py (llama.cpp's peer: its C++ `llama-server`
with one slot per client and continuous batching, built by build_llama_server.sh; llama-cpp-python's
serializing server only as a fallback when that binary is missing, labelled so in the results); then `hearth bench` on the same model
as the engine reference for the N=1 single-stream rate. Writes bench/results/serve_load.md (bench/results_file.py)
(load_report.py makes the table). A server whose projected time for a level exceeds its time budget skips
that level and the results say so; it must not read any server's text as an expected value.
"""

import argparse
import datetime
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "bench", "serve_overhead"))
sys.path.insert(0, HERE)
from load_gen import per_client, run_level, warm_up  # noqa: E402
from load_report import markdown, summarize  # noqa: E402
from run_bench import Server, engine_bench, eos_ids_gguf, free_port, loadavg, machine  # noqa: E402

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
LLAMACPP_LIB = os.path.join(CACHE, "bench", "llamacpp", "lib")
LLAMA_SERVER = os.path.join(CACHE, "bench", "llamacpp", "build-server", "bin", "llama-server")
# The 1B-shaped model's GGUF has no chat template: every server gets this ChatML one (its <|im_*|>
# markers are plain text to the synthetic vocabulary, the same for all three).
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MODELS = [
    {"id": "smollm2-135m-q4_1", "label": "SmolLM2-135M-Instruct Q4_1 (real)",
     "gguf": os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"), "template": None},
    {"id": "smollm2-135m-bf16", "label": "SmolLM2-135M-Instruct BF16 (the Q4_1 file dequantized by llama.cpp's quantizer)",
     "gguf": os.path.join(CACHE, "bench", "smollm2-135m-instruct-bf16.gguf"), "template": None},
    {"id": "llama1b-q4_0", "label": "Llama-3.2-1B shape (random weights) Q4_0",
     "gguf": os.path.join(CACHE, "bench", "random-llama-3.2-1b-q4_0.gguf"), "template": CHATML},
]
SERVERS = ("hearth", "mlx_lm", "llama.cpp")


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def mlx_dir(model):
    """The MLX-format copy of the GGUF (same packed 4-bit blocks), made once by gguf_to_mlx.py."""
    out = os.path.join(CACHE, "bench", "mlx", model["id"])
    if not os.path.exists(os.path.join(out, "config.json")):
        cmd = [sys.executable, os.path.join(HERE, "gguf_to_mlx.py"), model["gguf"], out]
        subprocess.run(cmd + (["--chat-template", model["template"]] if model["template"] else []), check=True)
    return out


def server_argv(name, model, port, a):
    t = str(a.threads)
    if name == "hearth":
        # the KV pool holds as many positions as llama-server's slots together (--ctx-size below):
        # hearth's default pool (two contexts, 2048 positions at --ctx 1024) would hold only the
        # prompts and answers of 13 of the 16 streams, and preempt and evict where llama.cpp does not
        argv = [a.hearth, "serve", "--model", model["gguf"], "--port", str(port), "--threads", t,
                "--max-sequences", str(max(16, max(a.n))), "--ctx", str(a.ctx),
                "--kv-blocks", str(a.ctx * max(a.n) // 16), "--log-level", "WARNING"]
        return argv + (["--chat-template", model["template"]] if model["template"] else []), None
    if name == "mlx_lm":
        # batching on: every request is batchable (no seed, no draft model, no KV bits) and up to 16
        # decode and 16 prompt rows run together (defaults 32 / 8)
        conc = str(max(a.n))
        return ([sys.executable, "-m", "mlx_lm", "server", "--model", model["mlx"], "--port", str(port),
                 "--decode-concurrency", conc, "--prompt-concurrency", conc, "--log-level", "WARNING"], None)
    if a.llama_server:
        # llama.cpp's own server: --parallel slots (one per client at the largest N), each with the
        # context hearth gets per sequence (-c is split between the slots), continuous batching;
        # --load-mode none: no mmap (see below); the ChatML template given as text like to the others
        n = max(a.n)
        argv = [a.llama_server, "--model", model["gguf"], "--host", "127.0.0.1", "--port", str(port),
                "--threads", t, "--threads-batch", t, "--ctx-size", str(a.ctx * n), "--parallel", str(n),
                "--cont-batching", "--load-mode", "none", "--no-webui"]
        return argv + (["--chat-template", model["template"]] if model["template"] else []), None
    # fallback, llama-cpp-python's server: one Llama object behind a lock, so requests run one at a time;
    # interrupt_requests (default on) would cut a running stream short when another one waits;
    # use_mmap off: on these VMs clean mmap'd pages get evicted and decode collapses (DESIGN.md)
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", model["gguf"], "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", t, "--n_threads_batch", t, "--n_ctx", str(a.ctx),
            "--interrupt_requests", "False", "--use_mmap", "False"]
    if model["template"]:
        argv += ["--chat_format", "chatml"]
    return argv, dict(os.environ, LLAMA_CPP_LIB_PATH=os.environ.get("LLAMA_CPP_LIB_PATH", LLAMACPP_LIB))


class PeerServer(Server):
    """serve_overhead's Server with an environment (llama.cpp needs LLAMA_CPP_LIB_PATH)."""

    def __init__(self, name, argv, port, log_path, env):
        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            super().__init__(name, argv, port, log_path)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def run_server(name, model, a, banned, log_dir):
    port = free_port()
    argv, env = server_argv(name, model, port, a)
    out = {"argv": argv, "loadavg_before": loadavg(), "levels": {}}
    t_start = time.monotonic()
    srv = PeerServer(name, argv, port, os.path.join(log_dir, f"{name}-{model['id']}.log"), env)
    try:
        out["load_s"] = time.monotonic() - t_start
        t_start = time.monotonic()  # the budget covers serving (warm-up and levels), not loading the model
        out["warm_up"] = w = warm_up(port, banned)
        rate = w["decode_tps"] or 1.0
        for n in a.n:
            each = per_client(n, a.max_requests)
            tokens = n * each * a.max_tokens
            left = a.budget - (time.monotonic() - t_start)
            # the best rate seen so far (batching only raises it); prompts and queueing come on top
            projected = tokens / rate
            if projected > left:
                out["levels"][str(n)] = {"skipped": f"projected {projected:.0f} s at {rate:.2f} tok/s > "
                                                    f"{left:.0f} s left of the {a.budget} s budget"}
                log(f"{name} {model['id']} N={n}: skipped ({out['levels'][str(n)]['skipped']})")
                continue
            reqs, s = run_level(port, n, each, a.max_tokens, banned)
            s["loadavg_after"] = loadavg()
            s["request_details"] = [{k: d[k] for k in ("ttft_s", "total_s", "completion_tokens", "prompt_tokens",
                                                      "decode_tps", "finish_reason", "error", "text_prefix")}
                                    for d in reqs]
            out["levels"][str(n)] = s
            rate = max(rate, s["aggregate_tps"] or 0)
            log(f"{name} {model['id']} N={n}: {s['aggregate_tps']:.1f} tok/s aggregate, TTFT p50 "
                f"{s['ttft_p50_ms']:.0f} ms p95 {s['ttft_p95_ms']:.0f} ms, decode/stream {s['decode_tps_median']:.1f} "
                f"tok/s, errors {s['errors']}, {s['wall_s']:.1f} s, load {s['loadavg_after'][0]}")
        if name == "hearth" and a.pairs > 0:
            out["n1_pairs"] = n1_pairs(port, model, a, banned)
    finally:
        srv.stop()
    out["loadavg_after"] = loadavg()
    out["seconds"] = time.monotonic() - t_start
    return out


def server_step_rate(port):
    """The engine's own decode rate inside the server: /stats' decode tokens per second over its last
    32 steps (the forward passes only: no sampling, detokenizing or HTTP), None when unavailable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
            return json.load(r)["steps"]["decode_tokens_per_second"]
    except (OSError, ValueError, KeyError):
        return None


def n1_pairs(port, model, a, banned):
    """The N=1 target (serve within 3% of the engine) as paired samples: one streamed request and
    `hearth bench -r 1` at that request's prompt length and answer length, a.pairs times, the server up
    and idle during the bench. On a shared 2-core box the rate drifts by 10-25% within minutes; pairing
    takes that drift out of the ratio (a serve level and a bench run minutes apart did not). The order
    within a pair alternates ABBA (serve first, bench first, bench first, serve first, ...): the order
    moved the ratio (12 pairs on 2 vCPUs alternating it: median 0.84 where the request ran first,
    1.01 where the bench did), and until 2026-12-04 the request always ran first. Each pair also records the engine's own
    step rate inside the server during the request (/stats), so client rate / step rate is the
    server's per-token overhead measured on the same tokens, free of drift between processes."""
    pairs, p = [], None
    for i in range(a.pairs):
        serve_first = p is None or i % 4 in (0, 3)
        if not serve_first:
            eng = engine_bench(a.hearth, model["gguf"], p, a.max_tokens, a.threads, runs=1)
        reqs, s = run_level(port, 1, 1, a.max_tokens, banned)
        inside = server_step_rate(port)
        p = int(reqs[0]["prompt_tokens"] or 40)
        if serve_first:
            eng = engine_bench(a.hearth, model["gguf"], p, a.max_tokens, a.threads, runs=1)
        client = s["decode_tps_median"]
        pairs.append({"serve_decode_tps": client, "bench_decode_tps": eng["decode_tps"], "prompt_tokens": p,
                      "order": "serve,bench" if serve_first else "bench,serve", "ratio": client / eng["decode_tps"],
                      "server_step_decode_tps": inside,
                      "client_vs_server_steps": client / inside if client and inside else None,
                      "loadavg": loadavg()[0]})
        log(f"hearth {model['id']} pair {i + 1} ({pairs[-1]['order']}): serve {client:.1f} tok/s (steps inside "
            f"{inside or 0:.1f}), bench {eng['decode_tps']:.1f} tok/s, x{pairs[-1]['ratio']:.3f}")
    return pairs


def versions():
    v = {}
    for k, p in (("mlx", "mlx"), ("mlx_lm", "mlx-lm"), ("llama_cpp_python", "llama_cpp_python")):
        try:
            v[k] = md.version(p)
        except md.PackageNotFoundError:
            v[k] = "not installed"
    git = lambda *args: subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True).stdout.strip()  # noqa: E731
    v["hearth_commit"] = git("rev-parse", "HEAD")
    v["hearth_tree_modified_files"] = len(git("status", "--porcelain", "--untracked-files=no").splitlines())
    return v


def llama_peer(path):
    """What the "llama.cpp" rows measured: llama-server (its version line) or the fallback."""
    if not path:
        return {"kind": "llama-cpp-python", "label": "llama-cpp-python's server (fallback: serializes requests)"}
    out = subprocess.run([path, "--version"], capture_output=True, text=True)
    ver = " ".join(l.strip() for l in (out.stdout + out.stderr).splitlines() if "version" in l or "built with" in l)
    return {"kind": "llama-server", "label": "llama.cpp's llama-server", "binary": path, "version": ver}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hearth", default=os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth")))
    ap.add_argument("--n", default="1,4,16", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence (prompts here are < 100 tokens)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER_BIN", LLAMA_SERVER),
                    help="llama.cpp's llama-server binary (build_llama_server.sh); when missing, llama-cpp-python's "
                    "serializing server is the fallback peer")
    ap.add_argument("--budget", type=int, default=300, help="serving seconds (warm-up + levels) per server and model; a level projected to end "
                    "beyond it is skipped")
    ap.add_argument("--pairs", type=int, default=12, help="paired N=1 samples (a streamed request and hearth bench -r 1, order alternating) "
                    "for the serve-vs-engine ratio; 0: off")
    ap.add_argument("--max-requests", type=int, default=16, help="requests per level: 2 per client up to this")
    ap.add_argument("--models", default="smollm2-135m-q4_1,smollm2-135m-bf16,llama1b-q4_0")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "serve_load"))
    a = ap.parse_args()
    if a.llama_server and not os.path.exists(a.llama_server):
        log(f"no llama-server at {a.llama_server}: falling back to llama-cpp-python's server (serializes requests)")
        a.llama_server = None
    models = [m for m in MODELS if m["id"] in a.models.split(",")]
    servers = [s for s in SERVERS if s in a.servers.split(",")]
    for path in [a.hearth] + [m["gguf"] for m in models]:
        if not os.path.exists(path):
            sys.exit(f"serve_load.py: {path} does not exist (bench/serve_load/run.sh prepares everything)")
    log_dir = tempfile.mkdtemp(prefix="hearth-serve-load.")
    res = {"machine": machine(), "versions": versions(), "hearth": a.hearth, "command": " ".join(sys.argv[1:]),
           "threads": a.threads, "max_tokens": a.max_tokens, "n": a.n, "max_requests": a.max_requests, "budget_s": a.budget, "logs": log_dir,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "loadavg_before": loadavg(), "models": [], "llama_cpp_peer": llama_peer(a.llama_server)}
    for m in models:
        banned = eos_ids_gguf(m["gguf"])
        if "mlx_lm" in servers:
            m["mlx"] = mlx_dir(m)
            m["mlx_notes"] = open(os.path.join(m["mlx"], "NOTES")).read().strip()
        entry = {k: m.get(k) for k in ("id", "label", "gguf", "mlx", "mlx_notes")}
        entry.update(banned_ids=banned, chat_template="ChatML (given to all servers)" if m["template"] else "the GGUF's",
                     servers={})
        for name in servers:
            log(f"{m['id']}: {name}")
            try:
                entry["servers"][name] = run_server(name, m, a, banned, log_dir)
            except (RuntimeError, OSError) as e:
                entry["servers"][name] = {"failed": str(e)}
                log(f"{name} {m['id']} failed: {e}")
        if "hearth" in servers:
            # the engine's own single-stream rate on the same prompt length and answer length, server stopped
            n1 = entry["servers"].get("hearth", {}).get("levels", {}).get("1", {})
            p = int(n1.get("prompt_tokens_median") or 40)
            entry["engine_bench"] = dict(engine_bench(a.hearth, m["gguf"], p, a.max_tokens, a.threads),
                                         prompt_tokens=p, loadavg=loadavg())
            log(f"{m['id']}: hearth bench decode {entry['engine_bench']['decode_tps']:.1f} tok/s")
        res["models"].append(entry)
    res["loadavg_after"] = loadavg()
    res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    res["summary"] = summarize(res)
    text = markdown(res)
    results_file.write(a.out, text, res)
    print(text)


if __name__ == "__main__":
    main()
