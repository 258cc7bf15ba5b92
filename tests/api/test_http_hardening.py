"""hearth serve against clients that a library would never be: raw sockets for HTTP/1.1
framing (RFC 9112), pipelined keep-alive, slow senders, cross-origin requests to the
endpoints that change state, requests that can never fit the KV pool, and the limits on
a request's work (issue 31). The oracle is the RFC's rule or the documented limit; the
SDK tests check the same refusals through the openai and anthropic clients.
"""
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import anthropic
import openai
import pytest

from conftest import server

# a small pool: 48 blocks of 16 = 768 positions, under the 1024-position context
FLAGS = ("--ctx", "1024", "--kv-blocks", "48", "--max-connections", "8", "--timeout", "10",
         "--header-timeout", "2")


@pytest.fixture(scope="module")
def base(smollm2):
    with server(smollm2, *FLAGS) as b:
        yield b


def addr(base):
    u = urlparse(base)
    return u.hostname, u.port


def exchange(base, data, timeout=5.0):
    """Sends data and reads until the server closes (or timeout); returns (bytes, closed)."""
    with socket.create_connection(addr(base), timeout=timeout) as s:
        s.sendall(data)
        got, t0 = b"", time.time()
        try:
            while time.time() - t0 < timeout:
                chunk = s.recv(65536)
                if not chunk:
                    return got, True
                got += chunk
        except socket.timeout:
            pass
        return got, False


def read_response(sock_file):
    """One response with a Content-Length body from a socket's file: (status, headers, body)."""
    status_line = sock_file.readline().decode()
    headers = {}
    while (line := sock_file.readline().decode()) not in ("\r\n", ""):
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = sock_file.read(int(headers.get("content-length", 0)))
    return int(status_line.split()[1]), headers, body


# ---- 2. strict framing: each answered 400 (or the RFC's code) once, at once, then closed

