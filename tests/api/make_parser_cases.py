"""Records what mlx-lm does with fixed model outputs, as the oracle for hearth's
src/server/textstate.c and toolparse.c (tests/api/test_parsers.py replays them).

For each case the decoded text arrives in chunks (one per generated token) and goes
through mlx-lm's own TextStateMachine (mlx_lm.generate.make_text_state_machine), its
tool parsers (mlx_lm.tool_parsers.*) and ToolCallFormatter (mlx_lm.server), driven by
the same per-token loop as mlx_lm.server's handle_completion (0.32.2). The loop is
restated here because upstream only runs it inside an HTTP handler.

Run:  .venv/bin/python tests/api/make_parser_cases.py   (writes tests/api/parser_cases.json)
"""

import importlib
import json
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import mlx_lm
from mlx_lm.generate import TextStateMachine, make_text_state_machine
from mlx_lm.server import ToolCallFormatter
from mlx_lm.tokenizer_utils import _infer_thinking, _infer_tool_parser

OUT = Path(__file__).with_name("parser_cases.json")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

THINK = ("<think>", "</think>")
WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "scale": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "raw": {},
                    "tags": {"description": "no type"},
                },
            },
        },
    }
]


def fake_tokenizer(think, tool):
    mod = importlib.import_module(f"mlx_lm.tool_parsers.{tool}") if tool else None
    return SimpleNamespace(
        has_thinking=think is not None,
        think_start=think[0] if think else None,
        think_end=think[1] if think else None,
        has_tool_calling=mod is not None,
        tool_call_start=mod.tool_call_start if mod else None,
        tool_call_end=mod.tool_call_end if mod else None,
        response_transitions={},
        structural_markers=(),
    ), (mod.parse_tool_call if mod else None)


def scrub(calls):
    """Random uuid4 ids cannot be compared; ids the model wrote can."""
    for c in calls:
        if UUID.match(c["id"]):
            c["id"] = "<uuid>"
    return calls


def run_case(case):
    tok, parser = fake_tokenizer(case.get("think"), case.get("tool"))
    sm = make_text_state_machine(tok, case.get("stops") or None)
    out = {}
    for streaming in (True, False):
        fmt = ToolCallFormatter(parser, case.get("tools"), streaming)

        def formatted(texts):
            try:
                return scrub(fmt(texts))
            except Exception as e:  # upstream lets these kill the request
                return {"crash": type(e).__name__}

        state = sm.make_state(case.get("initial", "normal"))
        prev_state = case.get("initial", "normal")
        text = reasoning = tool_text = ""
        tool_calls, events = [], []
        made_tool_call = False
        finish_reason = "stop"
        n = len(case["chunks"])
        for i, chunk in enumerate(case["chunks"]):
            fin = case["finish"] if i == n - 1 else None
            if fin == "stop":
                state, current = TextStateMachine.discard(state)
                segments = [(current, "")]
            elif fin == "length":
                state, segments = TextStateMachine.split(state, chunk)
                state, flushed, current = TextStateMachine.flush(state)
                segments.append((current, flushed))
            else:
                state, segments = TextStateMachine.split(state, chunk)
            for current, clean in segments:
                if current == "reasoning":
                    reasoning += clean
                elif current == "tool":
                    tool_text += clean
                elif current == "normal":
                    if prev_state == "tool":
                        tool_calls.append(tool_text)
                        tool_text = ""
                        made_tool_call = True
                    text += clean
                prev_state = current
            if streaming and current != "tool" and (text or tool_calls or reasoning):
                events.append(
                    {"content": text, "reasoning": reasoning, "tool_calls": formatted(tool_calls)}
                )
                text = reasoning = ""
                tool_calls = []
            if fin is not None:
                finish_reason = fin
        if prev_state == "tool" and tool_text:
            tool_calls.append(tool_text)
            made_tool_call = True
        if finish_reason == "stop" and made_tool_call:
            finish_reason = "tool_calls"
        final = {
            "content": text,
            "reasoning": reasoning,
            "tool_calls": formatted(tool_calls),
            "finish_reason": finish_reason,
        }
        if streaming:
            out["stream"] = events + [final]
        else:
            out["full"] = final
    return out


