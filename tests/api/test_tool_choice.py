"""Enforced tool_choice through the real SDKs (openai chat and Responses, anthropic).

"required" / a named function (Anthropic "any" / "tool") must always give calls to an
offered (or the named) tool whose arguments validate with `jsonschema` against that tool's
parameters, with finish_reason "tool_calls" (stop_reason "tool_use"): exactly one with
parallel_tool_calls false (Anthropic's disable_parallel_tool_use true), one or more with it
true, the default; the openai SDK parses the response. With "auto" and parallel calls off,
the generation ends with the model's first call (fewer tokens than with them on). "auto" must answer exactly what a request without tool_choice
answers, and "none" what a request without tools answers. Bad values are a 400 naming the
field. Run on the default model (SmolLM2, no tool format of its own: the hermes
<tool_call> form) and on tiny random-weight models of each template family: Qwen 3
(json_tools), Qwen 3.5 (qwen3_coder: <function=f><parameter=p> with raw string values),
pythonic (the tiny Llama with a minimal LFM2-style template: [f(a=1)] Python literals),
Llama 3 (its <|python_tag|> JSON, a special-token marker), Gemma 3 (no tool format) and
Gemma 4 (its own call syntax, <|"|>-delimited strings)."""
import json
import pathlib

import jsonschema
import pytest

from conftest import TINY, server, with_template

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
tokenizers = pytest.importorskip("tokenizers")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                        "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
       "required": ["a", "b"]}
SEARCH = {"$defs": {"when": {"type": "string", "format": "date"}},
          "type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 30},
                                           "since": {"$ref": "#/$defs/when"},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 20}},
          "required": ["query"]}
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "search": SEARCH}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": s}}
         for n, s in SCHEMAS.items()]
PROMPTS = ["What is the weather in Paris?", "What is 12 plus 30?", "Find news about rockets.", "Hello!"]


def check_calls(choice, allowed, single=True):
    """Calls to tools in `allowed` (exactly one when single, else one or more), arguments
    valid for their schemas; returns their names. A list of parallel calls may run to
    max_tokens (a small model that keeps calling): the complete calls come back."""
    assert choice.finish_reason == "tool_calls" or (not single and choice.finish_reason == "length"), choice
    calls = choice.message.tool_calls
    assert calls and (len(calls) == 1 or not single), choice.message
    for c in calls:
        assert c.function.name in allowed, c.function.name
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name],
                            format_checker=jsonschema.FormatChecker())
    return [c.function.name for c in calls]


def check_call(choice, allowed):
    """One call to a tool in `allowed`, arguments valid for its schema; returns its name."""
    return check_calls(choice, allowed)[0]


@pytest.fixture(scope="module")
def base(smollm2):
    with server(smollm2) as url:  # the fast kernels: no golden is compared here
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none")


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_required_calls_an_offered_tool(client, i):
    r = client.chat.completions.create(model="default_model", messages=[{"role": "user", "content": PROMPTS[i]}],
                                       tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0.7, seed=i,
                                       parallel_tool_calls=False)
    check_call(r.choices[0], SCHEMAS)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_named_function_calls_that_tool(client, name):
    for i in range(2):
        r = client.chat.completions.create(
            model="default_model", messages=[{"role": "user", "content": PROMPTS[i]}], tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": name}}, max_tokens=120, temperature=0.9, seed=i,
            parallel_tool_calls=False)
        assert check_call(r.choices[0], {name}) == name


def test_required_streaming(client):
    chunks = list(client.chat.completions.create(
        model="default_model", messages=[{"role": "user", "content": PROMPTS[0]}], tools=TOOLS,
        tool_choice="required", max_tokens=120, stream=True, parallel_tool_calls=False))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name in SCHEMAS
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[calls[0].function.name])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_auto_is_unchanged(client):
    """auto is what a request without tool_choice gets, to the byte of every choice."""
    body = dict(model="default_model", messages=[{"role": "user", "content": PROMPTS[0]}], tools=TOOLS,
                max_tokens=40)
    plain = client.chat.completions.with_raw_response.create(**body).http_response.json()
    auto = client.chat.completions.with_raw_response.create(**body, tool_choice="auto").http_response.json()
    assert json.dumps(auto["choices"]) == json.dumps(plain["choices"])
    assert auto["usage"] == plain["usage"]


