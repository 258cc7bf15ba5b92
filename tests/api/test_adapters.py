"""LoRA adapters in `hearth serve`: --adapter-path against the real mlx_lm.server with the
same --adapter-path (same greedy text); mixed batches (a request without an adapter among
requests with one is bit-identical to it alone, and the adapted one to itself alone, with
the scalar reference kernels: every row is computed on its own); the /v1/adapters endpoints
and their errors; `model` naming an adapter; unmounting mid-stream loses no request; a bad
adapter at start ends the server with the file and the mismatch named.

Adapters are made at test time by mlx-lm's own tuner (tests/parity/lora_helpers.py).
"""
import http.client
import importlib.util
import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import BIN, CACHE, need, server, upstream_server

def _lora_helpers():
    """tests/parity/lora_helpers.py, loaded by path (the two suites run as separate pytest
    sessions, each with its own conftest on the path)."""
    spec = importlib.util.spec_from_file_location(
        "lora_helpers", Path(__file__).resolve().parent.parent / "parity" / "lora_helpers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_mlx_adapter = _lora_helpers().make_mlx_adapter

TINY = CACHE / "tiny" / "llama-f32"
SCALAR = {"HEARTH_CPU": "scalar"}


def call(base, method, path, body=None, timeout=300):
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def chat(base, max_tokens=8, **kw):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": max_tokens,
            "temperature": 0, "logprobs": True, "top_logprobs": 3, **kw}
    st, out = call(base, "POST", "/v1/chat/completions", body)
    assert st == 200, out
    ch = out["choices"][0]
    return {"content": ch["message"]["content"], "logprobs": ch["logprobs"], "finish": ch["finish_reason"]}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    need(TINY, "tiny model", "run tools/make_tiny_models.py")
    root = tmp_path_factory.mktemp("adapters")
    return {"a": make_mlx_adapter(TINY, root / "a", seed=1),
            "b": make_mlx_adapter(TINY, root / "b", seed=2, keys=("self_attn.v_proj", "mlp.up_proj")),
            "dora": make_mlx_adapter(TINY, root / "dora", seed=3, dora=True),
            "qwen": make_mlx_adapter(CACHE / "tiny" / "qwen3-f32", root / "qwen", seed=4)}


def test_adapter_path_matches_mlx_lm_server(adapters):
    body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
    named = {**body, "model": str(TINY)}  # upstream: the adapter belongs to "default_model" only
    with upstream_server(TINY, "--adapter-path", adapters["a"]) as up:
        st, ref = call(up, "POST", "/v1/completions", body)
        assert st == 200, ref
        st, ref_named = call(up, "POST", "/v1/completions", named)
        assert st == 200, ref_named
    with server(TINY, "--adapter-path", adapters["a"], env=SCALAR) as base:
        st, ours = call(base, "POST", "/v1/completions", body)
        assert st == 200, ours
        st, plain = call(base, "POST", "/v1/completions", {**body, "adapter": "none"})
        st, ours_named = call(base, "POST", "/v1/completions", named)
    assert ours["choices"][0]["text"] == ref["choices"][0]["text"]
    assert plain["choices"][0]["text"] != ours["choices"][0]["text"]  # the adapter matters
    assert ours_named["choices"][0]["text"] == ref_named["choices"][0]["text"] == plain["choices"][0]["text"]


def test_mixed_batch_rows_match_their_lone_runs(adapters):
    with server(TINY, "--adapter", f"a={adapters['a']}", "--adapter", f"b={adapters['b']}",
                "--adapter", f"d={adapters['dora']}", env=SCALAR) as base:
        specs = ["none", "a", "b", "a+b", "d", "none"]
        alone = {s: chat(base, adapter=s) for s in set(specs)}
        assert len({alone[s]["content"] for s in ("none", "a", "b", "d")}) == 4  # each adapter changes the text
        for _ in range(2):
            with ThreadPoolExecutor(len(specs)) as ex:
                mixed = list(ex.map(lambda s: (s, chat(base, adapter=s)), specs))
            for s, got in mixed:
                assert got == alone[s], f"adapter {s}: batched run differs from its lone run"
        st, stats = call(base, "GET", "/stats")
        assert [a["id"] for a in stats["adapters"]] == ["a", "b", "d"]


