"""The official `openai` Python SDK against `hearth serve`'s Responses API: responses.create
(plain and streaming), instructions, max_output_tokens, previous_response_id resumption
from the store, retrieve and delete, function tools and function_call / function_call_output
input items, and bad requests answered in OpenAI's error shape. Expected values come from
independent oracles: mlx-lm's greedy golden for SmolLM2 (tests/parity/goldens), transformers'
apply_chat_template for prompt token counts, and the SDK's own event and response types
(its parsers must accept every event). A missing binary, model or SDK fails, never skips."""

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import SMOLLM2, TINY, need, server

try:
    import openai
    from openai.types.responses import ResponseStreamEvent  # noqa: F401  (the SDK's event union)
except ImportError:  # fail, not skip: the suite is part of the proof
    openai = None

GOLDEN = Path(__file__).resolve().parents[1] / "parity/goldens/smollm2-135m-instruct-q4_1.json"
_chat = next(p for p in json.loads(GOLDEN.read_text())["prompts"] if p["name"] == "chat")
QUESTION = _chat["messages"][0]["content"]  # one user message
PROMPT_IDS = _chat["ids"]  # the rendered chat prompt, tokenized by HF tokenizers
ANSWER = _chat["greedy_text"].split("<|im_end|>")[0]  # "The capital of France is Paris."
# SmolLM2's template inserts this system prompt only when none is given
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def hf_tokenizer(model):
    """tests/parity's transformers tokenizer loader (GGUF without torch), loaded by path
    because both test folders name their fixtures module conftest."""
    spec = importlib.util.spec_from_file_location("parity_conftest",
                                                  Path(__file__).resolve().parents[1] / "parity/conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.hf_tokenizer(str(model))


def n_tokens(tok, messages, tools=None):
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def client(smollm2_server):
    if openai is None:
        pytest.fail("the openai package is missing from .venv: run tools/deps.sh", pytrace=False)
    return openai.OpenAI(base_url=smollm2_server + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_create_knows_paris(client):
    r = client.responses.create(model="default_model", input=QUESTION, temperature=0, max_output_tokens=32)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].id.startswith("msg_") and r.output[0].status == "completed"
    assert r.output[0].content[0].type == "output_text" and r.output[0].content[0].annotations == []
    assert r.output_text == ANSWER
    assert r.usage.input_tokens == len(PROMPT_IDS)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.incomplete_details is None and r.max_output_tokens == 32
    # the same question as an item list with input_text parts
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    r2 = client.responses.create(model="default_model", input=items, temperature=0)
    assert r2.output_text == ANSWER and r2.usage.input_tokens == len(PROMPT_IDS)


def check_stream(events):
    """The Responses stream grammar: created, in_progress, then per output item added ->
    (content_part.added, text deltas, text.done, content_part.done | arguments delta/done)
    -> item done, and a final completed/incomplete; sequence_number counts from 0."""
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    body = types[2:-1]
    i = 0
    while i < len(body):
        assert body[i] == "response.output_item.added", types
        item = events[2 + i].item
        if item.type == "message":
            assert body[i + 1] == "response.content_part.added"
            j = i + 2
            while body[j] == "response.output_text.delta":
                j += 1
            assert body[j:j + 3] == ["response.output_text.done", "response.content_part.done",
                                     "response.output_item.done"], types
            i = j + 3
        else:
            assert item.type == "function_call"
            assert body[i + 1:i + 4] == ["response.function_call_arguments.delta",
                                         "response.function_call_arguments.done", "response.output_item.done"]
            i += 4
    return events[-1].response


def test_stream_matches_create(client):
    plain = client.responses.create(model="default_model", input=QUESTION, temperature=0)
    events = list(client.responses.create(model="default_model", input=QUESTION, temperature=0, stream=True))
    final = check_stream(events)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert deltas == ANSWER == plain.output_text == final.output_text and done == [ANSWER]
    assert final.status == "completed" and final.usage.input_tokens == len(PROMPT_IDS)
    item_ids = {e.item_id for e in events if e.type == "response.output_text.delta"}
    assert item_ids == {final.output[0].id}


def test_instructions(client):
    r = client.responses.create(model="default_model", input=QUESTION, instructions=SMOL_SYSTEM, temperature=0)
    assert r.instructions == SMOL_SYSTEM
    assert r.usage.input_tokens == len(PROMPT_IDS) and r.output_text == ANSWER
    brief = client.responses.create(model="default_model", input=QUESTION, instructions="Be brief.",
                                    max_output_tokens=4)
    assert brief.usage.input_tokens < len(PROMPT_IDS)


def test_max_output_tokens_incomplete(client):
    r = client.responses.create(model="default_model", input=QUESTION, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and ANSWER.startswith(r.output_text) and r.output[0].status == "incomplete"
    events = list(client.responses.create(model="default_model", input=QUESTION, temperature=0,
                                          max_output_tokens=3, stream=True))
    final = check_stream(events)
    assert events[-1].type == "response.incomplete" and final.output_text == r.output_text


def test_previous_response_id(client):
    tok = hf_tokenizer(need(SMOLLM2, "default model", "run tools/get_models.sh"))
    first = client.responses.create(model="default_model", input=QUESTION, temperature=0)
    follow = "And of Italy?"
    second = client.responses.create(model="default_model", input=follow, previous_response_id=first.id,
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id
    conv = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": follow}]
    assert n_tokens(tok, conv[:1]) == len(PROMPT_IDS)  # the oracle agrees with the golden
    assert second.usage.input_tokens == n_tokens(tok, conv)
    # a third turn sees both earlier turns (each response stores its whole conversation)
    third = client.responses.create(model="default_model", input="Thanks.", previous_response_id=second.id,
                                    max_output_tokens=4)
    conv += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "Thanks."}]
    assert third.usage.input_tokens == n_tokens(tok, conv)
    # store=false: nothing to resume from
    unstored = client.responses.create(model="default_model", input=QUESTION, store=False, max_output_tokens=2)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="default_model", input="x", previous_response_id=unstored.id)