def test_none_leaves_the_tools_out(client):
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    none = client.chat.completions.create(model="default_model", messages=msgs, tools=TOOLS, tool_choice="none",
                                          max_tokens=40)
    bare = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=40)
    assert none.choices[0].message.content == bare.choices[0].message.content
    assert none.choices[0].message.tool_calls is None
    assert none.usage.prompt_tokens == bare.usage.prompt_tokens


def test_responses_forced(client):
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    for choice, allowed in (("required", set(SCHEMAS)), ({"type": "function", "name": "add"}, {"add"})):
        r = client.responses.create(model="default_model", input=PROMPTS[1], tools=tools, tool_choice=choice,
                                    max_output_tokens=120, parallel_tool_calls=False)
        assert r.parallel_tool_calls is False
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name in allowed, r.output
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])


def test_anthropic_forced(base):
    a = anthropic.Anthropic(base_url=base, api_key="none")
    tools = [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()]
    for choice, allowed in (({"type": "any"}, set(SCHEMAS)), ({"type": "tool", "name": "search"}, {"search"})):
        choice = dict(choice, disable_parallel_tool_use=True)
        m = a.messages.create(model="local", max_tokens=120, tools=tools, tool_choice=choice,
                              messages=[{"role": "user", "content": PROMPTS[2]}])
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name in allowed, m.content
        jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])


