"""report.py: turns the raw measurements of run_bench.py into medians, ratios and a markdown table.

It owns the definitions of every reported number (see the markdown's notes); it must not measure
anything itself.
"""

import statistics


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def ms(x):
    return None if x is None else x * 1e3


def _ratio(a, b):
    return a / b if a and b else None


def _http_stats(runs):
    """Medians over every request of a list of measure_http() results, plus the aggregate tokens/s."""
    reqs = [r for run in runs for r in run["requests"]]
    return {
        "requests": len(reqs),
        "ttfb_ms": ms(median([r["ttfb_s"] for r in reqs])),
        "ttft_ms": ms(median([r["ttft_s"] for r in reqs])),
        "ttft_max_ms": ms(max(r["ttft_s"] for r in reqs)),
        "latency_ms": ms(median([r["total_s"] for r in reqs])),
        "latency_max_ms": ms(max(r["total_s"] for r in reqs)),
        "decode_ms_per_token": ms(median([r["decode_s_per_token"] for r in reqs])),
        "gap_median_ms": ms(median([r["gap_median_s"] for r in reqs])),
        "gap_p90_ms": ms(median([r["gap_p90_s"] for r in reqs])),
        "gap_max_ms": ms(max(r["gap_max_s"] for r in reqs)),
        "decode_tps": 1.0 / median([r["decode_s_per_token"] for r in reqs]),
        "e2e_tps_per_request": median([r["e2e_tps"] for r in reqs]),
        "aggregate_tps": median([run["aggregate_tps"] for run in runs]),
    }


def _summarize_overhead(o):
    reps = o["reps"]
    gen = median([r["generate"]["s_per_token"] for r in reps])
    bench = median([r["bench"]["s_per_token"] for r in reps])
    # paired per repetition (engine and HTTP ran back to back), then the median of the differences
    d_gen = [r["http"]["requests"][0]["decode_s_per_token"] - r["generate"]["s_per_token"] for r in reps]
    d_bench = [r["http"]["requests"][0]["decode_s_per_token"] - r["bench"]["s_per_token"] for r in reps]
    s = {
        "engine_bench_ms_per_token": ms(bench),
        "engine_generate_ms_per_token": ms(gen),
        "engine_generate_ttft_ms": ms(median([r["generate"]["ttft_s"] for r in reps])),
        "n1": _http_stats([r["http"] for r in reps]),
        "overhead_vs_generate_ms_per_token": ms(median(d_gen)),
        "overhead_vs_generate_each_rep_ms": [ms(x) for x in d_gen],
        "overhead_vs_bench_ms_per_token": ms(median(d_bench)),
        "overhead_vs_bench_each_rep_ms": [ms(x) for x in d_bench],
        # the spread of the engine alone across repetitions: overheads smaller than this are not resolved
        "engine_generate_range_ms": [ms(min(r["generate"]["s_per_token"] for r in reps)),
                                     ms(max(r["generate"]["s_per_token"] for r in reps))],
    }
    if o.get("n8"):
        n8 = _http_stats(o["n8"])
        n8["overhead_vs_generate_ms_per_token"] = n8["decode_ms_per_token"] - ms(gen)
        s["n8"] = n8
    return s


def summarize(res):
    s = {"overhead": _summarize_overhead(res["overhead"])}
    if "overhead_floor" in res:
        s["overhead_floor"] = _summarize_overhead(res["overhead_floor"])
    if "vs_mlx" in res:
        v = res["vs_mlx"]
        s["vs_mlx"] = {}
        for key in ("n1", "n8"):
            h, m = _http_stats(v[key]["hearth"]), _http_stats(v[key]["mlx_lm"])
            s["vs_mlx"][key] = {
                "hearth": h,
                "mlx_lm": m,
                "ratio_aggregate_tps": _ratio(h["aggregate_tps"], m["aggregate_tps"]),
                # per-stream decode rates with 8 Python client threads on 2 cores measure the client for
                # hearth's tiny-model streams (tokens pile up in the socket), so only N=1 gets this ratio
                "ratio_decode_tps": _ratio(h["decode_tps"], m["decode_tps"]) if key == "n1" else None,
                "ratio_ttft": _ratio(h["ttft_ms"], m["ttft_ms"]),
            }
    return s