def test_retrieve_and_delete(client):
    r = client.responses.create(model="default_model", input=QUESTION, temperature=0, max_output_tokens=16)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status
    assert got.usage.input_tokens == r.usage.input_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="default_model", input="x", previous_response_id=r.id)


def test_tools_accepted_and_well_formed(client):
    r = client.responses.create(model="default_model", input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="auto", max_output_tokens=24)
    assert r.tools[0].name == "get_weather" and r.tools[0].type == "function" and r.tool_choice == "auto"
    for item in r.output:
        assert item.type in ("message", "function_call")
        if item.type == "function_call":
            assert item.name == "get_weather" and item.call_id.startswith("call_") and item.id.startswith("fc_")
            assert isinstance(json.loads(item.arguments), dict)
    # required is accepted (not enforced: the server logs a warning)
    r = client.responses.create(model="default_model", input="Weather in Rome?", tools=[WEATHER],
                                tool_choice="required", max_output_tokens=4)
    assert r.tool_choice == "required"


def test_tool_items_render_like_transformers():
    """function_call and function_call_output input items become assistant tool_calls and
    role "tool" messages: the prompt token count must equal transformers'
    apply_chat_template on the equivalent chat conversation (tiny Qwen3, whose template
    renders tools, tool calls and tool results)."""
    qwen3 = need(TINY / "qwen3-f32", "tiny qwen3 model", "run tools/make_tiny_models.py")
    tok = hf_tokenizer(qwen3)
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_b", "output": "25 C"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Which is warmer?"}]},
    ]
    chat = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_b", "name": "get_weather", "content": "25 C"},
        {"role": "user", "content": "Which is warmer?"},
    ]
    chat_tools = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]
    with server(qwen3) as b:
        c = openai.OpenAI(base_url=b + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.responses.create(model="default_model", instructions="Be terse.", input=items, tools=[WEATHER],
                               max_output_tokens=4)
        assert r.usage.input_tokens == n_tokens(tok, chat, chat_tools)
        r = c.responses.create(model="default_model", instructions="Be terse.", input=items, tools=[WEATHER],
                               tool_choice="none", max_output_tokens=4)
        assert r.usage.input_tokens == n_tokens(tok, chat)


def test_bad_requests_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.responses.create(model="default_model", input="hi", previous_response_id="resp_doesnotexist")
    err = ei.value.body
    assert err["code"] == "previous_response_not_found" and err["param"] == "previous_response_id"
    assert err["type"] == "invalid_request_error" and "resp_doesnotexist" in err["message"]
    bad = [dict(input=""), dict(input=[]), dict(input=5), dict(input="hi", temperature="hot"),
           dict(input="hi", max_output_tokens=0), dict(input="hi", stream="yes"),
           dict(input=[{"type": "message", "role": "robot", "content": "hi"}]),
           dict(input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]),
           dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
           dict(input="hi", tools=[{"type": "web_search"}]), dict(input="hi", tool_choice="sometimes")]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="default_model", **kw)
        assert ei.value.status_code == 400 and ei.value.body["type"] == "invalid_request_error", kw
        assert ei.value.body["message"], kw
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    # and the server keeps serving
    r = client.responses.create(model="default_model", input=QUESTION, temperature=0)
    assert r.output_text == ANSWER
