"""The training view's API (serve --train-dir): GET /v1/train/runs lists the hearth train
runs under the folder, newest first, with their latest numbers, and GET /v1/train/runs/{id}
returns a run's metrics.jsonl records from ?from=N on. The oracle is the files themselves,
read here with Python's json: one real `hearth train` run on a tiny model, and hand-written
files for a run still going (a bad line, a half-written last line) and a failed one. Bad
ids and parameters get OpenAI-style 4xx errors; nothing outside the folder is read."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import BIN, TINY, need, server


def get(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def records(path):
    """The file's complete lines that are JSON objects (the view skips the others)."""
    out = []
    for line in open(path):
        if not line.endswith("\n"):
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def rec(step, loss, iters=20, elapsed=1.0):
    return {"step": step, "loss": loss, "learning_rate": 1e-4, "iterations_per_second": 2.0,
            "tokens_per_second": 100.5, "trained_tokens": 64 * step, "peak_memory_gb": 0.25, "iters": iters,
            "elapsed": elapsed}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    model = need(TINY / "llama-f32", "tiny models", "run tools/make_tiny_models.py (make test makes them)")
    data = root.parent / "data"
    data.mkdir(exist_ok=True)
    for name, n in (("train", 16), ("valid", 4)):
        with open(data / f"{name}.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": f"Sample {i}: the quick brown fox jumps over the lazy dog {i % 5}."}) + "\n")
    p = subprocess.run([str(BIN), "train", str(model), "--data", str(data), "--iters", "6", "--batch-size", "2",
                        "--num-layers", "1", "--steps-per-report", "2", "--steps-per-eval", "3",
                        "--adapter-path", str(root / "real"), "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (root / "live").mkdir()
    with open(root / "live" / "metrics.jsonl", "w") as f:
        for step in (2, 4):
            f.write(json.dumps(rec(step, 3.0 - step / 10)) + "\n")
        f.write("not json at all\n")
        f.write(json.dumps({"step": 5, "val_loss": 2.5, "val_time": 0.1, "iters": 20, "elapsed": 2.0}) + "\n")
        f.write('{"step": 6, "loss": 2.')  # the writer is mid-line
    (root / "failed").mkdir()
    with open(root / "failed" / "metrics.jsonl", "w") as f:
        f.write(json.dumps(rec(10, 1.5, iters=10)) + "\n")
        f.write(json.dumps({"done": True, "step": 10, "iters": 10, "elapsed": 3.0, "trained_tokens": 640,
                            "peak_memory_gb": 0.3, "error": "adapters.safetensors: disk full"}) + "\n")
    (root / "not-a-run").mkdir()  # no metrics.jsonl: not listed
    now = time.time()  # newest first: live, then real, then failed
    os.utime(root / "failed" / "metrics.jsonl", (now - 300, now - 300))
    os.utime(root / "real" / "metrics.jsonl", (now - 200, now - 200))
    os.utime(root / "live" / "metrics.jsonl", (now - 100, now - 100))
    with server(model, "--train-dir", root) as base:
        yield base, root


def test_runs_list_their_latest_numbers(runs):
    base, root = runs
    status, body = get(base, "/v1/train/runs")
    assert status == 200 and body["object"] == "list" and body["train_dir"] == str(root)
    assert [r["id"] for r in body["data"]] == ["live", "real", "failed"]
    by = {r["id"]: r for r in body["data"]}
    real = records(root / "real" / "metrics.jsonl")
    train = [r for r in real if "loss" in r]
    val = [r for r in real if "val_loss" in r]
    final = real[-1]
    assert final["done"] is True and "error" not in final
    r = by["real"]
    assert r["status"] == "done" and r["records"] == len(real) and r["skipped_lines"] == 0
    assert r["step"] == final["step"] == 6 and r["iters"] == 6
    assert r["loss"] == train[-1]["loss"] and r["val_loss"] == val[-1]["val_loss"]
    assert r["tokens_per_second"] == train[-1]["tokens_per_second"]
    assert r["peak_memory_gb"] == final["peak_memory_gb"]
    assert r["bytes"] == os.path.getsize(root / "real" / "metrics.jsonl")
    live = by["live"]  # the half-written line is not read yet; the bad one is counted
    assert live["status"] == "running" and live["records"] == 3 and live["skipped_lines"] == 1
    assert live["step"] == 5 and live["loss"] == 2.6 and live["val_loss"] == 2.5
    failed = by["failed"]
    assert failed["status"] == "failed" and failed["error"] == "adapters.safetensors: disk full"


def test_records_as_written_and_from(runs):
    base, root = runs
    want = records(root / "real" / "metrics.jsonl")
    status, body = get(base, "/v1/train/runs/real")
    assert status == 200 and body["records"] == want and body["next"] == len(want) and not body["restarted"]
    status, body = get(base, "/v1/train/runs/real?from=2")
    assert status == 200 and body["records"] == want[2:] and body["next"] == len(want)
    status, body = get(base, f"/v1/train/runs/real?from={len(want)}")
    assert status == 200 and body["records"] == [] and body["next"] == len(want)
    # more than the file holds: a new run rewrote it, so all of it comes again
    status, body = get(base, "/v1/train/runs/real?from=999")
    assert status == 200 and body["restarted"] and body["records"] == want


def test_a_growing_file_is_followed(runs):
    base, root = runs
    path = root / "live" / "metrics.jsonl"
    status, body = get(base, "/v1/train/runs/live")
    assert body["next"] == 3 and body["skipped_lines"] == 1
    with open(path, "a") as f:  # the writer finishes its line and the run ends
        f.write('5, "iters": 20, "elapsed": 3.0}\n')
        f.write(json.dumps({"done": True, "step": 6, "iters": 20, "elapsed": 3.1, "trained_tokens": 384,
                            "peak_memory_gb": 0.25}) + "\n")
    status, body = get(base, "/v1/train/runs/live?from=3")
    assert status == 200 and body["next"] == 5
    assert body["records"] == [{"step": 6, "loss": 2.5, "iters": 20, "elapsed": 3.0}, records(path)[-1]]
    status, body = get(base, "/v1/train/runs")
    assert {r["id"]: r["status"] for r in body["data"]}["live"] == "done"


@pytest.mark.parametrize("path,status,param", [
    ("/v1/train/runs/nope", 404, "id"),
    ("/v1/train/runs/not-a-run", 404, "id"),
    ("/v1/train/runs/..", 404, "id"),
    ("/v1/train/runs/real/../live", 404, "id"),
    ("/v1/train/runs/", 404, "id"),
    ("/v1/train/runs/real?from=-1", 400, "from"),
    ("/v1/train/runs/real?from=abc", 400, "from"),
])
def test_bad_requests(runs, path, status, param):
    base, _ = runs
    got, body = get(base, path)
    assert got == status, body
    assert body["error"]["param"] == param and body["error"]["message"]


def test_without_a_train_dir_and_with_one_run(tmp_path):
    model = TINY / "llama-f32"
    with server(model) as base:
        status, body = get(base, "/v1/train/runs")
        assert status == 200 and body["train_dir"] is None and body["data"] == []
        status, body = get(base, "/v1/train/runs/x")
        assert status == 404 and body["error"]["code"] == "train_dir_not_set"
    run = tmp_path / "my-run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps(rec(2, 2.0)) + "\n")
    with server(model, "--train-dir", run) as base:  # the folder is itself one run
        status, body = get(base, "/v1/train/runs")
        assert [r["id"] for r in body["data"]] == ["my-run"] and body["data"][0]["loss"] == 2.0
        status, body = get(base, "/v1/train/runs/my-run")
        assert status == 200 and body["records"] == [rec(2, 2.0)]
        status, body = get(base, "/v1/train/runs/other")
        assert status == 404
