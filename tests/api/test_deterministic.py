"""Deterministic mode (`hearth serve --deterministic`): with the fast kernels (no
HEARTH_CPU=scalar: AVX2/AVX-512, int8 activations, tile kernels for prefill) a request's
tokens and logprobs are bit-identical whether it runs alone or among N others. The oracle
is the same request run alone on the same server; the JSON floats compared are the exact
float32 logprobs hearth prints (as doubles with 17 significant digits), so equal JSON
means equal bits.

Without --deterministic the prefill tile kernels and the thread split depend on how many
tokens share a step, so batched rows may differ by float rounding (test_batching.py checks
equality only with the scalar kernels for that reason).
"""
import pytest

from conftest import server
from test_batching import PROMPTS, chat, run_alone, run_together

# greedy and seeded sampled requests, alternating; different lengths so rows leave the
# batch at different steps and the step's composition keeps changing
REQUESTS = [
    chat(PROMPTS[i % len(PROMPTS)] + (" Answer briefly." if i >= len(PROMPTS) else ""), 10 + (i % 5),
         **({} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.95, "seed": 1234 + i}))
    for i in range(16)
]


@pytest.fixture(scope="module")
def det_server(smollm2):
    # two threads: the output-row split over threads must not depend on the batch either
    with server(smollm2, "--deterministic", "--threads", "2", "--max-sequences", "16", "--ctx", "1024") as base:
        yield base


@pytest.fixture(scope="module")
def alone(det_server):
    return run_alone(det_server, REQUESTS)


@pytest.mark.parametrize("n", [1, 4, 16])
def test_concurrent_equals_alone(det_server, alone, n):
    together = run_together(det_server, REQUESTS[:n])
    for i, (a, t) in enumerate(zip(alone[:n], together)):
        assert t == a, f"request {i} ({'greedy' if i % 2 == 0 else 'sampled'}) differs among {n}"
    assert all(len(a["logprobs"]["content"]) == a["completion_tokens"] for a in alone)


def test_sampled_requests_really_sample(det_server, alone):
    """The seeded requests must not all be greedy in disguise: with another seed the
    same sampled request gives other tokens at least once in a few tries."""
    req = REQUESTS[1]
    texts = {alone[1]["content"]}
    for seed in (1, 2, 3, 4):
        texts.add(run_alone(det_server, [{**req, "seed": seed}])[0]["content"])
    assert len(texts) > 1


def test_int8_kv_concurrent_equals_alone(smollm2):
    """int8 KV (--kv-quant int8) is written on append and read by every batch size alike:
    with --deterministic, 4 concurrent requests still equal the same requests alone."""
    with server(smollm2, "--deterministic", "--kv-quant", "int8", "--threads", "2", "--max-sequences", "4",
                "--ctx", "1024") as base:
        reqs = REQUESTS[:4]
        alone = run_alone(base, reqs)
        together = run_together(base, reqs)
        for i, (a, t) in enumerate(zip(alone, together)):
            assert t == a, f"request {i} differs among 4 with int8 KV"