BAD_FRAMING = [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"2\r\n{}\r\n0\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}", 413),
    (b"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
    (b"GET /health HTTP/1.1\r\n\r\n", 400),                          # HTTP/1.1 without Host
    (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),     # two Hosts
    (b"GET /health HTTP/1.1\nHost: x\n\n", None),                    # bare LF: never a complete head
    (b"GET /health HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),   # obsolete line folding
    (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: something\r\n\r\n", 417),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX", 400),
]


@pytest.mark.parametrize("raw,want", BAD_FRAMING, ids=range(len(BAD_FRAMING)))
def test_bad_framing_is_refused_once_and_closed(base, raw, want):
    t0 = time.time()
    got, closed = exchange(base, raw, timeout=6)
    if want is None:  # the head never completes: the header timeout (2 s) answers 408
        assert got.startswith(b"HTTP/1.1 408") and closed, got
        return
    assert got.startswith(b"HTTP/1.1 %d " % want), got
    assert (b"\n" + got).count(b"\nHTTP/1.") == 1, got  # one status line, one set of headers
    assert closed and time.time() - t0 < 2, (closed, time.time() - t0)
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"Connection: close" in head
    assert list(json.loads(body)["error"]) == ["message", "type", "param", "code"]


def test_a_head_over_max_header_is_431(base):
    got, closed = exchange(base, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 431") and (b"\n" + got).count(b"\nHTTP/1.") == 1 and closed, got[:200]


# ---- 3. keep-alive: GETs keep the connection; pipelined requests answered in order


def test_pipelined_requests_are_answered_in_order_on_one_connection(base):
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    with socket.create_connection(addr(base), timeout=60) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" % (len(body), body))
        f = s.makefile("rb")
        answers = [read_response(f) for _ in range(4)]
        # the connection is still open: a fifth request on it is answered too
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answers.append(read_response(f))
    assert [a[0] for a in answers] == [200] * 5
    assert json.loads(answers[0][2]) == {"status": "ok"}
    assert json.loads(answers[1][2])["object"] == "list"
    assert json.loads(answers[2][2])["object"] == "text_completion"
    assert all(a[1].get("connection") != "close" for a in answers)


def test_a_refusal_at_the_door_with_an_unread_body_says_close(base):
    """A request answered from its head alone (here 404) leaves its body unread, so the
    server closes the connection after answering; the answer must say so, or a client
    that reuses the connection loses its next request (CI once lost one this way: an
    embeddings test's request after a 400 'cannot generate')."""
    body = json.dumps({"prompt": "Hi"}).encode()
    got, closed = exchange(base, b"POST /v1/no-such-route HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
    head = got.partition(b"\r\n\r\n")[0]
    assert got.startswith(b"HTTP/1.1 404") and closed, got
    assert b"Connection: close" in head, head
    # a GET refused the same way has no body to leave unread: the connection stays open
    with socket.create_connection(addr(base), timeout=10) as s:
        s.sendall(b"GET /v1/no-such-route HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        f = s.makefile("rb")
        first, second = read_response(f), read_response(f)
    assert (first[0], second[0]) == (404, 200)
    assert first[1].get("connection") != "close"


def test_http10_closes_unless_asked_to_keep_alive(base):
    got, closed = exchange(base, b"GET /health HTTP/1.0\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200") and closed
    with socket.create_connection(addr(base), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        f = s.makefile("rb")
        assert [read_response(f)[0] for _ in range(2)] == [200, 200]


# ---- 4. slow clients cannot hold every slot


def test_slow_header_senders_do_not_lock_out_new_clients(base):
    stop = threading.Event()
    socks = [socket.create_connection(addr(base), timeout=30) for _ in range(8)]  # every slot

    def drip(s):
        for ch in b"GET /health HTTP/1.1\r\nHost: x\r\n":
            if stop.is_set():
                return
            try:
                s.send(bytes([ch]))
            except OSError:
                return
            time.sleep(1)

    threads = [threading.Thread(target=drip, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)
        for _ in range(3):  # each new client gets through while the drip goes on
            t0 = time.time()
            got, _ = exchange(base, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
            assert got.startswith(b"HTTP/1.1 200") and time.time() - t0 < 2, (got, time.time() - t0)
        # and a slow sender is cut off once --header-timeout (2 s) has passed
        socks[-1].settimeout(6)
        data = b""
        try:
            while chunk := socks[-1].recv(4096):
                data += chunk
        except OSError:
            pass
        assert data == b"" or data.startswith(b"HTTP/1.1 408"), data
    finally:
        stop.set()
        for s in socks:
            s.close()


# ---- 5. endpoints that change state answer cross-origin requests only for listed origins


def raw_request(base, method, path, body=b"", headers=(), host=None):
    host = host or "%s:%d" % addr(base)
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n" % (
        method.encode(), path.encode(), host.encode(), len(body))
    head += b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers)
    got, _ = exchange(base, head + b"\r\n" + body, timeout=10)
    h, _, b = got.partition(b"\r\n\r\n")
    lines = h.decode().split("\r\n")
    return int(lines[0].split()[1]), {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}, b


def test_state_changing_endpoints_refuse_other_origins(base):
    host, port = addr(base)
    evil = [("Origin", "http://evil.example"), ("Content-Type", "text/plain")]
    # the body is not a download request: reaching the handler answers 400, refusal 403
    status, h, body = raw_request(base, "POST", "/downloads", b"{}", evil)
    assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed", body
    assert "access-control-allow-origin" not in h
    status, _, body = raw_request(base, "DELETE", "/v1/responses/resp_x", b"", evil)
    assert status == 403, body
    # without an Origin (curl, an SDK) or from this server's own page, the handler runs
    assert raw_request(base, "POST", "/downloads", b"{}")[0] == 400
    assert raw_request(base, "DELETE", "/v1/responses/resp_x")[0] == 404
    own = [("Origin", f"http://{host}:{port}")]
    assert raw_request(base, "POST", "/downloads", b"{}", own)[0] == 400
    # a DNS-rebinding page has its own name in Host and in Origin: still refused
    rebound = f"evil.example:{port}"
    status, _, _ = raw_request(base, "POST", "/downloads", b"{}", [("Origin", f"http://{rebound}")], host=rebound)
    assert status == 403
    # the preflight of a state-changing path names no origin; inference keeps "*"
    status, h, _ = raw_request(base, "OPTIONS", "/downloads", b"", [("Origin", "http://evil.example")])
    assert status == 204 and "access-control-allow-origin" not in h
    status, h, _ = raw_request(base, "OPTIONS", "/v1/chat/completions", b"", [("Origin", "http://evil.example")])
    assert status == 204 and h["access-control-allow-origin"] == "*"
    assert "content-length" not in h  # RFC 9110 section 8.6: never on a 204
    status, h, _ = raw_request(base, "GET", "/v1/models", b"", [("Origin", "http://evil.example")])
    assert status == 200 and h["access-control-allow-origin"] == "*"


def test_listed_origins_may_change_state(smollm2):
    with server(smollm2, "--allowed-origins", "http://a.example") as b:
        status, h, body = raw_request(b, "POST", "/downloads", b"{}", [("Origin", "http://a.example")])
        assert status == 400 and h["access-control-allow-origin"] == "http://a.example", body
        status, h, _ = raw_request(b, "OPTIONS", "/downloads", b"", [("Origin", "http://a.example")])
        assert status == 204 and h["access-control-allow-origin"] == "http://a.example"
        assert raw_request(b, "POST", "/downloads", b"{}", [("Origin", "http://b.example")])[0] == 403


# ---- 1. a request that can never fit the KV pool: 400 in each API's shape, before any stream

LONG = "word " * 550  # about 550 tokens: with max_tokens 800 the request needs the whole context


def test_never_fitting_requests_are_refused_at_the_door(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=20)
    for stream in (False, True):
        t0 = time.time()
        with pytest.raises(openai.BadRequestError) as ei:
            r = c.chat.completions.create(model="default_model", messages=[{"role": "user", "content": LONG}],
                                          max_tokens=800, stream=stream)
            list(r) if stream else None
        assert ei.value.body["code"] == "kv_pool_exceeded" and ei.value.body["param"] == "max_tokens"
        assert time.time() - t0 < 5
        with pytest.raises(openai.BadRequestError) as ei:
            r = c.completions.create(model="default_model", prompt=LONG, max_tokens=800, stream=stream)
            list(r) if stream else None
        assert ei.value.body["code"] == "kv_pool_exceeded"
        with pytest.raises(openai.BadRequestError) as ei:
            r = c.responses.create(model="default_model", input=LONG, max_output_tokens=800, stream=stream)
            list(r) if stream else None
        assert ei.value.body["param"] == "max_output_tokens"
        a = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=20)
        with pytest.raises(anthropic.BadRequestError) as ei:
            r = a.messages.create(model="m", max_tokens=800, messages=[{"role": "user", "content": LONG}],
                                  stream=stream)
            list(r) if stream else None
        assert ei.value.body["type"] == "error" and ei.value.body["error"]["type"] == "invalid_request_error"
    # one that fits runs
    r = c.completions.create(model="default_model", prompt=LONG, max_tokens=2)
    assert r.usage.completion_tokens >= 1


# ---- 6. limits on a request's work, each a 400 naming the limit


def test_limits_on_stop_and_logit_bias(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)
    a = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="default_model", messages=msgs, max_tokens=2,
                                  stop=[f"s{i}" for i in range(500000)])
    assert "limit is 64" in ei.value.body["message"] and ei.value.body["param"] == "stop"
    # the server's own time for the 5 MB body (the SDK spends more than that building it)
    body = json.dumps({"model": "default_model", "messages": msgs, "max_tokens": 2,
                       "stop": [f"s{i}" for i in range(500000)]}).encode()
    t0 = time.time()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as he:
        urllib.request.urlopen(req, timeout=60)
    assert he.value.code == 400
    assert time.time() - t0 < 10
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="default_model", messages=msgs, max_tokens=2, stop=["x" * 200000])
    assert "limit is 1024 bytes" in ei.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as ei:
        a.messages.create(model="m", max_tokens=2, messages=msgs, stop_sequences=[f"s{i}" for i in range(65)])
    assert "stop_sequences" in ei.value.body["error"]["message"]
    # 64 stops of the longest allowed length are accepted and generation ends normally
    r = a.messages.create(model="m", max_tokens=3, messages=msgs,
                          stop_sequences=[("ab" * 512)[: 1024 - i] for i in range(64)])
    assert r.stop_reason == "max_tokens"
    # more logit_bias entries than the vocabulary (49152): "1" and "01" are two keys of one id
    bias = {**{str(i): 0 for i in range(49152)}, "01": 0}
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model="default_model", prompt="Hi", max_tokens=1, logit_bias=bias)
    assert "vocabulary size (49152)" in ei.value.body["message"]
    # max_tokens 1e9 on /v1/messages and /v1/responses: clamped to the context, and here the
    # whole context does not fit the 48-block pool, which the 400 says
    with pytest.raises(anthropic.BadRequestError) as ei:
        a.messages.create(model="m", max_tokens=10**9, messages=msgs)
    assert "KV pool holds 48" in ei.value.body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="default_model", input="Hi", max_output_tokens=10**9)
    assert "max_output_tokens" in ei.value.body["message"]


