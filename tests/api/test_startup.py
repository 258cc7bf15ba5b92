"""Start-up, the default context and what `hearth fit` promises about a server.

- `hearth --no-open` (the appliance, default model) answers /health within a second and
  holds the model, not its KV pool: the pool is reserved, not touched (the kernel's VmRSS of
  the process is the oracle, against the model file's size).
- With no --ctx a server takes the model's own context limit (config.json's
  max_position_embeddings is the oracle) and answers a prompt longer than 8192 tokens (its
  length counted by the model's HF tokenizer).
- `hearth fit` with serve's flags predicts the server's /stats peak (the kernel's VmHWM)
  within 2%: at start (the pool untouched) and once requests have written every block and
  a constrained request (response_format json_schema) has made the server build its grammar
  tables for the vocabulary (jsonschema checks the answer).
- `hearth fit` reads this machine's bandwidth from the evals database (a bench row written
  with `hearth evals add`), else probes once and records it; `bench --json` reports the
  thread count it ran with (os.cpu_count() when not told).
"""
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from conftest import BIN, SMOLLM2, TINY, server
from hearth_process import free_port, running

TOLERANCE = 0.02  # tests/parity/test_fit.py's contract, docs/cli.md (hearth fit)


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def status_kb(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


def pid_of(port):
    """The hearth process listening on port: the one whose command line names it."""
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "exe").resolve() == BIN.resolve() and \
                    str(port).encode() in (d / "cmdline").read_bytes().split(b"\0"):
                return int(d.name)
        except OSError:
            pass
    raise AssertionError(f"no hearth process on port {port}")


