"""GET /metrics of `hearth serve` (src/server/metrics.c): the Prometheus text format, parsed
by the official `prometheus_client` parser, scraped before, during and after a streaming
chat completion read over a raw socket. During the request the running gauge, KV blocks,
generated tokens and the time-to-first-token histogram have moved while the request counter
has not (the request is not answered yet); after it, the token counters moved by exactly
the usage the response reports, the per-token histogram by one observation per gap, the
request counter by one under its endpoint and status, and a 404 and a 400 under theirs.
A repeated prompt's prefix-cache hits equal the cached_tokens its response reports."""
import http.client
import json
import time
from urllib.parse import urlparse

import pytest

from conftest import server

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # fail, not skip: tools/deps.sh installs it
    text_string_to_metric_families = None

NO_EOS = {"2": -100}  # SmolLM2's <|im_end|>: the answer runs to max_tokens
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


@pytest.fixture(scope="module")
def base(smollm2):
    assert text_string_to_metric_families, "prometheus_client missing: run tools/deps.sh"
    with server(smollm2) as b:
        yield b


def conn(base):
    u = urlparse(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def scrape(base):
    c = conn(base)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read().decode()
    assert r.status == 200
    assert r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    samples = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def post(base, path, body):
    c = conn(base)
    data = json.dumps(body) if not isinstance(body, (bytes, str)) else body
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read()


def test_metrics_move_during_and_after_a_request(base):
    before = scrape(base)
    chat = dict(endpoint="/v1/chat/completions", status="200")
    c = conn(base)
    c.request("POST", "/v1/chat/completions",
              json.dumps({"messages": STORY, "max_tokens": 64, "temperature": 0, "stream": True,
                          "stream_options": {"include_usage": True}, "logit_bias": NO_EOS}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    # read until some content has arrived: the request is mid-generation
    got = 0
    while got < 3:
        line = r.readline().decode()
        if line.startswith("data: {") and json.loads(line[6:])["choices"] and \
                json.loads(line[6:])["choices"][0]["delta"].get("content"):
            got += 1
    during = scrape(base)
    assert value(during, "hearth_requests_running") == 1
    assert value(during, "hearth_requests_waiting") == 0
    assert value(during, "hearth_kv_blocks_used") > 0
    assert 0 < value(during, "hearth_kv_cache_usage_ratio") <= 1
    assert value(during, "hearth_kv_blocks_total") >= value(during, "hearth_kv_blocks_used")
    assert value(during, "hearth_generation_tokens_total") >= value(before, "hearth_generation_tokens_total") + 3
    assert value(during, "hearth_time_to_first_token_seconds_count") == \
        value(before, "hearth_time_to_first_token_seconds_count") + 1
    assert value(during, "hearth_requests_total", **chat) == value(before, "hearth_requests_total", **chat)

    usage = None
    for raw in iter(r.readline, b""):
        line = raw.decode()
        if line.startswith("data: {") and json.loads(line[6:]).get("usage"):
            usage = json.loads(line[6:])["usage"]
    c.close()
    assert usage and usage["completion_tokens"] == 64
    time.sleep(0.2)  # the server counts the request once the connection has finished with it
    after = scrape(base)
    assert value(after, "hearth_requests_total", **chat) == value(before, "hearth_requests_total", **chat) + 1
    assert value(after, "hearth_requests_running") == 0
    assert value(after, "hearth_kv_blocks_used") == 0
    assert value(after, "hearth_prompt_tokens_total") - value(before, "hearth_prompt_tokens_total") == \
        usage["prompt_tokens"]
    assert value(after, "hearth_generation_tokens_total") - value(before, "hearth_generation_tokens_total") == \
        usage["completion_tokens"]
    gaps = value(after, "hearth_time_per_output_token_seconds_count") - \
        value(before, "hearth_time_per_output_token_seconds_count")
    assert gaps == usage["completion_tokens"] - 1
    # the buckets are cumulative up to the count, and the latencies are plausible
    assert value(after, "hearth_time_per_output_token_seconds_bucket", le="+Inf") == \
        value(after, "hearth_time_per_output_token_seconds_count")
    assert 0 < value(after, "hearth_time_per_output_token_seconds_sum") - \
        value(before, "hearth_time_per_output_token_seconds_sum") < 60
    assert value(after, "process_resident_memory_bytes") > 50e6  # the weights and KV pool are resident
    assert value(after, "hearth_process_peak_resident_memory_bytes") >= value(after, "process_resident_memory_bytes")


def test_errors_are_counted_by_endpoint_and_status(base):
    before = scrape(base)
    c = conn(base)
    c.request("GET", "/no/such/path")
    assert c.getresponse().status == 404
    status, _ = post(base, "/v1/chat/completions", "{not json")
    assert status == 400
    status, body = post(base, "/metrics", {})
    assert status == 405 and json.loads(body)["error"]["message"]
    time.sleep(0.2)
    after = scrape(base)
    for labels in ({"endpoint": "other", "status": "404"}, {"endpoint": "/v1/chat/completions", "status": "400"},
                   {"endpoint": "/metrics", "status": "405"}):
        assert value(after, "hearth_requests_total", **labels) == value(before, "hearth_requests_total", **labels) + 1
    # the scrape before this one counts too
    assert value(after, "hearth_requests_total", endpoint="/metrics", status="200") >= 1


def test_index_lists_metrics(base):
    c = conn(base)
    c.request("GET", "/v1")
    index = json.loads(c.getresponse().read())
    assert any(e["path"] == "/metrics" and e["method"] == "GET" for e in index["data"])


def test_prefix_cache_hits_equal_the_cached_tokens_reported(base):
    body = {"messages": [{"role": "system", "content": "You are a careful assistant. " * 20},
                         {"role": "user", "content": "Name three colours."}], "max_tokens": 4, "temperature": 0}
    status, _ = post(base, "/v1/chat/completions", body)
    assert status == 200
    before = scrape(base)
    status, raw = post(base, "/v1/chat/completions", body)
    assert status == 200
    usage = json.loads(raw)["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    after = scrape(base)
    assert value(after, "hearth_prefix_cache_hits_total") - value(before, "hearth_prefix_cache_hits_total") == cached
    assert value(after, "hearth_prefix_cache_queries_total") - value(before, "hearth_prefix_cache_queries_total") == \
        usage["prompt_tokens"]