# ---- one route table: the /v1 index lists exactly what the router answers


def test_v1_index_lists_what_the_router_answers(base):
    index = json.loads(raw_request(base, "GET", "/v1")[2])["data"]
    listed = {(e["method"], e["path"]) for e in index}
    for route in [("POST", "/v1/responses"), ("POST", "/embeddings"), ("GET", "/v1/stats"),
                  ("DELETE", "/v1/responses/{id}"), ("POST", "/downloads"), ("GET", "/v1/models/{id}")]:
        assert route in listed, route
    for e in index:
        method, path = e["method"], e["path"].replace("{id}", "x")
        if method == "OPTIONS" or path.startswith("/, "):
            continue
        # a body that is not JSON: a listed POST route answers 400 from its handler; GETs 200
        status, _, body = raw_request(base, method, path, b"{" if method == "POST" else b"")
        want = 400 if method == "POST" else 404 if path.startswith(("/v1/responses/", "/v1/adapters/x")) else 200
        if path.startswith(("/v1/memory", "/v1/train/runs/")):  # no --memory / --train-dir: the handlers say so
            want = 404
        assert status == want, (method, path, status, body)
        if want == 404:  # the handler's own answer, not the router's
            assert (b"Response with id 'x' not found" in body or b"no adapter with id 'x'" in body
                    or b'"code": "memory_off"' in body or b'"code": "train_dir_not_set"' in body), body
    # a known path with another method is 405 with the methods it has in Allow
    status, h, _ = raw_request(base, "PUT", "/downloads")
    assert status == 405 and set(h["allow"].split(", ")) == {"GET", "POST"}
    assert raw_request(base, "GET", "/v1/nothing-here")[0] == 404


def test_stop_sequences_cut_exactly_where_the_text_matches(base):
    """Anthropic's stop_sequences run in the engine's stop filter (held-back tail found by
    a KMP pass): the stopped text must be the free text cut at the first match, and a
    near miss must give back every held byte. Oracle: Python string slicing of the
    unstopped greedy text."""
    a = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]

    def text(stream, **kw):
        if not stream:
            r = a.messages.create(model="m", max_tokens=40, messages=msgs, **kw)
            return "".join(b.text for b in r.content if b.type == "text")
        with a.messages.stream(model="m", max_tokens=40, messages=msgs, **kw) as s:
            return "".join(s.text_stream)

    text(False)  # the prompt's blocks enter the prefix cache: every call below reads them alike
    free = text(False)
    assert len(free) > 40, free
    stop = free[20:31]
    near = stop[:-1] + ("#" if stop[-1] != "#" else "%")  # all but the last byte match
    # a repetitive stop whose prefix function matters: its own prefix repeated
    rep = free[20:24] * 3
    for stream in (False, True):
        assert text(stream, stop_sequences=[stop]) == free[: free.index(stop)]
        assert text(stream, stop_sequences=[near, rep]) == (free[: free.index(rep)] if rep in free else free)
