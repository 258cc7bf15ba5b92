"""Differential tests on Gemma 4: the real mlx_lm.server and `hearth serve` on the tiny
gemma4-f32 model (Gemma 4's chat template, its control tokens, float32 weights on both
sides), the same requests, responses compared field by field under the rules of
test_differential.py (its module docstring lists the allowed differences). Covered here:
the chat template's rendering (greedy tokens depend on it), thinking on the multi-token
<|channel>thought ... <channel|> markers, and Gemma 4 tool calls (<|tool_call>call:f{...}
<tool_call|>, mlx-lm's gemma4 parser), streamed and not, forced by logit_bias chains.
"""

import pytest

from conftest import BIN, TINY, need, server, upstream_server
from test_differential import FILLER, compare_forced, compare_greedy_chat
from test_differential import forced_body as differential_forced_body

MODEL = TINY / "gemma4-f32"


@pytest.fixture(scope="module")
def servers():
    need(MODEL, "tiny gemma4 model", "run tools/make_tiny_models.py")
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    with upstream_server(MODEL) as up, server(MODEL) as hz:
        yield up, hz


def tok():
    from conftest import hf_tokenizer
    return hf_tokenizer(MODEL)


def forced_body(tok, msgs, parts_options, **extra):
    """test_differential.forced_body with the prompt both servers render: enable_thinking
    defaults to True for a model with thinking markers (mlx-lm's TokenizerWrapper), and
    Gemma 4's template then opens no empty thought channel."""
    return differential_forced_body(tok, msgs, parts_options, template_kwargs={"enable_thinking": True}, **extra)


@pytest.mark.parametrize("msgs", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}],
], ids=["one_turn", "system_and_history"])
def test_chat_greedy(servers, msgs):
    compare_greedy_chat(servers, {"messages": msgs, "max_tokens": 24, "temperature": 0, "logprobs": True,
                                  "top_logprobs": 2})


def test_forced_thinking(servers):
    body = forced_body(tok(), [{"role": "user", "content": FILLER}],
                       [["<|channel>", "thought", "Hello world", "<channel|>", "The weather is nice."],
                        ["<|channel>", "thought", "Hmm", "<channel|>", "Sunny."]])
    up = compare_forced(servers, body)
    m = up["choices"][0]["message"]
    assert m.get("reasoning") and m.get("content"), m  # the chain did make a thinking turn


def test_forced_tool_call(servers):
    tools = [{"type": "function", "function": {"name": "sun", "description": "Sunshine hours",
                                               "parameters": {"type": "object", "properties": {}}}}]
    body = forced_body(tok(), [{"role": "user", "content": FILLER}],
                       [["<|tool_call>", "call:sun{}", "<tool_call|>"]], tools=tools)
    up = compare_forced(servers, body)
    assert up["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "sun", "arguments": "{}"}, up
    compare_forced(servers, dict(body, max_tokens=3))  # cut short inside the call
