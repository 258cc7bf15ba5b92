"""hearth serve on its own: every endpoint, streaming and not, error bodies, API key, CORS,
body limit, bad-request bursts, keep-alive, and cancellation when a client disconnects.
Expected token ids come from the mlx-lm goldens (tests/parity/goldens, made by
tools/make_goldens.py), never from hearth. The differential suite against the real
mlx_lm.server and the openai SDK tests live in their own files.
"""
import http.client
import json
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import REPO, server

GOLDEN = json.loads((REPO / "tests/parity/goldens/smollm2-135m-instruct-q4_1.json").read_text())
PROMPTS = {p["name"]: p for p in GOLDEN["prompts"]}
EOS_IDS = (0, 2)  # SmolLM2: <|endoftext|>, <|im_end|>
ERROR_KEYS = ["message", "type", "param", "code"]


def request(base, method, path, body=None, headers=None, raw=None):
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers=headers or {})
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def post(base, path, body, **kw):
    status, headers, data = request(base, "POST", path, body, **kw)
    return status, headers, json.loads(data) if data else None


def assert_error(status, body, want_status):
    assert status == want_status, body
    assert list(body) == ["error"] and list(body["error"]) == ERROR_KEYS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def greedy_prefix(golden, n):
    """The golden greedy ids up to n tokens, cut after the first EOS (the golden ignores EOS)."""
    ids = golden["greedy_ids"][:n]
    for i, t in enumerate(ids):
        if t in EOS_IDS:
            return ids[: i + 1]
    return ids


