"""hearth train-watch: the dashboard of a training run's metrics.jsonl. The oracle is the
file itself, read here with Python's json: --once --json reports the last training and
validation records, the loss history and the final record's totals exactly as written; a
watch without --once follows a file that another process appends to (a half-written last
line waits for its newline), restarts when the file is replaced by a new run, and exits at
the final record; bad input (a missing folder, lines that are no records) gets a message
naming the file and line, never a crash or a hang.
"""
import json
import os
import select
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import BIN, make_data, model_dir  # noqa: E402


def watch(*args, cwd=None, timeout=60):
    return subprocess.run([BIN, "train-watch", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def records(path):
    return [json.loads(line) for line in open(path)]


def test_once_json_equals_the_records(tmp_path):
    model = model_dir("llama-f32")
    data = make_data(str(tmp_path / "data"), "text")
    # the default --adapter-path (adapters, in the working folder) on both sides
    p = subprocess.run([BIN, "train", model, "--data", data, "--iters", "12", "--batch-size", "2", "--num-layers",
                        "2", "--steps-per-report", "3", "--steps-per-eval", "5", "--learning-rate", "1e-3",
                        "--threads", "2"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = records(tmp_path / "adapters" / "metrics.jsonl")
    train = [r for r in recs if "loss" in r]
    val = [r for r in recs if "val_loss" in r]
    final = recs[-1]
    assert final["done"] is True and final["step"] == 12 and final["iters"] == 12 and "error" not in final
    assert [r["step"] for r in train] == [3, 6, 9, 12] and [r["step"] for r in val] == [0, 4, 9, 11]

    w = watch("--once", "--json", cwd=tmp_path)
    assert w.returncode == 0, w.stderr
    got = json.loads(w.stdout)
    assert got["status"] == "done" and got["step"] == 12 and got["iters"] == 12 and got["error"] is None
    assert got["file"] == "adapters/metrics.jsonl" and got["skipped_lines"] == 0
    last = train[-1]
    assert got["last_train"] == last and got["last_val"] == val[-1]
    for k in ("loss", "learning_rate", "tokens_per_second", "iterations_per_second"):
        assert got[k] == last[k], k
    assert got["loss_step"] == 12 and got["val_loss"] == val[-1]["val_loss"] and got["val_step"] == 11
    assert got["trained_tokens"] == final["trained_tokens"] and got["peak_memory_gb"] == final["peak_memory_gb"]
    assert got["elapsed"] == final["elapsed"] and got["eta_seconds"] == 0
    assert got["losses"] == [[r["step"], r["loss"]] for r in train]
    assert got["val_losses"] == [[r["step"], r["val_loss"]] for r in val]

    # the folder as an argument, --adapter and the file itself give the same; text names the values
    for args in (["adapters"], ["--adapter", "adapters"], ["adapters/metrics.jsonl"]):
        w2 = watch(*args, "--once", "--json", cwd=tmp_path)
        assert w2.returncode == 0 and {**json.loads(w2.stdout), "file": None} == {**got, "file": None}, args
    t = watch(tmp_path / "adapters", "--once")
    assert t.returncode == 0, t.stderr
    assert "[done]" in t.stdout and "12 / 12" in t.stdout
    assert f"{last['loss']:.4f}" in t.stdout and f"{val[-1]['val_loss']:.4f}" in t.stdout
    assert f"{last['tokens_per_second']:.1f} tok/s" in t.stdout and f"{final['peak_memory_gb']:.3f} GB" in t.stdout
    assert f"over {len(train)} reports" in t.stdout


def rec(step, loss, iters=10, elapsed=None):
    return json.dumps({"step": step, "loss": loss, "learning_rate": 1e-5, "iterations_per_second": 2.0,
                       "tokens_per_second": 100.0 * step, "trained_tokens": 50 * step, "peak_memory_gb": 0.5,
                       "iters": iters, "elapsed": elapsed if elapsed is not None else step / 2.0})


class Lines:
    """A running train-watch --json: its stdout lines as they come."""

    def __init__(self, *args):
        self.p = subprocess.Popen([BIN, "train-watch", *map(str, args), "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def next(self, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            r, _, _ = select.select([self.p.stdout], [], [], 0.1)
            if r:
                line = self.p.stdout.readline()
                assert line, "train-watch ended: " + self.p.stderr.read()
                return json.loads(line)
        raise AssertionError("no update from train-watch")

    def until(self, pred, timeout=10):
        end = time.time() + timeout
        while True:
            got = self.next(max(end - time.time(), 0.1))
            if pred(got):
                return got


def test_follows_a_growing_file(tmp_path):
    d = tmp_path / "run"
    w = Lines(d, "--wait")  # the folder does not exist yet
    try:
        time.sleep(0.5)
        assert w.p.poll() is None  # still waiting
        d.mkdir()
        f = open(d / "metrics.jsonl", "w")
        f.write(rec(2, 3.0) + "\n" + rec(4, 2.5)[:20])  # a second record half written
        f.flush()
        got = w.until(lambda g: g["step"] == 2)
        assert got["status"] == "running" and got["losses"] == [[2, 3.0]] and got["skipped_lines"] == 0
        assert got["eta_seconds"] == pytest.approx(1.0 / 2 * 8)  # elapsed / step * steps left
        f.write(rec(4, 2.5)[20:] + "\n" + json.dumps({"step": 4, "val_loss": 2.75, "val_time": 0.1,
                                                       "iters": 10, "elapsed": 2.1}) + "\n")
        f.flush()
        got = w.until(lambda g: g["val_loss"] is not None)
        assert got["losses"] == [[2, 3.0], [4, 2.5]] and got["val_losses"] == [[4, 2.75]] and got["step"] == 4
        assert got["skipped_lines"] == 0
        f.close()
        # a new run replaces the file (hearth train opens it for writing): the watch starts over
        (tmp_path / "new.jsonl").write_text(rec(1, 9.0, iters=3) + "\n")
        os.replace(tmp_path / "new.jsonl", d / "metrics.jsonl")
        got = w.until(lambda g: g["iters"] == 3)
        assert got["losses"] == [[1, 9.0]] and got["val_losses"] == [] and got["step"] == 1
        with open(d / "metrics.jsonl", "a") as f:
            f.write(rec(3, 8.0, iters=3) + "\n")
            f.write(json.dumps({"done": True, "step": 3, "iters": 3, "elapsed": 1.5, "trained_tokens": 150,
                                "peak_memory_gb": 0.75}) + "\n")
        got = w.until(lambda g: g["status"] != "running")
        assert got["status"] == "done" and got["step"] == 3 and got["peak_memory_gb"] == 0.75
        assert got["trained_tokens"] == 150 and got["eta_seconds"] == 0
        assert w.p.wait(timeout=10) == 0  # the final record ends the watch
    finally:
        if w.p.poll() is None:
            w.p.kill()
            w.p.wait()


def test_bad_input(tmp_path):
    # a folder with no metrics.jsonl: a message naming the file, exit 1, at once
    w = watch(tmp_path / "nowhere")
    assert w.returncode == 1 and f"{tmp_path}/nowhere/metrics.jsonl" in w.stderr and "--wait" in w.stderr
    w = watch("--once", cwd=tmp_path)  # the default folder, adapters
    assert w.returncode == 1 and "adapters/metrics.jsonl" in w.stderr
    # flags
    assert watch("--bogus").returncode == 2
    assert watch("a", "b").returncode == 2
    assert watch("--adapter").returncode == 2
    assert watch("--help").returncode == 0

    # an empty file: a run that has not reported yet
    d = tmp_path / "d"
    d.mkdir()
    (d / "metrics.jsonl").write_text("")
    w = watch(d, "--once", "--json")
    assert w.returncode == 0 and json.loads(w.stdout)["status"] == "running" and json.loads(w.stdout)["step"] == 0

    # lines that are no records are skipped, each named with its line number; a failed run's
    # final record makes the exit status 1
    lines = ["garbage", rec(1, 2.0), "{}", "[1, 2]", '{"step": "x", "loss": 1}', "", '{"loss": 1.0}',
             "\x00\xff{" * 10, rec(2, 1.5),
             json.dumps({"done": True, "step": 2, "iters": 10, "elapsed": 1.0, "trained_tokens": 100,
                         "peak_memory_gb": 0.5, "error": "adapters/adapters.safetensors: write failed"})]
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    w = watch(d, "--once", "--json")
    assert w.returncode == 1
    got = json.loads(w.stdout)
    assert got["skipped_lines"] == 6 and got["losses"] == [[1, 2.0], [2, 1.5]]
    assert got["status"] == "failed" and got["error"] == "adapters/adapters.safetensors: write failed"
    for n in (1, 3, 4, 5, 7, 8):
        assert f"metrics.jsonl:{n}: not a hearth train metrics record" in w.stderr, n
    t = watch(d, "--once")
    assert t.returncode == 1 and "[failed]" in t.stdout and "write failed" in t.stdout and "skipped    6 lines" in t.stdout
    # the same file followed: it ends at once (the final record is there), as --once does
    w = watch(d, "--json", timeout=20)
    assert w.returncode == 1 and json.loads(w.stdout.splitlines()[-1])["status"] == "failed"

    # a line of over 1 MiB without a newline is dropped, the records after it still read
    (d / "metrics.jsonl").write_text("x" * (3 << 20) + "\n" + rec(5, 1.0) + "\n")
    w = watch(d, "--once", "--json")
    got = json.loads(w.stdout)
    assert w.returncode == 0 and got["skipped_lines"] == 1 and got["losses"] == [[5, 1.0]]


def test_a_failed_save_ends_the_file_and_the_watch(tmp_path):
    """hearth train's final record carries the error when the adapter cannot be saved (here
    adapters.safetensors is a folder): the watch reports the run as failed and exits 1."""
    model = model_dir("llama-f32")
    data = make_data(str(tmp_path / "data"), "text")
    out = tmp_path / "ad"
    (out / "adapters.safetensors").mkdir(parents=True)
    p = subprocess.run([BIN, "train", model, "--data", data, "--iters", "3", "--batch-size", "2", "--num-layers", "1",
                        "--steps-per-report", "1", "--adapter-path", str(out), "--threads", "2"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and "adapters.safetensors" in p.stderr
    final = records(out / "metrics.jsonl")[-1]
    assert final["done"] is True and final["step"] == 3 and "adapters.safetensors" in final["error"]
    w = watch(out, "--json", timeout=20)
    got = json.loads(w.stdout.splitlines()[-1])
    assert w.returncode == 1 and got["status"] == "failed" and got["error"] == final["error"]
    assert [s for s, _ in got["losses"]] == [1, 2, 3]


def test_preference_run_shows_its_rewards(tmp_path):
    """A dpo run's reports carry TRL's reward metrics: the JSON's last_train is the record as
    written and the text view shows the reward accuracy and margin."""
    model = model_dir("llama-f32")
    d = tmp_path / "prefs"
    d.mkdir()
    rows = [{"prompt": f"question {i} about cats", "chosen": " the cat sat on a mat", "rejected": " dogs ran"}
            for i in range(4)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "dpo"
    p = subprocess.run([BIN, "train", model, "--data", str(d), "--method", "dpo", "--iters", "4", "--num-layers", "1",
                        "--steps-per-report", "2", "--adapter-path", str(out), "--threads", "2"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    last = [r for r in records(out / "metrics.jsonl") if "loss" in r][-1]
    w = watch(out, "--once", "--json")
    assert w.returncode == 0 and json.loads(w.stdout)["last_train"] == last
    t = watch(out, "--once")
    assert f"accuracy {last['rewards/accuracies']:.3f}  margin {last['rewards/margins']:.4f}" in t.stdout
