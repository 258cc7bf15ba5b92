"""The chat page's memory panel and memory tools in headless Chromium, against `hearth
--memory` serving a vault made here (a ChatGPT export imported, synthesized by the scripted
model of tests/api): the panel lists the articles, searches, opens a page, shows what the
last synthesis runs changed (each file's added and removed lines, checked against the git
CLI's diff of the same commits) and the log, and runs a synthesis by the served model with its progress; the model is offered the memory tools, and when it calls one the page runs
it on the server and sends the result back. The model's side of that exchange is played by
Playwright (SmolLM2-135M does not call tools reliably): the requests the page sends are
recorded and checked, and the tool result in the second request comes from the real
server's vault. Then the real SmolLM2 plays it, its first turn forced to call
memory_search by tool_choice (added to the page's request on its way): the call, the
page's run of it and the answer after it."""
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect

from conftest import BIN, appliance, chat_page, shot

API = Path(__file__).resolve().parent.parent / "api"
sys.path.insert(0, str(API))
from test_memory import CHATGPT, CLAUDE, MORE, git_diff  # noqa: E402

SCRIPT = f"cmd:{sys.executable} {API / 'memory_scripted_model.py'}"
TOOLS = {"memory_status", "memory_list", "memory_search", "memory_read", "memory_toc", "memory_section",
         "memory_links"}


@pytest.fixture(scope="module")
def memory_app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory-ui")
    vault = tmp / "wiki"
    exports = []
    for name, data in (("chatgpt.json", CHATGPT), ("claude.json", CLAUDE)):
        exports.append(tmp / name)
        exports[-1].write_text(json.dumps(data))
    for args in (["init"], *(["import", str(e)] for e in exports), ["synthesize", "--model", SCRIPT]):
        subprocess.run([str(BIN), "memory", *args, "--vault", str(vault), "--embed-model", "none"], check=True,
                       capture_output=True, timeout=120)
    with appliance("--memory", "--memory-vault", str(vault)) as (base, _):
        yield base, vault


@pytest.fixture
def page(browser, memory_app):
    with chat_page(browser, memory_app[0]) as pg:
        yield pg