def fit(*args, env=None):
    p = subprocess.run([str(BIN), "fit", *map(str, args), "--json"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def cpu_seconds(pid):
    """User + system CPU time of a process (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_appliance_answers_health_fast_and_holds_the_model_only(smollm2):
    """Before the pool was reserved untouched: 2.5-10.9 s to /health and 3.2 GB resident for
    a 92 MB model (issue 30), 94% of it the kernel zeroing the pool. The first start probes
    the bandwidth (recorded); the second is the one measured. The CPU time the process
    spent until /health answered is the bound (under a second): unlike the wall time it
    does not grow with what else the machine runs (2-core test machines shared with
    builds saw 1-2.4 s wall for 0.2 s of CPU)."""
    for attempt in range(2):
        port = free_port()
        cmd = [str(BIN), "--no-open", "--port", str(port), "--threads", "1"]
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        with open(f"/tmp/hearth-startup-{port}.log", "w+b") as log:
            t0 = time.monotonic()
            with running(cmd, port, log, env, 60, what="hearth --no-open") as base:
                elapsed = time.monotonic() - t0
                pid = pid_of(port)
                cpu = cpu_seconds(pid)
                rss = status_kb(pid, "VmRSS")
                stats = get(base, "/stats")
    assert cpu < 1.0, f"{cpu:.2f} s of CPU until /health ({elapsed:.2f} s wall)"
    model_bytes = smollm2.stat().st_size
    # the model (weights copied once) plus the runtime; the default pool (8 x 8192 positions,
    # about 2.9 GiB for this model) is not resident. The runtime is ~25 MiB, in a build with
    # the CUDA backend too as long as the process runs on the CPU: cuBLAS (whose libcublasLt
    # relocates about 95 MiB of its data and maps 60 MiB of code when loaded) is opened only
    # when a CUDA engine is made (a process on a GPU is allowed 256 MiB for its context).
    runtime = (256 if stats.get("peak_bytes_of") == "device" else 64) << 20
    assert rss < model_bytes + runtime, f"VmRSS {rss} for a {model_bytes}-byte model"
    assert stats["context_length"] == 8192 and stats["context_source"] == "the model's own limit"


def test_default_context_is_the_models_own_and_long_prompts_are_answered():
    from transformers import AutoTokenizer

    model = TINY / "llama-f32"
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["max_position_embeddings"] > 8192
    tok = AutoTokenizer.from_pretrained(str(model))
    # just over 8192 tokens (the old fixed default): attention's cost grows with the square
    # of the prompt, and 34,000 tokens took 7 minutes on a loaded 2-core machine
    prompt = " ".join(["river stone light"] * 840)
    n = len(tok(prompt)["input_ids"])
    assert 8192 < n < 9000, n
    with server(model, "--max-tokens", "4", ready_timeout=120) as base:
        stats = get(base, "/stats")
        assert stats["context_length"] == cfg["max_position_embeddings"]
        assert stats["context_source"] == "the model's own limit"
        r = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert r["usage"]["prompt_tokens"] == n
        assert r["usage"]["completion_tokens"] >= 1


def test_fit_predicts_the_servers_peak_at_start_and_full(smollm2):
    flags = ["--ctx", "256", "--max-sequences", "2", "--threads", "1"]
    predicted = fit(smollm2, *flags)
    assert predicted["max_sequences"] == 2 and predicted["context_length"] == 256
    assert predicted["kv_blocks"] == 2 * 256 // 16
    with server(smollm2, *flags[:4]) as base:  # the fixture adds --threads 1
        # at start: the high-water mark (the load's worst moment or the engine, whichever is
        # larger) and the resident size both, the pool untouched
        rss = status_kb(pid_of(int(base.rsplit(":", 1)[1])), "VmRSS")
        start_peak = get(base, "/stats")["peak_bytes"]
        for measured in (rss, start_peak):
            assert abs(predicted["predicted_start_bytes"] - measured) <= TOLERANCE * measured, (predicted, measured)
        # two prompts of distinct text, each writing all 16 blocks of one sequence (more than
        # 240 prompt positions: the 16th block is written; the generated token's is not):
        # every block of the pool
        for word in ("the", "a"):
            r = post(base, "/v1/completions", {"prompt": " ".join([word] * 250), "max_tokens": 1, "temperature": 0})
            assert 241 <= r["usage"]["prompt_tokens"] <= 255, r["usage"]
        # /stats holds the numbers the engine thread publishes after each step, and the step's
        # answer can reach us first (seen on main: free 16, cached 16 right after the second
        # request, about one run in five): wait for the publication
        deadline = time.monotonic() + 10
        while (stats := get(base, "/stats"))["kv_blocks"]["free"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats["kv_blocks"]["total"] == predicted["kv_blocks"] and stats["kv_blocks"]["free"] == 0, stats
        # the first constrained request builds the vocabulary's grammar tables (fit's
        # grammar_bytes: in the peak, not at start), with every block already resident
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                  "additionalProperties": False}
        r = post(base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Give a number as JSON."}], "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
        answer = r["choices"][0]["message"]["content"]
        if r["choices"][0]["finish_reason"] == "stop":
            jsonschema.validate(json.loads(answer), schema)
        full = get(base, "/stats")["peak_bytes"]
    err = (predicted["predicted_peak_bytes"] - full) / full
    assert abs(err) <= TOLERANCE, (predicted["predicted_peak_bytes"], full, err)
    assert predicted["grammar_bytes"] > 0 and predicted["predicted_start_bytes"] < predicted["predicted_peak_bytes"]


def test_fit_uses_the_recorded_bandwidth(smollm2, tmp_path):
    env = dict(os.environ, HEARTH_CACHE=str(tmp_path))
    first = fit(smollm2, "--ctx", "256", env=env)
    assert first["bandwidth_source"].startswith("probe now"), first["bandwidth_source"]
    again = fit(smollm2, "--ctx", "256", env=env)  # the recorded probe, not a new one
    assert again["bandwidth_gbs"] == first["bandwidth_gbs"] and again["bandwidth_source"].startswith("probe 2")
    add = subprocess.run([str(BIN), "evals", "add", "--kind", "bench", "--model", str(smollm2), "--details",
                          json.dumps({"device": "cpu", "bandwidth_gbs": 42.5})], capture_output=True, text=True,
                         env=env, timeout=60)
    assert add.returncode == 0, add.stderr
    benched = fit(smollm2, "--ctx", "256", env=env)
    assert benched["bandwidth_gbs"] == 42.5 and benched["bandwidth_source"].startswith("hearth bench")
    assert benched["decode_tok_s"] == pytest.approx(42.5e9 / benched["decode_bytes_per_token"], rel=1e-8)


def test_bench_reports_its_thread_count():
    model = TINY / "llama-f32"
    for flags, threads in (([], os.cpu_count()), (["-t", "1"], 1)):
        p = subprocess.run([str(BIN), "bench", str(model), "-p", "8", "-n", "2", "-r", "1", "--json", *flags],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.splitlines()[-1])["threads"] == threads


def appliance_log(tmp_path, *flags, env_extra=None):
    """Starts `hearth --no-open <flags>` against a catalogue of one small absent model
    (HEARTH_DATA), waits for /health, and returns (its stderr, GET /downloads)."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    repo_data = Path(__file__).resolve().parent.parent.parent / "data"
    for f in repo_data.glob("*.json"):
        (data / f.name).write_text(f.read_text())
    cat = json.loads((repo_data / "catalogue.json").read_text())
    cat["models"] = [{"family": "llama", "name": "Absent Test Model", "params_b": 0.1, "format": "gguf",
                      "hub_id": "hearth-test/absent-model", "approx_bytes": 100000000}]
    (data / "catalogue.json").write_text(json.dumps(cat))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "HF_HUB_OFFLINE")}
    # a hub that refuses connections: a download that starts fails at once, offline
    env.update(HEARTH_DATA=str(data), HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
               **(env_extra or {}))
    log_path = tmp_path / f"appliance-{port}.log"
    with open(log_path, "w+b") as log:
        with running([str(BIN), "--no-open", "--port", str(port), "--threads", "1", *flags], port, log, env, 60,
                     what="hearth --no-open") as base:
            downloads = get(base, "/downloads")
    return log_path.read_text(), downloads


def test_appliance_says_what_it_downloads_and_no_download_skips_it(smollm2, tmp_path):
    log, downloads = appliance_log(tmp_path, "--no-download", env_extra={"HEARTH_AUTO_PULL": "1"})
    assert "Absent Test Model would fit this machine better (about 0.1 GB): hearth pull hearth-test/absent-model" in log
    assert "downloading" not in log and "hearth-test/absent-model" not in json.dumps(downloads)
    machine = re.findall(r"this machine: .*, ([0-9.]+) GB/s read", log)
    log2, downloads2 = appliance_log(tmp_path, env_extra={"HEARTH_AUTO_PULL": "1"})
    said = [line for line in log2.splitlines() if "downloading hearth-test/absent-model (about 0.1 GB)" in line]
    assert said, log2
    assert "hearth-test/absent-model" in json.dumps(downloads2)  # and it did start
    # the same bandwidth both times: the recorded one, not a new probe
    assert machine and machine == re.findall(r"this machine: .*, ([0-9.]+) GB/s read \((?:probe|hearth bench) 2", log2)
