"""Differential tests: the real mlx_lm.server (PyPI mlx-lm, CPU, offline) and `hearth serve`
serve the same tiny random-weight model (qwen3-f32: float32 on both sides, so greedy tokens
must agree) and get the same requests; responses are compared field by field.

Binary: env HEARTH_BIN (default <repo>/bin/hearth). Model: env HEARTH_CACHE/tiny/qwen3-f32.
A missing binary or model fails the test with the command that fixes it.

Allowed differences, each with its reason (everything else must match):
- `id`, `created`, `system_fingerprint`: random or time/host dependent by nature (compared
  for presence, type and prefix only).
- tool_calls[].id: random uuid4.
- Error responses (issue 4, intended): hearth answers OpenAI-style
  {"error": {"message", "type", "param", "code"}} where upstream sends {"error": "<str>"},
  a plain "Not Found" body, or closes the connection without a response (validation
  errors). Status codes must match where upstream sends one; where upstream drops the
  connection hearth must answer 4xx.
- HTTP version / keep-alive / Content-Length framing (issue 4: hearth speaks HTTP/1.1 with
  keep-alive; upstream HTTP/1.0 closes after every response).
- `usage.prompt_tokens_details.cached_tokens` and the numbers in `: keepalive d/T`
  comments: they depend on each server's prompt-cache history (hearth's prefix cache
  is its own design), so only presence, type and the comment syntax are compared.
- Sampled tokens with temperature > 0: the two RNGs differ by design; only the response
  shape is compared. Greedy (temperature 0) tokens must match exactly.
- logprob values: float32 math in a different order; tolerance 1e-3 (absolute), ids exact.
- /v1/models listing (issue 4: hearth also lists models upstream's cache scan skips):
  only the shape is compared.
"""

import http.client
import json
import re

import pytest

from conftest import BIN, TINY, need, server, upstream_server

MODEL = TINY / "qwen3-f32"
LOGPROB_TOL = 1e-3  # float32 on both sides, different reduction orders


@pytest.fixture(scope="module")
def servers():
    need(MODEL, "tiny model", "run tools/make_tiny_models.py")
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    with upstream_server(MODEL) as up, server(MODEL) as hz:
        yield up, hz


def request(base, method, path, body=None, headers=None, raw=None):
    """Returns (status, headers dict lowercased, body bytes); status None if the server
    closed the connection without a response."""
    host = base.split("//")[1]
    conn = http.client.HTTPConnection(host, timeout=120)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Connection": "close"}
    if data is not None:
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        out = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, out
    except (http.client.RemoteDisconnected, ConnectionResetError, http.client.IncompleteRead):
        return None, {}, b""
    finally:
        conn.close()


def both(servers, method, path, body=None, **kw):
    return [request(b, method, path, body, **kw) for b in servers]