def git_changes(vault):
    """The last commit as the panel should show it: its message and, per file, the diff
    lines the git CLI gives."""
    msg = subprocess.run(["git", "-C", str(vault), "log", "-1", "--format=%s"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return msg, {path: [f"{op} {text}" for op, text in lines] for path, lines in git_diff(vault, "HEAD").items()}


def shown_changes(pg):
    """Per run shown in the "What synthesis changed" view: (message, {path: [diff lines]})."""
    runs = pg.evaluate("""() => [...document.querySelectorAll('#memory-view-body section.change')].map(s => [
        s.querySelector('h3').textContent,
        Object.fromEntries([...s.querySelectorAll('.change-file')].map(f => [
            f.querySelector('summary .path').textContent,
            [...f.querySelectorAll('pre.diff span')].map(x => x.textContent)]))])""")
    return [(m, files) for m, files in runs]


def test_panel_lists_searches_opens_and_shows_changes(page, memory_app):
    pg, vault = page, memory_app[1]
    expect(pg.locator("#memory")).to_be_visible(timeout=10000)
    results = pg.locator("#memory-results button.open")
    expect(results).to_have_count(2)  # the articles synthesis wrote
    assert sorted(results.all_inner_texts()) == ["Baking", "Cycling"]
    pg.fill("#memory-query", "titanium frame")
    pg.press("#memory-query", "Enter")
    expect(results.first).to_contain_text("56 cm titanium")
    results.first.click()
    expect(pg.locator("#memory-view")).to_be_visible()
    expect(pg.locator("#memory-view-body")).to_contain_text("My road bike frame is 56 cm titanium.")
    assert pg.evaluate("document.activeElement.id") == "memory-close"
    shot(pg, "memory-01-search-open")
    pg.click("#memory-changes")
    expect(pg.locator("#memory-view-title")).to_have_text("What synthesis changed")
    expect(pg.locator("#memory-view-body")).to_contain_text("synthesize: 2 article(s) written")
    assert shown_changes(pg)[0] == git_changes(vault)
    pg.locator(".change-file", has_text="articles/Baking.md").locator("button.open-changed").click()
    expect(pg.locator("#memory-view-title")).to_have_text("Baking")
    pg.click("#memory-changes")
    pg.click("#memory-view-body button.open-log")  # the whole log is a click away
    expect(pg.locator("#memory-view-body")).to_contain_text("synthesize: 2 article(s) written")
    pg.click("#memory-close")
    expect(pg.locator("#memory-view")).to_be_hidden()
    pg.click("#memory-articles")
    expect(results).to_have_count(2)
    # page text never becomes HTML: a query with markup is searched, not rendered
    pg.fill("#memory-query", "<img src=x onerror=alert(1)>")
    pg.press("#memory-query", "Enter")
    expect(pg.locator("#memory-results li").first).to_be_visible()
    assert pg.locator("#memory-results img").count() == 0


def sse(*chunks):
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def chunk(delta, finish=None):
    return {"id": "x", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_model_calls_a_memory_tool_and_reads_the_result(page):
    pg = page
    expect(pg.locator("#memory")).to_be_visible(timeout=10000)
    sent = []

    def model(route):
        body = json.loads(route.request.post_data)
        sent.append(body)
        if len(sent) == 1:  # the model asks the memory, its arguments in two pieces
            call = {"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "memory_search", "arguments": '{"query": "sourdough'}}
            more = {"index": 0, "function": {"arguments": ' starter", "limit": 2}'}}
            text = sse(chunk({"role": "assistant", "tool_calls": [call]}), chunk({"tool_calls": [more]}),
                       chunk({}, "tool_calls"))
        else:
            text = sse(chunk({"role": "assistant", "content": "Your starter is called Clint."}), chunk({}, "stop"))
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=text)

    pg.route("**/v1/chat/completions", model)
    pg.fill("#prompt", "What is my sourdough starter called?")
    pg.press("#prompt", "Enter")
    expect(pg.locator("article.msg.assistant .body").last).to_have_text("Your starter is called Clint.",
                                                                        timeout=20000)
    assert len(sent) == 2
    assert {t["function"]["name"] for t in sent[0]["tools"]} == TOOLS
    assert all(t["type"] == "function" for t in sent[0]["tools"])
    msgs = sent[1]["messages"]
    asked = next(m for m in msgs if m.get("tool_calls"))
    assert asked["tool_calls"][0]["function"] == {"name": "memory_search",
                                                  "arguments": '{"query": "sourdough starter", "limit": 2}'}
    result = next(m for m in msgs if m["role"] == "tool")
    assert result["tool_call_id"] == "call_1"
    hits = json.loads(result["content"])  # the real server's search of the vault
    assert len(hits) == 2 and any("Clint" in h["text"] for h in hits)
    tool_node = pg.locator("article.msg.tool")
    expect(tool_node).to_have_count(1)
    expect(tool_node.locator(".who")).to_have_text("memory: memory_search")
    expect(pg.locator(".note.calls")).to_contain_text('memory_search({"query": "sourdough starter"')
    shot(pg, "memory-02-tool-call")
    # switched off in Settings: no tools are offered
    pg.click("#settings summary")
    pg.uncheck("#use-memory")
    pg.click("#new-chat")
    pg.fill("#prompt", "Hello")
    pg.press("#prompt", "Enter")
    expect(pg.locator("article.msg.assistant .body").last).to_have_text("Your starter is called Clint.",
                                                                        timeout=20000)
    assert "tools" not in sent[-1]


def test_the_served_model_calls_a_memory_tool_through_the_page(page, memory_app):
    """The real default model behind the page's tool loop. The question's first request
    gets tool_choice naming memory_search on its way to the server (added here; the page
    leaves the choice to the model, which SmolLM2 rarely uses), greedy; the later turns go
    as the page sends them (tools offered while tool turns are left), greedy and short. The
    model's call must validate against the tool's schema, the page must run it on the
    server and send back the vault's own result for those arguments, and a final answer
    must arrive within the 4 tool turns. Its wording is not judged."""
    import jsonschema
    pg, base = page, memory_app[0]
    expect(pg.locator("#memory")).to_be_visible(timeout=10000)
    sent = []

    def to_the_model(route):
        body = json.loads(route.request.post_data)
        body["temperature"] = 0
        if not sent:  # one call: with parallel calls allowed SmolLM2 may repeat it to max_tokens
            body.update(tool_choice={"type": "function", "function": {"name": "memory_search"}}, max_tokens=300,
                        parallel_tool_calls=False)
        else:
            body["max_tokens"] = 24
        sent.append(body)
        route.continue_(post_data=json.dumps(body))

    pg.route("**/v1/chat/completions", to_the_model)
    pg.fill("#prompt", "What is my sourdough starter called?")
    pg.press("#prompt", "Enter")
    expect(pg.locator("#status")).to_have_text("Answer complete.", timeout=240000)
    assert 2 <= len(sent) <= 5, len(sent)
    schema = next(t["function"]["parameters"] for t in sent[0]["tools"] if t["function"]["name"] == "memory_search")
    asked = next(m for m in sent[1]["messages"] if m.get("tool_calls"))
    call = asked["tool_calls"][0]
    assert call["function"]["name"] == "memory_search"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, schema)
    result = next(m for m in sent[1]["messages"] if m["role"] == "tool")
    assert result["tool_call_id"] == call["id"]
    req = urllib.request.Request(base + "/v1/memory/tools/memory_search", data=json.dumps(args).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(result["content"]) == json.loads(r.read())  # the vault's answer to that call
    print("the model asked", call["function"]["arguments"], "->", result["content"][:200], f"({len(sent)} turns)")
    tool_nodes = pg.locator("article.msg.tool")
    expect(tool_nodes.first.locator(".who")).to_have_text("memory: memory_search")
    assert tool_nodes.count() == len(sent) - 1 or "tools" not in sent[-1]
    final = pg.locator("article.msg.assistant").last
    expect(final.locator(".body")).not_to_be_empty()
    assert final.locator(".note.calls").count() == 0  # the last turn answered, it called nothing
    shot(pg, "memory-05-real-tool-call")


def test_synthesize_now_streams_progress_and_commits(page, memory_app, tmp_path):
    """A new conversation arrives (imported beside the running server); "Synthesize now"
    runs synthesis with the served SmolLM2 and shows its progress; one commit (git CLI)."""
    pg = page
    vault = memory_app[1]
    export = tmp_path / "more.json"
    export.write_text(json.dumps(MORE))
    subprocess.run([str(BIN), "memory", "import", str(export), "--vault", str(vault), "--embed-model", "none"],
                   check=True, capture_output=True)
    git = lambda *a: subprocess.run(["git", "-C", str(vault), *a], capture_output=True, text=True,  # noqa: E731
                                    check=True).stdout
    n = int(git("rev-list", "--count", "HEAD"))
    expect(pg.locator("#memory")).to_be_visible(timeout=10000)
    pg.click("#memory-synthesize")
    expect(pg.locator("#memory-synthesize")).to_be_disabled()
    expect(pg.locator("#memory-progress")).to_contain_text("Synthesis done:", timeout=120000)
    expect(pg.locator("#memory-synthesize")).to_be_enabled()
    assert int(git("rev-list", "--count", "HEAD")) == n + 1 and "synthesize" in git("log", "-1", "--format=%s")
    # what it changed: this run first, then the scripted run before it, as git shows them
    pg.click("#memory-changes")
    expect(pg.locator("#memory-view-body section.change")).to_have_count(2)
    shown = shown_changes(pg)
    assert shown[0] == git_changes(vault) and shown[1][0].startswith("memory: synthesize: 2 article(s)")
    shot(pg, "memory-04-changes")
    pg.click("#memory-close")
    # nothing new the second time
    pg.click("#memory-synthesize")
    expect(pg.locator("#memory-progress")).to_have_text("Nothing new to synthesize.", timeout=60000)
    assert int(git("rev-list", "--count", "HEAD")) == n + 1
    shot(pg, "memory-03-synthesized")
