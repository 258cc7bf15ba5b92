"""The official `anthropic` Python SDK (pinned in tools/deps.sh) against `hearth serve`:
POST /v1/messages (create and stream), /v1/messages/count_tokens, tools and a tool_result
round trip, stop_sequences, max_tokens, x-api-key, and bad requests answered in
Anthropic's error shape. Expected values come from independent oracles: mlx-lm's greedy
golden for SmolLM2 (tests/parity/goldens) and transformers' apply_chat_template for
prompt token counts; the event grammar is Anthropic's published one. A missing binary,
model or SDK fails with the fix, never skips."""

import http.client
import json
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import TINY, need, server

try:
    import anthropic
except ImportError:  # fail, not skip: the suite is part of the proof
    anthropic = None

GOLDEN = Path(__file__).resolve().parents[1] / "parity/goldens/smollm2-135m-instruct-q4_1.json"
_chat = next(p for p in json.loads(GOLDEN.read_text())["prompts"] if p["name"] == "chat")
QUESTION = _chat["messages"]  # one user message
PROMPT_IDS = _chat["ids"]  # the rendered chat prompt, tokenized by HF tokenizers
ANSWER = _chat["greedy_text"].split("<|im_end|>")[0]  # "The capital of France is Paris."
KEY = "sekrit"
MODEL = "claude-local-test"  # Anthropic clients send their own model names; hearth echoes them

WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def base(smollm2):
    # reference kernels: greedy tokens equal the mlx-lm golden exactly
    with server(smollm2, "--api-key", KEY, env={"HEARTH_CPU": "scalar"}) as b:
        yield b


@pytest.fixture(scope="module")
def client(base):
    if anthropic is None:
        pytest.fail("the anthropic package is missing from .venv: run tools/deps.sh", pytrace=False)
    return anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)


def raw(base, method, path, body=None, headers=None):
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "Content-Type": "application/json",
         **(headers or {})}
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def sse(data):
    """Anthropic SSE bytes -> [(event name, parsed data)], checking each event's framing."""
    events = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, payload = lines[0][7:], json.loads(lines[1][6:])
        assert payload["type"] == name, block
        events.append((name, payload))
    return events


def check_grammar(events):
    """Anthropic's stream grammar: message_start, then content blocks (start, deltas,
    stop) with consecutive indices, then one message_delta and message_stop; ping
    anywhere. Returns (message_start message, [blocks], message_delta)."""
    names = [n for n, _ in events if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    blocks, open_index = [], None
    for name, e in events[1:]:
        if name in ("ping", "message_delta", "message_stop"):
            assert open_index is None, "a block was left open"
            continue
        if name == "content_block_start":
            assert open_index is None and e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
            open_index = e["index"]
        elif name == "content_block_delta":
            assert e["index"] == open_index
            d, b = e["delta"], blocks[open_index]
            if d["type"] == "text_delta":
                assert b["type"] == "text"
                b["text"] += d["text"]
            else:
                assert d["type"] == "input_json_delta" and b["type"] == "tool_use"
                b["_json"] = b.get("_json", "") + d["partial_json"]
        elif name == "content_block_stop":
            assert e["index"] == open_index
            open_index = None
        else:
            raise AssertionError(f"unexpected event {name}")
    delta = next(e for n, e in events if n == "message_delta")
    return start, blocks, delta


def prompt_tokens(usage):
    """The whole prompt of an Anthropic usage: input_tokens counts only what was not read
    from the cache (Anthropic's definition); hearth writes no explicit cache entries."""
    u = usage if isinstance(usage, dict) else usage.model_dump()
    assert u["cache_creation_input_tokens"] == 0, u
    return u["input_tokens"] + u["cache_read_input_tokens"]


def assert_anthropic_error(status, body, want_status, want_type, needle=None):
    assert status == want_status, (status, body)
    err = json.loads(body)
    assert err["type"] == "error" and set(err["error"]) >= {"type", "message"}, err
    assert err["error"]["type"] == want_type, err
    if needle:
        assert needle in err["error"]["message"], err


def test_create_knows_paris(client):
    r = client.messages.create(model=MODEL, max_tokens=32, messages=QUESTION,
                               extra_body={"temperature": 0.0, "top_p": 1.0, "top_k": 0})
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"]
    assert "Paris" in ANSWER and r.content[0].text == ANSWER
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    assert prompt_tokens(r.usage) == len(PROMPT_IDS)
    # the answer's tokens plus the end-of-turn token
    assert 1 < r.usage.output_tokens <= 32


def test_stream_events_and_text(client, base):
    args = dict(model=MODEL, max_tokens=32, messages=QUESTION)  # the server's default --temp 0: greedy
    full = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_delta" in types
    assert final.content[0].text == full.content[0].text == ANSWER
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == full.usage.output_tokens
    # the raw bytes: exact framing and grammar (the SDK hides ping events)
    status, headers, data = raw(base, "POST", "/v1/messages", {**args, "stream": True})
    assert status == 200 and headers["Content-type"].startswith("text/event-stream")
    events = sse(data)
    assert events[1][0] == "ping"  # Anthropic sends one right after message_start
    start, blocks, delta = check_grammar(events)
    assert prompt_tokens(start["usage"]) == len(PROMPT_IDS) == prompt_tokens(delta["usage"])
    assert blocks == [{"type": "text", "text": ANSWER}]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == full.usage.output_tokens


def test_stop_sequences(client, base):
    args = dict(model=MODEL, max_tokens=32, messages=QUESTION, stop_sequences=["nowhere", "Paris"])
    r = client.messages.create(**args)
    assert r.content[0].text == ANSWER.split("Paris")[0]  # "The capital of France is "
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "Paris"
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == r.content[0].text
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "Paris"


def test_max_tokens(client, base):
    r = client.messages.create(model=MODEL, max_tokens=3, messages=QUESTION,
                               extra_body={"temperature": 0.0, "top_p": 1.0, "top_k": 0})
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3
    assert r.content[0].text == "The capital of"  # the golden's first three tokens
    status, _, data = raw(base, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": QUESTION,
                                                         "stream": True})
    _, blocks, delta = check_grammar(sse(data))
    assert blocks[0]["text"] == "The capital of" and delta["delta"]["stop_reason"] == "max_tokens"


