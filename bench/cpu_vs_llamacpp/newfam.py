#!/usr/bin/env python3
"""bench/cpu_vs_llamacpp/newfam.py: CPU prefill and decode of the new families (issue 33's CPU rows),
hearth (`hearth bench --json`) against llama.cpp's own llama-bench, on random-weight models of real
shapes written by tools/gpu_models.py: Qwen3.5-0.8B (hybrid Gated DeltaNet) in Q4_K_M, the same GGUF
file for both engines, and Gemma-4-E2B, the same GGUF too (hearth reads Gemma 4 from GGUF; a family
it could not read from GGUF would get its MLX 4-bit model, and the table says when the files differ).

Measures prefill of -p tokens into an empty cache (llama-bench pp512 -d 0) and decode of -n tokens
after a -p-token prompt (hearth bench -p 512 -n 128; llama-bench tg128 -d 512), in interleaved rounds:
each round runs hearth once and every llama.cpp configuration once (fresh processes, -r 1, the order
turning each round), so every engine sees the same neighbours on this shared machine; medians over
rounds. llama.cpp runs at -t T as hearth does ("t2", the issue's setting) and, because its OpenMP
threads lose badly when the 2 cores are oversubscribed by other tenants, also at -t 1 ("t1") by
default: the table gives the ratio against both, the smaller of the two being the honest one.
Each hearth run measures the bandwidth right after its decode; its roofline fraction counts the bytes a
decode token reads, the Gated DeltaNet layers' recurrent state read and written included (the state's
share is printed). Writes bench/results/cpu_newfam.md (bench/results_file.py). Nothing is asserted.

usage: .venv/bin/python bench/cpu_vs_llamacpp/newfam.py --hearth BIN [--models qwen35_0_8b,gemma4_e2b]
       [-p 512] [-n 128] [-t 2] [-r 3] [--rounds-big 2] [--llama t2,t1[,t2passive]] [--dir MODELS]
       [--scale full|small] [--out bench/results/cpu_newfam] [--timeout 600]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tools"))
import results_file  # noqa: E402
import gpu_models  # noqa: E402
from run_bench import LLAMA_BENCH, cpu_info, git_describe, loadavg, mem_total_gb, run_child  # noqa: E402

CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
# llama.cpp configurations: name -> (threads or None for -t T, extra environment)
LLAMA_CONFIGS = {"t2": (None, {}), "t1": (1, {}), "t2passive": (None, {"OMP_WAIT_POLICY": "passive"})}
TITLES = {"qwen35_0_8b": "Qwen3.5-0.8B", "gemma4_e2b": "Gemma-4-E2B"}


def model_files(name, scale, d):
    """(hearth's file, llama.cpp's GGUF), written by tools/gpu_models.py when missing."""
    d.mkdir(parents=True, exist_ok=True)
    suffix = "" if scale == "full" else "-" + scale
    gguf, mlx = d / f"{name}{suffix}-q4_k_m.gguf", d / f"{name}{suffix}-mlx4"
    py = sys.executable
    if not gguf.exists():
        subprocess.run([py, str(REPO / "tools" / "gpu_models.py"), name, "gguf", str(gguf), "--scale", scale], check=True)
    same_file = gpu_models.MODELS[name]["gguf"] in gpu_models.HEARTH_GGUF
    if not same_file and not (mlx / "model.safetensors").exists():
        subprocess.run([py, str(REPO / "tools" / "gpu_models.py"), name, "mlx", str(mlx), "--scale", scale], check=True)
    return (gguf if same_file else mlx), gguf, same_file


def state_bytes_per_token(name, scale):
    """Bytes of recurrent state a decode token reads and writes (conv window + delta-rule state,
    f32, every Gated DeltaNet layer): what the roofline's byte count adds for them."""
    c = gpu_models.model_config(name, scale)
    n = sum(1 for t in c.get("layer_types", []) if t == "linear_attention")
    if not n:
        return 0
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    floats = (c["linear_conv_kernel_dim"] - 1) * (2 * nk * dk + nv * dv) + nv * dv * dk
    return 2 * 4 * floats * n


def hearth_cmd(args, path):
    return [args.hearth, "bench", str(path), "--device", "cpu", "-t", str(args.threads), "-p", str(args.prompt),
            "-n", str(args.gen), "-r", "1", "--json"]


def llama_cmds(args, gguf, cfg):
    """Two llama-bench processes: prefill (pp P into an empty cache) and decode (tg N after P)."""
    threads = LLAMA_CONFIGS[cfg][0] or args.threads
    base = [str(LLAMA_BENCH), "-m", str(gguf), "-lm", "none", "-t", str(threads), "-r", "1", "-o", "jsonl"]
    return (base + ["-p", str(args.prompt), "-n", "0"], base + ["-p", "0", "-n", str(args.gen), "-d", str(args.prompt)])


def llama_tps(out):
    t = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {"tps": t[0]["avg_ts"], "build_commit": t[0].get("build_commit")}


