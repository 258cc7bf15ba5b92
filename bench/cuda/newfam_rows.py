#!/usr/bin/env python3
"""newfam_rows.py: the rows of tools/gpu_run.d/newfam-bench.sh (issue 33's speed table on the
new families) from the JSON files the phase leaves in its log folder, and the result file.

  newfam_rows.py row LOGDIR MODEL FORMAT [--tflops TF]   prints the row, appends it to LOGDIR/rows.jsonl
  newfam_rows.py write LOGDIR OUT.md --machine LINE [--command CMD] [--load L]

Per (model, format) the phase leaves LOGDIR/<model>-<format>.{decode,prefill}.{json,log}
(hearth bench --json and its stderr) and, per model with a GGUF form,
LOGDIR/llama-<model>.{decode,prefill}.json (llama-bench -o json: decode of 128 tokens after 512,
prefill of 4096). Decode roofline fraction: hearth bench's own (weights as stored, a token's
experts only, plus KV at the mean context, over the device's copy bandwidth); llama.cpp's is
its rate over the same roofline (same GGUF; for an MLX row, the GGUF's). Prefill fraction:
FLOPs of the 4096 tokens (2 x the matmul weights a token multiplies, its experts only, plus
causal softmax attention; the Gated DeltaNet recurrence not counted) over the bf16 GEMM rate
measured in the same call (bench/cuda/roofline.py). A model hearth refuses gets the row
"refused: <its message>" ("timed out: ..." or "crashed (signal N): ..." when that is what
happened). Standard library and numpy only (tools/gpu_models.py).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import gpu_models  # noqa: E402
import results_file  # noqa: E402


def last_json(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().strip().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def failure(base):
    """Why base.json has no result: 'refused: <the last line hearth wrote to stderr>', or a
    timeout or crash by its exit status (base.rc, written by the phase)."""
    try:
        with open(base + ".log") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        lines = []
    msg = lines[-1] if lines else "no output"
    msg = msg[len("hearth: "):] if msg.startswith("hearth: ") else msg
    try:
        with open(base + ".rc") as f:
            rc = int(f.read().strip())
    except (OSError, ValueError):
        rc = None
    if rc == 124:
        return "timed out: " + msg
    if rc is not None and rc > 128:
        return f"crashed (signal {rc - 128}): " + msg
    if rc == 0:
        return "no result: " + msg
    return "refused: " + msg


def llama_rate(path, kind):
    """tok/s of llama-bench's decode (n_gen) or prefill (n_prompt) row."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        return None
    for r in rows:
        if (kind == "decode" and r.get("n_gen")) or (kind == "prefill" and r.get("n_prompt") and not r.get("n_gen")):
            return r.get("avg_ts")
    return None


def prefill_flops(model, scale, T):
    s = gpu_models.stats(model, scale)
    f = 2.0 * s["active_matmul_params"] * T
    for heads, hd, window in s["attention_layers"]:
        # causal: query t sees min(t + 1, window) keys; QK^T and PV, 2 FLOPs per multiply-add
        keys = sum(min(t + 1, window) if window else t + 1 for t in range(T))
        f += 4.0 * heads * hd * keys
    return f


def row(logdir, model, fmt, tflops=None):
    base = os.path.join(logdir, f"{model}-{fmt}")
    dec, pre = last_json(base + ".decode.json"), last_json(base + ".prefill.json")
    r = {"model": model, "format": fmt}
    lp = os.path.join(logdir, f"llama-{model}")
    r["llama_decode_tps"], r["llama_prefill_tps"] = llama_rate(lp + ".decode.json", "decode"), \
        llama_rate(lp + ".prefill.json", "prefill")
    if dec is None and pre is None:  # the llama.cpp numbers stay (Gemma 4's GGUF: only llama.cpp reads it)
        r["status"] = failure(base + ".decode")
        return r
    r["status"] = "ok"
    if dec:
        r.update(decode_tps=dec["decode_tps"], gen_tokens=dec["gen_tokens"], runs=dec["runs"], roofline_fraction=dec["roofline_fraction"],
                 roofline_tps=dec["roofline_tps"], decode_bytes_per_token=dec["decode_bytes_per_token"],
                 bandwidth_gbs=dec["bandwidth_gbs"], decode_context=dec["prompt_tokens"], device=dec["device"],
                 load_s=dec.get("load_s"))  # the engine's load (hearth bench's load_s; absent before 877b453)
        if r["llama_decode_tps"]:
            r["decode_ratio"] = dec["decode_tps"] / r["llama_decode_tps"]
            r["llama_roofline_fraction"] = r["llama_decode_tps"] / dec["roofline_tps"] if dec["roofline_tps"] else None
    else:
        r["decode_status"] = failure(base + ".decode")
    if pre:
        T = pre["prompt_tokens"]
        r.update(prefill_tps=pre["prefill_tps"], prefill_tokens=T)
        if tflops:
            scale = "small" if os.environ.get("NF_SCALE") == "small" else "full"
            r["prefill_flops"] = prefill_flops(model, scale, T)
            r["prefill_gemm_fraction"] = r["prefill_flops"] / (T / pre["prefill_tps"]) / (tflops * 1e12)
            r["bf16_gemm_tflops"] = tflops
        if r["llama_prefill_tps"]:
            r["prefill_ratio"] = pre["prefill_tps"] / r["llama_prefill_tps"]
    else:
        r["prefill_status"] = failure(base + ".prefill")
    return r


