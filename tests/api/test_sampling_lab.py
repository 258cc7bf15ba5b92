"""The sampling lab over HTTP against `hearth serve` with the default model: the `curve`
field on chat, completions, Responses and Anthropic requests (through the official openai
and anthropic SDKs' extra_body), the identity curve drawing exactly what temperature 1
draws with the same seed, XTC actually applied (checked against the request's own
logprobs: whenever two or more tokens are above the threshold, the chosen one is never a
more likely one than the least of them), `hlg`, POST /signal (80 bins that count the
vocabulary, the top token's bin agreeing with the logprobs API), POST /generate (shapes,
modes, the default recipe) and bad input answered with a 400 in OpenAI's error shape (the
Anthropic shape on /v1/messages). A missing binary, model or SDK fails, never skips."""
import json
import math
import subprocess

import pytest

from conftest import BIN, server
from test_server_basic import assert_error, post

import anthropic
import openai

IDENTITY = {"space": "logprob", "points": [{"x_pct": 1e-4, "y_pct": 1e-4}, {"x_pct": 1, "y_pct": 1},
                                            {"x_pct": 100, "y_pct": 100}]}
SHARP = {"space": "logprob", "points": [{"x_pct": 1e-4, "y_pct": 1e-7}, {"x_pct": 10, "y_pct": 3},
                                         {"x_pct": 100, "y_pct": 100}]}
STORY = [{"role": "user", "content": "Tell me a short story about a fox."}]
EXEMPT_TEXT = {"\u010a", "<|im_end|>", "<|endoftext|>"}  # SmolLM2's "\n" token and EOS ids


@pytest.fixture(scope="module")
def base(smollm2):
    with server(smollm2, "--threads", "2") as b:
        yield b


def chat(base, **extra):
    status, _, body = post(base, "/v1/chat/completions", dict({"messages": STORY, "max_tokens": 24}, **extra))
    assert status == 200, body
    return body


def test_identity_curve_is_temperature_one(base):
    for seed in (1, 2, 3):
        chat(base, temperature=1.0, seed=seed)  # warm the prefix cache: both below see the same state
        t1 = chat(base, temperature=1.0, seed=seed)["choices"][0]["message"]["content"]
        cv = chat(base, curve=IDENTITY, seed=seed)["choices"][0]["message"]["content"]
        assert t1 == cv, (seed, t1, cv)
    # a curve that is not the identity samples differently for at least one seed
    differs = [chat(base, curve=SHARP, seed=s)["choices"][0]["message"]["content"] !=
               chat(base, temperature=1.0, seed=s)["choices"][0]["message"]["content"] for s in (1, 2, 3)]
    assert any(differs)


def test_xtc_applied(base):
    checked = 0
    for seed in range(4):
        body = chat(base, temperature=1.0, seed=seed, xtc_probability=1.0, xtc_threshold=0.1, logprobs=True,
                    top_logprobs=10, max_tokens=40)
        for step in body["choices"][0]["logprobs"]["content"]:
            above = [t for t in step["top_logprobs"] if math.exp(t["logprob"]) > 0.1]
            if len(above) < 2:
                continue
            dropped = [t for t in above[:-1] if t["token"] not in EXEMPT_TEXT and t["logprob"] > above[-1]["logprob"]]
            assert step["id"] not in [t["id"] for t in dropped], step
            checked += 1
    assert checked >= 5, "too few steps with two tokens above the threshold: the test checked nothing"


def test_hlg_field(base):
    for hlg in (True, {"width": 2, "shoulder": 3, "toe": 5, "pivot_offset": 4}, {"gain": 2.0}, False):
        text = chat(base, temperature=0.8, seed=4, hlg=hlg)["choices"][0]["message"]["content"]
        assert text
    for bad in ({"width": -1}, {"bogus": 1}, 5, {"enabled": "yes"}):
        status, _, body = post(base, "/v1/chat/completions", {"messages": STORY, "hlg": bad})
        assert_error(status, body, 400)
        assert body["error"]["param"] == "hlg"