def run_llama(args, gguf, cfg):
    env_extra = LLAMA_CONFIGS[cfg][1]
    saved = {k: os.environ.get(k) for k in env_extra}
    os.environ.update(env_extra)
    try:
        (pre, e1, _), (dec, e2, _) = (run_child(c, str(gguf), args.timeout, llama_tps) for c in llama_cmds(args, gguf, cfg))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"prefill_tps": pre and pre["tps"], "decode_tps": dec and dec["tps"],
            "build_commit": (pre or dec or {}).get("build_commit"), "error": e1 or e2}


def measure(args, name):
    hpath, gguf, same = model_files(name, args.scale, Path(args.dir))
    rounds = args.rounds_big if name == "gemma4_e2b" and args.rounds_big else args.runs
    row = {"model": name, "title": TITLES.get(name, name), "hearth_file": hpath.name, "llamacpp_file": gguf.name,
           "same_file": same, "rounds": [], "load_before": loadavg(),
           "state_bytes_per_token": state_bytes_per_token(name, args.scale)}
    sides = ["hearth"] + args.llama
    for i in range(rounds):
        k = i % len(sides)
        rnd = {"load": loadavg()[0]}
        for side in sides[k:] + sides[:k]:
            if side == "hearth":
                d, e, _ = run_child(hearth_cmd(args, hpath), str(hpath), args.timeout)
                rnd["hearth"] = d if d else {"error": e}
            else:
                rnd[side] = run_llama(args, gguf, side)
            print(f"{name} round {i + 1}/{rounds} {side}: " + json.dumps({k2: v for k2, v in rnd[side].items()
                  if k2 in ("prefill_tps", "decode_tps", "roofline_fraction", "error")}), file=sys.stderr, flush=True)
        row["rounds"].append(rnd)
    row["load_after"] = loadavg()

    def med(side, key):
        xs = [r[side].get(key) for r in row["rounds"] if r.get(side) and r[side].get(key)]
        return statistics.median(xs) if xs else None
    row["hearth"] = {k: med("hearth", k) for k in ("prefill_tps", "decode_tps", "bandwidth_gbs", "roofline_tps",
                                                    "roofline_fraction", "decode_bytes_per_token")}
    row["llamacpp"] = {cfg: {k: med(cfg, k) for k in ("prefill_tps", "decode_tps")} for cfg in args.llama}
    # llama.cpp's decode against the roofline of the same round
    fr = [r[c]["decode_tps"] / r["hearth"]["roofline_tps"] for r in row["rounds"] for c in args.llama[:1]
          if r.get(c, {}).get("decode_tps") and r.get("hearth", {}).get("roofline_tps")]
    row["llamacpp_roofline_fraction"] = statistics.median(fr) if fr else None
    return row


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a and b else None


