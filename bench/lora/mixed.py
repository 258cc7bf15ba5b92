#!/usr/bin/env python3
"""mixed.py: what LoRA adapters cost `hearth serve`: aggregate decode throughput of N
concurrent streams when every stream uses the base model, against the same N streams spread
over K mounted rank-R adapters (one step mixes them, and base rows), on one server in the
same run. The peer is hearth's own base path (no peer engine batches different adapters
together: llama.cpp runs one adapter set per batch). Alternates the two modes --repeat times
and reports the best and the median of each (the machine is shared: best-of is the least
disturbed).
Adapters are random, in MLX format, shaped for the model (made here with numpy alone, so the
GPU machine needs no mlx). --device cuda serves on the GPU (the serving tier's shrink /
expand kernels, decode steps in CUDA graphs); --all-adapted gives every stream an adapter
(no base rows).
Usage: mixed.py BIN MODEL [--device cpu|cuda] [--streams 8] [--adapters 4] [--rank 16]
                [--tokens 64] [--threads 2] [--all-adapted]
Writes bench/results/lora_mixed.md through bench/results_file.py (--device cuda: its own section
of it, json key "cuda"; a CPU run keeps that section)."""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))
import results_file  # noqa: E402
from serve_util import hearth_serve  # noqa: E402
PROJ = {"self_attn.q_proj": ("hidden", "q"), "self_attn.k_proj": ("hidden", "kv"), "self_attn.v_proj": ("hidden", "kv"),
        "self_attn.o_proj": ("q", "hidden"), "mlp.gate_proj": ("hidden", "ffn"), "mlp.up_proj": ("hidden", "ffn"),
        "mlp.down_proj": ("ffn", "hidden")}


def model_dims(bin_, model):
    info = json.loads(subprocess.run([bin_, "info", model, "--json"], capture_output=True, check=True).stdout)
    hd = info.get("head_dim") or info["hidden_size"] // info["num_attention_heads"]
    return {"hidden": info["hidden_size"], "q": info["num_attention_heads"] * hd,
            "kv": info["num_key_value_heads"] * hd, "ffn": info["intermediate_size"],
            "layers": info["num_hidden_layers"]}


def save_safetensors(path, tensors):
    """tensors: name -> float32 numpy array (the safetensors layout: a JSON header, then the data)."""
    header, off = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for t in tensors.values():
            f.write(t.tobytes())


def make_adapter(path, dims, rank, seed, projs=tuple(PROJ)):
    """A random rank-`rank` adapter on projections projs of every layer; returns its file's bytes."""
    import numpy as np
    rng = np.random.default_rng(seed)
    w = {}
    for i in range(dims["layers"]):
        for name in projs:
            din, dout = PROJ[name]
            w[f"model.layers.{i}.{name}.lora_a"] = rng.normal(0, 0.02, (dims[din], rank)).astype(np.float32)
            w[f"model.layers.{i}.{name}.lora_b"] = rng.normal(0, 0.02, (rank, dims[dout])).astype(np.float32)
    os.makedirs(path, exist_ok=True)
    save_safetensors(os.path.join(path, "adapters.safetensors"), w)
    json.dump({"fine_tune_type": "lora", "num_layers": dims["layers"],
               "lora_parameters": {"rank": rank, "scale": 2.0, "dropout": 0.0}},
              open(os.path.join(path, "adapter_config.json"), "w"))
    return os.path.getsize(os.path.join(path, "adapters.safetensors"))


