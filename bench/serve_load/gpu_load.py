#!/usr/bin/env python3
"""gpu_load.py: hearth serve --device cuda vs llama.cpp's CUDA llama-server under N concurrent streams.

It owns the GPU half of bench/serve_load (issue 6): for each GGUF (the same file for both servers),
both servers on loopback with one slot per stream (started side by side, so they load in parallel),
a warm-up that leaves the shared prompt prefix in each server's cache, then N concurrent streaming
/v1/completions requests through load_gen.run_level: prompts of --prompt-tokens tokens whose first
--prefix-tokens are the same for every request (distinct tails), --max-tokens answers with EOS banned,
greedy. Records aggregate tok/s, TTFT p50/p95, cached prompt tokens and hearth's /stats per level, and
rewrites OUT.md (bench/results_file.py: the tables, then the full result as json) after every level, so a run cut short still leaves a table. Runs within
--budget seconds: the levels come in priority order and a level whose projected time does not fit
what is left is skipped (the results say so). Standard library only (the GPU machine has no extra
Python packages); it never reads a server's text as an expected value.
usage: gpu_load.py --hearth BIN [--llama-server BIN] --model f16=PATH --model q4_k_m=PATH --out PREFIX
"""

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve_overhead"))
sys.path.insert(0, os.path.join(HERE, ".."))
import results_file  # noqa: E402
sys.path.insert(0, HERE)
from load_gen import run_level  # noqa: E402
from run_bench import Server, free_port, loadavg, machine  # noqa: E402
from sse_client import stream_completion  # noqa: E402

SERVERS = ("hearth", "llama.cpp")
# The prompt text: lowercase letters, no spaces. The stand-in vocabulary of tools/cuda_gguf8b.py has
# no piece two characters could merge into (every longer piece is "\u2581t<digits>", and "\u2581t"
# itself is absent), so SentencePiece falls back to one byte token per letter: a prompt is BOS +
# the 3 byte tokens of the "\u2581" dummy prefix + one token per letter. usage.prompt_tokens of
# every request is recorded, so a server that counts otherwise shows in the table.
LETTERS = "abcdefghijklmnopqrsuvwxyz"
PROMPT_OVERHEAD = 4  # BOS + the dummy prefix's 3 byte tokens
EOS_ID = 2  # tools/cuda_gguf8b.py's tokenizer.ggml.eos_token_id