def sse_events(raw):
    """Splits an SSE body into ('comment', text) and ('data', text) items, checking framing."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    items = []
    for block in text[:-2].split("\n\n"):
        assert "\n" not in block, block
        if block.startswith(": "):
            items.append(("comment", block[2:]))
        else:
            assert block.startswith("data: "), block
            items.append(("data", block[6:]))
    return items


def test_health_models_index(smollm2_server, smollm2):
    status, headers, body = request(smollm2_server, "GET", "/health")
    assert status == 200 and body == b'{"status": "ok"}'
    assert headers["Content-type"] == "application/json"
    status, _, body = request(smollm2_server, "GET", "/v1/models")
    models = json.loads(body)
    assert status == 200 and list(models) == ["object", "data"] and models["object"] == "list"
    assert [list(m) for m in models["data"]] == [["id", "object", "created"]]
    assert models["data"][0]["id"] == str(smollm2) and models["data"][0]["object"] == "model"
    status, _, body = request(smollm2_server, "GET", "/v1/models/no/such-model")
    assert status == 200 and json.loads(body)["data"] == []
    status, _, body = request(smollm2_server, "GET", "/v1")
    paths = {(e["method"], e["path"]) for e in json.loads(body)["data"]}
    for want in [("POST", "/v1/chat/completions"), ("POST", "/chat/completions"), ("POST", "/v1/completions"),
                 ("GET", "/v1/models"), ("GET", "/health")]:
        assert want in paths


def test_text_completion_matches_mlx_lm_greedy(smollm2_server):
    g = PROMPTS["plain"]
    status, headers, body = post(smollm2_server, "/v1/completions",
                                 {"prompt": g["text"], "max_tokens": 12, "logprobs": True})
    assert status == 200, body
    assert int(headers["Content-Length"]) > 0
    assert list(body) == ["id", "system_fingerprint", "object", "model", "created", "choices", "usage"]
    assert body["id"].startswith("cmpl-") and len(body["id"]) == 5 + 36
    assert body["object"] == "text_completion" and body["model"] == "default_model"
    choice = body["choices"][0]
    assert list(choice) == ["index", "finish_reason", "logprobs", "text"]
    want = greedy_prefix(g, 12)
    assert [e["id"] for e in choice["logprobs"]["content"]] == want
    assert all(list(e) == ["id", "logprob"] and e["logprob"] <= 0 for e in choice["logprobs"]["content"])
    assert choice["finish_reason"] == ("stop" if want[-1] in EOS_IDS else "length")
    assert body["usage"] == {"prompt_tokens": len(g["ids"]), "completion_tokens": len(want),
                             "total_tokens": len(g["ids"]) + len(want), "prompt_tokens_details": {"cached_tokens": 0}}


def test_chat_completion_and_stream_agree(smollm2_server):
    g = PROMPTS["chat"]
    req = {"messages": g["messages"], "max_tokens": 16, "model": "my-client-name-is-ignored"}
    status, _, body = post(smollm2_server, "/v1/chat/completions", req)
    # a model that is not the served one is refused (hearth does not switch models)
    assert_error(status, body, 404)
    req["model"] = "default_model"
    req["logprobs"] = True
    status, _, body = post(smollm2_server, "/v1/chat/completions", req)
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert list(choice) == ["index", "finish_reason", "logprobs", "message"]
    assert list(choice["message"]) == ["role", "content"] and choice["message"]["role"] == "assistant"
    want = greedy_prefix(g, 16)
    assert [e["id"] for e in choice["logprobs"]["content"]] == want
    assert body["usage"]["prompt_tokens"] == len(g["ids"])
    content = choice["message"]["content"]

    del req["logprobs"]
    req.update(stream=True, stream_options={"include_usage": True})
    status, headers, raw = request(smollm2_server, "POST", "/v1/chat/completions", req)
    assert status == 200 and headers["Content-type"] == "text/event-stream"
    assert headers["Cache-Control"] == "no-cache"
    items = sse_events(raw)
    comments = [t for k, t in items if k == "comment"]
    n_prompt = len(g["ids"])
    assert comments and comments[-1] == f"keepalive {n_prompt}/{n_prompt}"
    data = [t for k, t in items if k == "data"]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    *deltas, final, usage = chunks
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in deltas + [final])
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in deltas + [final])
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas)
    assert all("logprobs" not in c["choices"][0] for c in deltas + [final])
    assert final["choices"][0]["finish_reason"] == choice["finish_reason"]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in deltas + [final])
    assert streamed == (content or "")
    assert usage["object"] == "chat.completion" and usage["choices"] == []
    # the same prompt again: all of it but the last token now comes from the prefix cache
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert usage["usage"][k] == body["usage"][k]
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1


def test_stop_strings_and_token_limits(smollm2_server):
    g = PROMPTS["plain"]
    status, _, full = post(smollm2_server, "/v1/completions", {"prompt": g["text"], "max_tokens": 24})
    text = full["choices"][0]["text"]
    words = [w for w in text.split() if len(w) > 3]
    assert words, text
    stop = words[len(words) // 2]
    for s in (stop, [stop, "never-appears-xyz"]):
        status, _, body = post(smollm2_server, "/v1/completions", {"prompt": g["text"], "max_tokens": 24, "stop": s})
        assert status == 200
        # token-level stop as upstream (test_differential.py compares the exact text with
        # mlx_lm.server): the output is a prefix of the free run, ends before the stop
        # word, never contains it, and finishes with "stop"
        # A stop word the model writes as a different token sequence (" language" vs
        # "language") does not stop generation but is stripped from the text.
        out, finish = body["choices"][0]["text"], body["choices"][0]["finish_reason"]
        assert stop not in out
        if finish == "stop":
            assert text.startswith(out) and len(out) <= text.index(stop) + 1, (out, stop)
        else:
            assert finish == "length" and out == text.replace(stop, ""), (out, stop)
    status, _, body = post(smollm2_server, "/v1/completions", {"prompt": g["text"], "max_tokens": 1})
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 1
    status, _, body = post(smollm2_server, "/v1/completions",
                           {"prompt": g["text"], "max_tokens": 9, "max_completion_tokens": 2})
    assert body["usage"]["completion_tokens"] == 2
    status, _, body = post(smollm2_server, "/v1/completions",
                           {"prompt": g["text"], "max_tokens": 3, "max_completion_tokens": None})
    assert body["usage"]["completion_tokens"] == 3


BAD_REQUESTS = [
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("POST", "/v1/chat/completions", b'{"messages": []}', 400),
    ("POST", "/v1/chat/completions", b'{"max_tokens": 4}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "x"}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 50}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stop": 5}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}', 400),
    ("POST", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    ("POST", "/v1/completions", b'{"prompt": 7}', 400),
    ("POST", "/v1/completions", b'{"prompt": "hi", "xtc_probability": 0}', 400),
    ("POST", "/v1/nothing-here", b"{}", 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("DELETE", "/v1/models", None, 405),
]


def test_bad_requests_then_a_good_one(smollm2_server):
    for method, path, raw, want in BAD_REQUESTS:
        status, headers, data = request(smollm2_server, method, path, raw=raw,
                                        headers={"Content-Type": "application/json"})
        assert_error(status, json.loads(data), want)
        assert headers["Content-type"] == "application/json"
    # unknown fields are ignored, as upstream does (OpenAI clients send many)
    status, _, body = post(smollm2_server, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                            "max_tokens": 2, "n": 1, "user": "x", "some_future_field": {"a": 1}})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_missing_length_is_411_and_chunked_bodies_are_read(smollm2_server):
    u = urlparse(smollm2_server)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = s.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 411"), reply
    # RFC 9112: an HTTP/1.1 server reads a chunked body (here split mid-key, with an
    # extension and a trailer field, all of which the decoder must skip)
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    parts = [body[:7], body[7:]]
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: 1\r\n\r\n"
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"Connection: close\r\n\r\n" + chunked)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, data = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), reply
    assert json.loads(data)["usage"]["completion_tokens"] >= 1


def test_keep_alive_serves_several_requests_on_one_connection(smollm2_server):
    u = urlparse(smollm2_server)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    for _ in range(3):
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 2}))
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] >= 1
    c.close()


def test_api_key_cors_and_body_limit(smollm2):
    with server(smollm2, "--api-key", "sekrit", "--allowed-origins", "http://a.example,http://b.example",
                "--max-body", "1K") as base:
        status, _, body = request(base, "GET", "/health")
        assert status == 200  # /health needs no key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            status, h, data = request(base, "GET", "/v1/models", headers=headers)
            assert_error(status, json.loads(data), 401)
        ok = {"Authorization": "Bearer sekrit"}
        status, _, _ = request(base, "GET", "/v1/models", headers=ok)
        assert status == 200
        status, h, _ = request(base, "GET", "/v1/models", headers={**ok, "Origin": "http://b.example"})
        assert h.get("Access-Control-Allow-Origin") == "http://b.example" and h.get("Vary") == "Origin"
        status, h, _ = request(base, "GET", "/v1/models", headers={**ok, "Origin": "http://evil.example"})
        assert "Access-Control-Allow-Origin" not in h
        status, h, data = request(base, "OPTIONS", "/v1/chat/completions", headers={"Origin": "http://a.example"})
        assert status == 204 and data == b""
        assert h["Access-Control-Allow-Origin"] == "http://a.example"
        assert h["Access-Control-Allow-Methods"] == "*" and h["Access-Control-Allow-Headers"] == "*"
        big = {"prompt": "x" * 2000, "max_tokens": 1}
        status, _, body = post(base, "/v1/completions", big, headers=ok)
        assert_error(status, body, 413)
        status, _, body = post(base, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, headers=ok)
        assert status == 200
    with server(smollm2) as base:  # default: any origin
        status, h, _ = request(base, "OPTIONS", "/anything", headers={"Origin": "http://x.example"})
        assert status == 204 and h["Access-Control-Allow-Origin"] == "*"


def test_client_disconnect_cancels_generation(smollm2_server):
    # EOS banned so the stream would run for all 3000 tokens if nobody stopped it
    req = {"prompt": "Once upon a time", "max_tokens": 3000, "stream": True,
           "logit_bias": {str(t): -100 for t in EOS_IDS}}
    u = urlparse(smollm2_server)
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    body = json.dumps(req).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    # the engine is free again long before 3000 tokens could have been generated
    t0 = time.time()
    status, _, body = post(smollm2_server, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
    assert status == 200 and time.time() - t0 < 10, time.time() - t0