def test_adapter_endpoints(adapters, tmp_path):
    with server(TINY, env=SCALAR) as base:
        assert call(base, "GET", "/v1/adapters") == (200, {"object": "list", "data": []})
        st, a = call(base, "POST", "/v1/adapters", {"id": "a", "path": str(adapters["a"])})
        assert st == 200 and a["id"] == "a" and a["rank"] == 4 and a["scale"] == 2.0 and a["type"] == "lora"
        assert a["layers"] == 3 and a["format"] == "mlx"
        st, lst = call(base, "GET", "/v1/adapters")
        assert [x["id"] for x in lst["data"]] == ["a"]
        st, models = call(base, "GET", "/v1/models")
        assert [m["id"] for m in models["data"]][1:] == ["a"]
        # errors: taken id, mismatched adapter, missing folder, bad body, unknown adapter in a request
        st, err = call(base, "POST", "/v1/adapters", {"id": "a", "path": str(adapters["b"])})
        assert st == 409 and "mounted already" in err["error"]["message"]
        st, err = call(base, "POST", "/v1/adapters", {"id": "q", "path": str(adapters["qwen"])})
        assert st == 400 and "adapters.safetensors" in err["error"]["message"], err
        st, err = call(base, "POST", "/v1/adapters", {"id": "x", "path": str(tmp_path / "nowhere")})
        assert st == 400 and "not a folder" in err["error"]["message"]
        st, err = call(base, "POST", "/v1/adapters", {"path": str(adapters["b"])})
        assert st == 400 and err["error"]["param"] == "id"
        st, err = call(base, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "adapter": "zzz"})
        assert st == 400 and err["error"]["code"] == "adapter_not_found"
        st, err = call(base, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "adapter": 3})
        assert st == 400 and err["error"]["param"] == "adapter"
        # model naming an adapter id = that adapter; "adapters" (mlx_lm.server's field) by path
        by_model = chat(base, model="a")
        assert by_model == chat(base, adapter="a") == chat(base, adapters=str(adapters["a"]))
        assert by_model != chat(base)
        # the folders beside a mounted adapter that fit this model (not the qwen one)
        st, avail = call(base, "GET", "/v1/adapters/available")
        paths = sorted(Path(x["path"]).name for x in avail["data"])
        assert paths == ["a", "b", "dora"], avail
        assert call(base, "DELETE", "/v1/adapters/a")[0] == 200
        st, err = call(base, "DELETE", "/v1/adapters/a")
        assert st == 404 and "no adapter with id 'a'" in err["error"]["message"]
        st, err = call(base, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "model": "a"})
        assert st == 404  # no adapter of that name now: an unknown model


def test_prefix_cache_is_namespaced_by_adapter(adapters):
    """The same long prompt under another adapter (or none) reuses nothing; under the same
    adapter set it reuses the cached prefix."""
    with server(TINY, "--adapter", f"a={adapters['a']}", "--adapter", f"b={adapters['b']}", env=SCALAR) as base:
        msgs = [{"role": "system", "content": "river stone lantern " * 40}, {"role": "user", "content": "hi"}]

        def cached(adapter):
            st, out = call(base, "POST", "/v1/chat/completions",
                           {"messages": msgs, "max_tokens": 1, "temperature": 0, "adapter": adapter})
            assert st == 200, out
            return out["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached("a") == 0
        assert cached("none") == 0 and cached("b") == 0 and cached("a+b") == 0
        assert cached("a") > 100 and cached("none") > 100 and cached("a+b") > 100


def test_openai_sdk_sends_adapter(adapters):
    from openai import OpenAI
    with server(TINY, "--adapter", f"a={adapters['a']}", env=SCALAR) as base:
        client = OpenAI(base_url=base + "/v1", api_key="x")
        msgs = [{"role": "user", "content": "Tell me a story"}]
        got = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=8, temperature=0,
                                             extra_body={"adapter": "a"})
        by_model = client.chat.completions.create(model="a", messages=msgs, max_tokens=8, temperature=0)
        base_only = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=8,
                                                   temperature=0)
        assert got.choices[0].message.content == by_model.choices[0].message.content
        assert got.choices[0].message.content != base_only.choices[0].message.content


def stream_text(base, max_tokens, adapter, started):
    """A streamed chat's whole text; sets `started` once the first content arrives."""
    u = urlparse(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "adapter": adapter}
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    text, finish = "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])["choices"]
        if ch and ch[0]["delta"].get("content"):
            text += ch[0]["delta"]["content"]
            started.set()
        if ch and ch[0].get("finish_reason"):
            finish = ch[0]["finish_reason"]
    c.close()
    return text, finish


