"""Differential tests on Qwen3.5's real chat template: the real mlx_lm.server and `hearth
serve` on the tiny hybrid qwen3_5-f32 model given Qwen3.5's own template
(tests/parity/templates/Qwen-Qwen3.5-4B.jinja) instead of the qwen3 one it was made
with, and no tool_parser_type, so both servers infer thinking and the qwen3_coder tool
parser from that template as they would for a real Qwen3.5 repo. The same requests go
to both; responses are compared field by field under the rules of test_differential.py.

Covered: the template's rendering (prompt_tokens and the greedy tokens depend on it)
with and without tools, an agent history (reasoning_content, XML tool calls with typed
arguments, tool responses), enable_thinking off through chat_template_kwargs; the
reasoning state the prompt leaves the output in (the template ends it with "<think>\\n",
so the answer starts as reasoning until "</think>"), streamed and not.

Not covered here: a forced XML tool call. The tiny tokenizer (700 tokens) has a single
"<" token, so "<function=...></function>" cannot be written as a chain of distinct
tokens for the logit_bias trick; the qwen3_coder parser and the text state machine are
checked against mlx-lm's own on Qwen3.5-shaped outputs in test_parsers.py instead.
"""
import json
import pathlib

import pytest

from conftest import BIN, TINY, need, server, upstream_server, with_template
from test_differential import FILLER, both, compare_forced, compare_greedy_chat, forced_body

SOURCE = TINY / "qwen3_5-f32"
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "parity" / "templates" / "Qwen-Qwen3.5-4B.jinja"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A copy of the tiny qwen3_5 model whose chat template is Qwen3.5's own."""
    need(SOURCE, "tiny qwen3_5 model", "run tools/make_tiny_models.py")
    return with_template(SOURCE, TEMPLATE, tmp_path_factory.mktemp("qwen35_template") / "model")


@pytest.fixture(scope="module")
def servers(model):
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    with upstream_server(model) as up, server(model) as hz:
        yield up, hz


def tok(model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(model))


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}

AGENT_HISTORY = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Weather in Oslo for 3 days?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
     "tool_calls": [{"id": "a", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 3}'}}]},
    {"role": "tool", "tool_call_id": "a", "content": '{"forecast": ["rain", "sun", "snow"]}'},
]

CONVERSATIONS = {
    "one_turn": ([{"role": "user", "content": "What is the capital of France?"}], {}),
    "system_and_history": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "<think>\ngreet\n</think>\n\nHello."},
                            {"role": "user", "content": "Name a colour."}], {}),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], {"tools": [WEATHER]}),
    "agent_history": (AGENT_HISTORY, {"tools": [WEATHER]}),
    "thinking_off": ([{"role": "user", "content": "Hi"}], {"chat_template_kwargs": {"enable_thinking": False}}),
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_greedy(servers, name):
    msgs, extra = CONVERSATIONS[name]
    up = compare_greedy_chat(servers, {"messages": msgs, "max_tokens": 16, "temperature": 0, "logprobs": True,
                                       "top_logprobs": 2, **extra})
    m = up["choices"][0]["message"]
    if name == "thinking_off":  # the prompt closed an empty think block: the answer is content
        assert m.get("content") and not m.get("reasoning"), m
    else:  # the prompt opened one: 16 random tokens stay reasoning
        assert m.get("reasoning") and not m.get("content"), m


def test_prompt_is_the_template_rendering(servers, model):
    """prompt_tokens equals the length of jinja2's rendering of Qwen3.5's template, so both
    servers ran that template (and the agent history's arguments were parsed to objects)."""
    t = tok(model)
    for name, (msgs, extra) in CONVERSATIONS.items():
        kwargs = dict(extra.get("chat_template_kwargs") or {})
        hist = json.loads(json.dumps(msgs))
        for m in hist:
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        ids = t.apply_chat_template(hist, tools=extra.get("tools"), add_generation_prompt=True, tokenize=True,
                                    **kwargs)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        body = {"messages": msgs, "max_tokens": 1, "temperature": 0, **extra}
        (s1, _, b1), (s2, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
        assert s1 == s2 == 200
        assert json.loads(b1)["usage"]["prompt_tokens"] == json.loads(b2)["usage"]["prompt_tokens"] == len(ids), name


def test_forced_end_of_thinking(servers, model):
    """The answer starts as reasoning (the prompt ends with "<think>\\n"); "</think>" moves
    it to content, streamed and not, identically on both servers."""
    body = forced_body(tok(model), [{"role": "user", "content": FILLER}],
                       [["Hello world", "</think>", "\n\nThe weather is nice."], ["Hmm", "</think>", "\n\nSunny."]],
                       template_kwargs={"enable_thinking": True})
    up = compare_forced(servers, body)
    m = up["choices"][0]["message"]
    assert m.get("reasoning") and m.get("content"), m
    compare_forced(servers, dict(body, max_tokens=2))  # cut inside the reasoning
