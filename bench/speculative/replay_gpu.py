#!/usr/bin/env python3
"""replay_gpu.py: speculative decoding with a draft model at known acceptance (issue 34's GPU
speed table). `hearth bench --spec-accept` runs the draft model as usual (its cost is paid)
and replaces its proposals by the target's own greedy text, each token kept with probability
A, so the acceptance is set, not hoped for; the engine verifies as usual and every
speculative text must equal the one without speculation (the bench checks it per request).
Each row is speculation against no speculation on the same model, in the same process,
runs alternating (A/B, B/A), median of -r runs.

Table 1, one stream: A in --accept x K in --depths; the ideal speedup for (A, K) is the
expected tokens a verification step yields, (1 - A^(K+1)) / (1 - A), and the target is 0.9
of it. Table 2, --streams concurrent streams (same prompt) at one (A, K): targets 1.3x
no-speculation at 32 streams, never below 0.97x at any other count (128 on the H200).

Standard library only (the GPU machine's bare python3). Writes --out (default
bench/results/speculative_gpu.md) through bench/results_file.py.

  python3 bench/speculative/replay_gpu.py HEARTH MODEL DRAFT [--device cuda] [-n 128] [-r 3]
      [--accept 0.6,0.8,0.95] [--depths 2,4,8] [--streams 32,128] [--streams-accept 0.8]
      [--streams-depth 4] [--flags "..."] [--out FILE.md]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import results_file  # noqa: E402

# any text: the models have random weights; about 60 tokens
PROMPT = ("Rewrite the function below so that it returns a list instead of printing, keeping the names:\n\n"
          "def show(items):\n    for i, item in enumerate(items):\n        print(i, item)\n")
TARGET_FRACTION, TARGET_32, TARGET_FLOOR = 0.9, 1.3, 0.97


def bench(args, prompt, batches, depths, accepts, log):
    """One `hearth bench` process (the model and draft load once): its JSON reports and rc."""
    cmd = [args.hearth, "bench", args.model, "--prompt-file", prompt, "--draft-model", args.draft,
           "--device", args.device, "--batch", ",".join(map(str, batches)),
           "--num-draft-tokens", ",".join(map(str, depths)), "--spec-accept", ",".join(map(str, accepts)),
           "-n", str(args.n), "-r", str(args.r), "--json"] + shlex.split(args.flags)
    print("+", " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\nrc {p.returncode}\n{p.stdout}{p.stderr}\n")
    rows = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
    if p.returncode and not rows:
        sys.stderr.write(p.stderr[-2000:])
    return rows, p.returncode, p.stderr.strip().splitlines()[-3:]


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def report(args, one, rc1, tail1, many, rc2, tail2, streams, pending):
    """Writes the result file (the tables so far); returns whether every text was equal."""
    def equal(o):  # the timed texts against the replayed ones, and where those depart from no speculation
        if not o.get("texts_equal"):
            return "**no**"
        if o["requests_departing_from_none"] == 0:
            return "yes"
        return (f"yes; re-recorded {o['rerecorded']}x: {o['requests_departing_from_none']} request(s) depart from "
                f"no speculation, first at token {o['first_departure_from_none']}")

    def measured(o):  # no drafts: nothing proposed (above the backend's limit)
        return f"{o['measured_accept']:.3f}" if o["last_run_drafts"] else "none proposed"

    lines = ["# Speculative decoding on the GPU at known acceptance", "",
             f"Target `{args.model}`, draft `{args.draft}`, `--device {args.device}`"
             f"{' ' + args.flags if args.flags else ''}; one prompt of {one[0]['prompt_tokens'] if one else '?'} "
             f"tokens, {args.n} generated a request, greedy, median of {args.r} runs alternating with no "
             "speculation in the same process. The draft model runs and pays its cost; its proposals are replaced "
             "by the target's recorded greedy text, each token kept with probability A (`hearth bench "
             "--spec-accept`). Ideal: expected tokens a verified step, (1 - A^(K+1)) / (1 - A). Ideal with "
             "draft cost: that over (1 + K x the model's decode time a token / the draft's), a cycle being one "
             "step of the model and K of the draft, each timed alone at the same batch in the same run.", "",
             "## One stream", "",
             "| A | K | none tok/s | speculative tok/s | speedup | measured A | tokens / step | ideal | "
             f"of ideal (target {TARGET_FRACTION}) | met | draft alone tok/s | ideal with draft cost | of it | "
             "text equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for o in one:
        met = o["fraction_of_ideal"] >= TARGET_FRACTION
        verdicts.append(met)
        lines.append(f"| {o['spec_accept']:.2f} | {o['num_draft_tokens']} | {o['none_decode_tps']:.1f} | "
                     f"{o['spec_decode_tps']:.1f} | {o['speedup']:.2f}x | {measured(o)} | "
                     f"{o['tokens_per_step']:.2f} | {o['ideal_speedup']:.2f}x | {o['fraction_of_ideal']:.2f} | "
                     f"{'yes' if met else 'no'} | {o['draft_decode_tps']:.1f} | {o['ideal_with_draft_cost']:.2f}x | "
                     f"{o['fraction_of_ideal_with_draft_cost']:.2f} | {equal(o)} |")
    if rc1 and not one:
        lines.append(f"\nOne-stream runs failed (rc {rc1}): {' / '.join(tail1)}")
    if streams:
        lines += ["", "## Concurrent streams", "",
                  "| streams | A | K | none tok/s | speculative tok/s | speedup | target | met | measured A | "
                  "tokens / step | text equal |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for o in many:
            target = TARGET_32 if o["batch"] == 32 else TARGET_FLOOR
            met = o["speedup"] >= target
            verdicts.append(met)
            lines.append(f"| {o['batch']} | {o['spec_accept']:.2f} | {o['num_draft_tokens']} | "
                         f"{o['none_decode_tps']:.1f} | {o['spec_decode_tps']:.1f} | {o['speedup']:.2f}x | "
                         f">= {target}x | {'yes' if met else 'no'} | {measured(o)} | "
                         f"{o['tokens_per_step']:.2f} | {equal(o)} |")
        if rc2 and not many:
            lines.append(f"\nStream runs failed (rc {rc2}): {' / '.join(tail2)}")
    if pending:
        lines.append("\nConcurrent streams: not run yet (the run was cut short, or is still going).")
    all_equal = all(o.get("texts_equal") for o in one + many)
    departing = sum(1 for o in one + many if o.get("requests_departing_from_none"))
    lines += ["", f"Targets met: {sum(verdicts)} of {len(verdicts)}; every speculative text equal to the text it "
              f"replayed: {'yes' if all_equal and one else 'no'}; rows whose replayed text departs from the text "
              f"without speculation: {departing}.", "",
              "Text equal: each timed speculative run's texts against the replayed recording, request by request. "
              "The recording starts as the text without speculation; where a verified step rounds differently "
              "from a one-token step (cuBLAS above 8 tokens a step) a greedy near-tie can break the other way, and "
              "an untimed speculative run then becomes the recording (re-recorded), until the replay is a fixed "
              "point; the column says where that recording departs from the text without speculation."]
    body = "\n".join(lines) + "\n"
    data = {"model": args.model, "draft": args.draft, "device": args.device, "flags": args.flags, "gen_tokens": args.n,
            "runs": args.r, "one_stream": one, "streams": many, "rc": [rc1, rc2],
            "targets": {"fraction_of_ideal": TARGET_FRACTION, "streams_32": TARGET_32, "floor": TARGET_FLOOR}}
    gpu = gpu_name() if args.device == "cuda" else None
    path = results_file.write(args.out, body, data, machine_line=f"{gpu}, {results_file.machine()}" if gpu else None)
    if not pending:
        print(body)
    print(f"wrote {path}")
    return all_equal


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hearth")
    ap.add_argument("model")
    ap.add_argument("draft")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("-n", type=int, default=128, help="tokens generated a request")
    ap.add_argument("-r", type=int, default=3, help="runs a row (median)")
    ap.add_argument("--accept", default="0.6,0.8,0.95")
    ap.add_argument("--depths", default="2,4,8")
    ap.add_argument("--streams", default="32,128")
    ap.add_argument("--streams-accept", default="0.8")
    ap.add_argument("--streams-depth", default="4")
    ap.add_argument("--flags", default="", help="more hearth bench flags (e.g. --deterministic, -t 2)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default="speculative_gpu", help="a bench/results name or a path")
    ap.add_argument("--log", default=None, help="the hearth bench output (default: beside --out)")
    args = ap.parse_args()
    accepts = [float(a) for a in args.accept.split(",")]
    depths = [int(k) for k in args.depths.split(",")]
    streams = [int(s) for s in args.streams.split(",") if s]
    out_path = results_file.path_of(args.out)
    log = args.log or os.path.splitext(out_path)[0] + ".log"
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    open(log, "w").close()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(PROMPT)
        prompt = f.name
    try:
        one, rc1, tail1 = bench(args, prompt, [1], depths, accepts, log)
        # written now too: a phase cut short by its time budget keeps the one-stream table
        report(args, one, rc1, tail1, [], 0, [], streams, pending=bool(streams))
        many, rc2, tail2 = bench(args, prompt, streams, [int(args.streams_depth)], [float(args.streams_accept)],
                                 log) if streams else ([], 0, [])
    finally:
        os.unlink(prompt)
    all_equal = report(args, one, rc1, tail1, many, rc2, tail2, streams, pending=False)
    return 0 if one and (not streams or many) and all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