def test_system_prompt(client):
    # SmolLM2's template puts its default system prompt only when none is given
    sys_text = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    as_string = client.messages.create(model=MODEL, max_tokens=32, messages=QUESTION, system=sys_text)
    as_blocks = client.messages.create(model=MODEL, max_tokens=32, messages=QUESTION,
                                       system=[{"type": "text", "text": sys_text}])
    for r in (as_string, as_blocks):
        assert prompt_tokens(r.usage) == len(PROMPT_IDS) and r.content[0].text == ANSWER
    other = client.messages.count_tokens(model=MODEL, messages=QUESTION, system="Be brief.")
    assert other.input_tokens < len(PROMPT_IDS)


def test_count_tokens(client):
    assert client.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens == len(PROMPT_IDS)


def test_tools_accepted_and_well_formed(client):
    r = client.messages.create(model=MODEL, max_tokens=24, tools=[WEATHER], tool_choice={"type": "auto"},
                               messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                               metadata={"user_id": "u-1"})
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for b in r.content:
        assert b.type in ("text", "tool_use")
        if b.type == "tool_use":
            assert b.id.startswith("toolu_") and isinstance(b.input, dict)
    # a tool_result round trip is accepted and answered
    r2 = client.messages.create(model=MODEL, max_tokens=16, tools=[WEATHER], messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                      "content": [{"type": "text", "text": "18 C, sunny"}]},
                                     {"type": "text", "text": "Summarize."}]}])
    assert r2.type == "message" and prompt_tokens(r2.usage) > prompt_tokens(r.usage)


BAD = [
    ({"model": MODEL, "messages": QUESTION}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "vision"),
    ({"model": MODEL, "max_tokens": "8", "messages": QUESTION}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 0, "messages": QUESTION}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 8, "messages": "hi"}, "messages"),
    ({"model": MODEL, "max_tokens": 8, "messages": []}, "messages"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "video"),
    ({"model": MODEL, "max_tokens": 8, "messages": QUESTION, "temperature": 1.5}, "temperature"),
    ({"model": MODEL, "max_tokens": 8, "messages": QUESTION, "stop_sequences": "x"}, "stop_sequences"),
    ({"model": MODEL, "max_tokens": 8, "messages": QUESTION, "tools": [{"name": "f"}]}, "input_schema"),
    ({"model": MODEL, "max_tokens": 8, "messages": QUESTION, "stream": "yes"}, "stream"),
    ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]}, "tool_use"),
    ({"max_tokens": 8, "messages": QUESTION}, "model"),
]


def test_bad_requests_in_anthropic_shape(client, base):
    for body, needle in BAD:
        status, _, data = raw(base, "POST", "/v1/messages", body)
        assert_anthropic_error(status, data, 400, "invalid_request_error", needle)
    status, _, data = raw(base, "POST", "/v1/messages", b'{"model": ')
    assert_anthropic_error(status, data, 400, "invalid_request_error", "JSON")
    status, _, data = raw(base, "GET", "/v1/messages")
    assert_anthropic_error(status, data, 405, "invalid_request_error")
    status, _, data = raw(base, "POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": 3})
    assert_anthropic_error(status, data, 400, "invalid_request_error", "messages")
    # the SDK maps the status and shape to its exception types
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert ei.value.status_code == 400 and ei.value.body["error"]["type"] == "invalid_request_error"
    # and the server still serves
    assert client.messages.create(model=MODEL, max_tokens=32, messages=QUESTION).content[0].text == ANSWER


