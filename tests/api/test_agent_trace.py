"""A coding agent's traffic replayed against `hearth serve` (tests/api/data/agent_trace.json,
made by tools/make_agent_trace.py: three interleaved sessions whose conversations grow by one
reply and one message per request, with a title side request per session), through the
OpenAI chat endpoint (pi, Codex's chat wire) and the Anthropic Messages endpoint (Claude
Code). Every conversation request after a session's first takes at least 90% of its prompt
from the prefix cache, and never less than the longest common token prefix with the
session's previous prompt (oracle: HF transformers' chat template and tokenizer), although
other sessions and title requests ran in between."""
import json
from pathlib import Path

import pytest

from conftest import expected_cached, hf_tokenizer, need, prompt_ids, server
from test_prefix_cache import NO_EOS, TINY_LLAMA, post

TRACE = Path(__file__).resolve().parent / "data" / "agent_trace.json"


def openai_call(base, msgs):
    status, body = post(base, "/v1/chat/completions",
                        {"messages": msgs, "max_tokens": 8, "temperature": 0, "logit_bias": NO_EOS})
    assert status == 200, body
    u = body["usage"]
    return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


def anthropic_call(base, msgs):
    status, body = post(base, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 8, "temperature": 0,
                                               "system": msgs[0]["content"], "messages": msgs[1:]})
    assert status == 200, body
    u = body["usage"]
    return u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"]


@pytest.mark.parametrize("call", [openai_call, anthropic_call], ids=["openai-chat", "anthropic-messages"])
def test_agent_trace_stays_cached(call):
    tiny = need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")
    tok = hf_tokenizer(str(tiny))
    trace = json.loads(TRACE.read_text())["requests"]
    last = {}  # session -> prompt ids of its previous conversation request
    shares = []
    with server(tiny, "--kv-blocks", "4096") as base:
        for r in trace:
            n, cached = call(base, r["messages"])
            if r["kind"] != "turn":
                continue
            ids = prompt_ids(tok, r["messages"])
            assert n == len(ids)
            if r["session"] in last:
                assert cached >= expected_cached(last[r["session"]], ids), r["turn"]
                shares.append(cached / n)
            last[r["session"]] = ids
    print(f"\n{call.__name__}: {len(shares)} follow-up requests, cached share min {min(shares):.1%}, "
          f"mean {sum(shares) / len(shares):.1%}")
    assert min(shares) >= 0.90, shares
