"""Speculative decoding against the real mlx_lm.server: both run the tiny qwen3-f32 model with
the tiny qwen3-q8g64 (same tokenizer, other weights, so proposals are both accepted and
rejected) as `--draft-model`, and get the same greedy requests, chat and text, with the
request's `num_draft_tokens` absent (the `--num-draft-tokens` default) or set; the answers'
text, finish reason and usage must match (the output of speculative decoding is the model's
own). hearth runs its reference kernels (HEARTH_CPU=scalar), as the other differential
tests. Also: hearth's /stats counts the draft's proposals, and a draft model with another
tokenizer is refused at start with a message naming it. A hybrid (Qwen3.5) draft model answers
as mlx_lm.server's target alone does, and so does a Qwen3.5 proposing with its own
multi-token-prediction head (`--speculate mtp`), alone and concurrently.

`cached_tokens` is not compared (each server's prompt cache is its own design; see
test_differential.py).
"""

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import BIN, REPO, SMOLLM2, TINY, need, server, upstream_server

MODEL = TINY / "qwen3-f32"
DRAFT = TINY / "qwen3-q8g64"


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def servers():
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(DRAFT, "tiny model", "run tools/make_tiny_models.py")
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    flags = ("--draft-model", DRAFT, "--num-draft-tokens", "3")
    with upstream_server(MODEL, *flags) as up, server(MODEL, *flags, env={"HEARTH_CPU": "scalar"}) as hz:
        yield up, hz


CASES = [
    ("/v1/completions", {"prompt": "one two three one two three one two", "max_tokens": 24}),
    ("/v1/completions", {"prompt": "the cat sat on the mat", "max_tokens": 30, "num_draft_tokens": 2}),
    ("/v1/completions", {"prompt": "a b c d a b c d a", "max_tokens": 16, "num_draft_tokens": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "repeat after me: red green blue"}],
                              "max_tokens": 28}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20,
                              "num_draft_tokens": 5}),
]


@pytest.mark.parametrize("path,body", CASES)
def test_same_answer_as_mlx_lm_with_draft(servers, path, body):
    up, hz = servers
    body = dict(body, temperature=0)
    a, b = post(up, path, body), post(hz, path, body)
    ca, cb = a["choices"][0], b["choices"][0]
    key = "text" if path == "/v1/completions" else "message"
    assert cb[key] == ca[key], (ca, cb)
    assert cb["finish_reason"] == ca["finish_reason"]
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert b["usage"][k] == a["usage"][k], (k, a["usage"], b["usage"])


def spec_stats_after(base, max_tokens):
    """/stats' speculative counters after one greedy completion"""
    post(base, "/v1/completions", {"prompt": "x y z x y z x y", "max_tokens": max_tokens, "temperature": 0})
    with urllib.request.urlopen(base + "/stats", timeout=10) as r:
        return json.load(r)["speculative"]


def test_stats_count_the_drafts(servers):
    spec = spec_stats_after(servers[1], 12)
    assert spec["draft"]["proposed_tokens"] > 0
    assert 0 < spec["draft"]["accepted_tokens"] <= spec["draft"]["proposed_tokens"]
    assert spec["lookup"]["proposed_tokens"] == 0  # the draft model replaces prompt lookup