def test_unmount_mid_stream_loses_no_request(adapters):
    with server(TINY, "--adapter", f"a={adapters['a']}", env=SCALAR) as base:
        alone = chat(base, max_tokens=200, adapter="a")
        started, results = threading.Event(), {}
        t = threading.Thread(target=lambda: results.update(stream=stream_text(base, 200, "a", started)))
        t.start()
        assert started.wait(120)
        st, _ = call(base, "DELETE", "/v1/adapters/a")  # while the stream decodes with it
        assert st == 200
        t.join()
        assert results["stream"] == (alone["content"], alone["finish"])  # finished with its adapter
        st, err = call(base, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "adapter": "a"})
        assert st == 400 and err["error"]["code"] == "adapter_not_found"


def test_bad_adapter_at_start_ends_the_server(adapters):
    p = subprocess.run([str(BIN), "serve", "--model", str(TINY), "--port", "0", "--adapter-path",
                        str(adapters["qwen"])], capture_output=True, timeout=120)
    assert p.returncode != 0
    assert "adapters.safetensors" in p.stderr.decode()


def test_hybrid_state_snapshots_are_per_adapter(tmp_path):
    """Qwen3.5 keeps recurrent-state snapshots for its prefix cache beside the KV blocks:
    what a request with an adapter computed must never start a request without one (or the
    reverse). A long prompt is answered without, then with an adapter; then the next turn
    of the adapter's conversation without the adapter must equal that turn on a fresh
    server, where nothing was cached."""
    hybrid = need(CACHE / "tiny" / "qwen3_5-f32", "tiny qwen3_5 model", "run tools/make_tiny_models.py")
    ad = make_mlx_adapter(hybrid, tmp_path / "ad", seed=5, keys=("self_attn.q_proj", "mlp.down_proj"))
    long = " ".join(f"word{i % 11}" for i in range(300))
    msgs = [{"role": "user", "content": long}]
    with server(hybrid, "--adapter", f"a={ad}", env=SCALAR) as base:
        plain = chat(base, 40, messages=msgs, adapter="none")
        with_a = chat(base, 40, messages=msgs, adapter="a")
        turn2 = msgs + [{"role": "assistant", "content": with_a["content"]}, {"role": "user", "content": "again"}]
        after = chat(base, 8, messages=turn2, adapter="none")
        again_a = chat(base, 40, messages=msgs, adapter="a")
    with server(hybrid, "--adapter", f"a={ad}", env=SCALAR) as base:
        fresh = chat(base, 8, messages=turn2, adapter="none")
    assert plain["content"] != with_a["content"]  # the adapter matters
    assert after == fresh
    assert again_a == with_a


def test_moe_default_keys_adapter_matches_mlx_lm_server_and_batches(tmp_path):
    """mlx_lm.lora's default keys on a mixture-of-experts model adapt the router, the routed
    experts (one pair per expert), the shared expert and its gate: hearth serves such an
    adapter with the real mlx_lm.server's greedy text, and rows with it, with another adapter
    and with none share steps with the text each gives alone."""
    moe = need(CACHE / "tiny" / "qwen3_5_moe-f32", "tiny qwen3_5_moe model", "run tools/make_tiny_models.py")
    a = make_mlx_adapter(moe, tmp_path / "a", seed=6, keys=None)
    b = make_mlx_adapter(moe, tmp_path / "b", seed=7, keys=("mlp.switch_mlp.down_proj", "mlp.gate"))
    body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
    with upstream_server(moe, "--adapter-path", a) as up:
        st, ref = call(up, "POST", "/v1/completions", body)
        assert st == 200, ref
    with server(moe, "--adapter", f"a={a}", "--adapter", f"b={b}", env=SCALAR) as base:
        st, ours = call(base, "POST", "/v1/completions", {**body, "adapter": "a"})
        assert st == 200, ours
        assert ours["choices"][0]["text"] == ref["choices"][0]["text"]
        specs = ["none", "a", "b", "a+b", "none", "a"]
        alone = {s: chat(base, adapter=s) for s in set(specs)}
        assert len({alone[s]["content"] for s in ("none", "a", "b")}) == 3  # each adapter changes the text
        with ThreadPoolExecutor(len(specs)) as ex:
            mixed = list(ex.map(lambda s: (s, chat(base, adapter=s)), specs))
        for s, got in mixed:
            assert got == alone[s], f"adapter {s}: batched run differs from its lone run"
        st, listing = call(base, "GET", "/v1/adapters")
        mods = {x["id"]: x["modules"] for x in listing["data"]}
        assert {"router", "experts.gate_proj", "experts.down_proj", "shared_expert_gate"} <= set(mods["a"])
