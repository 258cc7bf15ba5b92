"""The personal memory over HTTP (`serve --memory`, docs/memory.md): the read-only tools
as chat function tools (their parameter schemas checked by jsonschema, one offered to
the model through the openai SDK), a tool call and its errors (OpenAI error bodies),
`GET /v1/memory/synthesize` as server-sent events (parsed here from the raw stream; the
commit checked with the git CLI) and its ?since=, `GET /v1/memory/changes` (each line
checked against the git CLI's diff), and the Responses store feeding the vault
(`--memory-log`, written through the openai SDK). The served model is the default
SmolLM2; what it writes is not judged, only the protocol and the vault."""
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jsonschema
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import BIN, SMOLLM2, server  # noqa: E402
from hearth_process import need  # noqa: E402
from test_memory import CHATGPT, CLAUDE, MORE, SCRIPT, git_diff  # noqa: E402

TOOLS = {"memory_status", "memory_list", "memory_search", "memory_read", "memory_toc", "memory_section",
         "memory_links"}


def git(vault, *args):
    return subprocess.run(["git", "-C", str(vault), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def vault(tmp_path):
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    need(SMOLLM2, "SmolLM2-135M-Instruct", "run tools/get_models.sh")
    v = tmp_path / "wiki"
    export = tmp_path / "export.json"
    export.write_text(json.dumps(CHATGPT))
    for args in (["init"], ["import", str(export)]):
        subprocess.run([str(BIN), "memory", *args, "--vault", str(v), "--embed-model", "none"], check=True,
                       capture_output=True)
    return v


def post(base, path, body):
    req = urllib.request.Request(base + path, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(base, path):
    try:
        with urllib.request.urlopen(base + path, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def events(base, path):
    """The (event, data) pairs of a text/event-stream response, read to its end."""
    with urllib.request.urlopen(base + path, timeout=600) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_tools_calls_and_errors(vault):
    with server(SMOLLM2, "--memory", "--memory-vault", vault) as base:
        status, tools = get(base, "/v1/memory/tools")
        assert status == 200 and tools["object"] == "list"
        assert {t["function"]["name"] for t in tools["data"]} == TOOLS
        for t in tools["data"]:
            assert t["type"] == "function"
            jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
        status, hits = post(base, "/v1/memory/tools/memory_search", '{"query": "sourdough starter", "limit": 3}')
        assert status == 200 and "Clint" in hits[0]["text"] and hits[0]["path"].startswith("Conversations/")
        status, doc = post(base, "/v1/memory/tools/memory_read", json.dumps({"article": hits[0]["path"]}))
        assert status == 200 and "Feed Clint rye flour" in doc["text"]
        status, err = post(base, "/v1/memory/tools/memory_write", "{}")  # the tools are read-only
        assert status == 404 and "read-only" in err["error"]["message"]
        status, err = post(base, "/v1/memory/tools/memory_search", "[1]")
        assert status == 400 and err["error"]["type"] == "invalid_request_error"
        status, err = post(base, "/v1/memory/tools/memory_read", '{"article": "No Such Page"}')
        assert status == 404 and "No Such Page" in err["error"]["message"]
        # the list is what a chat request's "tools" takes: the SDK sends it, the server accepts it
        client = openai.OpenAI(base_url=base + "/v1", api_key="x")
        r = client.chat.completions.create(model="default_model", max_tokens=4, temperature=0, tools=tools["data"],
                                           messages=[{"role": "user", "content": "What is my starter called?"}])
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert git(vault, "status", "--porcelain") == ""


FORCE_SEARCH = {"type": "function", "function": {"name": "memory_search"}}


def check_hits(vault, hits):
    """A memory_search result from this vault: every passage is in the file it names."""
    assert isinstance(hits, list)
    for h in hits:
        text = (vault / h["path"]).read_text()
        assert all(line.strip() in text for line in h["text"].splitlines()), h


def test_the_default_model_calls_a_memory_tool(vault):
    """The real default model (SmolLM2-135M) offered the memory tools with tool_choice naming
    memory_search makes one call whose arguments validate (jsonschema) against the tool's
    own parameters; the call runs on the vault; its result goes back as a tool message and
    is in the model's prompt (more prompt tokens than the same request with an empty
    result), and the answer after it arrives. What the model says is not judged."""
    with server(SMOLLM2, "--memory", "--memory-vault", vault) as base:
        _, tools = get(base, "/v1/memory/tools")
        schema = next(t["function"]["parameters"] for t in tools["data"] if t["function"]["name"] == "memory_search")
        client = openai.OpenAI(base_url=base + "/v1", api_key="x")
        msgs = [{"role": "user", "content": "What is my sourdough starter called?"}]
        # one call: with parallel calls allowed, SmolLM2 on the fast kernels sits at a near-tie
        # between ending its turn and repeating the same call (1, 2 or 4+ copies, by how a
        # verify step's rows round), which is the model's choice, not what this test checks
        r = client.chat.completions.create(model="default_model", messages=msgs, tools=tools["data"],
                                           tool_choice=FORCE_SEARCH, parallel_tool_calls=False, temperature=0,
                                           max_tokens=300)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
        call = choice.message.tool_calls[0]
        assert call.function.name == "memory_search"
        jsonschema.validate(json.loads(call.function.arguments), schema)
        status, hits = post(base, "/v1/memory/tools/memory_search", call.function.arguments)
        assert status == 200
        check_hits(vault, hits)
        print("the model asked", call.function.arguments, "->", len(hits), "hit(s)")
        asked = {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": "memory_search", "arguments": call.function.arguments}}]}

        def answer(content):
            return client.chat.completions.create(
                model="default_model", temperature=0, max_tokens=16, tools=tools["data"], tool_choice="none",
                messages=msgs + [asked, {"role": "tool", "tool_call_id": call.id, "content": content}])
        final, empty = answer(json.dumps(hits)), answer("")
        assert final.usage.prompt_tokens > empty.usage.prompt_tokens  # the result is in the prompt
        assert final.choices[0].finish_reason in ("stop", "length") and not final.choices[0].message.tool_calls
        assert isinstance(final.choices[0].message.content, str) and final.usage.completion_tokens > 0


def test_without_memory_the_routes_say_how(vault):
    with server(SMOLLM2) as base:
        status, err = get(base, "/v1/memory/tools")
        assert status == 404 and err["error"]["code"] == "memory_off" and "--memory" in err["error"]["message"]


def test_synthesize_streams_progress_and_commits_once(vault):
    n = int(git(vault, "rev-list", "--count", "HEAD"))
    with server(SMOLLM2, "--memory", "--memory-vault", vault) as base:
        plan = events(base, "/v1/memory/synthesize?dry=1")
        assert [e for e, _ in plan] == ["plan", "done"]
        assert plan[0][1]["segment"] == 1 and plan[1][1]["committed"] is False
        assert int(git(vault, "rev-list", "--count", "HEAD")) == n  # the plan writes nothing
        run = events(base, "/v1/memory/synthesize")
        kinds = [e for e, _ in run]
        assert kinds[0] == "plan" and kinds[-1] == "done" and set(kinds[1:-1]) == {"progress"}, kinds
        stages = [d["stage"] for e, d in run if e == "progress"]
        assert stages == sorted(stages, key=["segment", "extract", "route", "synthesize"].index) and "segment" in stages
        done = run[-1][1]
        assert done["committed"] is True
        assert int(git(vault, "rev-list", "--count", "HEAD")) == n + 1 and git(vault, "status", "--porcelain") == ""
        assert "synthesize" in git(vault, "log", "-1", "--format=%s")
        for name in done["articles"]:
            assert (vault / "articles" / f"{name}.md").exists() or (vault / "Talk" / f"{name}.md").exists()
        again = events(base, "/v1/memory/synthesize")
        assert again[-1][0] == "done" and again[-1][1]["committed"] is False
        status, err = get(base, "/v1/memory/synthesize?dry=maybe")
        assert status == 400 and err["error"]["param"] == "dry"


def test_synthesize_since(vault, tmp_path):
    """?since= as `hearth memory synthesize --since` takes it (CHATGPT was created
    2023-11-14 22:13 UTC, MORE 2023-11-16 02:00): the plan and the run leave older
    conversations waiting; a bad value is a 400 naming the field, before any stream."""
    export = tmp_path / "more.json"
    export.write_text(json.dumps(MORE))
    subprocess.run([str(BIN), "memory", "import", str(export), "--vault", str(vault), "--embed-model", "none"],
                   check=True, capture_output=True)
    n = int(git(vault, "rev-list", "--count", "HEAD"))
    with server(SMOLLM2, "--memory", "--memory-vault", vault) as base:
        def plan(since):
            ev = events(base, "/v1/memory/synthesize?dry=1&since=" + urllib.parse.quote(since))
            assert [e for e, _ in ev] == ["plan", "done"]
            return ev[0][1]["segment"]
        assert plan("2023-11-14") == 2 and plan("2023-11-15") == 1 and plan("2023-11-17") == 0
        assert plan("2023-11-14T22:13") == 2 and plan("2023-11-14 22:14") == 1
        for bad in ("yesterday", "2023-11-31", "2023-11-14T22:61", "2023-11-14T22", ""):
            status, err = get(base, "/v1/memory/synthesize?since=" + urllib.parse.quote(bad))
            assert status == 400 and err["error"]["param"] == "since", (bad, err)
            assert err["error"]["type"] == "invalid_request_error" and "YYYY-MM-DD" in err["error"]["message"]
        run = events(base, "/v1/memory/synthesize?since=2023-11-15")  # the served model reads MORE only
        assert run[0][1]["segment"] == 1 and run[-1][0] == "done" and run[-1][1]["committed"] is True
        assert [d["done"] for e, d in run if e == "progress" and d["stage"] == "segment"] == [1]
        assert int(git(vault, "rev-list", "--count", "HEAD")) == n + 1
        assert plan("2023-11-14") == 1  # the older conversation still waits


def test_changes_shows_what_synthesis_changed(vault, tmp_path):
    """GET /v1/memory/changes: the last synthesis commits (import commits skipped), each
    file's added and removed lines equal to the git CLI's own diff of that commit."""
    def memory(*args):
        return subprocess.run([str(BIN), "memory", *args, "--vault", str(vault), "--embed-model", "none"],
                              check=True, capture_output=True, text=True).stdout
    assert json.loads(memory("changes", "--json")) == []  # no synthesis yet
    for i, export in enumerate((CLAUDE, MORE)):
        (tmp_path / f"e{i}.json").write_text(json.dumps(export))
        memory("import", str(tmp_path / f"e{i}.json"))
        memory("synthesize", "--model", SCRIPT)
        if i == 0:
            first = git(vault, "rev-parse", "HEAD").strip()
    second = git(vault, "rev-parse", "HEAD").strip()
    assert git(vault, "rev-list", "--count", f"{first}..{second}").strip() == "2"  # MORE's import between
    with server(SMOLLM2, "--memory", "--memory-vault", vault) as base:
        status, one = get(base, "/v1/memory/changes")
        assert status == 200 and one["object"] == "list" and [c["commit"] for c in one["data"]] == [second]
        status, two = get(base, "/v1/memory/changes?limit=20")
        assert status == 200 and [c["commit"] for c in two["data"]] == [second, first]
        for c in two["data"]:
            assert c["message"] == git(vault, "log", "-1", "--format=%s", c["commit"]).strip()
            assert c["message"].startswith("memory: synthesize")
            want = git_diff(vault, c["commit"])
            got = {f["path"]: [(ln["op"], ln["text"]) for ln in f["lines"]] for f in c["files"]}
            assert got == want
            for f in c["files"]:
                assert f["added"] == sum(op == "+" for op, _ in want[f["path"]])
                assert f["removed"] == sum(op == "-" for op, _ in want[f["path"]]) and not f["truncated"]
        # the second run rewrote the articles the first one wrote: lines went and came
        arts = {f["path"]: f for f in two["data"][0]["files"] if f["kind"] == "article"}
        assert arts and all(f["status"] == "modified" for f in arts.values())
        assert any("spelt" in ln["text"] for f in arts.values() for ln in f["lines"] if ln["op"] == "+")
        assert {f["status"] for f in two["data"][1]["files"] if f["kind"] == "article"} == {"added"}
        for bad in ("0", "21", "two", ""):
            status, err = get(base, "/v1/memory/changes?limit=" + bad)
            assert status == 400 and err["error"]["param"] == "limit", (bad, err)
    text = memory("changes", "--limit", "2")  # the CLI prints the same diff
    assert text.count("memory: synthesize") == 2 and "spelt" in text


def test_responses_store_feeds_the_vault(vault):
    before = set((vault / "Conversations").glob("*.md"))
    with server(SMOLLM2, "--memory-log", "--memory-vault", vault) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x")
        client.responses.create(model="default_model", input="My cat is called Miso.", max_output_tokens=8,
                                temperature=0, store=False)
        assert set((vault / "Conversations").glob("*.md")) == before  # not stored: not remembered
        r = client.responses.create(model="default_model", input="My cat is called Miso.", max_output_tokens=8,
                                    temperature=0)
        # the stored conversation is in the vault, committed, and searchable at once
        status, hits = post(base, "/v1/memory/tools/memory_search", '{"query": "Miso"}')
    new = set((vault / "Conversations").glob("*.md")) - before
    assert len(new) == 1
    text = next(iter(new)).read_text()
    assert "My cat is called Miso." in text and r.output_text.strip()[:10] in text
    assert "/v1/responses" in text and git(vault, "status", "--porcelain") == ""
    assert status == 200 and hits and hits[0]["path"] == f"Conversations/{next(iter(new)).name}"
