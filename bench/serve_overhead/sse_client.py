"""sse_client.py: a minimal HTTP/1.x client over raw sockets that times one streaming completion.

It owns the client-side clock for bench/serve_overhead: time to first byte, arrival time of every
SSE event, chunked and close-delimited bodies. It must not depend on anything outside the Python
standard library (the point is to measure the server, not a client library's buffering).
"""

import json
import socket
import time


class StreamResult:
    """What one streaming request saw, in seconds relative to the moment the request was sent."""

    def __init__(self):
        self.t_send = 0.0  # absolute perf_counter() at send, for aggregating concurrent clients
        self.status = 0
        self.ttfb = None  # first byte of the status line
        self.ttft = None  # first SSE event carrying generated text
        self.token_times = []  # arrival of every event carrying text
        self.t_done = None  # `data: [DONE]` or end of body
        self.text = ""
        self.usage = None
        self.finish_reason = None
        self.error = None

    def to_dict(self):
        return {
            "status": self.status,
            "ttfb_s": self.ttfb,
            "ttft_s": self.ttft,
            "total_s": self.t_done,
            "content_events": len(self.token_times),
            "completion_tokens": (self.usage or {}).get("completion_tokens"),
            "prompt_tokens": (self.usage or {}).get("prompt_tokens"),
            "finish_reason": self.finish_reason,
            "error": self.error,
        }


class _Chunked:
    """Incremental decoder of a chunked transfer-encoded body (RFC 9112 section 7.1)."""

    def __init__(self):
        self.raw = b""
        self.need = None  # bytes of chunk data still expected, None while reading a size line
        self.finished = False

    def feed(self, data):
        self.raw += data
        out = b""
        while not self.finished:
            if self.need is None:
                eol = self.raw.find(b"\r\n")
                if eol < 0:
                    break
                size_text = self.raw[:eol].split(b";")[0].strip()
                self.raw = self.raw[eol + 2 :]
                self.need = int(size_text, 16)
                if self.need == 0:
                    self.finished = True
                    break
            if len(self.raw) < self.need + 2:
                break
            out += self.raw[: self.need]
            self.raw = self.raw[self.need + 2 :]
            self.need = None
        return out


def _event_text(obj):
    """Generated text of one completion or chat-completion chunk ('' when none)."""
    choices = obj.get("choices") or []
    if not choices:
        return "", None
    c = choices[0]
    text = c.get("text")
    if text is None:
        text = (c.get("delta") or {}).get("content") or ""
    return text, c.get("finish_reason")


def stream_completion(port, path, body, timeout=900.0):
    """POST `body` (a dict) to 127.0.0.1:port/path with stream=true and time everything."""
    res = StreamResult()
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    # Small writes from the client must not wait for Nagle; the server side is what we measure.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    clock = time.perf_counter
    res.t_send = t0 = clock()
    try:
        sock.sendall(head + payload)
        buf = b""
        headers_done = False
        chunked = None
        sse = b""
        while True:
            data = sock.recv(65536)
            now = clock() - t0
            if res.ttfb is None and data:
                res.ttfb = now
            if not data:
                break
            if not headers_done:
                buf += data
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                lines = buf[:end].decode("latin-1").split("\r\n")
                res.status = int(lines[0].split()[1])
                hdrs = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                chunked = _Chunked() if "chunked" in hdrs.get("transfer-encoding", "").lower() else None
                data = buf[end + 4 :]
                headers_done = True
            sse += chunked.feed(data) if chunked else data
            sse = sse.replace(b"\r\n", b"\n")
            done = _consume_events(res, sse, now)
            sse = sse[sse.rfind(b"\n\n") + 2 :] if b"\n\n" in sse else sse
            if done or (chunked and chunked.finished):
                break
        res.t_done = clock() - t0
        if res.status != 200:
            res.error = f"HTTP {res.status}: {sse[:300]!r}"
    except (OSError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        sock.close()
    return res


def _consume_events(res, sse, now):
    """Handle every complete SSE event in `sse`; True once `data: [DONE]` was seen."""
    cut = sse.rfind(b"\n\n")
    if cut < 0:
        return False
    for event in sse[:cut].split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # `: keepalive` comments and blank lines
            data = line[5:].strip()
            if data == b"[DONE]":
                return True
            obj = json.loads(data)
            if obj.get("usage"):
                res.usage = obj["usage"]
            text, finish = _event_text(obj)
            if finish:
                res.finish_reason = finish
            if text:
                if res.ttft is None:
                    res.ttft = now
                res.token_times.append(now)
                res.text += text
    return False
