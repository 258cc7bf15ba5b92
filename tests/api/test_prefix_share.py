"""Concurrent requests with a shared prefix compute it once (src/engine/scheduler.c:
waits_for_shared_prefix): a request whose long prefix another running request is prefilling
waits for those KV blocks and attaches them, instead of computing them a second time.

Oracles: HF transformers' chat template + tokenizer give each prompt's tokens, hence the
token prefix two prompts share (a waiting request takes all of it: it waits for the
leader's block that holds the last shared token); each answer must equal the same request
run alone on a fresh server (nothing cached, nothing concurrent). --deterministic makes a
sequence's numerics independent of its batch, so tokens and logprobs must be identical.
Small steps (--max-step-tokens 64) spread the 2k-token prefill over ~30 steps, so the
requests sent together really arrive while the first one is still prefilling.
"""
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from conftest import need, server
from test_prefix_cache import (NO_EOS, QUESTIONS, TINY_LLAMA, answer, cached, chat, expected_cached,
                               hf_tokenizer, messages, prompt_ids, wait_idle)

FLAGS = ("--ctx", "4096", "--max-sequences", "4", "--max-step-tokens", "64", "--deterministic")
QS = QUESTIONS[:4]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tiny():
    return need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")


@pytest.fixture(scope="module")
def ids(tiny):
    tok = hf_tokenizer(tiny)
    return {q: prompt_ids(tok, messages(q)) for q in QS}


@pytest.fixture(scope="module")
def alone(tiny):
    """Each question alone on a fresh server: the oracle."""
    out = {}
    for q in QS:
        with server(tiny, *FLAGS) as base:
            body = chat(base, messages(q), MAX_TOKENS, logit_bias=NO_EOS)
            assert cached(body) == 0
            out[q] = answer(body)
    return out


def check_computed_once(got, ids, qs):
    """At most one request (the leader) computed the common prefix; every other one attached
    at least what it shares with the leader. Returns the leader."""
    share = {q: {o: expected_cached(ids[o], ids[q]) for o in qs if o != q} for q in qs}
    assert min(min(s.values()) for s in share.values()) > 1800, "the shared prefix should be about 2k tokens"
    leaders = [q for q in qs if cached(got[q]) < min(share[q].values())]
    assert len(leaders) == 1, {q: cached(got[q]) for q in qs}
    lead = leaders[0]
    for q in qs:
        assert got[q]["usage"]["prompt_tokens"] == len(ids[q])
        if q != lead:
            assert cached(got[q]) >= share[q][lead]
    # computed prompt tokens: one prefix plus the tails (plus what the leader got from the cache)
    computed = sum(len(ids[q]) - cached(got[q]) for q in qs)
    assert computed == len(ids[lead]) - cached(got[lead]) + sum(len(ids[q]) - cached(got[q]) for q in qs if q != lead)
    assert computed <= len(ids[lead]) + sum(len(ids[q]) - share[q][lead] for q in qs if q != lead)
    return lead


def test_four_concurrent_requests_compute_the_prefix_once(tiny, ids, alone):
    with server(tiny, *FLAGS) as base:
        with ThreadPoolExecutor(len(QS)) as ex:
            bodies = list(ex.map(lambda q: chat(base, messages(q), MAX_TOKENS, logit_bias=NO_EOS), QS))
        got = dict(zip(QS, bodies))
        lead = check_computed_once(got, ids, QS)
        assert cached(got[lead]) == 0  # a fresh server: the leader computed everything
        for q in QS:
            assert answer(got[q]) == alone[q]
        s = wait_idle(base)
        assert s["prefix_cache"]["cached_tokens"] == sum(cached(b) for b in bodies)
        assert s["kv_blocks"]["free"] + s["kv_blocks"]["cached"] == s["kv_blocks"]["total"]


def test_leader_cancelled_mid_prefill(tiny, ids, alone):
    qs = QS[1:]
    with server(tiny, *FLAGS) as base:
        u = urlparse(base)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        body = {"messages": messages("cancel me while you read the prompt"), "max_tokens": 1000, "stream": True,
                "logit_bias": NO_EOS}
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        for line in r:  # its prefill has begun: a progress comment per step
            if line.startswith(b": keepalive"):
                break
        with ThreadPoolExecutor(len(qs)) as ex:
            futs = [ex.submit(chat, base, messages(q), MAX_TOKENS, logit_bias=NO_EOS) for q in qs]
            time.sleep(0.05)  # let them queue behind the first one's prefix
            c.close()  # hang up mid-prefill: the server cancels the first request
            got = {q: f.result() for q, f in zip(qs, futs)}
        lead = check_computed_once(got, ids, qs)
        for q in qs:
            assert answer(got[q]) == alone[q]
        s = wait_idle(base)
        assert s["requests_served"] == 4
        assert s["kv_blocks"]["free"] + s["kv_blocks"]["cached"] == s["kv_blocks"]["total"]
        # the first request had computed at least one 64-token step (a keepalive came) before
        # it went, and the new leader took those blocks over
        assert cached(got[lead]) >= 64