def test_forced_streams_on_responses_and_anthropic(base):
    """The streamed forms carry the same one call (Responses function_call item, Anthropic
    tool_use block with its input_json_delta)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    events = list(c.responses.create(model="default_model", input=PROMPTS[0], tools=tools, stream=True,
                                     tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120,
                                     parallel_tool_calls=False))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert len(done) == 1 and done[0].name == "get_weather"
    jsonschema.validate(json.loads(done[0].arguments), WEATHER)
    a = anthropic.Anthropic(base_url=base, api_key="none")
    with a.messages.stream(model="local", max_tokens=120, tools=[{"name": "add", "input_schema": ADD}],
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           messages=[{"role": "user", "content": PROMPTS[1]}]) as s:
        m = s.get_final_message()
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "add"
    jsonschema.validate(uses[0].input, ADD)


@pytest.mark.parametrize("extra,field,needle", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "no tool named 'nope'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice", "an object must be"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "'auto', 'none', 'required'"),
    ({"tools": TOOLS, "tool_choice": 3}, "tool_choice", "an object must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs a non-empty 'tools'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"uniqueItems": True}}}],
      "tool_choice": "required"}, "tools", "tools[0].function.parameters: json schema: keyword 'uniqueItems'"),
])
def test_bad_tool_choice_is_400(client, extra, field, needle):
    with pytest.raises(openai.BadRequestError) as ex:
        client.chat.completions.create(model="default_model", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}], extra_body=extra)
    assert ex.value.body["param"] == field
    assert needle in ex.value.body["message"], ex.value.body["message"]


def test_parallel_calls_on_by_default(client, base):
    """parallel_tool_calls true (OpenAI's default) or absent: one or more calls, each to an
    offered tool with valid arguments; Responses echo the value; Anthropic the same."""
    for i, extra in enumerate([{}, {"parallel_tool_calls": True}, {}, {"parallel_tool_calls": True}]):
        r = client.chat.completions.create(model="default_model", messages=[{"role": "user", "content": PROMPTS[i]}],
                                           tools=TOOLS, tool_choice="required", max_tokens=300, temperature=0.7,
                                           seed=i, extra_body=extra)
        check_calls(r.choices[0], SCHEMAS, single=False)
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    r = client.responses.create(model="default_model", input=PROMPTS[0], tools=tools, tool_choice="required",
                                max_output_tokens=300)
    assert r.parallel_tool_calls is True
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    a = anthropic.Anthropic(base_url=base, api_key="none")
    m = a.messages.create(model="local", max_tokens=300, tools=[{"name": n, "input_schema": s} for n, s in
                                                                 SCHEMAS.items()],
                          tool_choice={"type": "any"}, messages=[{"role": "user", "content": PROMPTS[2]}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason in ("tool_use", "max_tokens") and uses, m.content
    for u in uses:
        jsonschema.validate(u.input, SCHEMAS[u.name])


@pytest.mark.parametrize("extra,field,needle", [
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls", "must be a boolean"),
    ({"parallel_tool_calls": [True]}, "parallel_tool_calls", "must be a boolean"),
])
def test_bad_parallel_tool_calls_is_400(client, extra, field, needle):
    with pytest.raises(openai.BadRequestError) as ex:
        client.chat.completions.create(model="default_model", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                                       extra_body=dict(extra, tools=TOOLS, tool_choice="required"))
    assert ex.value.body["param"] == field and needle in ex.value.body["message"], ex.value.body
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    with pytest.raises(openai.BadRequestError) as ex:
        client.responses.create(model="default_model", max_output_tokens=5, input="hi",
                                extra_body=dict(extra, tools=tools, tool_choice="required"))
    assert needle in str(ex.value) and field in str(ex.value), ex.value


def test_anthropic_bad_disable_parallel_is_400(base):
    a = anthropic.Anthropic(base_url=base, api_key="none")
    with pytest.raises(anthropic.BadRequestError) as ex:
        a.messages.create(model="local", max_tokens=5, tools=[{"name": "f", "input_schema": ADD}],
                          tool_choice={"type": "any", "disable_parallel_tool_use": "yes"},
                          messages=[{"role": "user", "content": "hi"}])
    assert "disable_parallel_tool_use" in str(ex.value)


def test_anthropic_unknown_tool_is_400(base):
    a = anthropic.Anthropic(base_url=base, api_key="none")
    with pytest.raises(anthropic.BadRequestError) as ex:
        a.messages.create(model="local", max_tokens=5, tools=[{"name": "f", "input_schema": ADD}],
                          tool_choice={"type": "tool", "name": "g"}, messages=[{"role": "user", "content": "hi"}])
    assert "no tool named 'g'" in str(ex.value)


# ---- tiny random-weight models, one per template family -----------------------------------

# family -> the marker its forced call opens with; Llama 3's <|python_tag|> is a special
# token, which the call must use as that one token (never its text spelled out)
FAMILIES = {"qwen3-f32": "<tool_call>", "llama-f32": "<|python_tag|>", "gemma3-f32": "<tool_call>"}
SPECIAL_MARKER = {"llama-f32"}
QWEN35_TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "parity" / "templates" / "Qwen-Qwen3.5-4B.jinja"
PYTHONIC_TEMPLATE = pathlib.Path(__file__).resolve().parent / "templates" / "pythonic-minimal.jinja"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny_family_forced_call(family):
    """Random weights write anything they may: the grammar alone makes every call valid."""
    model = TINY / family
    if not model.exists():
        pytest.fail(f"{model} missing: run tools/make_tiny_models.py")
    with server(model) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none")
        names = set()
        for seed in range(4):
            r = c.chat.completions.create(model="default_model", messages=[{"role": "user", "content": "hi"}],
                                          tools=TOOLS, tool_choice="required", max_tokens=300, temperature=1.0,
                                          seed=seed, logprobs=True, top_logprobs=1, parallel_tool_calls=False)
            names.add(check_call(r.choices[0], SCHEMAS))
            if family in SPECIAL_MARKER:
                assert r.choices[0].logprobs.content[0].token == FAMILIES[family]
            r = c.chat.completions.create(
                model="default_model", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=300, temperature=1.0,
                seed=seed, parallel_tool_calls=False)
            check_call(r.choices[0], {"add"})


def forced_rounds(base, model, named, seeds=6, **extra):
    """Per seed at temperature 1: a "required" call and one forced to `named`, both checked
    (check_call); returns each named call's tokens (special ones as their text) and the
    text they decode to with the model's tokenizer (an oracle of its own)."""
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    tok = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    names, out = set(), []
    for seed in range(seeds):
        msgs = [{"role": "user", "content": "hi"}]
        r = c.chat.completions.create(model="default_model", messages=msgs, tools=TOOLS, tool_choice="required",
                                      max_tokens=400, temperature=1.0, seed=seed, extra_body=extra,
                                      parallel_tool_calls=False)
        names.add(check_call(r.choices[0], SCHEMAS))
        r = c.chat.completions.create(model="default_model", messages=msgs, tools=TOOLS,
                                      tool_choice={"type": "function", "function": {"name": named}},
                                      max_tokens=400, temperature=1.0, seed=seed, logprobs=True, top_logprobs=1,
                                      extra_body=extra, parallel_tool_calls=False)
        check_call(r.choices[0], {named})
        toks = [t.token for t in r.choices[0].logprobs.content]
        out.append((toks, tok.decode([tok.token_to_id(t) for t in toks], skip_special_tokens=False)))
    return names, out


def anthropic_forced_add(base):
    a = anthropic.Anthropic(base_url=base, api_key="none")
    m = a.messages.create(model="local", max_tokens=400, tools=[{"name": "add", "input_schema": ADD}],
                          tool_choice={"type": "any", "disable_parallel_tool_use": True},
                          messages=[{"role": "user", "content": "hi"}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "add", m.content
    jsonschema.validate(uses[0].input, ADD)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    """The tiny qwen3_5 model with Qwen3.5's own chat template, from which hearth infers
    the qwen3_coder tool format as it does for a real Qwen3.5 repo."""
    return with_template(TINY / "qwen3_5-f32", QWEN35_TEMPLATE, tmp_path_factory.mktemp("qwen35_forced") / "model")


@pytest.mark.parametrize("thinking", [False, True])
def test_tiny_qwen3_coder_forced_call(qwen35, thinking):
    """qwen3_coder markup (<function=f><parameter=p> with raw string values): the raw
    output is that form, and its parsed call, through the SDK, validates."""
    with server(qwen35) as base:
        names, calls = forced_rounds(base, qwen35, "get_weather",
                                     chat_template_kwargs={"enable_thinking": thinking})
        for _, text in calls:
            assert text.startswith("<tool_call>\n<function=get_weather>\n<parameter=city>\n"), text
            for eos in ("<|endoftext|>", "<|im_end|>"):  # the end of turn the grammar allows last
                text = text.removesuffix(eos)
            assert text.endswith("\n</parameter>\n</function>\n</tool_call>"), text
        assert len(names) > 1, names
        anthropic_forced_add(base)


@pytest.fixture(scope="module")
def pythonic(tmp_path_factory):
    """The tiny llama model with a minimal LFM2-style template (tests/api/templates), from
    which hearth infers the pythonic tool format."""
    return with_template(TINY / "llama-f32", PYTHONIC_TEMPLATE, tmp_path_factory.mktemp("pythonic_forced") / "model")


def test_tiny_pythonic_forced_call(pythonic):
    """pythonic markup (<|tool_call_start|>[f(a=1, b="x")]<|tool_call_end|>, Python literals):
    every forced call, through the SDKs, validates; the raw output is that form."""
    with server(pythonic) as base:
        _, calls = forced_rounds(base, pythonic, "search")
        for _, text in calls:
            assert text.startswith("<|tool_call_start|>[search(query="), text
            assert ")]<|tool_call_end|>" in text and text.endswith(("<|tool_call_end|>", "<|eot_id|>")), text
        anthropic_forced_add(base)


def test_tiny_gemma4_forced_call():
    """Gemma 4's own call syntax (<|tool_call>call:f{a:1,b:<|"|>x<|"|>}<tool_call|>, the
    delimiter a special token): every forced call, through the SDKs, validates."""
    model = TINY / "gemma4-f32"
    if not model.exists():
        pytest.fail(f"{model} missing: run tools/make_tiny_models.py")
    with server(model) as base:
        _, calls = forced_rounds(base, model, "get_weather")
        for toks, text in calls:
            assert toks[0] == "<|tool_call>" and '<|"|>' in toks, toks  # special tokens, not spelled out
            assert text.startswith('<|tool_call>call:get_weather{city:<|"|>'), text
            assert "}<tool_call|>" in text, text
        anthropic_forced_add(base)


# two hermes calls, forced as text by a regex (tool_choice "auto": the model's own choice)
TWO_CALLS = ('<tool_call>\\n\\{"name": "add", "arguments": \\{"a": 1, "b": 2\\}\\}\\n</tool_call>\\n'
             '<tool_call>\\n\\{"name": "add", "arguments": \\{"a": 3, "b": 4\\}\\}\\n</tool_call>')


@pytest.fixture(scope="module")
def tiny_qwen3():
    model = TINY / "qwen3-f32"
    if not model.exists():
        pytest.fail(f"{model} missing: run tools/make_tiny_models.py")
    with server(model) as base:
        yield model, base


def test_auto_single_call_stops_after_the_first(tiny_qwen3):
    """tool_choice "auto" with parallel calls off: the generation ends where the model's first
    call ends, so the second call it was about to write (the regex makes it write two) is
    never generated: finish_reason "tool_calls" with one call, and fewer completion tokens
    than with parallel calls on, where both come back (chat, streamed chat, Responses,
    streamed Responses)."""
    _, base = tiny_qwen3
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    msgs = [{"role": "user", "content": "add twice"}]
    rtools = [{"type": "function", "name": n_, "parameters": s_} for n_, s_ in SCHEMAS.items()]
    used = {}
    for parallel, n in ((True, 2), (False, 1)):
        r = c.chat.completions.create(model="default_model", messages=msgs, tools=TOOLS, max_tokens=200,
                                      parallel_tool_calls=parallel, extra_body={"regex": TWO_CALLS})
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == n, r.choices[0]
        assert [json.loads(x.function.arguments) for x in calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}][:n]
        assert not (r.choices[0].message.content or "").strip(), r.choices[0].message
        used["chat", parallel] = r.usage.completion_tokens
        chunks = list(c.chat.completions.create(model="default_model", messages=msgs, tools=TOOLS, max_tokens=200,
                                                stream=True, parallel_tool_calls=parallel,
                                                stream_options={"include_usage": True},
                                                extra_body={"regex": TWO_CALLS}))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        assert [d.index for d in deltas] == list(range(n)), deltas
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
        used["stream", parallel] = chunks[-1].usage.completion_tokens
        for stream in (False, True):
            r = c.responses.create(model="default_model", input="add twice", tools=rtools, max_output_tokens=200,
                                   parallel_tool_calls=parallel, extra_body={"regex": TWO_CALLS}, stream=stream)
            if stream:
                r = [e for e in r if e.type == "response.completed"][0].response
            assert r.parallel_tool_calls is parallel and r.status == "completed", r
            assert len([o for o in r.output if o.type == "function_call"]) == n, r.output
            used["responses", stream, parallel] = r.usage.output_tokens
    # the same forced text may take other token splits from one request to the next, but
    # the second call (a newline and its <tool_call> block) is at least 30 tokens of this
    # vocabulary however it is split (a shortest-split search over the vocabulary's byte
    # strings): none of them is generated
    for k in used:
        if k[-1] is False:
            assert used[k] + 30 <= used[k[:-1] + (True,)], used


PYTHONIC_TWO = ('<\\|tool_call_start\\|>\\[add\\(a=1, b=2\\)\\]<\\|tool_call_end\\|>'
                '<\\|tool_call_start\\|>\\[add\\(a=3, b=4\\)\\]<\\|tool_call_end\\|>')


def test_auto_single_call_stops_pythonic(pythonic):
    """The same on the pythonic format (markers <|tool_call_start|> / <|tool_call_end|>,
    plain text in the tiny Llama's vocabulary, so the regex can make it write two blocks)."""
    with server(pythonic) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none")
        used = {}
        for parallel, n in ((True, 2), (False, 1)):
            r = c.chat.completions.create(model="default_model", messages=[{"role": "user", "content": "add"}],
                                          tools=TOOLS, max_tokens=200, parallel_tool_calls=parallel,
                                          extra_body={"regex": PYTHONIC_TWO})
            calls = r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "tool_calls" and len(calls) == n, r.choices[0]
            assert [json.loads(x.function.arguments) for x in calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}][:n]
            used[parallel] = r.usage.completion_tokens
        # the second block is at least 41 tokens of the tiny Llama's 608-entry vocabulary
        # however it is split (a shortest-split search over its byte strings)
        assert used[False] + 41 <= used[True], used


def test_anthropic_auto_single_call_stops_after_the_first(tiny_qwen3):
    """Anthropic's disable_parallel_tool_use with tool_choice auto: one tool_use block,
    stop_reason "tool_use", fewer output tokens than with parallel use allowed (streaming
    and not); the regex field (llama-server's, on every API) makes the model write two."""
    _, base = tiny_qwen3
    c = anthropic.Anthropic(base_url=base, api_key="none")
    tools = [{"name": n_, "input_schema": s_} for n_, s_ in SCHEMAS.items()]
    used = {}
    for disable, n in ((False, 2), (True, 1)):
        kw = dict(model="default_model", max_tokens=200, tools=tools,
                  messages=[{"role": "user", "content": "add twice"}],
                  tool_choice={"type": "auto", "disable_parallel_tool_use": disable},
                  extra_body={"regex": TWO_CALLS})
        m = c.messages.create(**kw)
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and len(uses) == n, m
        assert [u.input for u in uses] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}][:n]
        used["messages", disable] = m.usage.output_tokens
        with c.messages.stream(**kw) as st:
            final = st.get_final_message()
        assert final.stop_reason == "tool_use" and len([b for b in final.content if b.type == "tool_use"]) == n
        used["stream", disable] = final.usage.output_tokens
    for api in ("messages", "stream"):
        assert used[api, True] + 30 <= used[api, False], used