def test_api_key(base):
    bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as ei:
        bad.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert ei.value.status_code == 401 and ei.value.body["error"]["type"] == "authentication_error"
    status, _, data = raw(base, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": QUESTION},
                          headers={"x-api-key": ""})
    assert_anthropic_error(status, data, 401, "authentication_error")
    # --api-key also accepts OpenAI's Bearer header on the Anthropic route, and x-api-key on OpenAI's
    status, _, _ = raw(base, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": QUESTION},
                       headers={"x-api-key": "", "Authorization": f"Bearer {KEY}"})
    assert status == 200
    status, _, _ = raw(base, "POST", "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2})
    assert status == 200


# ---- the request translation, checked against transformers on a tool-aware template ----

QWEN3 = TINY / "qwen3-f32"


def test_count_tokens_matches_transformers_with_tools():
    """count_tokens renders the Anthropic conversation through the chat template; the
    count must equal transformers' apply_chat_template on the equivalent OpenAI-style
    conversation (system message, assistant tool_calls, role "tool" results, function
    tools), with the tiny Qwen3's template, which renders all of them."""
    need(QWEN3, "tiny qwen3 model", "run tools/make_tiny_models.py")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN3))
    anth_messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "18 C"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "25 C"}]},
            {"type": "text", "text": "Which is warmer?"}]},
    ]
    openai_messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "toolu_b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "name": "get_weather", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_b", "name": "get_weather", "content": "25 C"},
        {"role": "user", "content": "Which is warmer?"},
    ]
    openai_tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                      "parameters": WEATHER["input_schema"]}}]
    want_tools = tok.apply_chat_template(openai_messages, tools=openai_tools, add_generation_prompt=True,
                                         tokenize=False)
    want_plain = tok.apply_chat_template(openai_messages, add_generation_prompt=True, tokenize=False)
    assert want_tools != want_plain  # the template really renders tools
    with server(QWEN3) as b:
        c = anthropic.Anthropic(base_url=b, api_key="unused", max_retries=0, timeout=60)
        got = c.messages.count_tokens(model=MODEL, system="Be terse.", messages=anth_messages, tools=[WEATHER])
        assert got.input_tokens == len(tok(want_tools, add_special_tokens=False)["input_ids"])
        # tool_choice none: the model is not told about the tools
        got = c.messages.count_tokens(model=MODEL, system="Be terse.", messages=anth_messages, tools=[WEATHER],
                                      tool_choice={"type": "none"})
        assert got.input_tokens == len(tok(want_plain, add_special_tokens=False)["input_ids"])
        # and a generation on that conversation is a well-formed Message
        r = c.messages.create(model=MODEL, max_tokens=8, system="Be terse.", messages=anth_messages,
                              tools=[WEATHER])
        assert prompt_tokens(r.usage) == len(tok(want_tools, add_special_tokens=False)["input_ids"])
        assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_usage_splits_cached_prompt():
    """Anthropic's usage: input_tokens is the part of the prompt not read from the cache,
    cache_read_input_tokens the part that was; their sum is the prompt as HF tokenizers
    count it. The same long prompt twice: the second time hearth's prefix cache holds all
    its full KV blocks, and the create, the stream's message_start and its message_delta
    (as the SDK accumulates them) all say so."""
    need(QWEN3, "tiny qwen3 model", "run tools/make_tiny_models.py")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(QWEN3))
    text = "Remember these pairs. " + " ".join(f"key {i} maps to value {i * 7919 % 1000}" for i in range(60))
    messages = [{"role": "user", "content": text}]
    want = len(tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"])
    assert want > 300  # many KV blocks
    with server(QWEN3) as b:
        with urllib.request.urlopen(b + "/stats", timeout=30) as r:
            block = json.loads(r.read())["kv_blocks"]["block_tokens"]
        c = anthropic.Anthropic(base_url=b, api_key="unused", max_retries=0, timeout=120)
        first = c.messages.create(model=MODEL, max_tokens=4, messages=messages)
        second = c.messages.create(model=MODEL, max_tokens=4, messages=messages)
        with c.messages.stream(model=MODEL, max_tokens=4, messages=messages) as stream:
            start = next(e for e in stream if e.type == "message_start").message.usage
            final = stream.get_final_message().usage
    for u in (first, second):
        assert prompt_tokens(u.usage) == want, u.usage
    assert first.usage.cache_read_input_tokens == 0  # a fresh server: nothing was cached before
    # every full block of the prompt but the last (one token is always computed) is reused
    for u in (second.usage, start, final):
        assert prompt_tokens(u) == want, u
        assert u.cache_read_input_tokens > 0 and u.cache_read_input_tokens >= want - 2 * block, u
        assert u.input_tokens == want - u.cache_read_input_tokens