def test_draft_with_another_tokenizer_is_refused():
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(SMOLLM2, "default model", "run tools/get_models.sh")
    r = subprocess.run([str(BIN), "serve", "--model", str(MODEL), "--draft-model", str(SMOLLM2), "--port", "0",
                        "--no-open"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--draft-model" in r.stderr and "tokenizer" in r.stderr, r.stderr


def test_bench_prompt_file_with_draft(tmp_path):
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(DRAFT, "tiny model", "run tools/make_tiny_models.py")
    f = tmp_path / "prompt.txt"
    f.write_text("one two three one two three one two three one two")
    r = subprocess.run([str(BIN), "bench", str(MODEL), "--prompt-file", str(f), "--draft-model", str(DRAFT),
                        "-n", "24", "-r", "2", "-t", "1", "--json"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HEARTH_CPU": "scalar"})
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    assert o["proposer"] == "draft" and o["gen_tokens"] == 24 and o["runs"] == 2
    assert o["none_decode_tps"] > 0 and o["spec_decode_tps"] > 0
    assert 0 < o["last_run_accepted"] <= o["last_run_proposed"]
    bad = subprocess.run([str(BIN), "bench", str(MODEL), "--draft-model", str(DRAFT)], capture_output=True, text=True)
    assert bad.returncode == 2 and "--prompt-file" in bad.stderr


# ---- a hybrid (Qwen3.5) draft model: its recurrent state goes back to a backup after a rejection ----

HYBRID, HYBRID_DRAFT = TINY / "qwen3_5-f32", TINY / "qwen3_5-q8g64"


@pytest.fixture(scope="module")
def hybrid_servers():
    """mlx_lm.server runs the hybrid target alone (mlx-lm cannot draft with a recurrent model:
    its cache cannot be trimmed); hearth drafts with another weight format of it."""
    need(HYBRID, "tiny model", "run tools/make_tiny_models.py")
    need(HYBRID_DRAFT, "tiny model", "run tools/make_tiny_models.py")
    with upstream_server(HYBRID) as up, server(HYBRID, "--draft-model", HYBRID_DRAFT, "--num-draft-tokens", "3",
                                                env={"HEARTH_CPU": "scalar"}) as hz:
        yield up, hz


@pytest.mark.parametrize("path,body", CASES)
def test_hybrid_draft_answers_as_mlx_lm(hybrid_servers, path, body):
    up, hz = hybrid_servers
    body = {k: v for k, v in body.items() if k != "num_draft_tokens"} | {"temperature": 0}
    a, b = post(up, path, body), post(hz, path, dict(body, num_draft_tokens=3))
    ca, cb = a["choices"][0], b["choices"][0]
    key = "text" if path == "/v1/completions" else "message"
    assert cb[key] == ca[key], (ca, cb)
    assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]


def test_hybrid_draft_stats(hybrid_servers):
    spec = spec_stats_after(hybrid_servers[1], 24)
    assert spec["draft"]["proposed_tokens"] > 0
    assert 0 < spec["draft"]["accepted_tokens"] < spec["draft"]["proposed_tokens"]  # rejections were put back


# ---- --speculate suffix: the recent outputs' index, against mlx_lm.server without speculation ----

@pytest.fixture(scope="module")
def suffix_servers():
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    with upstream_server(MODEL) as up, server(MODEL, "--speculate", "suffix", env={"HEARTH_CPU": "scalar"}) as hz:
        yield up, hz


def test_suffix_index_answers_as_mlx_lm(suffix_servers):
    """Each request twice, the second after its own answer went into the index (and a
    different prompt in between): every answer as mlx_lm.server gives it, and the index's
    proposals were verified and accepted (/stats and /metrics count them apart from lookup's)."""
    up, hz = suffix_servers
    asks = [("/v1/completions", {"prompt": "the quick brown fox jumps", "max_tokens": 40}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "name three colors"}],
                                      "max_tokens": 40})]
    for path, body in asks + asks:
        want, got = post(up, path, body), post(hz, path, body)
        text = (lambda r: r["choices"][0].get("text") or r["choices"][0]["message"]["content"])
        assert text(got) == text(want), (path, body)
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    with urllib.request.urlopen(hz + "/stats", timeout=30) as r:
        spec = json.load(r)["speculative"]
    assert spec["suffix"]["accepted_tokens"] > 0, spec
    with urllib.request.urlopen(hz + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    line = [x for x in metrics.splitlines() if x.startswith("hearth_spec_suffix_accepted_tokens_total ")]
    assert line and float(line[0].split()[1]) == spec["suffix"]["accepted_tokens"]


def test_unknown_speculate_mode_is_refused():
    p = subprocess.run([BIN, "serve", "--model", str(MODEL), "--speculate", "sufix", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "lookup, suffix, mtp or none" in p.stderr, p.stderr


# ---- --speculate mtp: the model's own multi-token-prediction head (tools/mtp_checkpoint.py) ----

@pytest.fixture(scope="module")
def mtp_servers(tmp_path_factory):
    """A tiny Qwen3.5 in the Hugging Face layout with an MTP head fitted to be often right:
    mlx_lm.server runs it without the head (mlx-lm drops mtp.*), hearth proposes with it."""
    need(HYBRID, "tiny model", "run tools/make_tiny_models.py")
    sys.path.insert(0, str(REPO / "tools"))
    from mtp_checkpoint import make_checkpoint
    d = tmp_path_factory.mktemp("qwen3_5_mtp")
    make_checkpoint(str(d))
    with upstream_server(d) as up, server(d, "--speculate", "mtp", "--num-draft-tokens", "3",
                                          env={"HEARTH_CPU": "scalar"}) as hz:
        yield up, hz


MTP_CASES = [("/v1/completions", {"prompt": "The quick brown fox jumps over the lazy dog, and then",
                                  "max_tokens": 40})] + CASES


@pytest.mark.parametrize("path,body", MTP_CASES)
def test_mtp_answers_as_mlx_lm(mtp_servers, path, body):
    up, hz = mtp_servers
    body = {k: v for k, v in body.items() if k != "num_draft_tokens"} | {"temperature": 0}
    a, b = post(up, path, body), post(hz, path, body)
    ca, cb = a["choices"][0], b["choices"][0]
    key = "text" if path == "/v1/completions" else "message"
    assert cb[key] == ca[key], (ca, cb)
    assert cb["finish_reason"] == ca["finish_reason"]
    assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]


def test_mtp_concurrent_and_counted(mtp_servers):
    """Requests proposing together in one batch answer as each does alone, and /stats counts the
    head's proposals under "mtp" (fitted to one prompt's text, it is right there and rarely
    elsewhere)."""
    up, hz = mtp_servers
    bodies = [(p, {k: v for k, v in b.items() if k != "num_draft_tokens"} | {"temperature": 0}) for p, b in MTP_CASES]
    alone = [post(up, p, b) for p, b in bodies]
    with ThreadPoolExecutor(len(bodies)) as ex:
        together = list(ex.map(lambda pb: post(hz, *pb), bodies))
    for (p, _), a, b in zip(bodies, alone, together):
        key = "text" if p == "/v1/completions" else "message"
        assert b["choices"][0][key] == a["choices"][0][key]
    with urllib.request.urlopen(hz + "/stats", timeout=10) as r:
        spec = json.load(r)["speculative"]
    assert spec["mtp"]["proposed_tokens"] > 0
    assert 0 < spec["mtp"]["accepted_tokens"] < spec["mtp"]["proposed_tokens"], spec
    assert spec["lookup"]["proposed_tokens"] == 0