def fixed_cases():
    tc = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    c = []

    def add(name, chunks, finish="stop", think=THINK, tool="json_tools", **kw):
        c.append(dict(name=name, chunks=chunks, finish=finish, think=think, tool=tool, **kw))

    add("plain", ["Hello", " world", "<|im_end|>"])
    add("plain_length", ["Hello", " world"], "length")
    add("think_then_answer", ["<think>", "I reason", "</think>", "\n\nAnswer", "<|im_end|>"])
    add("markers_split", ["<thi", "nk>abc</th", "ink>done", "."], "length")
    add("initial_reasoning", ["thinking...", "</think>", "\n\nHi", ""], initial="reasoning")
    add("tool_call", ["Let me check.", "<tool_call>", tc[11:-12], "</tool_call>", "<|im_end|>"])
    add("tool_call_split", [tc[:5], tc[5:20], tc[20:-4], tc[-4:], ""])
    add("back_to_back", [tc, "\n", tc.replace("Paris", "Rome"), "<|im_end|>"])
    add("back_to_back_adjacent", [tc + tc.replace("Paris", "Oslo"), "x", ""])
    add("tool_in_reasoning", ["<think>hmm ", tc, " more</think>ok", ""])
    add("truncated_tool_length", ["<tool_call>", '\n{"name": "f", "argu'], "length")
    add("truncated_tool_stop", ["<tool_call>", '\n{"name": "f"', "<|im_end|>"])
    add("empty_tool", ["<tool_call></tool_call>after", ""])
    add("json_list", ['<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, 2.5]}}]</tool_call>', ""])
    add("json_extra_keys", ['<tool_call>{"arguments": {"k": null}, "name": "f", "id": "call_7"}</tool_call>', ""])
    add("json_zero_id", ['<tool_call>{"name": "f", "arguments": {}, "id": ""}</tool_call>', ""])
    add("json_unicode_floats", ['<tool_call>{"name": "f", "arguments": {"t": 0.1, "big": 1e20, "small": 1e-7, "one": 1.0, "s": "h\u00e9llo \u65e5\u672c \U0001F600", "c": "a\\tb\\u0001\\u007f"}}</tool_call>', ""])
    add("json_not_object", ["<tool_call>42</tool_call>", ""])
    add("json_missing_arguments", ['<tool_call>{"name": "f"}</tool_call>', ""])
    add("json_bad", ["<tool_call>{not json}</tool_call>done", ""])
    add("stop_string", ["abc E", "ND more", ""], stops=["END"])
    add("stop_partial_length", ["abc EN"], "length", stops=["END"])
    add("stop_partial_discard", ["abc EN", "<|im_end|>"], stops=["END"])
    add("stop_in_reasoning", ["<think>a STOP b</think>c STOP", ""], stops=["STOP"])
    add("stop_prefix_of_marker", ["<think>x</think>y", ""], stops=["</"])
    add("stops_overlap", ["xabcx", "bcd", ""], stops=["abc", "bc", "b"])
    add("stop_equals_marker", ["<think>a</think>b", ""], stops=["<think>"])
    add("unicode", ["h\u00e9llo <think>\u65e5\u672c</think>\U0001F600", "\u00e9", ""])
    add("empty_chunks", ["", "", "<think>", "", "x", "", "</think>", "", "y", ""])
    add("not_a_marker", ["<tool", "s are <thin", "gs>", " <tool_cal", "l_x>"], "length")
    add("no_think_model", ["<think>raw</think>", ""], think=None)
    add("no_tool_model", [tc, ""], tool=None)
    add("nothing", ["<think>a</think>", tc], think=None, tool=None, stops=["a"])
    # mistral: no end marker, the tool section lasts to the end of the output
    add("mistral_headers", ["Sure", "[TOOL_CALLS]", 'get_weather[ARGS]{"city": "Paris"}', 'other-fn [ARGS] {"a": [1, {"b": null}]}', "</s>"], think=None, tool="mistral")
    add("mistral_json", ['[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abc123xyz"}, {"name": "g", "arguments": "{\\"y\\": 2}"}]', ""], think=None, tool="mistral")
    add("mistral_truncated", ["[TOOL_CALLS]", 'f[ARGS]{"x": '], "length", think=None, tool="mistral")
    add("mistral_truncated_stop", ["[TOOL_CALLS]", 'f[ARGS]{"x": ', "</s>"], think=None, tool="mistral")
    add("mistral_json_bad_item", ['[TOOL_CALLS][{"name": 5}]', ""], think=None, tool="mistral")
    add("mistral_then_text", ["a[TOOL", "_CALLS]", "f[ARGS]{}", " trailing", ""], think=None, tool="mistral")
    # pythonic (LFM2 style)
    pt = "<|tool_call_start|>{}<|tool_call_end|>"
    add("pythonic", [pt.format('[get_weather(city="Paris", days=3), pkg.other(flag=true, xs=[1, 2.5, None], d={"k": (1,)})]'), "done", ""], think=None, tool="pythonic")
    add("pythonic_fallback", [pt.format('[f(a=x, b="y", c=\'z\', d= 4 , e=[1,2])]'), ""], think=None, tool="pythonic")
    add("pythonic_strings", [pt.format("[f(a='it\\'s', b=\"\\u00e9\\n\", c=r'\\d', d='x' 'y', e=-1.5e3, f=0x1F)]"), ""], think=None, tool="pythonic")
    add("pythonic_positional", [pt.format("[f(1, a=2)]"), ""], think=None, tool="pythonic")
    add("pythonic_garbage", [pt.format("no call here"), ""], think=None, tool="pythonic")
    add("pythonic_split", ["<|tool_call", "_start|>[f(", "a=1)]<|tool_", "call_end|>x", ""], think=None, tool="pythonic")
    # qwen3_coder (XML-ish), typed by the request's tools
    qc = "<tool_call>\n<function=get_weather>\n{}</function>\n</tool_call>"
    params = (
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=scale>\n2.0\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
        '<parameter=opts>\n{"a": [1, 2]}\n</parameter>\n<parameter=raw>\n[1, 2]\n</parameter>\n'
        "<parameter=tags>\n{'x': 1}\n</parameter>\n<parameter=extra>\nnull\n</parameter>\n"
    )
    add("qwen3_coder", [qc.format(params), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen3_coder_no_tools", [qc.format(params), ""], tool="qwen3_coder")
    add("qwen3_coder_bad_int", [qc.format("<parameter=days>\n3.5\n</parameter>\n"), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen3_coder_float_int", [qc.format("<parameter=scale>\n7\n</parameter>\n<parameter=days>\n 1_0 \n</parameter>\n"), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen3_coder_two", [qc.format("<parameter=city>\nA\n</parameter>\n") + "\n" + qc.format(""), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen3_coder_trailing", ["<tool_call>\n<function=f>\n</function>\n\n</tool_call>", ""], tool="qwen3_coder")
    add("qwen3_coder_no_function", ["<tool_call>\nhello\n</tool_call>", ""], tool="qwen3_coder")
    # Qwen3.5 (its template ends the prompt with "<think>\n", so the output starts in
    # reasoning; calls follow the thinking, one <function=...> per <tool_call>)
    q35 = "<tool_call>\n<function={}>\n{}</function>\n</tool_call>"
    p = "<parameter={}>\n{}\n</parameter>\n"
    add("qwen35_think_then_call", ["The user wants", " weather.\n", "</think>", "\n\n",
                                   q35.format("get_weather", p.format("city", "New York") + p.format("days", "5")), ""],
        initial="reasoning", tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_split_markers", ["ok</th", "ink>\n\nLet me look.\n\n<tool_", "call>\n<func", "tion=get_weather>\n<param",
                                 "eter=city>\nPar", "is\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n</fun",
                                 "ction>\n</tool", "_call>", ""],
        initial="reasoning", tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_parallel", ["</think>\n\n", q35.format("get_weather", p.format("city", "Oslo")), "\n",
                            q35.format("get_weather", p.format("city", "Rome") + p.format("scale", "-1.5e1")), ""],
        initial="reasoning", tool="qwen3_coder", tools=WEATHER_TOOLS)
    typed = (p.format("city", "line one\nline two\n") + p.format("days", "1e2") + p.format("scale", "0.25")
             + p.format("metric", "TRUE") + p.format("opts", '{"when": "now\nlater", "n": [1, {"k": null}]}')
             + p.format("raw", '{"a": "b\tc"}') + p.format("tags", "[1, 'two', (3, 4)]") + p.format("extra", "NULL")
             + p.format("unknown_param", "  kept as text  "))
    add("qwen35_typed_values", [q35.format("get_weather", typed), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_lax_json", [q35.format("get_weather", p.format("opts", '{"a": "x\\\ny", "b": "\t"}')
                                       + p.format("raw", '["\\\n"]')), ""], tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_unicode", [q35.format("get_weather", p.format("city", "Z\u00fcrich \u65e5\u672c \U0001F600")), ""],
        tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_truncated", ["</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPa"], "length",
        initial="reasoning", tool="qwen3_coder", tools=WEATHER_TOOLS)
    add("qwen35_no_params", ["</think>\n\n", q35.format("get_weather", ""), "<|im_end|>"],
        initial="reasoning", tool="qwen3_coder", tools=WEATHER_TOOLS)
    # minicpm5 (MiniCPM5-1B): <function name="f"><param name="p">v</param></function>, no wrapper,
    # CDATA for values with <, & or newlines, parallel calls as consecutive blocks; typed by schema
    typed_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "unit": {"enum": ["c", "f", 3]},
        "mixed": {"type": ["number", "string"]}, "odd": {"type": "tuple"}, "free": {}}}}}]
    mf = '<function name="get_weather">{}</function>'
    mp = '<param name="{}">{}</param>'
    add("minicpm5", ["Let me check.", mf.format(mp.format("city", "Paris") + mp.format("days", "3")), "<|im_end|>"],
        tool="minicpm5", tools=typed_tools)
    add("minicpm5_think_parallel", ["<think>", "two cities", "</think>", "\n",
                                    mf.format(mp.format("city", "Oslo")), "\n", mf.format(mp.format("city", "Rome")), ""],
        tool="minicpm5", tools=typed_tools)
    add("minicpm5_split", ["<func", "tion na", 'me="get_weather"><par', 'am name="days">', "1_0", "</param></fun",
                           "ction>done", ""], tool="minicpm5", tools=typed_tools)
    typed5 = (mp.format("city", "<![CDATA[a < b & c\nline 2  ]]>") + mp.format("days", " 42 ")
              + mp.format("scale", "2.50") + mp.format("metric", " Yes ") + mp.format("opts", '{"k": "v\nw"}')
              + mp.format("tags", "[1, 'two', None]") + mp.format("maybe", "None") + mp.format("unit", "3")
              + mp.format("mixed", "nan") + mp.format("odd", "[1, 2]") + mp.format("free", "  {\"a\": 1}  ")
              + mp.format("unknown", " 7 ") + mp.format("extra", "NULL"))
    add("minicpm5_typed", [mf.format(typed5), ""], tool="minicpm5", tools=typed_tools)
    typed5b = (mp.format("days", "3.5") + mp.format("scale", "4.0") + mp.format("metric", "maybe")
               + mp.format("maybe", "nil") + mp.format("unit", "c") + mp.format("odd", "bare words"))
    add("minicpm5_typed_fallbacks", [mf.format(typed5b), ""], tool="minicpm5", tools=typed_tools)
    add("minicpm5_quotes", ["<function name='f'><param name=x>1</param><param name = 'y' >2</param></function>",
                            "<function name=g >\n</function>", ""], tool="minicpm5")
    add("minicpm5_no_tools", [mf.format(mp.format("days", "3")), ""], tool="minicpm5")
    add("minicpm5_inf", [mf.format(mp.format("scale", "inf")), ""], tool="minicpm5", tools=typed_tools)
    add("minicpm5_truncated", ['<function name="get_weather"><param name="city">Pa'], "length",
        tool="minicpm5", tools=typed_tools)
    add("minicpm5_garbage", ["<function name=>oops</function>", ""], tool="minicpm5")
    add("minicpm5_unicode", [mf.format(mp.format("city", "Z\u00fcrich \u65e5\u672c \U0001F600")), ""],
        tool="minicpm5", tools=typed_tools)
    # gemma4: call:name{key:value} with <|"|>-delimited strings, thinking as <|channel>thought...<channel|>
    g4 = ("<|channel>thought", "<channel|>")
    gt = "<|tool_call>{}<tool_call|>"
    q = '<|"|>'
    add("gemma4", ["Checking.", gt.format(f"call:get_weather{{city:{q}Paris, {{FR}}{q},days:3,scale:2.5,metric:true,"
                                          f"opts:{{tags:[{q}a{q},{q}b{q}],n:null}}}}"), "<turn|>"],
        think=g4, tool="gemma4")
    add("gemma4_think_then_call", ["<|channel>", "thought", "plan it", "<channel|>", gt.format("call:f{}"), ""],
        think=g4, tool="gemma4")
    add("gemma4_two_calls", [gt.format(f"call:a{{x:1}}call:b-2{{y:{q}z{q}}}"), gt.format("call:c{}"), ""],
        think=g4, tool="gemma4")
    add("gemma4_split", ["<|tool_", "call>call:f{k:", f"{q}v}}{q}", "}<tool_", "call|>after", ""], think=g4, tool="gemma4")
    add("gemma4_strings", [gt.format(f"call:f{{s:{q}h\u00e9llo \"q\" \\ \n日{q},t:{q}{q}}}"), ""],
        think=g4, tool="gemma4")
    add("gemma4_nested", [gt.format("call:f{a:{b:{c:[1,{d:2}]}},e:-1e3}"), ""], think=g4, tool="gemma4")
    add("gemma4_garbage", [gt.format("no call here"), ""], think=g4, tool="gemma4")
    add("gemma4_bad_json", [gt.format("call:f{a b}"), ""], think=g4, tool="gemma4")
    add("gemma4_truncated", ["<|tool_call>", "call:f{a:"], "length", think=g4, tool="gemma4")
    return c


PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "STOP", "ST",
          "<", "</", "<tool", "think>", "hello", " ", "\n", "\u00e9", "\u65e5", "\U0001F600",
          '{"name": "f", "arguments": {"a": 1}}', "f[ARGS]{}", "x"]


def random_cases(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for k in range(n):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        chunks, last = [], 0
        for cut in cuts:
            chunks.append(text[last:cut])
            last = cut
        chunks.append(text[last:])
        finish = rng.choice(["stop", "length"])
        if finish == "stop":
            chunks.append("<eos>")
        tool = rng.choice(["json_tools", "mistral", None])
        out.append(dict(
            name=f"random_{k}", chunks=chunks, finish=finish,
            think=rng.choice([THINK, None]), tool=tool,
            stops=rng.choice([[], ["STOP"], ["ST", "STOP", "<"]]),
            initial=rng.choice(["normal", "reasoning"]),
        ))
        if out[-1]["think"] is None:
            out[-1]["initial"] = "normal"
    return out


def inference_cases():
    """mlx-lm's parser choice from the chat template text, and think markers from the vocab."""
    templates = {
        "qwen3": "{%- for tool in tools %}<tool_call>\\n{\"name\": {{ tool_call.name }}}</tool_call>",
        "qwen3_coder": "<tools>...<tool_call>\n<function={{ name }}>",
        "qwen3_coder_escaped": "<tool_call>\\n<function=x>",
        "mistral": "{{ '[TOOL_CALLS]' }}",
        "lfm2": "<|tool_list_start|>[...]",
        "lfm2_call": "<|tool_call_start|>",
        "kimi": "<|tool_calls_section_begin|>",
        "glm": "<arg_key>k</arg_key><tool_call>tool_call.name",
        "gemma4": "<|tool_call>x<tool_call|>",
        "function_gemma": "<start_function_call>",
        "longcat": "<longcat_tool_call>",
        "minimax": "<minimax:tool_call>[TOOL_CALLS]",
        "minicpm5": '<function name="x"><param name="y">',
        "muse": "<atem:function_calls>",
        "llama31": '{{- "<|python_tag|>" }}{"name": "' + "{{ tool_call.name }}" + '", "parameters": ',
        "tool_call_without_name": "<tool_call>",
        "none": "{{ messages }}",
    }
    vocabs = {
        "think": ["<think>", "</think>", "a"],
        "longcat": ["<longcat_think>", "</longcat_think>"],
        "think_colon": ["<|think:start|>", "<|think:end|>"],
        "half": ["<think>"],
        "none": ["a", "b"],
        "lfm_vocab": ["<|tool_call_start|>", "<|tool_call_end|>"],
    }
    cases = []
    for tname, t in templates.items():
        for vname, v in vocabs.items():
            vocab = {s: i for i, s in enumerate(v)}
            tok = SimpleNamespace(chat_template=t, get_vocab=lambda vocab=vocab: vocab)
            think = _infer_thinking(tok)
            cases.append({"template": t, "vocab": v, "tool": _infer_tool_parser(tok),
                          "think": list(think[:2]) if think[0] else None,
                          "name": f"{tname}/{vname}"})
    return cases


def main():
    cases = fixed_cases() + random_cases(150)
    for case in cases:
        case["expect"] = run_case(case)
    doc = {
        "generated_by": "tests/api/make_parser_cases.py with mlx-lm " + mlx_lm.__version__,
        "cases": cases,
        "inference": inference_cases(),
    }
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(cases)} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