def shape(v):
    """Keys (in order) and types, recursively; lists by their first element."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()} | {"__order__": list(v)}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    if isinstance(v, bool) or v is None:
        return type(v).__name__
    if isinstance(v, (int, float)):
        return "number" if isinstance(v, float) else "int"
    return type(v).__name__


RANDOM_KEYS = ("id", "created", "system_fingerprint")


def strip_random(d):
    d = dict(d)
    for k in RANDOM_KEYS:
        assert k in d, f"missing {k}"
    assert isinstance(d["created"], int)
    assert re.match(r"^(chatcmpl|cmpl)-", d["id"]), d["id"]
    for k in RANDOM_KEYS:
        d.pop(k)
    if "usage" in d:
        d["usage"] = dict(d["usage"])
        det = d["usage"].pop("prompt_tokens_details", None)
        assert det is not None and isinstance(det.get("cached_tokens"), int) and det["cached_tokens"] >= 0
    return d


def assert_same_json(up, hz):
    assert shape(hz) == shape(up), f"shape differs:\n upstream={up}\n hearth={hz}"
    assert strip_random(hz) == strip_random(up)


def sse(body):
    """(data events as parsed JSON or '[DONE]', comment lines)."""
    events, comments = [], []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        if block.startswith(":"):
            comments.append(block)
        elif block.startswith("data: "):
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        else:
            raise AssertionError(f"unexpected SSE block {block!r}")
    return events, comments


CHAT = {"messages": [{"role": "user", "content": "Tell me a story about a cat."}], "max_tokens": 16,
        "temperature": 0}


def test_health_same_bytes(servers):
    (s1, _, b1), (s2, _, b2) = both(servers, "GET", "/health")
    assert s1 == s2 == 200
    assert b2 == b1


def test_chat_greedy(servers):
    (s1, h1, b1), (s2, h2, b2) = both(servers, "POST", "/v1/chat/completions", CHAT)
    assert s1 == s2 == 200
    assert h2["content-type"] == h1["content-type"] == "application/json"
    up, hz = json.loads(b1), json.loads(b2)
    assert hz["model"] == "default_model"
    assert_same_json(up, hz)


def test_chat_model_echo_and_max_completion_tokens(servers):
    body = dict(CHAT, model="default_model", max_tokens=3, max_completion_tokens=5)
    (s1, _, b1), (s2, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    assert s1 == s2 == 200
    up, hz = json.loads(b1), json.loads(b2)
    assert up["usage"]["completion_tokens"] == 5  # max_completion_tokens wins
    assert_same_json(up, hz)


def test_max_tokens_one(servers):
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=1))
    up, hz = json.loads(b1), json.loads(b2)
    assert up["choices"][0]["finish_reason"] == "length" and up["usage"]["completion_tokens"] == 1
    assert_same_json(up, hz)


def test_logprobs_token_parity(servers):
    body = dict(CHAT, logprobs=True, max_tokens=24)
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    up, hz = json.loads(b1), json.loads(b2)
    assert shape(hz) == shape(up)
    lu, lh = up["choices"][0]["logprobs"]["content"], hz["choices"][0]["logprobs"]["content"]
    assert [e["id"] for e in lh] == [e["id"] for e in lu], "greedy token ids differ"
    for a, b in zip(lu, lh):
        assert abs(a["logprob"] - b["logprob"]) < LOGPROB_TOL


def test_top_logprobs(servers):
    body = dict(CHAT, logprobs=True, top_logprobs=5, max_tokens=8)
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    up, hz = json.loads(b1), json.loads(b2)
    assert shape(hz) == shape(up)
    for a, b in zip(up["choices"][0]["logprobs"]["content"], hz["choices"][0]["logprobs"]["content"]):
        # argpartition order upstream is unspecified: compare the sets
        assert {t["id"] for t in b["top_logprobs"]} == {t["id"] for t in a["top_logprobs"]}
        assert set(a) == set(b) == {"id", "token", "logprob", "top_logprobs"}


def test_stream_matches_non_stream(servers):
    body = dict(CHAT, stream=True, stream_options={"include_usage": True})
    (s1, h1, b1), (s2, h2, b2) = both(servers, "POST", "/v1/chat/completions", body)
    assert s1 == s2 == 200
    assert h1["content-type"] == h2["content-type"] == "text/event-stream"
    (eu, cu), (eh, ch) = sse(b1), sse(b2)
    for c in cu + ch:
        assert re.fullmatch(r": keepalive \d+/\d+", c), c
    assert ch, "hearth sent no ': keepalive' comment"
    assert eh[-1] == eu[-1] == "[DONE]"
    assert len(eh) == len(eu), "number of SSE events differs"
    for a, b in zip(eu[:-1], eh[:-1]):
        assert_same_json(a, b)
    usage = eh[-2]
    assert usage["object"] == "chat.completion" and usage["choices"] == []


def test_text_completion(servers):
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/completions", body)
    up, hz = json.loads(b1), json.loads(b2)
    assert up["object"] == "text_completion"
    assert_same_json(up, hz)
    body["stream"] = True
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/completions", body)
    (eu, _), (eh, _) = sse(b1), sse(b2)
    assert len(eh) == len(eu)
    for a, b in zip(eu[:-1], eh[:-1]):
        assert_same_json(a, b)


def test_stop_strings(servers):
    _, _, b = request(servers[0], "POST", "/v1/chat/completions", dict(CHAT, max_tokens=24))
    text = json.loads(b)["choices"][0]["message"]["content"] or ""
    word = next((w for w in re.findall(r"[A-Za-z]{3,}", text)), None)
    stops = [s for s in (word, [word, "zzzq"], text[len(text) // 2: len(text) // 2 + 2]) if s]
    for stop in stops:
        body = dict(CHAT, max_tokens=24, stop=stop)
        (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
        assert strip_random(json.loads(b2)) == strip_random(json.loads(b1)), f"stop={stop!r}"
        body["stream"] = True
        (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
        (eu, _), (eh, _) = sse(b1), sse(b2)
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in eh[:-1]) == \
            "".join(e["choices"][0]["delta"].get("content", "") for e in eu[:-1])
        assert eh[-2]["choices"][0]["finish_reason"] == eu[-2]["choices"][0]["finish_reason"]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tools_request(servers):
    body = dict(CHAT, tools=TOOLS, max_tokens=20)
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    assert_same_json(json.loads(b1), json.loads(b2))  # same prompt tokens => tools templated alike


def test_logit_bias(servers):
    body = dict(CHAT, logit_bias={"100": 100.0}, max_tokens=4, logprobs=True)
    (_, _, b1), (_, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    up, hz = json.loads(b1), json.loads(b2)
    assert [e["id"] for e in up["choices"][0]["logprobs"]["content"]] == [100] * 4
    assert [e["id"] for e in hz["choices"][0]["logprobs"]["content"]] == [100] * 4


def test_seed_sampling_shape(servers):
    body = dict(CHAT, temperature=0.8, seed=7, max_tokens=8)
    (s1, _, b1), (s2, _, b2) = both(servers, "POST", "/v1/chat/completions", body)
    assert s1 == s2 == 200
    up, hz = json.loads(b1), json.loads(b2)
    assert shape(hz) == shape(up)  # tokens differ by design (RNG), shape must not
    _, _, b3 = request(servers[1], "POST", "/v1/chat/completions", body)
    assert json.loads(b3)["choices"] == hz["choices"], "same seed must give the same tokens"


def test_models_shape(servers):
    (s1, _, b1), (s2, _, b2) = both(servers, "GET", "/v1/models")
    assert s1 == s2 == 200
    hz = json.loads(b2)
    # Upstream scans the HF hub cache; without one (as here) it sends the 200 headers and
    # closes the connection (contract §2). hearth must still answer the documented shape.
    if b1:
        assert list(json.loads(b1)) == ["object", "data"]
    assert list(hz) == ["object", "data"] and hz["object"] == "list"
    for item in hz["data"]:
        assert {"id", "object", "created"} <= set(item) and item["object"] == "model"


def test_options_cors(servers):
    (s1, h1, _), (s2, h2, _) = both(servers, "OPTIONS", "/v1/chat/completions")
    assert s1 == s2 == 204
    for k in ("access-control-allow-origin", "access-control-allow-methods", "access-control-allow-headers"):
        assert h2.get(k) == h1.get(k), k


# mlx-lm 0.32.2 answers 400 {"error": "<str>"} for field validation errors and missing
# messages/prompt (the contract file, read from 0.32.0, says the connection drops); an
# image part makes it try to fetch the URL (offline here: 400). The real server wins.
BAD = [
    # (name, path, raw body, upstream status)
    ("unknown path", "/v1/nope", b"{}", 404),
    ("bad json", "/v1/chat/completions", b"{not json", 400),
    ("array body", "/v1/chat/completions", b"[1, 2]", 400),
    ("string temperature", "/v1/chat/completions",
     json.dumps(dict(CHAT, temperature="x")).encode(), 400),
    ("int logprobs", "/v1/chat/completions", json.dumps(dict(CHAT, logprobs=3)).encode(), 400),
    ("missing messages", "/v1/chat/completions", b'{"max_tokens": 3}', 400),
    ("missing prompt", "/v1/completions", b'{"max_tokens": 3}', 400),
    ("image part", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}).encode(), 400),
]


@pytest.mark.parametrize("name,path,raw,up_status", BAD, ids=[b[0] for b in BAD])
def test_bad_requests(servers, name, path, raw, up_status):
    s1, _, _ = request(servers[0], "POST", path, raw=raw)
    s2, _, b2 = request(servers[1], "POST", path, raw=raw)
    assert s1 == up_status, f"upstream answered {s1}, this test expects {up_status}"
    assert s2 == up_status, f"hearth answered {s2}, upstream {s1}"
    err = json.loads(b2)["error"]
    assert isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err
    # the server keeps serving
    s3, _, _ = request(servers[1], "POST", "/v1/chat/completions", dict(CHAT, max_tokens=1))
    assert s3 == 200