def markdown(res):
    s, cfgs = res["settings"], res["settings"]["llama_configs"]
    p, n, t = s["prompt_tokens"], s["gen_tokens"], s["threads"]
    cfg_text = {"t2": f"-t {t}, as shipped", "t1": "-t 1", "t2passive": f"-t {t}, OMP_WAIT_POLICY=passive"}
    lines = [f"# hearth vs llama.cpp on CPU, the new families ({t} threads, prefill {p}, decode {n} after {p}, "
             "interleaved rounds)", "",
             f"Prefill: {p} tokens into an empty cache (llama-bench pp{p}). Decode: {n} tokens after a {p}-token prompt "
             f"(hearth bench -p {p} -n {n}; llama-bench tg{n} -d {p}). hearth always runs -t {t}; llama.cpp runs as "
             + ", ".join(f"`{c}` ({cfg_text[c]})" for c in cfgs) + ". Ratios are hearth / llama.cpp (above 1: hearth "
             "faster); 'worst' is the smaller ratio over the llama.cpp configurations. Random weights of the real "
             "shapes (tools/gpu_models.py), Q4_K_M structure (Q6_K for the tied output/embedding and the down "
             "projections and V of the layers llama-quantize gives more bits). Medians over rounds; each round runs "
             "every engine once (fresh processes, the order turning each round). The machine is shared: its load "
             "average is given per row and per round in the json.", "",
             "| model | hearth file | llama.cpp file | hearth prefill tok/s | "
             + " | ".join(f"llama.cpp {c} prefill" for c in cfgs) + " | prefill ratio (vs " + cfgs[0] + ") | worst | "
             "hearth decode tok/s | " + " | ".join(f"llama.cpp {c} decode" for c in cfgs) + " | decode ratio (vs "
             + cfgs[0] + ") | worst | hearth roofline frac | llama.cpp " + cfgs[0] + " roofline frac | GB/s | "
             "MB/token (state) | rounds | load 1 min before -> after |",
             "|" + "---|" * 3 + "---:|" * (3 + len(cfgs)) + "---:|" * (3 + len(cfgs)) + "---:|" * 5 + "---|"]
    for r in res["rows"]:
        h, l = r["hearth"], r["llamacpp"]
        pr = [ratio(h["prefill_tps"], l[c]["prefill_tps"]) for c in cfgs]
        dr = [ratio(h["decode_tps"], l[c]["decode_tps"]) for c in cfgs]
        worst = lambda xs: min(x for x in xs if x) if any(xs) else None
        same = "" if r["same_file"] else " (not the same file)"
        mb = (h["decode_bytes_per_token"] or 0) / 1e6
        lines.append(f"| {r['title']} | {r['hearth_file']} | {r['llamacpp_file']}{same} | {fmt(h['prefill_tps'])} | "
                     + " | ".join(fmt(l[c]["prefill_tps"]) for c in cfgs) + f" | {fmt(pr[0], '.2f')} | "
                     f"{fmt(worst(pr), '.2f')} | {fmt(h['decode_tps'])} | "
                     + " | ".join(fmt(l[c]["decode_tps"]) for c in cfgs) + f" | {fmt(dr[0], '.2f')} | "
                     f"{fmt(worst(dr), '.2f')} | {fmt(h['roofline_fraction'], '.2f')} | "
                     f"{fmt(r['llamacpp_roofline_fraction'], '.2f')} | {fmt(h['bandwidth_gbs'])} | "
                     f"{mb:.0f} ({r['state_bytes_per_token'] / 1e6:.1f}) | {len(r['rounds'])} | "
                     f"{r['load_before'][0]} -> {r['load_after'][0]} |")
    m = res["machine"]
    lines += ["", "Roofline fraction: decode tok/s over (bandwidth hearth measured right after its decode, its own "
              "threads reading 1 GiB) / (bytes a decode token reads: the weights, KV at the mean decode context, and "
              "for Gated DeltaNet layers the recurrent state read and written, its share in brackets in MB).", "",
              f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, {m['mem_total_gb']} GB RAM, ISA "
              f"{' '.join(m['isa'])}; shared with other workers: /proc/loadavg (1/5/15 min) before "
              f"{' '.join(m['loadavg_before'])}, after {' '.join(m['loadavg_after'])}.",
              f"hearth {res['hearth']['commit']} ({res['hearth']['binary']}); llama.cpp's llama-bench (build "
              f"{res['llamacpp_build']}) built by install_llamacpp.sh (llama-cpp-python's vendored source, "
              "GGML_NATIVE=ON with AMX off, CPU only, OpenMP), `-lm none` (weights in anonymous memory).",
              f"Run {res['started']} .. {res['finished']}."]
    errs = [f"- {r['model']} round {i + 1} {side}: {rnd[side]['error']}" for r in res["rows"]
            for i, rnd in enumerate(r["rounds"]) for side in rnd if isinstance(rnd[side], dict) and rnd[side].get("error")]
    if errs:
        lines += ["", "Errors:"] + errs
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hearth", required=True)
    ap.add_argument("--models", default="qwen35_0_8b,gemma4_e2b")
    ap.add_argument("-p", "--prompt", type=int, default=512)
    ap.add_argument("-n", "--gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--runs", type=int, default=3)
    ap.add_argument("--rounds-big", type=int, default=0, help="rounds for Gemma-4-E2B (default: -r)")
    ap.add_argument("--llama", default="t2,t1", help="llama.cpp configurations: " + ",".join(LLAMA_CONFIGS))
    ap.add_argument("--dir", default=str(CACHE / "bench" / "newfam"))
    ap.add_argument("--scale", default="full", choices=("full", "small"))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", default="cpu_newfam")
    args = ap.parse_args()
    args.llama = args.llama.split(",")
    bad = [c for c in args.llama if c not in LLAMA_CONFIGS] + [m for m in args.models.split(",") if m not in TITLES]
    if bad:
        sys.exit(f"newfam.py: unknown {', '.join(bad)}")
    if not LLAMA_BENCH.exists():
        sys.exit(f"newfam.py: no {LLAMA_BENCH}: run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine = dict(cpu_info(), mem_total_gb=mem_total_gb(), loadavg_before=loadavg())
    rows = [measure(args, name) for name in args.models.split(",")]
    machine["loadavg_after"] = loadavg()
    build = next((rnd[c].get("build_commit") for r in rows for rnd in r["rounds"] for c in args.llama
                  if rnd.get(c, {}).get("build_commit")), None)
    res = {"benchmark": "cpu_newfam", "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "settings": {"prompt_tokens": args.prompt, "gen_tokens": args.gen, "threads": args.threads,
                        "runs": args.runs, "rounds_big": args.rounds_big or args.runs, "llama_configs": args.llama,
                        "scale": args.scale},
           "machine": machine, "hearth": {"binary": args.hearth, "commit": git_describe()},
           "llamacpp_build": build, "rows": rows}
    text = markdown(res)
    print(text)
    print("wrote", results_file.write(args.out, text, res), file=sys.stderr)


if __name__ == "__main__":
    main()