def test_anthropic_bad_regex_is_400(tiny_qwen3):
    _, base = tiny_qwen3
    c = anthropic.Anthropic(base_url=base, api_key="none")
    with pytest.raises(anthropic.BadRequestError) as ex:
        c.messages.create(model="default_model", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                          extra_body={"regex": "(a"})
    assert "regex" in str(ex.value)


@pytest.mark.parametrize("family", ["qwen3-f32", "llama-f32", "gemma4-f32", "qwen35"])
def test_tiny_forced_parallel_calls(family, request):
    """Forced calls with parallel calls on, random weights at temperature 1: every call of
    every finished turn validates and some turn has more than one, in the family's list
    form: one <tool_call> each for hermes and qwen3_coder, ';'-separated after one
    <|python_tag|> for Llama 3, one <|tool_call> each for Gemma 4 (with parallel calls off
    every turn has exactly one: the tests above). The pythonic tiny model writes the same
    single call at every seed, so its [f(..), g(..)] list is checked by the unit walks
    (tests/unit/test_tool_choice.c)."""
    model = request.getfixturevalue(family) if family == "qwen35" else TINY / family
    if not model.exists():
        pytest.fail(f"{model} missing: run tools/make_tiny_models.py")
    with server(model) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none")
        most, finished = 0, 0
        for seed in range(8):
            r = c.chat.completions.create(model="default_model", messages=[{"role": "user", "content": "hi"}],
                                          tools=TOOLS, tool_choice="required", max_tokens=1000, temperature=1.0,
                                          seed=seed)
            if r.choices[0].finish_reason == "length":
                continue  # a long list cut short: its last call is incomplete
            finished += 1
            most = max(most, len(check_calls(r.choices[0], SCHEMAS, single=False)))
        assert finished >= 4 and most >= 2, (finished, most)