def _f(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def _overhead_md(o, so, title):
    lines = [
        f"## {title}: {o['model'].split('/')[-1]}, --threads {o['threads']}, prompt {o['prompt_tokens']} tokens, "
        f"{o['gen_tokens']} greedy tokens (EOS ids {o['banned_ids']} banned with logit_bias), {len(o['reps'])} repetitions",
        "",
        "| path | clients | ms/token (decode) | overhead ms/token vs generate | vs bench | TTFB ms | TTFT ms "
        "| gap median / p90 / max ms | latency ms (median / max) | tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
        f"| `hearth bench` (forward + argmax) | - | {_f(so['engine_bench_ms_per_token'], 3)} | | | | | | | "
        f"{_f(1e3 / so['engine_bench_ms_per_token'], 1)} |",
        f"| `hearth generate` (sampler, detokenize) | - | {_f(so['engine_generate_ms_per_token'], 3)} | | | | "
        f"{_f(so['engine_generate_ttft_ms'], 1)} | | | {_f(1e3 / so['engine_generate_ms_per_token'], 1)} |",
    ]
    for key, label in (("n1", 1), ("n8", 8)):
        if key not in so:
            continue
        h = so[key]
        ov = so["overhead_vs_generate_ms_per_token"] if key == "n1" else h["overhead_vs_generate_ms_per_token"]
        ovb = _f(so["overhead_vs_bench_ms_per_token"], 3) if key == "n1" else ""
        lines.append(
            f"| `hearth serve` HTTP stream | {label} | {_f(h['decode_ms_per_token'], 3)} | **{_f(ov, 3)}** | {ovb} | "
            f"{_f(h['ttfb_ms'], 1)} | {_f(h['ttft_ms'], 1)} (max {_f(h['ttft_max_ms'], 0)}) | {_f(h['gap_median_ms'])} / "
            f"{_f(h['gap_p90_ms'])} / {_f(h['gap_max_ms'], 1)} | {_f(h['latency_ms'], 0)} / {_f(h['latency_max_ms'], 0)} | "
            f"{_f(h['aggregate_tps'], 1)} aggregate |")
    lines += [
        "",
        f"Overhead of each N=1 repetition (HTTP − generate, ms/token): "
        f"{', '.join(_f(x, 3) for x in so['overhead_vs_generate_each_rep_ms'])}; (HTTP − bench): "
        f"{', '.join(_f(x, 3) for x in so['overhead_vs_bench_each_rep_ms'])}. "
        f"`hearth generate` alone ranged {_f(so['engine_generate_range_ms'][0], 3)}..{_f(so['engine_generate_range_ms'][1], 3)} "
        f"ms/token over the repetitions: an overhead smaller than that spread is not resolved by this section. "
        f"Load (1 min) {o['loadavg_before'][0]} -> {o['loadavg_after'][0]}.",
        "",
    ]
    return lines


def markdown(res):
    s, o = res["summary"], res["overhead"]
    lines = ["# hearth serve: per-token overhead and hearth vs mlx_lm.server", ""]
    lines += _overhead_md(o, s["overhead"], "Server overhead on the real model")
    if "overhead_floor" in res:
        lines += _overhead_md(res["overhead_floor"], s["overhead_floor"],
                              "Overhead floor (compute per token ≈ 0.1 ms, so HTTP time ≈ server path)")
    if "vs_mlx" in s:
        v = res["vs_mlx"]
        lines += [
            f"## hearth serve vs mlx_lm.server {res.get('mlx_lm_version', '')}: {v['model'].split('/')[-1]}, "
            f"hearth --threads {res['threads']}, {v['gen_tokens']} greedy tokens, same /v1/completions streaming "
            f"requests, {len(v['n1']['hearth'])} repetitions alternating the servers",
            "",
            "| clients | server | TTFB ms | TTFT ms (median / max) | decode tok/s per stream | end-to-end tok/s per request "
            "| latency ms (median / max) | aggregate tok/s |",
            "|---:|---|---:|---|---:|---:|---|---:|",
        ]
        ratios = []
        for key, label in (("n1", 1), ("n8", 8)):
            sv = s["vs_mlx"][key]
            for name in ("hearth", "mlx_lm"):
                h = sv[name]
                lines.append(
                    f"| {label} | {name} | {_f(h['ttfb_ms'], 1)} | {_f(h['ttft_ms'], 1)} / {_f(h['ttft_max_ms'], 0)} | "
                    f"{_f(h['decode_tps'], 1)} | {_f(h['e2e_tps_per_request'], 1)} | {_f(h['latency_ms'], 0)} / "
                    f"{_f(h['latency_max_ms'], 0)} | {_f(h['aggregate_tps'], 1)} |")
            ratios.append(f"N={label}: aggregate tok/s {_f(sv['ratio_aggregate_tps'])}, decode tok/s "
                          f"{_f(sv['ratio_decode_tps'])}, TTFT {_f(sv['ratio_ttft'])}")
        lines += [
            "",
            "Ratios hearth / mlx_lm (tokens/s above 1: hearth faster; TTFT below 1: hearth faster): "
            + "; ".join(ratios) + ".",
            f"Same greedy text from both servers (first 80 characters): {v['same_text_prefix']}. "
            f"Idle CPU of the servers between requests (CPU-s/s): {v['idle_cpu_s_per_s']}.",
            "",
        ]
    m = res["machine"]
    lines += [
        "## Notes",
        "",
        "- All times are client-side (raw sockets, `time.perf_counter`), from the moment the request is sent. "
        "TTFB: first byte of the response; TTFT: first SSE event carrying text; decode ms/token: "
        "(last − first text event) / (events − 1), or (end − first text event) / (tokens − 1) when some tokens carry no "
        "visible text (the tiny random model emits partial UTF-8); with the tiny model hearth's tokens often arrive "
        "faster than the Python client reads them (gap 0: several events in one recv), so its HTTP numbers are "
        "upper bounds on the server's cost; gap: time between consecutive text events; "
        "latency: until `data: [DONE]`; aggregate tok/s: all completion tokens / (last done − first sent).",
        "- Engine references run back to back with each HTTP repetition while the server idles: "
        "`hearth bench -p P -n N -r 3 --json` (decode_tps, median of 3) and `hearth generate --no-chat-template` "
        "((tokens − 1) / generation seconds, the same definition as the HTTP decode rate). Overhead = HTTP ms/token − "
        "engine ms/token, paired per repetition, median reported.",
        "- hearth serves requests one at a time in arrival order (FIFO, no batching): with N=8 the queue wait shows in "
        "TTFT and latency. mlx_lm.server batches concurrent requests.",
        f"- Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, shared with other workers: /proc/loadavg "
        f"(1/5/15 min) before {' '.join(res['loadavg_before'])}, after {' '.join(res['loadavg_after'])} "
        f"(overhead part {' '.join(o['loadavg_before'])} -> {' '.join(o['loadavg_after'])}"
        + (f"; mlx part {' '.join(res['vs_mlx']['loadavg_before'])} -> {' '.join(res['vs_mlx']['loadavg_after'])}"
           if "vs_mlx" in res else "") + ").",
        f"- Run {res['started']} .. {res['finished']}; hearth `{res['hearth']}`; command: `run_bench.py {res['command']}`.",
        "",
    ]
    return "\n".join(lines)
