#!/usr/bin/env python3
"""registry.py: what mounting adapters costs `hearth serve` (issue 36's targets: mounting a
rank-16 adapter under 100 ms; 1,000 registered adapters slowing base requests by under 2%).

1. Mount latency: POST /v1/adapters of a rank-R adapter on all 7 projections of every layer
   (random, MLX format, shaped for the model), timed from the request to the answer, while the
   server also decodes base streams (the mount must not stall them: their slowest token gap
   during the mounts is reported), then DELETE; --mounts times.
2. Registry size: base requests (no adapter) on one server, in turns with its registry empty
   and holding --registered adapters (rank R on q_proj only, so a thousand fit in host memory:
   each its own copy; mounted, measured, unmounted each round), --repeat rounds; the ratio of
   the median throughputs.
The peer is hearth's own base path (the product we replace and mlx_lm.server mount adapters
too, but report no numbers for it).
Usage: registry.py BIN MODEL [--rank 16] [--mounts 10] [--registered 1000] [--streams 4]
                   [--tokens 64] [--repeat 5] [--threads 2] [--mount-only]
Writes bench/results/lora_registry.md through bench/results_file.py; --mount-only runs part 1
alone (the issue's 8B-shaped mount, where a thousand full-model registries do not fit this
machine's memory) into its own section of the same file (json key "mount_only")."""
import argparse, json, os, statistics, sys, tempfile, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
from mixed import PROJ, make_adapter, model_dims  # noqa: E402
from serve_util import hearth_serve  # noqa: E402


