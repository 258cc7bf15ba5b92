"""Continuous batching in `hearth serve` (src/engine/scheduler.c): concurrent requests are
packed into shared forward steps. The oracle for every batched request is the same request
run alone (one at a time) on the same server: with the scalar reference kernels
(HEARTH_CPU=scalar) every row of a step is computed independently, so greedy tokens, text
and logprobs must be bit-identical. Also: no head-of-line blocking, a cancelled stream
leaves the others intact, a burst larger than the KV pool waits and completes, and a
request that can never fit the pool gets an error instead of waiting forever.
"""
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from conftest import CACHE, need, server

TINY = CACHE / "tiny" / "llama-f32"
SCALAR = {"HEARTH_CPU": "scalar"}
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Explain what a hash table is in one sentence.",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
]


def post(base, body, timeout=300):
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


def chat(prompt, max_tokens, **kw):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "logprobs": True, "top_logprobs": 3, **kw}


def answer(body):
    """What must match between a batched and a lone run: text, finish, usage, logprobs."""
    ch = body["choices"][0]
    return {"content": ch["message"].get("content"), "finish": ch["finish_reason"],
            "completion_tokens": body["usage"]["completion_tokens"],
            "prompt_tokens": body["usage"]["prompt_tokens"], "logprobs": ch["logprobs"]}


def run_alone(base, reqs):
    out = []
    for r in reqs:
        status, body = post(base, r)
        assert status == 200, body
        out.append(answer(body))
    return out


def run_together(base, reqs):
    with ThreadPoolExecutor(len(reqs)) as ex:
        results = list(ex.map(lambda r: post(base, r), reqs))
    for status, body in results:
        assert status == 200, body
    return [answer(b) for _, b in results]


@pytest.fixture(scope="module")
def tiny():
    return need(TINY, "tiny llama f32 model", "run tools/make_tiny_models.py (HEARTH_CACHE/tiny/llama-f32)")


@pytest.fixture(scope="module")
def tiny_server(tiny):
    with server(tiny, "--max-sequences", "8", "--ctx", "2048", env=SCALAR) as base:
        yield base


@pytest.mark.parametrize("n", [4, 8])
def test_tiny_concurrent_equals_alone(tiny_server, n):
    reqs = [chat(p, 40 + 7 * i) for i, p in enumerate(PROMPTS[:n])]  # different lengths: rows leave at different steps
    alone = run_alone(tiny_server, reqs)
    together = run_together(tiny_server, reqs)
    for a, t in zip(alone, together):
        assert t == a
    assert all(len(a["logprobs"]["content"]) == a["completion_tokens"] for a in alone)


@pytest.mark.parametrize("name", ["gemma4-f32", "gemma4_moe-f32"])
def test_gemma4_concurrent_equals_alone(name):
    """Gemma 4 in a ragged step: per-layer inputs by row, layers of two KV shapes, shared-KV
    layers reading another layer's rows of each sequence, the MoE block's per-token routing;
    prompts past the 16-token window."""
    model = need(CACHE / "tiny" / name, f"tiny {name} model", "run tools/make_tiny_models.py")
    reqs = [chat(p * 3, 30 + 5 * i) for i, p in enumerate(PROMPTS[:6])]
    with server(model, "--max-sequences", "8", "--ctx", "2048", env=SCALAR) as base:
        alone = run_alone(base, reqs)
        together = run_together(base, reqs)
    for a, t in zip(alone, together):
        assert t == a
    # prefill cut into 7-token steps (chunk boundaries inside KV blocks and windows) changes nothing
    with server(model, "--max-sequences", "4", "--ctx", "2048", "--max-step-tokens", "7", env=SCALAR) as base:
        assert run_alone(base, reqs[:2]) == alone[:2]


def test_smollm2_concurrent_equals_alone(smollm2):
    # scalar kernels on a real model are slow (~1 s per request here): three rows of different
    # lengths exercise join/leave; test_deterministic.py covers 16 rows with the fast kernels
    with server(smollm2, "--max-sequences", "6", "--ctx", "1024", env=SCALAR) as base:
        reqs = [chat(p, 8 + 3 * i) for i, p in enumerate(PROMPTS[:3])]
        alone = run_alone(base, reqs)
        together = run_together(base, reqs)
        for a, t in zip(alone, together):
            assert t == a


def stream_open(base, body):
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    return c, r


def sse_data(resp):
    """Yields the JSON payloads of an SSE stream until [DONE]."""
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        yield json.loads(line[6:])


def test_no_head_of_line_blocking(tiny):
    with server(tiny, "--max-sequences", "4", "--ctx", "8192", env=SCALAR) as base:
        # EOS banned so the long one runs its full length
        long_req = chat("Tell me a very long story.", 6000, logit_bias={"601": -100, "604": -100, "605": -100})
        short_reqs = [chat(p, 8) for p in PROMPTS[:3]]
        want_short = run_alone(base, short_reqs)
        c, r = stream_open(base, long_req)
        events = sse_data(r)
        next(events)  # the long request is decoding
        t_short = []

        def short(req):
            res = post(base, req)
            t_short.append(time.monotonic())
            return res

        with ThreadPoolExecutor(3) as ex:
            futs = [ex.submit(short, q) for q in short_reqs]
            last = list(events)[-1]  # drain the long stream to its end
            t_long = time.monotonic()
            got = [f.result() for f in futs]
        c.close()
        assert last["choices"][0]["finish_reason"] == "length"
        assert max(t_short) < t_long, "short requests waited for the long one"
        assert [answer(b) for _, b in got] == want_short


def test_cancel_one_stream_others_unaffected(tiny_server):
    reqs = [chat(p, 60) for p in PROMPTS[:4]]
    alone = run_alone(tiny_server, reqs)
    c, r = stream_open(tiny_server, chat("This one is cancelled.", 1500,
                                         logit_bias={"601": -100, "604": -100, "605": -100}))
    events = sse_data(r)
    next(events)
    next(events)
    results = []
    t = threading.Thread(target=lambda: results.extend(run_together(tiny_server, reqs)))
    t.start()
    time.sleep(0.2)
    c.close()  # the client leaves mid-stream: its job is cancelled at the next step
    t.join()
    assert results == alone
    assert run_alone(tiny_server, reqs[:1]) == alone[:1]  # the server is still healthy


def test_burst_beyond_kv_pool_waits_and_completes(tiny):
    # 12 blocks of 16 positions: each request needs ~4-5 blocks, so at most 2-3 run at a time
    with server(tiny, "--max-sequences", "8", "--kv-blocks", "12", "--ctx", "2048", env=SCALAR) as base:
        reqs = [chat(p, 40) for p in PROMPTS]
        alone = run_alone(base, reqs)
        together = run_together(base, reqs)
        assert together == alone
        status, body = post(base, chat("too big", 500))  # 500 tokens can never fit 192 positions
        assert status == 400, body
        assert "KV pool" in body["error"]["message"]
        assert run_alone(base, reqs[:1]) == alone[:1]