def log(msg):
    print(f"[{datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def letters(seed, n):
    rng = random.Random(seed)  # str seeds are hashed with sha512: the same text on every machine
    return "".join(rng.choice(LETTERS) for _ in range(n))


class Prompts:
    """Request bodies: one shared prefix, a distinct tail per (level, request), the same for both servers."""

    def __init__(self, prompt_tokens, prefix_tokens, max_tokens):
        self.prefix_len = prefix_tokens - PROMPT_OVERHEAD
        self.prefix = letters("gpu-serve-prefix", self.prefix_len)
        self.tail_len = prompt_tokens - prefix_tokens
        self.max_tokens = max_tokens

    def body(self, tag, max_tokens=None, prefix=None):
        """prefix: another shared prefix's name (a cold one, in no cache yet); default the warm one."""
        head = self.prefix if prefix is None else letters(f"gpu-serve-prefix-{prefix}", self.prefix_len)
        return {
            "prompt": head + letters(f"gpu-serve-tail-{tag}", self.tail_len),
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            # every stream runs exactly max_tokens on both servers: -100 keeps EOS from being chosen
            # (OpenAI's bias range), ignore_eos is llama-server's own switch (hearth ignores the field)
            "logit_bias": {str(EOS_ID): -100},
            "ignore_eos": True,
            "cache_prompt": True,  # llama-server's per-request prompt cache (its default, said outright)
        }


def server_argv(name, a, gguf, port, step_tokens):
    n = max(a.n)
    if name == "hearth":
        # one sequence per stream; a KV pool that holds every stream's whole context even without
        # prefix sharing (16-token blocks); --max-step-tokens: the step budget (decode rows first,
        # then prompt chunks; see docs/server.md); --ctx leaves headroom over prompt + answer
        blocks = n * ((a.prompt_tokens + a.max_tokens + 15) // 16)
        return [a.hearth, "serve", "--model", gguf, "--device", a.device, "--host", "127.0.0.1", "--port", str(port),
                "--max-sequences", str(n), "--ctx", str(a.ctx), "--kv-blocks", str(blocks),
                "--max-step-tokens", str(step_tokens), "--max-connections", str(2 * n + 16),
                "--log-level", "WARNING"] + a.hearth_arg
    # llama-server: --parallel slots (one per stream, each with a.ctx of the -c total), continuous
    # batching, flash attention, every layer on the GPU, its prompt cache on per slot (the shared
    # prefix stays in each slot's KV); --cache-ram 0: no host-RAM prompt cache (hearth has none, the
    # prefix fits on the GPU, and on 2026-12-01 a level run after N=128 on the same llama-server
    # took 8-61 s to first token with it on); --fit off: keep the asked context even while another
    # server holds GPU memory
    return [a.llama_server, "--model", gguf, "--host", "127.0.0.1", "--port", str(port), "-ngl", "99",
            "-fa", a.llama_fa, "--parallel", str(n), "--ctx-size", str(a.ctx * n), "--cont-batching",
            "--cache-prompt", "--cache-ram", "0", "--fit", "off", "--no-webui"] + a.llama_arg


def gpu_info():
    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,memory.free",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    f = [x.strip() for x in q.stdout.splitlines()[0].split(",")] if q.returncode == 0 and q.stdout else None
    return None if not f else {"name": f[0], "driver": f[1], "total_mib": int(f[2]), "used_mib": int(f[3]),
                               "free_mib": int(f[4])}


def version_of(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e})"
    return " ".join(ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip())[:300]


def hearth_stats(port):
    try:
        s = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5).read())
    except (OSError, ValueError) as e:
        return {"error": str(e)}
    return {k: s.get(k) for k in ("kv_blocks", "prefix_cache", "requests_served", "running", "queued") if k in s}