def test_hlg_flags():
    p = subprocess.run([str(BIN), "serve", "--hlg-sampling", "maybe"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--hlg-sampling" in p.stderr
    p = subprocess.run([str(BIN), "serve", "--hlg-width", "-2"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--hlg-width" in p.stderr


def test_curve_on_every_api_through_the_sdks(base):
    oa = openai.OpenAI(base_url=base + "/v1", api_key="none")
    r = oa.chat.completions.create(model="default_model", messages=STORY, max_tokens=12, seed=5,
                                   extra_body={"curve": SHARP})
    assert r.choices[0].message.content
    r = oa.completions.create(model="default_model", prompt="Once upon a time", max_tokens=12, seed=5,
                              extra_body={"curve": SHARP})
    assert r.choices[0].text
    r = oa.responses.create(model="default_model", input="Tell me about foxes.", max_output_tokens=12,
                            extra_body={"curve": SHARP, "hlg": True})
    assert r.output_text
    an = anthropic.Anthropic(base_url=base, api_key="none")
    m = an.messages.create(model="any", max_tokens=12, messages=STORY, extra_body={"curve": SHARP})
    assert m.content[0].text
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="default_model", messages=STORY, max_tokens=4,
                                   extra_body={"curve": {"points": [{"x_pct": 10, "y_pct": 50},
                                                                     {"x_pct": 50, "y_pct": 10}]}})
    assert "not monotone" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        oa.responses.create(model="default_model", input="hi", extra_body={"curve": {"points": []}})
    with pytest.raises(anthropic.BadRequestError) as e:
        an.messages.create(model="any", max_tokens=4, messages=STORY, extra_body={"curve": "steep"})
    assert "curve" in str(e.value)


def test_xtc_threshold_bound(base):
    status, _, body = post(base, "/v1/chat/completions",
                           {"messages": STORY, "xtc_probability": 0.5, "xtc_threshold": 0.7})
    assert_error(status, body, 400)
    assert body["error"]["param"] == "xtc_threshold"
    # XTC off: the threshold is only validated in [0, 1], as mlx_lm.server does
    chat(base, max_tokens=2, xtc_threshold=0.7)


def test_signal(base):
    status, headers, body = post(base, "/signal", {"prompt": "What is the capital of France?"})
    assert status == 200, body
    assert list(body) == ["bins", "vocab"] and len(body["bins"]) == 80 and body["vocab"] == 49152
    assert sum(body["bins"]) == body["vocab"]
    # the top token's log-probability (from the logprobs API, greedy) falls in the highest non-empty bin
    top = chat(base, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=1,
               temperature=0, logprobs=True, top_logprobs=1)["choices"][0]["logprobs"]["content"][0]["logprob"]
    lo = math.log(1e-6)
    want = min(79, int((top - lo) / -lo * 80))
    assert max(i for i, c in enumerate(body["bins"]) if c) == want, (top, body["bins"][-20:])


def test_generate(base):
    status, _, body = post(base, "/generate", {"prompt": "Write one sentence about the sea.", "curve": IDENTITY,
                                               "n": 4, "max_tokens": 16, "seed": 11})
    assert status == 200, body
    assert list(body) == ["mode", "n", "seed", "samples"] and body["mode"] == "curve"
    assert body["n"] == 4 and body["seed"] == 11 and len(body["samples"]) == 4
    for s in body["samples"]:
        assert list(s) == ["text", "junk"] and isinstance(s["junk"], bool)
    assert len({s["text"] for s in body["samples"]}) > 1  # seeds 11..14 differ
    status, _, body = post(base, "/generate", {"prompt": "Hi", "default": True, "curve": IDENTITY, "n": 2,
                                               "max_tokens": 4})
    assert status == 200, body
    assert body["mode"] == "default" and list(body["recipe"]) == ["temperature", "top_p", "top_k"]
    assert body["recipe"]["temperature"] > 0 and len(body["samples"]) == 2
    status, _, body = post(base, "/generate", {"prompt": "Hi", "max_tokens": 4})  # no curve: default, n 3
    assert status == 200 and body["mode"] == "default" and body["n"] == 3, body


@pytest.mark.parametrize("path,body,param", [
    ("/generate", {"curve": IDENTITY}, "prompt"),
    ("/generate", {"prompt": ""}, "prompt"),
    ("/generate", {"prompt": "a", "n": 9}, "n"),
    ("/generate", {"prompt": "a", "n": 0}, "n"),
    ("/generate", {"prompt": "a", "max_tokens": 257}, "max_tokens"),
    ("/generate", {"prompt": "a", "seed": "x"}, "seed"),
    ("/generate", {"prompt": "a", "default": "yes"}, "default"),
    ("/generate", {"prompt": "a", "curve": {"space": "prob", "points": IDENTITY["points"]}}, "curve"),
    ("/generate", {"prompt": "a", "curve": {"points": [{"x_pct": 10, "y_pct": 10}]}}, "curve"),
    ("/generate", {"prompt": "a", "curve": {"points": [{"x_pct": 10, "y_pct": 10}, {"x_pct": 10, "y_pct": 20}]}},
     "curve"),
    ("/generate", {"prompt": "a", "curve": {"points": [{"x_pct": 10, "y_pct": 10}, {"x_pct": 200, "y_pct": 20}]}},
     "curve"),
    ("/generate", {"prompt": "a", "curve": {"points": [{"x_pct": 10}, {"x_pct": 20, "y_pct": 20}]}}, "curve"),
    ("/signal", {}, "prompt"),
    ("/signal", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "a", "curve": [1, 2]}, "curve"),
])
def test_bad_input(base, path, body, param):
    status, _, reply = post(base, path, body)
    assert_error(status, reply, 400)
    assert reply["error"]["param"] == param, reply


def test_bad_json(base):
    for path in ("/generate", "/signal"):
        status, _, reply = post(base, path, None, raw=b"{not json")
        assert_error(status, reply, 400)
        status, _, reply = post(base, path, None, raw=b"[1, 2]")
        assert_error(status, reply, 400)