def one(port, adapter, tokens):
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0, "adapter": adapter}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def cpu_seconds(pid):
    """The server's user + system CPU time so far (/proc/PID/stat)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def run(port, pid, adapters, tokens):
    """(tokens per wall second, tokens per server CPU second): the second is less moved by
    other processes on a shared machine."""
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    with ThreadPoolExecutor(len(adapters)) as ex:
        done = sum(ex.map(lambda a: one(port, a, tokens), adapters))
    return done / (time.perf_counter() - t0), done / max(cpu_seconds(pid) - c0, 1e-9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--all-adapted", action="store_true", help="every stream uses an adapter (no base rows)")
    a = ap.parse_args()
    dims = model_dims(a.bin, a.model)
    tmp = tempfile.mkdtemp(prefix="hearth-lora-bench-")
    flags = []
    for k in range(a.adapters):
        make_adapter(os.path.join(tmp, f"a{k}"), dims, a.rank, k)
        flags += ["--adapter", f"a{k}={os.path.join(tmp, f'a{k}')}"]
    base_runs, mixed_runs = [], []
    with hearth_serve(a.bin, ["--model", a.model, "--threads", str(a.threads), "--ctx", "1024", "--max-sequences",
                              str(a.streams), "--device", a.device, "--log-level", "WARNING", *flags]) as (p, port):
        if a.all_adapted:
            spread = [f"a{i % a.adapters}" for i in range(a.streams)]
        else:
            spread = [f"a{i % a.adapters}" if i % (a.adapters + 1) else "none" for i in range(a.streams)]
        run(port, p.pid, ["none"] * a.streams, 8)  # warm up
        for _ in range(a.repeat):
            base_runs.append(run(port, p.pid, ["none"] * a.streams, a.tokens))
            mixed_runs.append(run(port, p.pid, spread, a.tokens))
    machine = f"{platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    if a.device == "cuda":
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        machine = f"{gpu.stdout.strip().splitlines()[0] if gpu.returncode == 0 else 'unknown GPU'}; {machine}"
    res = {"model": a.model, "device": a.device, "streams": a.streams, "adapters": a.adapters, "rank": a.rank,
           "tokens": a.tokens, "threads": a.threads, "machine": machine,
           "mix": spread, "base_tok_s": [r[0] for r in base_runs], "mixed_tok_s": [r[0] for r in mixed_runs],
           "base_tok_per_cpu_s": [r[1] for r in base_runs], "mixed_tok_per_cpu_s": [r[1] for r in mixed_runs]}
    best = lambda runs, i: max(r[i] for r in runs)
    med = lambda runs, i: statistics.median(r[i] for r in runs)
    res["ratio_best"] = best(mixed_runs, 0) / best(base_runs, 0)
    res["ratio_median"] = med(mixed_runs, 0) / med(base_runs, 0)
    res["ratio_cpu_median"] = med(mixed_runs, 1) / med(base_runs, 1)
    md = (f"# LoRA: mixed-adapter batches vs the base (`bench/lora/mixed.py`)\n\n"
          f"{a.streams} concurrent streams of {a.tokens} tokens, {a.model}, --device {a.device}, {a.threads} threads, "
          f"{res['machine']}; "
          f"mixed: {a.adapters} rank-{a.rank} adapters on all 7 projections of every layer"
          f"{'' if a.all_adapted else ', and base rows'} "
          f"({', '.join(spread)}).\n\n| mode | best tok/s | median tok/s | median tok per server CPU s |\n"
          f"| --- | --- | --- | --- |\n"
          f"| base only | {best(base_runs, 0):.1f} | {med(base_runs, 0):.1f} | {med(base_runs, 1):.1f} |\n"
          f"| mixed adapters | {best(mixed_runs, 0):.1f} | {med(mixed_runs, 0):.1f} | {med(mixed_runs, 1):.1f} |\n"
          f"| ratio mixed / base | {res['ratio_best']:.3f} | {res['ratio_median']:.3f} | "
          f"{res['ratio_cpu_median']:.3f} |\n")
    if a.device == "cuda":  # its own section of the same file
        section = (f"{CUDA_HEADING}\n\n{results_file.provenance()}\n\n" + md.split("\n", 2)[2])
        results_file.write_section("lora_mixed", md.split("\n", 1)[0], CUDA_HEADING, section, "cuda", res)
    else:
        results_file.write_keeping("lora_mixed", md, res, [(CUDA_HEADING, "cuda")])
    print(md)


CUDA_HEADING = "## On the GPU (`--device cuda`)"


if __name__ == "__main__":
    main()