def fmt_num(v, spec, missing="-"):
    return spec % v if isinstance(v, (int, float)) else missing


def line(r):
    if r["status"] != "ok":
        r = dict(r, decode_status=r["status"], prefill_status="-")
    return "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["model"], r["format"], fmt_num(r.get("decode_tps"), "%.1f", r.get("decode_status", "-")), fmt_num(r.get("llama_decode_tps"), "%.1f"),
        fmt_num(r.get("decode_ratio"), "%.2f"), fmt_num(r.get("roofline_fraction"), "%.2f"),
        fmt_num(r.get("llama_roofline_fraction"), "%.2f"),
        fmt_num(r.get("prefill_tps"), "%.0f", r.get("prefill_status", "-")),
        fmt_num(r.get("llama_prefill_tps"), "%.0f"), fmt_num(r.get("prefill_ratio"), "%.2f"),
        fmt_num(r.get("prefill_gemm_fraction"), "%.2f"), fmt_num(r.get("load_s"), "%.1f"))


HEADER = ("| model | format | hearth decode tok/s | llama.cpp decode tok/s | ratio | hearth roofline | "
          "llama.cpp roofline | hearth prefill tok/s | llama.cpp prefill tok/s | ratio | prefill of bf16 GEMM | hearth load s |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def write(logdir, out, machine, command=None, load=None):
    rows = []
    try:
        with open(os.path.join(logdir, "rows.jsonl")) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except OSError:
        pass
    ok = next((r for r in rows if r.get("decode_tps") and r.get("prefill_tokens")), {})
    n, c, p = ok.get("gen_tokens", 128), ok.get("decode_context", 512), ok.get("prefill_tokens", 4096)
    device = ok.get("device", "cuda")
    where = "flash attention, all layers on the GPU" if device == "cuda" else "on the CPU (a dry run)"
    body = [f"# New families, {device}: batch-1 decode and prefill-{p} against llama.cpp (issue 33)", "",
            "Random weights with the real shapes (`tools/gpu_models.py`): MLX affine 4-bit (group 64, routers "
            f"8-bit) and Q4_K_M-structured GGUF. Decode: {n} tokens after a {c}-token prompt (llama-bench "
            f"`-n {n} -d {c}`); prefill: {p} tokens (`-p {p}`); hearth median of {ok.get('runs', 3)} runs, "
            f"llama-bench mean of 2; {where}. The llama.cpp columns of an MLX row are the same model's "
            "GGUF (llama.cpp reads no MLX). Roofline: hearth bench's bytes per token "
            "(weights as stored, only a token's experts, KV at the mean context) over the device's copy "
            "bandwidth; prefill: its FLOPs (2 x active matmul weights + causal attention; the Gated DeltaNet "
            "recurrence not counted) over the bf16 GEMM rate of the same call. Load: the decode run's engine "
            "creation (weights read and uploaded in their device layouts). Targets: decode 1.5x llama.cpp "
            "and 0.70 of the roofline, prefill 0.55 of the bf16 GEMM rate.", "", HEADER]
    body += [line(r) for r in rows]
    data = {"rows": rows, "targets": {"decode_vs_llama_cpp": 1.5, "decode_roofline": 0.70, "prefill_of_gemm": 0.55}}
    return results_file.write(out, "\n".join(body) + "\n", data, command=command, machine_line=machine, load=load)


def main(argv):
    if len(argv) >= 4 and argv[0] == "row":
        tf = float(argv[argv.index("--tflops") + 1]) if "--tflops" in argv else None
        r = row(argv[1], argv[2], argv[3], tf)
        with open(os.path.join(argv[1], "rows.jsonl"), "a") as f:
            f.write(json.dumps(r) + "\n")
        print(line(r))
    elif len(argv) >= 3 and argv[0] == "write":
        opt = lambda k: argv[argv.index(k) + 1] if k in argv else None  # noqa: E731
        print(write(argv[1], argv[2], opt("--machine"), opt("--command"), opt("--load")))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
