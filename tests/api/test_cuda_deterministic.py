"""Deterministic mode on the GPU (`hearth serve --device cuda --deterministic`): one greedy
request with logprobs gives bit-identical tokens and logprobs alone and among 1, 7 and 63
others. The others mix long prompts (prefill chunks of > 8 tokens sharing steps with decode
rows), short ones and seeded sampled ones, so the step's T and composition keep changing:
without the mode, T > 8 goes to cuBLAS and the prefill attention tiles, whose arithmetic
depends on the batch. The oracle is the same request alone on the same server; logprobs are
printed as 17-digit doubles of the float32 values, so equal JSON means equal bits.

The prefix cache on the GPU: a repeated prompt takes all but its last token from the
cache (the rows of its last, partial block copied on the device from the block the first
run left) and a prompt that diverges inside a block copies that block's shared rows; both
must give the bits of an uncached run (the oracle: a fresh server), in float and fp8 KV.

Skipped (with the reason) where no CUDA device exists; tools/gpu_run.d/gpu-kv.sh runs it
on the GPU machine with HEARTH_CACHE pointing at the tiny models' parent folder.
"""
import subprocess

import pytest

from conftest import BIN, TINY, expected_cached, hf_tokenizer, prompt_ids, server
from test_batching import PROMPTS, answer, chat, post, run_alone, run_together

MODELS = ["llama-f32", "qwen3-q4g64"]  # f32 GEMVs; MLX 4-bit GEMVs with QK-norm
TARGET = chat("Explain what a hash table is in one sentence.", 24)


def others(n):
    out = []
    for i in range(n):
        p = PROMPTS[i % len(PROMPTS)]
        if i % 3 == 0:
            p = (p + " ") * (8 + i % 5)  # long prompt: a multi-token prefill chunk in a decode step
        kw = {} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.95, "seed": 100 + i}
        out.append(chat(p, 6 + (i * 5) % 20, **kw))
    return out


def gpu_present(model):
    p = subprocess.run([str(BIN), "trace", str(model), "--ids", "[1,2,3]", "--last", "1", "--device", "auto"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return "device auto: cpu" not in p.stderr


@pytest.fixture(scope="module", params=[(m, q) for m in MODELS for q in ("none", "fp8")],
                ids=lambda p: f"{p[0]}-kv-{p[1]}")
def det_gpu_server(request):
    model, kvq = request.param
    path = TINY / model
    if not path.exists():
        pytest.skip(f"tiny model {path} missing (tools/make_tiny_models.py)")
    if not gpu_present(path):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the GPU deterministic test did NOT run")
    with server(path, "--device", "cuda", "--deterministic", "--kv-quant", kvq, "--max-sequences", "64", "--ctx",
                "1024") as base:
        yield base


@pytest.fixture(scope="module")
def alone(det_gpu_server):
    return run_alone(det_gpu_server, [TARGET])[0]


@pytest.mark.parametrize("n_others", [1, 7, 63])
def test_gpu_request_among_others_equals_alone(det_gpu_server, alone, n_others):
    assert len(alone["logprobs"]["content"]) == alone["completion_tokens"] > 0
    together = run_together(det_gpu_server, [TARGET] + others(n_others))
    assert together[0] == alone, f"the target request differs among {n_others} others on the GPU"


def test_gpu_default_mode_depends_on_the_batch():
    """The control that gives the test above its teeth: without --deterministic the same
    request among 63 others is computed by other kernels (cuBLAS with bf16 operands, the
    prefill attention tiles) in steps of more than 8 tokens, so its logprobs differ."""
    path = TINY / MODELS[0]
    if not path.exists() or not gpu_present(path):
        pytest.skip("no CUDA device here (or tiny model missing): the GPU control did NOT run")
    with server(path, "--device", "cuda", "--max-sequences", "64", "--ctx", "1024") as base:
        alone = run_alone(base, [TARGET])[0]
        together = run_together(base, [TARGET] + others(63))
    assert together[0]["logprobs"] != alone["logprobs"], "batch-dependent kernels gave identical bits (control)"


FOX = "The quick brown fox jumps over the lazy dog while seven wizards quietly vex the jolly king of the hills."


def test_gpu_prefix_cache_copies_partial_blocks(det_gpu_server, request):
    model, kvq = request.node.callspec.params["det_gpu_server"]
    first, other = chat(FOX, 8), chat(FOX.replace("jolly", "grumpy"), 8)
    with server(TINY / model, "--device", "cuda", "--deterministic", "--kv-quant", kvq, "--max-sequences", "64",
                "--ctx", "1024") as fresh:  # nothing cached there: the oracle
        want_first, want_other = run_alone(fresh, [first])[0], run_alone(fresh, [other])[0]
    tok = hf_tokenizer(TINY / model)
    ids = [prompt_ids(tok, r["messages"]) for r in (first, other)]
    got = []
    for r in (first, first, other):
        status, body = post(det_gpu_server, r)
        assert status == 200, body
        got.append(body)
    n = got[0]["usage"]["prompt_tokens"]
    assert n == len(ids[0]) and n % 16 != 0
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in got]
    assert cached[1] == n - 1  # the last block's rows copied from the first run's tail
    assert cached[2] == expected_cached(ids[0], ids[1]) and cached[2] % 16 != 0  # diverges inside a block
    assert answer(got[0]) == want_first and answer(got[1]) == want_first
    assert answer(got[2]) == want_other