def call(port, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode() if body else None,
                                 {"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.status, json.load(r)


def stream_gaps(port, tokens, out):
    """One streamed base completion: the gaps between its chunks (seconds) into out."""
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    last = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data:"):
                now = time.perf_counter()
                if last is not None:
                    out.append(now - last)
                last = now


def base_rate(port, streams, tokens):
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0}

    def one(_):
        return call(port, "POST", "/v1/completions", body)[1]["usage"]["completion_tokens"]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as ex:
        done = sum(ex.map(one, range(streams)))
    return done / (time.perf_counter() - t0)


def mount_part(a, full_bytes, mount_ms, quiet_gaps, gaps):
    """Part 1's result fields and its two table rows."""
    med = statistics.median
    res = {"model": a.model, "rank": a.rank, "threads": a.threads, "streams": a.streams, "tokens": a.tokens,
           "adapter_bytes": full_bytes, "mount_ms": mount_ms, "gap_ms_p50_quiet": med(quiet_gaps) * 1e3,
           "gap_ms_max_quiet": max(quiet_gaps) * 1e3, "gap_ms_p50_mounting": med(gaps) * 1e3,
           "gap_ms_max_mounting": max(gaps) * 1e3}
    rows = (f"| what | result | target (issue 36) |\n|---|---|---|\n"
            f"| mount a rank-{a.rank} adapter on all 7 projections of every layer ({full_bytes / 1e6:.1f} MB), "
            f"POST /v1/adapters while {a.streams} streams decode, {a.mounts} times | median "
            f"{med(mount_ms):.1f} ms, max {max(mount_ms):.1f} ms | under 100 ms |\n"
            f"| the decoding streams' token gap during the mounts (the same streams, none mounting: p50 "
            f"{res['gap_ms_p50_quiet']:.1f} ms, max {res['gap_ms_max_quiet']:.1f} ms) | p50 "
            f"{res['gap_ms_p50_mounting']:.1f} ms, max {res['gap_ms_max_mounting']:.1f} ms | no stall |\n")
    return res, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--mounts", type=int, default=10)
    ap.add_argument("--registered", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mount-only", action="store_true", help="part 1 only (its section of bench/results/lora_registry.md)")
    a = ap.parse_args()
    dims = model_dims(a.bin, a.model)
    tmp = tempfile.mkdtemp(prefix="hearth-lora-registry-")
    full = os.path.join(tmp, "full")
    full_bytes = make_adapter(full, dims, a.rank, 1, list(PROJ))
    small = os.path.join(tmp, "small")
    small_bytes = make_adapter(small, dims, a.rank, 2, ["self_attn.q_proj"])
    common = ["--model", a.model, "--threads", str(a.threads), "--ctx", "1024", "--max-sequences", str(a.streams + 1),
              "--log-level", "WARNING"]

    # 1. mount latency while base streams decode
    mount_ms, gaps, quiet_gaps = [], [], []
    with hearth_serve(a.bin, common) as (p, port):
        base_rate(port, a.streams, 8)  # warm up
        for i in range(a.mounts):  # the same streams without a mount: the gaps' baseline
            quiet = [threading.Thread(target=stream_gaps, args=(port, a.tokens * 2, quiet_gaps)) for _ in range(a.streams)]
            for b in quiet:
                b.start()
            for b in quiet:
                b.join()
        for i in range(a.mounts):
            busy = [threading.Thread(target=stream_gaps, args=(port, a.tokens * 2, gaps)) for _ in range(a.streams)]
            for b in busy:
                b.start()
            time.sleep(0.3)  # the streams are decoding
            t0 = time.perf_counter()
            st, _ = call(port, "POST", "/v1/adapters", {"id": f"m{i}", "path": full})
            mount_ms.append((time.perf_counter() - t0) * 1e3)
            assert st == 200
            for b in busy:
                b.join()
            assert call(port, "DELETE", f"/v1/adapters/m{i}")[0] == 200

    med = statistics.median
    if a.mount_only:
        write_mount_only(a, dims, full_bytes, mount_ms, quiet_gaps, gaps)
        return
    # 2. base requests on one server, its registry empty and then holding --registered adapters,
    # in turns (the same process both ways: two servers side by side differ by more than this)
    empty, full_reg, reg_s = [], [], []
    with hearth_serve(a.bin, common) as (p1, port1):
        base_rate(port1, a.streams, 8)  # warm up
        for r in range(a.repeat):  # the empty run first, then last: each state runs right after a change too
            if r % 2 == 0:
                empty.append(base_rate(port1, a.streams, a.tokens))
            t0 = time.perf_counter()
            for i in range(a.registered):
                assert call(port1, "POST", "/v1/adapters", {"id": f"r{i}", "path": small})[0] == 200
            reg_s.append(time.perf_counter() - t0)
            assert len(call(port1, "GET", "/v1/adapters")[1]["data"]) == a.registered
            full_reg.append(base_rate(port1, a.streams, a.tokens))
            for i in range(a.registered):
                assert call(port1, "DELETE", f"/v1/adapters/r{i}")[0] == 200
            if r % 2 == 1:
                empty.append(base_rate(port1, a.streams, a.tokens))
    res, rows = mount_part(a, full_bytes, mount_ms, quiet_gaps, gaps)
    res.update({"small_adapter_bytes": small_bytes, "registered": a.registered, "register_seconds": reg_s,
                "base_tok_s_empty": empty, "base_tok_s_registered": full_reg,
                "ratio_median": med(full_reg) / med(empty), "ratio_best": max(full_reg) / max(empty)})
    md = (f"# LoRA: mounting adapters and a large registry (`bench/lora/registry.py`)\n\n"
          f"{a.model}, {dims['layers']} layers, CPU, {a.threads} threads per server.\n\n" + rows +
          f"| {a.registered} adapters registered (rank {a.rank} on q_proj, {small_bytes / 1e6:.1f} MB each, "
          f"mounted one by one in {med(reg_s):.1f} s): base throughput, {a.streams} streams x {a.tokens} tokens, "
          f"against the same server's empty registry, {a.repeat} rounds (mount all, registered, unmount all; the empty run before or after, in turns) | median {med(full_reg):.1f} vs "
          f"{med(empty):.1f} tok/s: **{res['ratio_median']:.3f}** (best {res['ratio_best']:.3f}) | at least 0.98 |\n")
    results_file.write_keeping("lora_registry", md, res, [(MOUNT_HEADING, "mount_only")])
    print(md)


MOUNT_HEADING = "## Mounting a full-model adapter (`--mount-only`)"


def write_mount_only(a, dims, full_bytes, mount_ms, quiet_gaps, gaps):
    res, rows = mount_part(a, full_bytes, mount_ms, quiet_gaps, gaps)
    md = (f"{MOUNT_HEADING}\n\n{results_file.provenance()}\n\n"
          f"{a.model}, {dims['layers']} layers (hidden {dims['hidden']}, MLP {dims['ffn']}), CPU, "
          f"{a.threads} threads.\n\n" + rows)
    print(md)
    print("wrote", results_file.write_section("lora_registry", "# LoRA: mounting adapters and a large registry",
                                              MOUNT_HEADING, md, "mount_only", res))


if __name__ == "__main__":
    main()
