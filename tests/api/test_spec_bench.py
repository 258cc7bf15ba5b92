"""`hearth bench --spec-accept A`: controlled acceptance for the speculative-decoding speed
table. The draft model's proposals are replaced by the target's own greedy text (recorded
by a run without speculation), each token kept with probability A; the engine verifies as
usual, so every speculative run's text must equal the recorded one (the bench fails
otherwise) and the measured acceptance follows A: A = 1 keeps every proposal (K + 1 tokens
a verified step), A = 0 none, and in between the per-token estimate lands near A."""
import json
import os
import subprocess

import pytest

from conftest import BIN, TINY, need

MODEL = TINY / "llama-f32"
DRAFT = TINY / "llama-q8g64"  # the same tokenizer, other weights: its own guesses differ
PROMPT = "def f(x):\n    return x + 1\n\ndef g(y):\n    return y * 2\n"


def bench(tmp_path, *args):
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(DRAFT, "tiny model", "run tools/make_tiny_models.py")
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT)
    return subprocess.run([str(BIN), "bench", str(MODEL), "--prompt-file", str(f), "--draft-model", str(DRAFT),
                           "-t", "1", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HEARTH_CPU": "scalar"})


def report(r):
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    # the exact tier (HEARTH_CPU=scalar): a verified step rounds as a one-token step, so the
    # text without speculation is the replayed one, never re-recorded
    assert o["rerecorded"] == 0 and o["requests_departing_from_none"] == 0, o
    assert o["first_departure_from_none"] == -1, o
    return o


def test_accept_one_keeps_every_proposal(tmp_path):
    o = report(bench(tmp_path, "--spec-accept", "1", "--num-draft-tokens", "4", "-n", "48", "-r", "2", "--json"))
    assert o["texts_equal"] is True
    assert o["last_run_proposed"] > 0 and o["last_run_accepted"] == o["last_run_proposed"]
    assert o["measured_accept"] == 1.0
    assert o["ideal_speedup"] == 5.0
    # only the drafts cut short by max_tokens carry fewer than K = 4
    assert 4.0 < o["tokens_per_step"] <= 5.0


def test_accept_zero_keeps_none(tmp_path):
    o = report(bench(tmp_path, "--spec-accept", "0", "--num-draft-tokens", "3", "-n", "32", "-r", "1", "--json"))
    assert o["texts_equal"] is True
    assert o["last_run_proposed"] > 0 and o["last_run_accepted"] == 0
    assert o["measured_accept"] == 0.0 and o["tokens_per_step"] == 1.0
    assert o["ideal_speedup"] == 1.0


def test_partial_acceptance_in_a_batch(tmp_path):
    a, k = 0.6, 2
    o = report(bench(tmp_path, "--spec-accept", str(a), "--num-draft-tokens", str(k), "--batch", "3", "-n", "64",
                     "-r", "1", "--json"))
    assert o["texts_equal"] is True and o["batch"] == 3
    assert 0 < o["last_run_accepted"] < o["last_run_proposed"]
    # about 100 kept-or-missed trials: the estimate's sd is about 0.05
    assert abs(o["measured_accept"] - a) < 0.2, o
    assert abs(o["ideal_speedup"] - (1 - a ** (k + 1)) / (1 - a)) < 1e-9
    assert abs(o["fraction_of_ideal"] - o["speedup"] / o["ideal_speedup"]) < 1e-9
    # a cycle: one step of the model and K of the draft, each at its own measured rate
    assert o["draft_decode_tps"] > 0
    assert abs(o["ideal_with_draft_cost"] - o["ideal_speedup"] /
               (1 + k * o["none_decode_tps"] / o["draft_decode_tps"])) < 1e-9


def test_text_report(tmp_path):
    r = bench(tmp_path, "--spec-accept", "0.8", "--num-draft-tokens", "2", "-n", "16", "-r", "1")
    assert r.returncode == 0, r.stderr
    assert "ideal       2.44x" in r.stdout and "text        equal to the run without speculation" in r.stdout, r.stdout


def test_bad_spec_accept(tmp_path):
    for args, msg in ((["--spec-accept", "1.5"], "probability"), (["--spec-accept", "x"], "probability"),
                      (["--spec-accept", "0.5", "--num-draft-tokens", "0"], "--num-draft-tokens")):
        r = bench(tmp_path, *args)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("name", ["llama-f32", "qwen3_5-f32"])  # a dense model and a hybrid (state backup + replay)
def test_spec_accept_replaces_lookup_without_draft(tmp_path, name):
    """Without --draft-model, --spec-accept replays the recorded text in prompt lookup's place
    (at lookup's adaptive depth): the text stays the replayed one, and the acceptance is the
    asked one at 1 and 0."""
    model = TINY / name
    need(model, "tiny model", "run tools/make_tiny_models.py")
    f = tmp_path / "prompt.txt"
    f.write_text("the cat sat on the mat and then the dog sat on the log while it rained")
    r = subprocess.run([str(BIN), "bench", str(model), "--prompt-file", str(f), "--spec-accept", "1,0", "-n", "24",
                        "-r", "1", "--num-draft-tokens", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    reports = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [o["spec_accept"] for o in reports] == [1.0, 0.0]
    for o in reports:
        assert o["texts_equal"] is True, o
        assert o["measured_accept"] == o["spec_accept"], o


def test_lists_run_every_combination(tmp_path):
    r = bench(tmp_path, "--spec-accept", "1,0", "--num-draft-tokens", "2,3", "--batch", "1,2", "-n", "24", "-r", "1",
              "--json")
    assert r.returncode == 0, r.stderr
    reports = [json.loads(line) for line in r.stdout.strip().splitlines()]
    got = [(o["batch"], o["num_draft_tokens"], o["spec_accept"]) for o in reports]
    assert got == [(b, k, a) for b in (1, 2) for k in (2, 3) for a in (1.0, 0.0)]
    for o in reports:
        assert o["texts_equal"] is True and o["rerecorded"] == 0
        assert o["measured_accept"] == o["spec_accept"], o
        assert o["ideal_speedup"] == (o["num_draft_tokens"] + 1 if o["spec_accept"] == 1 else 1), o
    bad = subprocess.run([str(BIN), "bench", str(MODEL), "--prompt-file", str(tmp_path / "prompt.txt"), "--draft-model",
                          str(DRAFT), "--num-draft-tokens", "2,3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--spec-accept" in bad.stderr, bad.stderr


def test_gpu_phase_dry_run_on_the_cpu(tmp_path):
    """tools/gpu_run.d/spec-bench.sh's whole path (bench/speculative/replay_gpu.py, the
    results file) with tiny models on the CPU, so the GPU call does not fail on a typo."""
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(DRAFT, "tiny model", "run tools/make_tiny_models.py")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "H": str(BIN), "TINY": str(TINY), "SB_MODEL": str(MODEL), "SB_DRAFT": str(DRAFT),
           "SB_DEVICE": "cpu", "SB_N": "16", "SB_RUNS": "1", "SB_ACCEPT": "0.6,1", "SB_DEPTHS": "2,3",
           "SB_STREAMS": "2,8", "SB_FLAGS": "-t 1", "HEARTH_CPU": "scalar"}
    env.pop("OUT", None)
    r = subprocess.run(["bash", os.path.join(repo, "tools", "gpu_run.d", "spec-bench.sh"), str(tmp_path / "log")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (tmp_path / "log" / "speculative_gpu.md").read_text()
    assert "## One stream" in md and "## Concurrent streams" in md and "## Machine-readable result" in md
    data = json.loads(md.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert [(o["spec_accept"], o["num_draft_tokens"]) for o in data["one_stream"]] == [
        (a, k) for k in (2, 3) for a in (0.6, 1.0)]
    assert [o["batch"] for o in data["streams"]] == [2, 8]
    # the CPU proposes for up to 4 decoding requests: 2 streams speculate, 8 do not
    assert data["streams"][0]["last_run_proposed"] > 0 and data["streams"][1]["last_run_proposed"] == 0
    assert all(o["texts_equal"] for o in data["one_stream"] + data["streams"])
    assert "every speculative text equal to the text it replayed: yes" in md
    assert "rows whose replayed text departs from the text without speculation: 0." in md


def test_fast_kernels_rerecord_at_near_ties(tmp_path):
    """On the SIMD kernels a 9-token verified step (K = 8) sums some rows in another order
    than a one-token step, so a greedy near-tie may break the other way than in the
    recording: the bench then re-records until the replay is a fixed point, and every
    timed speculative text equals what it replayed; where it departs from the text without
    speculation is reported (how often depends on the machine's kernels)."""
    need(TINY / "llama-q4g64", "tiny model", "run tools/make_tiny_models.py")
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT)
    r = subprocess.run([str(BIN), "bench", str(TINY / "llama-q4g64"), "--prompt-file", str(f), "--draft-model",
                        str(DRAFT), "--num-draft-tokens", "8", "--spec-accept", "0.8", "-n", "64", "-r", "1", "-t", "2",
                        "--json"], capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "HEARTH_CPU"})
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    assert o["texts_equal"] is True and 0 <= o["rerecorded"] < 8, o
    assert (o["requests_departing_from_none"] > 0) == (o["first_departure_from_none"] >= 0), o
    assert o["last_run_accepted"] > 0
