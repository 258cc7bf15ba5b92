"""Two `hearth serve` replicas behind nginx (Debian's nginx-light) or HAProxy (Debian's
haproxy), both installed by tools/deps.sh, on loopback, as docs/server.md "Running
replicas" sets them up. A trace of 32 two-turn conversations (a long document, a
question; then the answer and a follow-up), all first turns then all second turns, each in
a shuffled order, goes through each router: with `hash $http_x_session_id consistent` (nginx) or `balance hdr(X-Session-Id)` with
`hash-type consistent` (HAProxy) every second turn lands on the replica that served its
first turn, and usage.prompt_tokens_details.cached_tokens covers at least 90% of
the second turns' prompt tokens; with round robin about half of them land on the other
replica, which has nothing cached for that conversation. The cached counts are hearth's
own prefix cache (whose exact count test_prefix_cache.py checks against HF's tokenizer)."""
import json
import os
import random
import shutil
import subprocess
import time
import urllib.request

import pytest

from conftest import free_port, need, server
from test_prefix_cache import NO_EOS, TINY_LLAMA, WORDS

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SESSIONS = 32


def nginx_conf(tmp, port, upstreams, hashed):
    balance = "hash $http_x_session_id consistent;" if hashed else ""  # round robin otherwise
    servers = "".join(f"server 127.0.0.1:{p};" for p in upstreams)
    user = "user root;" if os.geteuid() == 0 else ""  # workers must write the temp folders below
    return f"""{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream hearth {{ {balance} {servers} keepalive 8; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://hearth;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


def haproxy_conf(port, upstreams):
    """docs/server.md's HAProxy backend, with a frontend on port."""
    servers = "".join(f"    server r{i} 127.0.0.1:{p} check inter 2s\n" for i, p in enumerate(upstreams))
    return f"""global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 600s
frontend hearth_in
    bind 127.0.0.1:{port}
    default_backend hearth
backend hearth
    balance hdr(X-Session-Id)
    hash-type consistent
    option http-server-close
    timeout server 600s
{servers}"""


def chat(port, session, msgs):
    body = json.dumps({"messages": msgs, "max_tokens": 8, "temperature": 0, "logit_bias": NO_EOS}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "X-Session-Id": session})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_trace(port, salt):
    """Cached share of the second turns' prompt tokens."""
    rng = random.Random(7 + salt)
    # every document its own from its first word: conversations share only the template's header
    docs = {f"s{salt}-{i}": " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(120))
            for i in range(SESSIONS)}
    first = {}
    order = list(docs)
    rng.shuffle(order)
    for s in order:
        msgs = [{"role": "user", "content": f"Read this: {docs[s]}\nWhat is it about?"}]
        first[s] = (msgs, chat(port, s, msgs)["choices"][0]["message"]["content"])
    rng.shuffle(order)
    cached = prompt = 0
    for s in order:
        msgs, answer = first[s]
        msgs = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        usage = chat(port, s, msgs)["usage"]
        cached += usage["prompt_tokens_details"]["cached_tokens"]
        prompt += usage["prompt_tokens"]
    return cached / prompt


@pytest.fixture(scope="module")
def replicas():
    tiny = need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")
    need(NGINX, "nginx", "run tools/deps.sh (Debian package nginx-light)")
    # KV pools large enough that no conversation is evicted during the trace
    with server(tiny, "--kv-blocks", "4096") as a, server(tiny, "--kv-blocks", "4096") as b:
        yield [int(a.rsplit(":", 1)[1]), int(b.rsplit(":", 1)[1])]


@pytest.mark.parametrize("router", ["nginx-hash", "haproxy-hash", "nginx-round-robin"])
def test_session_affinity_keeps_the_cache(replicas, tmp_path, router):
    port = free_port()
    hashed = router.endswith("hash")
    if router.startswith("nginx"):
        (tmp_path / "nginx.conf").write_text(nginx_conf(tmp_path, port, replicas, hashed))
        cmd = [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]
    else:
        need(HAPROXY, "haproxy", "run tools/deps.sh (Debian package haproxy)")
        (tmp_path / "haproxy.cfg").write_text(haproxy_conf(port, replicas))
        cmd = [HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)
        share = run_trace(port, salt={"nginx-hash": 1, "nginx-round-robin": 2, "haproxy-hash": 3}[router])
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(f"\n{router}: {share:.1%} of second-turn prompt tokens cached")
    if hashed:
        assert share >= 0.90
    else:
        assert 0.2 <= share <= 0.8, share  # about half the conversations land on the other replica