class Run:
    def __init__(self, a):
        self.a = a
        self.t0 = time.monotonic()
        self.prompts = Prompts(a.prompt_tokens, a.prefix_tokens, a.max_tokens)
        self.up = {}  # (server, fmt, hearth's step budget) -> Server
        self.rate = {}  # same keys -> best tokens/s seen (projection of a level's time)
        self.level_rate = set()  # keys whose rate came from a level (aggregate), not only a warm-up
        self.res = {
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "gpu": gpu_info(), "device": a.device,
            "hearth": a.hearth, "hearth_version": version_of([a.hearth, "--version"]),
            "llama_server": a.llama_server,
            "llama_server_version": None,  # asked when it first starts (its build may still be running now)
            "command": " ".join(sys.argv[1:]), "budget_s": a.budget, "n": a.n,
            "prompt_tokens": a.prompt_tokens, "prefix_tokens": a.prefix_tokens, "max_tokens": a.max_tokens,
            "max_step_tokens": a.max_step_tokens, "ctx": a.ctx,
            "models": dict(a.model), "servers": {}, "levels": {}, "notes": [],
        }

    def name(self, key):
        """'hearth f16'; the A/B servers with another step budget: 'hearth f16 step 2048'."""
        s, fmt, step = key
        return f"{s} {fmt}" + (f" step {step}" if step != self.a.max_step_tokens else "")

    def left(self):
        return self.a.budget - (time.monotonic() - self.t0)

    def save(self):
        self.res["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        gpu = (self.res.get("gpu") or {}).get("name")
        results_file.write(self.a.out, markdown(self.res), self.res,
                           machine_line=f"{gpu} + {results_file.machine()}" if gpu else None)

    def stop(self, key):
        srv = self.up.pop(key, None)
        if srv:
            srv.stop()
            log(f"stopped {self.name(key)}")

    def make_room(self, fmt):
        """Stop the other format's servers when the GPU cannot hold this pair too (weights twice,
        KV pools and scratch: 2.2 x the file + 40 GB, generous for the 8B shapes)."""
        g = gpu_info()
        need = 2.2 * os.path.getsize(self.a.model[fmt]) / 2**20 + 40 * 1024
        if g and g["free_mib"] < need:
            for key in [k for k in self.up if k[1] != fmt]:
                self.stop(key)

    def llama_state(self):
        """'ready', 'pending' (its build, --llama-ready, has not finished) or 'failed: why'."""
        if self.a.llama_ready:
            try:
                with open(self.a.llama_ready) as f:
                    rc = (f.read().split() or ["?"])[0]
            except OSError:
                return "pending"
            if rc != "0":
                return f"failed: llama-server build rc {rc} (see its log)"
        return "ready" if os.access(self.a.llama_server, os.X_OK) else f"failed: no {self.a.llama_server}"

    def ensure(self, keys):
        """Start the servers of keys that are not up yet, side by side; warm each up. llama-server
        keys wait while its build is pending (level() starts them once it is done)."""
        state = self.llama_state() if any(k[0] == "llama.cpp" for k in keys) else "ready"
        if state.startswith("failed"):
            for k in keys:
                if k[0] == "llama.cpp":
                    self.res["servers"].setdefault(self.name(k), {})["failed"] = state[len("failed: "):]
        todo = [k for k in keys if k not in self.up and not self.res["servers"].get(self.name(k), {}).get("failed")
                and (k[0] != "llama.cpp" or state == "ready")]
        if not todo:
            return
        self.make_room(todo[0][1])
        started = {}
        for key in todo:
            s, fmt, step = key
            if s == "llama.cpp" and not self.res["llama_server_version"]:
                self.res["llama_server_version"] = version_of([self.a.llama_server, "--version"])
            port = free_port()
            argv = server_argv(s, self.a, self.a.model[fmt], port, step)
            info = self.res["servers"][self.name(key)] = {"argv": argv, "port": port}
            t = time.monotonic()
            try:
                log_path = os.path.join(self.a.logs, self.name(key).replace(" ", "-") + ".log")
                started[key] = (Server(s, argv, port, log_path, wait=False), t)
            except OSError as e:
                info["failed"] = f"cannot start: {e}"
        for key, (srv, t) in started.items():
            info = self.res["servers"][self.name(key)]
            try:
                srv.wait_ready(max(10.0, min(self.a.load_timeout, self.left() - 5)))
                info["load_s"] = round(time.monotonic() - t, 1)  # loaded side by side: each one's wall time
                self.up[key] = srv
            except RuntimeError as e:
                info["failed"] = str(e)
                log(f"{self.name(key)}: {e}")
        self.res["gpu_after_load_" + "+".join(self.name(k) for k in todo)] = gpu_info()
        for key in todo:
            if key in self.up:
                self.warm_up(key)
        self.save()

    def warm_up(self, key):
        """Two short requests with the shared prefix: first-request costs stay out of the levels and
        the prefix is in the server's cache before any level (the levels measure cached-prefix TTFT)."""
        port, info, rates = self.up[key].port, self.res["servers"][self.name(key)], []
        for i in range(2):
            r = stream_completion(port, "/v1/completions", self.prompts.body(f"warm-{i}", 16), timeout=120)
            if r.error or r.status != 200:
                info["warm_up_error"] = r.error
                log(f"{self.name(key)} warm-up failed: {r.error}")
                return
            if r.ttft is not None and r.t_done > r.ttft:
                rates.append(15 / (r.t_done - r.ttft))
            info.setdefault("warm_up", []).append({"ttft_ms": r.ttft and r.ttft * 1e3, "total_s": r.t_done,
                                                   "usage": r.usage})
        # a restarted server keeps the best rate its key has measured (the projection that skips a
        # level must not fall back to a 15-token warm-up's rate)
        self.rate[key] = max([self.rate.get(key, 0.0)] + rates) if rates else self.rate.get(key, 10.0)

    def level(self, key, n, out, prefix=None):
        """One level of n streams on the server of key into out[str(n)]; prefix: see Prompts.body.
        False when it could not run yet (llama-server still building): the caller runs it later."""
        name = self.name(key)
        if key not in self.up and key[0] == "llama.cpp":
            if self.llama_state() == "pending":
                out[str(n)] = {"skipped": "llama-server still building when its turn came"}
                return False
            self.ensure([key])
        srv = self.up.get(key)
        if not srv or srv.proc.poll() is not None:
            why = self.res["servers"].get(name, {}).get("failed") or "server not running"
            out[str(n)] = {"skipped": why}
            return True
        each = 2 if n == 1 else 1  # N=1: two requests back to back, so its p50 is not one sample
        # a rate measured by a level is aggregate tok/s; one from the warm-up is a single stream's,
        # and N streams run together: assume aggregate grows at least as sqrt(N) (batched decode
        # on a GPU grows faster), so a server's first level is not skipped on a 1-stream rate
        rate = self.rate[key] * (1.0 if key in self.level_rate else max(1.0, n ** 0.5))
        projected = n * each * self.a.max_tokens / rate + 3
        if projected > self.left() - 5:
            out[str(n)] = {"skipped": f"projected {projected:.0f} s at {rate:.0f} tok/s > {self.left():.0f} s left"}
            log(f"{name} N={n}: skipped ({out[str(n)]['skipped']})")
            return True
        reqs, summ = run_level(srv.port, n, each, self.a.max_tokens, [], path="/v1/completions",
                               make_body=lambda k: self.prompts.body(f"{n}-{k}", prefix=prefix), timeout=max(10.0, self.left()))
        summ["request_details"] = [{k: d[k] for k in ("ttft_s", "total_s", "completion_tokens", "prompt_tokens",
                                                     "cached_tokens", "decode_tps", "finish_reason", "error")}
                                   for d in reqs]
        summ["loadavg_after"] = loadavg()
        if key[0] == "hearth":
            summ["stats_after"] = hearth_stats(srv.port)
        out[str(n)] = summ
        if summ["aggregate_tps"]:
            self.rate[key] = max(self.rate[key], summ["aggregate_tps"])
            self.level_rate.add(key)
        log(f"{name} N={n}: {fmt_num(summ['aggregate_tps'])} tok/s aggregate, TTFT p50 {fmt_num(summ['ttft_p50_ms'])} "
            f"p95 {fmt_num(summ['ttft_p95_ms'])} ms, cached {summ['cached_tokens_median']}, errors {summ['errors']}, "
            f"{summ['wall_s']:.1f} s")
        return True

    def cold_prefix(self, fmt, servers):
        """N=32 (or the largest N below it) once more, the 32 requests sharing a prefix no server has
        seen: the prefix computed once for all (hearth) or per slot, against the cached case above."""
        n = max([x for x in self.a.n if x <= 32] or self.a.n)
        if self.left() < 30:
            self.res["notes"].append(f"no time left for the cold-prefix level N={n}")
            return
        keys = [(s, fmt, self.a.max_step_tokens) for s in servers]
        self.ensure(keys)
        for key in keys:
            out = self.res.setdefault("cold_prefix", {}).setdefault(fmt, {}).setdefault(key[0], {})
            self.level(key, n, out, prefix=f"cold-{key[0]}")  # a new prefix for each server: both start cold
            self.save()

    def ab_step_tokens(self, fmt):
        """With the time left: hearth alone on fmt with other step budgets (--ab-step-tokens), at the
        N of the issue's TTFT target (32, when measured) and the largest N; everything else stopped."""
        ns = [n for n in (32, max(self.a.n)) if n in self.a.n] or [max(self.a.n)]
        for step in self.a.ab_step_tokens:
            if self.left() < 40:
                self.res["notes"].append(f"no time left for --max-step-tokens {step}")
                return
            for key in list(self.up):
                self.stop(key)
            key = ("hearth", fmt, step)
            self.ensure([key])
            out = self.res.setdefault("ab_step_tokens", {}).setdefault(fmt, {}).setdefault(str(step), {})
            for n in sorted(set(ns)):
                self.level(key, n, out)
                self.save()

    def run(self):
        servers = [s for s in SERVERS if s in self.a.servers and (s != "llama.cpp" or self.a.llama_server)]
        if "llama.cpp" in self.a.servers and not self.a.llama_server:
            self.res["notes"].append("llama.cpp rows not run: no llama-server binary")
        fmts = list(self.a.model)
        small = [n for n in self.a.n if n < max(self.a.n)] or self.a.n
        big = [n for n in self.a.n if n not in small]
        # priority order: every format at the smaller N first, then the largest N (formats reversed,
        # so the servers still up from the last step go first)
        plan = [(f, small) for f in fmts] + [(f, big) for f in reversed(fmts) if big]
        step = self.a.max_step_tokens
        out = lambda key: self.res["levels"].setdefault(key[1], {}).setdefault(key[0], {})  # noqa: E731
        deferred = []  # llama-server levels whose turn came while it was still building
        try:
            for fmt, ns in plan:
                if self.left() < 20:
                    self.res["notes"].append(f"budget spent before {fmt} N={ns}")
                    break
                self.ensure([(s, fmt, step) for s in servers])
                for n in ns:
                    for s in servers:
                        if not self.level((s, fmt, step), n, out((s, fmt, step))):
                            deferred.append(((s, fmt, step), n))
                        self.save()
            waited = time.monotonic()
            while deferred and self.left() > 30:
                if self.llama_state() == "pending":
                    if time.monotonic() - waited > self.a.llama_wait:
                        break
                    time.sleep(2)
                    continue
                key, n = deferred.pop(0)
                # a fresh llama-server (loaded and warmed up again) for a level run out of order,
                # so it does not inherit the state of a larger level run just before
                self.stop(key)
                self.level(key, n, out(key))
                self.save()
            if deferred:
                self.res["notes"].append(f"llama-server was not built in time for {len(deferred)} levels")
            self.cold_prefix(fmts[0], servers)
            self.ab_step_tokens(fmts[0])
        finally:
            for key in list(self.up):
                self.stop(key)
            self.res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            self.save()


def fmt_num(x, nd=0):
    return "-" if x is None else f"{x:.{nd}f}"


def cell(lv, key, nd=0):
    if not lv:
        return "not run"
    if "skipped" in lv:
        return "skipped"
    return fmt_num(lv.get(key), nd)


def targets(res):
    """The issue's GPU targets against this run: aggregate >= 1.5x llama.cpp (F16, bf16-class) and
    >= 2.5x (4-bit) at N >= 8; TTFT p50 < 250 ms for a cached prefix at N = 32."""
    out = []
    for fmt, by in res["levels"].items():
        want = 2.5 if fmt.startswith("q4") else 1.5
        h, l = by.get("hearth", {}), by.get("llama.cpp", {})
        ratios = [(n, h[str(n)]["aggregate_tps"] / l[str(n)]["aggregate_tps"]) for n in res["n"] if n >= 8
                  and (h.get(str(n)) or {}).get("aggregate_tps") and (l.get(str(n)) or {}).get("aggregate_tps")]
        if ratios:
            low = min(ratios, key=lambda x: x[1])
            out.append(f"- {fmt}: aggregate ratio at N >= 8 lowest {low[1]:.2f} (N={low[0]}), target >= {want}: "
                       f"{'met' if low[1] >= want else 'NOT met'}")
        t = (h.get("32") or {}).get("ttft_p50_ms")
        if t is not None:
            out.append(f"- {fmt}: hearth TTFT p50 at N=32 (prefix cached: {h['32'].get('cached_tokens_median')} "
                       f"tokens) {t:.0f} ms, target < 250 ms: {'met' if t < 250 else 'NOT met'}")
    return (["Targets (issue 6):", ""] + out + [""]) if out else []


def markdown(res):
    lines = [f"# serve_load on the GPU: hearth serve --device {res['device']} vs llama.cpp llama-server", "",
             f"{res['started']}; GPU: {(res.get('gpu') or {}).get('name', 'none')}; hearth `{res['hearth_version']}`; "
             f"llama-server `{res.get('llama_server_version') or 'not run'}`.",
             f"Prompts of {res['prompt_tokens']} tokens (the first {res['prefix_tokens']} shared by every request, "
             f"cached by a warm-up before the levels), {res['max_tokens']}-token answers (EOS banned, greedy), "
             "N concurrent streaming /v1/completions (N=1: two requests back to back). Aggregate = completion tokens "
             "of the level / its wall time; TTFT at the first SSE event with text; ratio = hearth / llama.cpp.", ""]
    for fmt, path in res["models"].items():
        lv = res["levels"].get(fmt, {})
        h, l = lv.get("hearth", {}), lv.get("llama.cpp", {})
        lines += [f"## {fmt} (`{os.path.basename(path)}`)", "",
                  "| N | hearth tok/s | llama.cpp tok/s | ratio | hearth TTFT p50 / p95 ms | llama.cpp TTFT p50 / p95 ms "
                  "| decode tok/s per stream (h / l) | cached prompt tokens (h / l) | prompt tokens (h / l) | errors (h / l) |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n in res["n"]:
            a, b = h.get(str(n)), l.get(str(n))
            ra = (a or {}).get("aggregate_tps"), (b or {}).get("aggregate_tps")
            ratio = fmt_num(ra[0] / ra[1], 2) if ra[0] and ra[1] else "-"
            lines.append(f"| {n} | {cell(a, 'aggregate_tps', 1)} | {cell(b, 'aggregate_tps', 1)} | {ratio} "
                         f"| {cell(a, 'ttft_p50_ms')} / {cell(a, 'ttft_p95_ms')} | {cell(b, 'ttft_p50_ms')} / {cell(b, 'ttft_p95_ms')} "
                         f"| {cell(a, 'decode_tps_median', 1)} / {cell(b, 'decode_tps_median', 1)} "
                         f"| {cell(a, 'cached_tokens_median')} / {cell(b, 'cached_tokens_median')} "
                         f"| {cell(a, 'prompt_tokens_median')} / {cell(b, 'prompt_tokens_median')} "
                         f"| {cell(a, 'errors')} / {cell(b, 'errors')} |")
        lines.append("")
    lines += targets(res)
    for fmt, by in res.get("cold_prefix", {}).items():
        h, l = by.get("hearth", {}), by.get("llama.cpp", {})
        lines += [f"Cold shared prefix on {fmt} (the N requests share a {res['prefix_tokens']}-token prefix no server "
                  "had seen; the tables above: cached by the warm-up):", "",
                  "| N | hearth tok/s | llama.cpp tok/s | hearth TTFT p50 / p95 ms | llama.cpp TTFT p50 / p95 ms "
                  "| cached prompt tokens (h / l) |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n in sorted({int(x) for x in list(h) + list(l)}):
            a, b = h.get(str(n)), l.get(str(n))
            lines.append(f"| {n} | {cell(a, 'aggregate_tps', 1)} | {cell(b, 'aggregate_tps', 1)} | {cell(a, 'ttft_p50_ms')} / "
                         f"{cell(a, 'ttft_p95_ms')} | {cell(b, 'ttft_p50_ms')} / {cell(b, 'ttft_p95_ms')} "
                         f"| {cell(a, 'cached_tokens_median')} / {cell(b, 'cached_tokens_median')} |")
        lines.append("")
    for fmt, by in res.get("ab_step_tokens", {}).items():
        lines += [f"hearth alone on {fmt} with other step budgets (`--max-step-tokens`; the table above: "
                  f"{res.get('max_step_tokens')}):", "",
                  "| --max-step-tokens | N | tok/s | TTFT p50 / p95 ms | cached prompt tokens |", "| ---: | ---: | ---: | ---: | ---: |"]
        for step, lv in by.items():
            for n, v in lv.items():
                lines.append(f"| {step} | {n} | {cell(v, 'aggregate_tps', 1)} | {cell(v, 'ttft_p50_ms')} / "
                             f"{cell(v, 'ttft_p95_ms')} | {cell(v, 'cached_tokens_median')} |")
        lines.append("")
    skipped = [f"{s} {f} N={n}: {v['skipped']}" for f, by in res["levels"].items() for s, lv in by.items()
               for n, v in lv.items() if "skipped" in v]
    failed = [f"{k}: {v['failed']}" for k, v in res["servers"].items() if v.get("failed")]
    loads = [f"{k} {v['load_s']} s" for k, v in res["servers"].items() if "load_s" in v]
    lines += ["Server commands: " + "; ".join(f"`{' '.join(os.path.basename(x) if i == 0 else x for i, x in enumerate(v['argv']))}`"
                                              for v in res["servers"].values() if "argv" in v), "",
              "Load (wall, the pair side by side): " + (", ".join(loads) or "-"), ""]
    lines += [f"- skipped: {x}" for x in skipped] + [f"- failed: {x}" for x in failed] + [f"- {x}" for x in res["notes"]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hearth", required=True)
    ap.add_argument("--llama-server", default="", help="llama-server binary; empty: hearth only")
    ap.add_argument("--llama-ready", default="", help="file that appears when llama-server's build ends (first "
                    "word: its exit status); until then hearth's levels run and llama-server's wait")
    ap.add_argument("--llama-wait", type=float, default=120, help="seconds to wait for that build after hearth's levels")
    ap.add_argument("--model", action="append", required=True, type=lambda s: tuple(s.split("=", 1)),
                    help="FORMAT=PATH.gguf, in priority order (repeat)")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--device", default="cuda", help="hearth's --device (cpu for a dry run without a GPU)")
    ap.add_argument("--n", default="1,8,32,64,128", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--prefix-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=768, help="context per sequence / slot (prompt + answer + headroom)")
    ap.add_argument("--max-step-tokens", type=int, default=512, help="hearth's step budget")
    ap.add_argument("--ab-step-tokens", default="", type=lambda s: [int(x) for x in s.split(",") if x],
                    help="after the main runs, with the time left: hearth alone on the first format with these "
                    "--max-step-tokens values (N=32 and the largest N)")
    ap.add_argument("--hearth-arg", action="append", default=[], help="extra hearth serve argument (repeat)")
    ap.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument (repeat)")
    ap.add_argument("--llama-fa", default="on", help="llama-server -fa value")
    ap.add_argument("--budget", type=float, default=280, help="seconds for everything; levels that do not fit are skipped")
    ap.add_argument("--load-timeout", type=float, default=120)
    ap.add_argument("--out", required=True, help="writes OUT.md (after every level)")
    ap.add_argument("--logs", default=None, help="server logs folder (default: beside OUT)")
    a = ap.parse_args()
    a.model = dict(a.model)
    a.servers = a.servers.split(",")
    a.logs = a.logs or os.path.dirname(os.path.abspath(a.out))
    if a.prefix_tokens <= PROMPT_OVERHEAD or a.prompt_tokens <= a.prefix_tokens:
        sys.exit("gpu_load.py: need prompt-tokens > prefix-tokens > 4")
    for p in [a.hearth] + list(a.model.values()) + ([a.llama_server] if a.llama_server and not a.llama_ready else []):
        if not os.path.exists(p):
            sys.exit(f"gpu_load.py: {p} does not exist")
    os.makedirs(a.logs, exist_ok=True)
    Run(a).run()


if __name__ == "__main__":
    main()
