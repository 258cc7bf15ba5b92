"""hearth memory: the vault (checked with the git CLI, an independent reader of what libgit2
wrote), import of ChatGPT / Claude exports and Markdown folders (dedup, no system prompts),
the reading verbs, the MCP server (JSON-RPC 2.0 on stdio; its tool schemas checked by
jsonschema), and a corrupt vault (conflict markers, non-UTF-8, detached HEAD, locked index)
reported and never written. BM25 only (--embed-model none) except the hybrid test, which
uses the tiny random-weight embedding model (ranking is not what it checks)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import isolate_cache, need  # noqa: E402

isolate_cache()
REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(os.environ.get("HEARTH_BIN", REPO / "bin" / "hearth"))
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
TINY_EMBED = CACHE / "tiny-embed" / "qwen3-embed-f32"


def hearth(vault, *args, check=True, stdin=None):
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    r = subprocess.run([str(BIN), "memory", *[str(a) for a in args], "--vault", str(vault)]
                       + ([] if "--embed-model" in args else ["--embed-model", "none"]),
                       capture_output=True, text=True, input=stdin, timeout=120)
    if check and r.returncode:
        raise AssertionError(f"hearth memory {args}: rc {r.returncode}\n{r.stderr}")
    return r


def git(vault, *args):
    return subprocess.run(["git", "-C", str(vault), *args], capture_output=True, text=True, check=True).stdout


def commits(vault):
    return int(git(vault, "rev-list", "--count", "HEAD"))


@pytest.fixture
def vault(tmp_path):
    v = tmp_path / "wiki"
    report = json.loads(hearth(v, "init").stdout)
    assert report["created"] and report["committed"]
    return v


CHATGPT = [{
    "title": "Sourdough",
    "create_time": 1700000000.0,
    "current_node": "c",
    "mapping": {
        "root": {"id": "root", "message": None, "parent": None, "children": ["s"]},
        "s": {"id": "s", "parent": "root", "children": ["a"], "message": {
            "author": {"role": "system"}, "content": {"parts": ["SECRET SYSTEM PROMPT zebra"]}}},
        "a": {"id": "a", "parent": "s", "children": ["b", "x"], "message": {
            "author": {"role": "user"}, "content": {"parts": ["My sourdough starter is named Clint."]},
            "create_time": 1700000001.0}},
        "x": {"id": "x", "parent": "a", "children": [], "message": {  # an abandoned branch
            "author": {"role": "assistant"}, "content": {"parts": ["abandoned quokka branch"]}}},
        "b": {"id": "b", "parent": "a", "children": ["c"], "message": {
            "author": {"role": "assistant"}, "content": {"parts": ["Feed Clint rye flour twice a day."]}}},
        "c": {"id": "c", "parent": "b", "children": [], "message": {
            "author": {"role": "user"}, "content": {"parts": ["Thanks, I bake on Sundays.", {"image": 1}]}}},
    }}]

CLAUDE = [{"uuid": "u1", "name": "Bike fitting", "created_at": "2024-03-01T10:00:00Z", "chat_messages": [
    {"sender": "human", "text": "My road bike frame is 56 cm titanium.", "created_at": "2024-03-01T10:00:00Z"},
    {"sender": "assistant", "text": "", "content": [{"type": "text", "text": "A 56 cm frame suits 178 cm riders."}]},
]}]


def test_init_is_a_git_repo_with_reference_and_idempotent(vault):
    assert commits(vault) == 1
    files = git(vault, "ls-files").split("\n")
    assert "Meta/index.md" in files and "Meta/log.md" in files
    assert any(f.startswith("Reference/") and f.endswith(".md") for f in files)
    assert not any(f.startswith(".hearth") for f in files)  # the index is derived, not tracked
    assert git(vault, "status", "--porcelain") == ""
    again = json.loads(hearth(vault, "init").stdout)
    assert not again["created"] and not again["committed"] and commits(vault) == 1
    status = json.loads(hearth(vault, "status", "--json").stdout)
    assert status["commits"] == 1 and status["problems"] == [] and status["kinds"]["reference"] >= 5
    # the docs are there on day one: searching them finds hearth's own flags
    hits = json.loads(hearth(vault, "search", "kv-quant int8 scale", "--json").stdout)
    assert hits and all(h["kind"] == "reference" for h in hits)


def test_import_chatgpt_claude_dedup_and_search(vault, tmp_path):
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps(CHATGPT))
    r = json.loads(hearth(vault, "import", export).stdout)
    assert r == {"conversations": 1, "notes": 0, "skipped": 0, "committed": True}
    convs = list((vault / "Conversations").glob("*.md"))
    assert len(convs) == 1
    text = convs[0].read_text()
    assert "zebra" not in text and "SYSTEM" not in text  # no system prompts stored
    assert "quokka" not in text  # only the thread current_node names
    assert text.index("Clint.") < text.index("rye flour") < text.index("Sundays")
    assert "source: \"chatgpt\"" in text
    assert commits(vault) == 2
    again = json.loads(hearth(vault, "import", export).stdout)
    assert again == {"conversations": 0, "notes": 0, "skipped": 1, "committed": False} and commits(vault) == 2
    claude = tmp_path / "claude" / "conversations.json"
    claude.parent.mkdir()
    claude.write_text(json.dumps(CLAUDE))
    assert json.loads(hearth(vault, "import", claude.parent).stdout)["conversations"] == 1
    # searchable at once, before any synthesis: the passage and its source
    hits = json.loads(hearth(vault, "search", "which flour to feed Clint", "--json").stdout)
    assert hits[0]["kind"] == "conversation" and "rye flour" in hits[0]["text"] and hits[0]["source"] == "chatgpt"
    assert hits[0]["path"].startswith("Conversations/") and hits[0]["anchor"]
    hits = json.loads(hearth(vault, "search", "titanium frame size", "--kind", "conversation", "--json").stdout)
    assert "56 cm titanium" in hits[0]["text"]
    log = (vault / "Meta" / "log.md").read_text()
    assert log.count("import:") == 2


NOTE = """---
title: Garden plan
---
# Garden plan

Tomatoes go by the south wall. See [[Compost]] and [[Watering#Summer|summer watering]] and [[Nowhere]].

## Beds

Three raised beds of cedar.

### Bed one

Basil and *peppers*.

```
[[not a link]]
# not a heading
```

## Harvest

August.
"""


def test_notes_and_reading_verbs(vault, tmp_path):
    src = tmp_path / "notes"
    (src / "sub").mkdir(parents=True)
    (src / "garden.md").write_text(NOTE)
    (src / "sub" / "Compost.md").write_text("# Compost\n\nGreens and browns. Back to [[Garden plan]].\n")
    (src / "Watering.txt").write_text("Summer\n\nWater at dawn.\n")
    (src / "photo.jpg").write_bytes(b"\xff\xd8")
    r = json.loads(hearth(vault, "import", src).stdout)
    assert r["notes"] == 3 and r["committed"]
    assert json.loads(hearth(vault, "import", src).stdout)["skipped"] == 3
    toc = json.loads(hearth(vault, "toc", "Garden plan", "--json").stdout)
    assert toc["path"] == "Notes/garden.md"
    assert [(h["level"], h["text"]) for h in toc["headings"]] == [(1, "Garden plan"), (2, "Beds"), (3, "Bed one"),
                                                                  (2, "Harvest")]
    section = hearth(vault, "section", "garden", "beds").stdout
    assert section.startswith("## Beds") and "Bed one" in section and "Harvest" not in section
    assert hearth(vault, "read", "Notes/garden.md").stdout == NOTE
    links = json.loads(hearth(vault, "links", "garden", "--json").stdout)
    got = {(l["target"], l["heading"], l["exists"]) for l in links["links"]}
    assert got == {("Compost", "", True), ("Watering", "Summer", True), ("Nowhere", "", False)}
    assert links["backlinks"] == ["Notes/sub/Compost.md"]
    listing = json.loads(hearth(vault, "list", "--kind", "note", "--json").stdout)
    assert {d["path"] for d in listing} == {"Notes/garden.md", "Notes/sub/Compost.md", "Notes/Watering.md"}
    miss = hearth(vault, "section", "garden", "no such heading", check=False)
    assert miss.returncode == 1 and "no section 'no such heading'" in miss.stderr


def mcp(vault, *requests):
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    out = hearth(vault, "mcp", stdin=lines).stdout
    return [json.loads(l) for l in out.splitlines()]


def test_mcp_tools(vault, tmp_path):
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "cats.md").write_text("# Cats\n\nMy cat Miso likes tuna.\n")
    hearth(vault, "import", tmp_path / "n")
    out = mcp(vault,
              {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
              {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
              {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "memory_search", "arguments": {"query": "what does Miso eat"}}},
              {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
               "params": {"name": "memory_write", "arguments": {"article": "x", "text": "y"}}},
              {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": "memory_search", "arguments": {"query": 3}}},
              "{not json",
              {"jsonrpc": "2.0", "id": 6, "method": "resources/list"},
              {"jsonrpc": "2.0", "id": 7, "method": "ping"})
    by_id = {m.get("id"): m for m in out}
    assert len(out) == 8  # the notification got no answer
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18" and "tools" in by_id[1]["result"]["capabilities"]
    tools = by_id[2]["result"]["tools"]
    assert {t["name"] for t in tools} == {"memory_status", "memory_list", "memory_search", "memory_read",
                                          "memory_toc", "memory_section", "memory_links"}
    for t in tools:
        jsonschema.Draft202012Validator.check_schema(t["inputSchema"])
    hits = json.loads(by_id[3]["result"]["content"][0]["text"])
    assert not by_id[3]["result"]["isError"] and "tuna" in hits[0]["text"]
    assert by_id[4]["result"]["isError"] and "read-only" in by_id[4]["result"]["content"][0]["text"]
    assert by_id[5]["result"]["isError"] and "'query'" in by_id[5]["result"]["content"][0]["text"]
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[6]["error"]["code"] == -32601
    assert by_id[7]["result"] == {}
    # the tools wrote nothing
    assert git(vault, "status", "--porcelain") == ""


def corrupt_cases(vault):
    note = vault / "Notes" / "x.md"

    def conflict():
        note.parent.mkdir(exist_ok=True)
        note.write_text("# X\n<<<<<<< HEAD\nmine\n=======\ntheirs\n>>>>>>> other\n")
        return "merge conflict markers"

    def latin1():
        note.parent.mkdir(exist_ok=True)
        note.write_bytes(b"# X\n\ncaf\xe9\n")
        return "not valid UTF-8"

    def detached():
        git(vault, "checkout", "-q", "--detach")
        return "HEAD is detached"

    def locked():
        (vault / ".git" / "index.lock").write_text("")
        return "index is locked"

    return [conflict, latin1, detached, locked]


@pytest.mark.parametrize("case", range(4))
def test_corrupt_vault_reported_never_written(vault, tmp_path, case):
    problem = corrupt_cases(vault)[case]()
    before = {p: p.read_bytes() for p in vault.rglob("*") if p.is_file() and ".hearth" not in p.parts}
    head = git(vault, "rev-parse", "HEAD")
    status = json.loads(hearth(vault, "status", "--json").stdout)
    assert any(problem in p for p in status["problems"]), status["problems"]
    src = tmp_path / "in"
    src.mkdir()
    (src / "new.md").write_text("# New\n\nfresh\n")
    r = hearth(vault, "import", src, check=False)
    assert r.returncode == 1 and "needs attention" in r.stderr and problem in r.stderr
    r = hearth(vault, "init", check=False)
    assert r.returncode == 1 and problem in r.stderr
    after = {p: p.read_bytes() for p in vault.rglob("*") if p.is_file() and ".hearth" not in p.parts}
    assert after == before and git(vault, "rev-parse", "HEAD") == head


def test_bad_input(vault, tmp_path):
    bad = tmp_path / "conversations.json"
    bad.write_text('{"not": "an export"}')
    r = hearth(vault, "import", bad, check=False)
    assert r.returncode == 1 and str(bad) in r.stderr and "not a ChatGPT or Claude export" in r.stderr
    bad.write_text("[{\"mapping\": ")
    r = hearth(vault, "import", bad, check=False)
    assert r.returncode == 1 and str(bad) in r.stderr
    r = hearth(vault, "import", tmp_path / "missing", check=False)
    assert r.returncode == 1 and "no such file" in r.stderr
    r = hearth(vault, "frobnicate", check=False)
    assert r.returncode == 2 and "unknown memory command" in r.stderr
    r = hearth(vault, "search", check=False)
    assert r.returncode == 2
    r = hearth(vault, "search", "x", "--kind", "bogus", check=False)
    assert r.returncode == 1 and "unknown kind" in r.stderr
    r = hearth(tmp_path / "nothing-here", "status", check=False)
    assert r.returncode == 1 and "hearth memory init" in r.stderr
    assert commits(vault) == 1


def test_hybrid_search_and_reindex(vault, tmp_path):
    need(TINY_EMBED, "tiny embedding model", "run tools/make_tiny_models.py")
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "cats.md").write_text("# Cats\n\nMy cat Miso likes tuna.\n")
    hearth(vault, "import", tmp_path / "n", "--embed-model", TINY_EMBED)
    status = json.loads(hearth(vault, "status", "--json", "--embed-model", TINY_EMBED).stdout)
    assert status["embedding_model"] == str(TINY_EMBED)
    hits = json.loads(hearth(vault, "search", "Miso tuna", "--json", "--embed-model", TINY_EMBED).stdout)
    assert hits[0]["path"] == "Notes/cats.md"
    # a query no word of which is in the vault still gets the nearest vectors
    hits = json.loads(hearth(vault, "search", "qqqqzzzz", "--json", "--limit", "3", "--embed-model", TINY_EMBED).stdout)
    assert len(hits) == 3
    before = json.loads(hearth(vault, "status", "--json").stdout)
    rebuilt = json.loads(hearth(vault, "reindex").stdout)
    assert rebuilt["documents"] == before["documents"] and rebuilt["chunks"] == before["chunks"]
    # a file edited behind hearth's back is re-read on the next open
    (vault / "Notes" / "cats.md").write_text("# Cats\n\nMiso now prefers salmon.\n")
    hits = json.loads(hearth(vault, "search", "salmon", "--json").stdout)
    assert hits and hits[0]["path"] == "Notes/cats.md"


def git_diff(vault, rev):
    """{path: [(op, text)]} of a commit against its parent, read from the git CLI's patch."""
    out = subprocess.run(["git", "-C", str(vault), "-c", "core.quotePath=false", "show", "--format=", "-U0",
                          "--no-renames", "--no-color", rev], capture_output=True, text=True, check=True).stdout
    files, cur, old, in_hunk = {}, None, None, False
    for line in out.split("\n"):
        if line.startswith("diff --git "):
            cur, in_hunk = None, False
        elif not in_hunk and line.startswith("--- "):
            old = line[6:].rstrip("\t")  # git ends a name holding a space with a tab
        elif not in_hunk and line.startswith("+++ "):
            cur = files.setdefault(old if line[4:] == "/dev/null" else line[6:].rstrip("\t"), [])
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line[:1] in "+-" and line:
            cur.append((line[0], line[1:]))
    return files


# ---- synthesis, with the scripted deterministic model -------------------------------
SCRIPT = f"cmd:{sys.executable} {Path(__file__).resolve().parent / 'memory_scripted_model.py'}"
MORE = [{"title": "More", "create_time": 1700100000.0, "current_node": "b", "mapping": {
    "a": {"id": "a", "parent": None, "children": ["b"], "message": {
        "author": {"role": "user"}, "content": {"parts": ["I switched my sourdough to spelt flour."]}}},
    "b": {"id": "b", "parent": "a", "children": [], "message": {
        "author": {"role": "user"}, "content": {"parts": ["My bike is now a gravel bike."]}}}}}]


def synthesize(vault, *args, env=None, check=True):
    r = subprocess.run([str(BIN), "memory", "synthesize", "--model", SCRIPT, "--vault", str(vault),
                        "--embed-model", "none", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    if check and r.returncode:
        raise AssertionError(f"synthesize: rc {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout) if r.returncode == 0 else r


def imported(vault, tmp_path, *exports):
    for i, e in enumerate(exports):
        f = tmp_path / f"export{i}.json"
        f.write_text(json.dumps(e))
        hearth(vault, "import", f)


def tree(vault):
    return {str(p.relative_to(vault)): p.read_bytes() for p in vault.rglob("*")
            if p.is_file() and ".git" not in p.parts and ".hearth" not in p.parts}


def test_synthesis_articles_citations_and_idempotence(vault, tmp_path):
    imported(vault, tmp_path, CHATGPT, CLAUDE)
    plan = synthesize(vault, "--dry-run")
    assert plan["dry_run"] and plan["segment"] == 2 and not plan["committed"]
    n = commits(vault)
    reference = {k: v for k, v in tree(vault).items() if k.startswith("Reference/")}
    r = synthesize(vault)
    assert r["committed"] and r["articles"] == ["Baking", "Cycling"] and r["rejected"] == 0
    assert commits(vault) == n + 1  # one commit per run
    assert "synthesize" in git(vault, "log", "-1", "--format=%s")
    baking = (vault / "articles" / "Baking.md").read_text()
    assert "My sourdough starter is named Clint. [^1]" in baking
    # every citation names an existing conversation message heading
    conv = next((vault / "Conversations").glob("*.md"))
    assert f"[^1]: [[Conversations/{conv.stem}#a user]]" in baking
    assert "## a user" in conv.read_text()
    assert "[[Baking]]" in (vault / "Meta" / "index.md").read_text()
    # idempotence: nothing new, no commit, no change
    before = tree(vault)
    r = synthesize(vault)
    assert not r["committed"] and r["segment"] == r["extract"] == r["route"] == r["synthesize"] == 0
    assert commits(vault) == n + 1 and tree(vault) == before
    assert {k: v for k, v in tree(vault).items() if k.startswith("Reference/")} == reference
    # the articles are searchable and readable through the tools
    hits = json.loads(hearth(vault, "search", "titanium", "--kind", "article", "--json").stdout)
    assert hits[0]["path"] == "articles/Cycling.md"
    assert git(vault, "status", "--porcelain") == ""


def test_synthesis_gate_refuses_rewrites_and_secrets(vault, tmp_path):
    imported(vault, tmp_path, CHATGPT)
    synthesize(vault, env={"SCRIPT_SECRET": "1"})
    baking = (vault / "articles" / "Baking.md").read_text()
    allfiles = b"".join(tree(vault).values())
    assert b"sk-abcdefghijklmnopqrstuvwxyz" not in allfiles  # the secret fact was dropped
    imported(vault, tmp_path, MORE)
    r = synthesize(vault, env={"SCRIPT_REWRITE": "1"})
    assert r["rejected"] >= 1 and r["committed"]
    assert (vault / "articles" / "Baking.md").read_text() == baking  # refused: unchanged
    talk = (vault / "Talk" / "Baking.md").read_text()
    assert "not applied" in talk and "70%" in talk and "spelt flour" in talk


def test_synthesis_link_unwraps_dangling_links(vault, tmp_path):
    imported(vault, tmp_path, CHATGPT)
    synthesize(vault, env={"SCRIPT_DANGLE": "1"})
    text = (vault / "articles" / "Baking.md").read_text()
    assert "[[No Such Article]]" not in text and "See also No Such Article" in text
    # every [[link]] of every article names a document of the vault
    for a in (vault / "articles").glob("*.md"):
        links = json.loads(hearth(vault, "links", f"articles/{a.name}", "--json").stdout)["links"]
        assert all(l["exists"] for l in links), (a.name, links)


@pytest.mark.parametrize("stage,n", [("segment", 2), ("extract", 1), ("route", 2), ("synthesize", 2)])
def test_synthesis_resumes_after_a_kill(vault, tmp_path, stage, n):
    """hearth is SIGKILLed at the n-th model call of a stage: nothing is committed, and the
    next run finishes with the same vault a run without the kill makes."""
    imported(vault, tmp_path, CHATGPT, CLAUDE)
    clean = tmp_path / "clean"
    subprocess.run(["git", "clone", "-q", str(vault), str(clean)], check=True)
    hearth(clean, "status")
    synthesize(clean)
    head = git(vault, "rev-parse", "HEAD")
    counts = tmp_path / "counts"
    counts.mkdir()
    r = synthesize(vault, env={"SCRIPT_KILL": f"{stage}:{n}", "SCRIPT_COUNT_DIR": str(counts)}, check=False)
    assert r.returncode == -9  # killed
    assert git(vault, "rev-parse", "HEAD") == head  # a partial run commits nothing
    r = synthesize(vault)
    assert r["committed"]
    got = {k: v for k, v in tree(vault).items() if not k.startswith("Meta/log")}
    want = {k: v for k, v in tree(clean).items() if not k.startswith("Meta/log")}
    assert got == want
    assert not synthesize(vault)["committed"]


def test_synthesis_refuses_a_corrupt_vault_and_bad_stage(vault, tmp_path):
    imported(vault, tmp_path, CHATGPT)
    (vault / ".git" / "index.lock").write_text("")
    r = synthesize(vault, check=False)
    assert r.returncode == 1 and "index is locked" in r.stderr
    (vault / ".git" / "index.lock").unlink()
    r = subprocess.run([str(BIN), "memory", "synthesize", "--vault", str(vault), "--embed-model", "none"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--model" in r.stderr
    assert not (vault / "articles" / "Baking.md").exists()


def test_synthesis_since(vault, tmp_path):
    """--since takes a UTC date or date and minute (the conversations' created times:
    CHATGPT 2023-11-14 22:13, MORE 2023-11-16 02:00, CLAUDE 2024-03-01T10:00:00Z), keeps
    older conversations waiting, and refuses anything else naming the flag's field."""
    imported(vault, tmp_path, CHATGPT, MORE, CLAUDE)
    plan = lambda since: synthesize(vault, "--dry-run", "--since", since)["segment"]  # noqa: E731
    assert plan("2023-11-14") == 3 and plan("2023-11-15") == 2 and plan("2024-03-01") == 1
    assert plan("2023-11-14T22:13") == 3 and plan("2023-11-14 22:14") == 2 and plan("2024-03-01T10:01") == 0
    assert plan("2024-02-29") == 1  # a leap day
    for bad in ("yesterday", "2023-11-31", "2023-02-29", "2023-11-14T24:00", "2023-11-14T22", "2023/11/14", ""):
        r = synthesize(vault, "--dry-run", "--since", bad, check=False)
        assert r.returncode == 1 and "since" in r.stderr and "YYYY-MM-DD" in r.stderr, (bad, r.stderr)
    r = synthesize(vault, "--since", "2023-11-15")  # the run itself leaves the older one for later
    assert r["segment"] == 2 and r["committed"]
    assert synthesize(vault, "--dry-run")["segment"] == 1


def test_serve_memory_log(vault):
    """`serve --memory-log`: each chat completion (streamed or not) lands in the vault, one
    file per chat (the next turn replaces the previous one), committed, searchable; the
    system message is not stored. Uses the real openai SDK against the default model."""
    from conftest import SMOLLM2, server
    import openai
    need(SMOLLM2, "SmolLM2-135M-Instruct", "run tools/get_models.sh")
    n = commits(vault)
    with server(SMOLLM2, "--memory-log", "--memory-vault", vault) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x")
        msgs = [{"role": "system", "content": "SYSTEM SECRET walrus"},
                {"role": "user", "content": "My favourite tea is genmaicha."}]
        r = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=8, temperature=0)
        first = r.choices[0].message.content
        msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "And my dog is Biscuit."}]
        stream = client.chat.completions.create(model="default_model", messages=msgs, max_tokens=8, temperature=0, stream=True)
        second = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    convs = list((vault / "Conversations").glob("*.md"))
    assert len(convs) == 1, convs  # the second turn replaced the first
    text = convs[0].read_text()
    assert "genmaicha" in text and "Biscuit" in text and second.strip()[:10] in text
    assert "walrus" not in text and 'source: "hearth serve"' in text
    assert commits(vault) == n + 2 and git(vault, "status", "--porcelain") == ""
    hits = json.loads(hearth(vault, "search", "Biscuit", "--json").stdout)
    assert hits and hits[0]["path"] == f"Conversations/{convs[0].name}"


def fake_tools(tmp_path, systemd):
    """A PATH whose systemctl and crontab are scripts recording what hearth asked."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/systemctl.log\nexit {0 if systemd else 1}\n")
    (bindir / "crontab").write_text(f"#!/bin/sh\nif [ \"$1\" = -l ]; then cat {tmp_path}/cron 2>/dev/null || exit 1;"
                                    f" else cp \"$1\" {tmp_path}/cron; fi\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config")}


def test_schedule_systemd_and_cron(vault, tmp_path):
    env = fake_tools(tmp_path, systemd=True)
    run = lambda *a: subprocess.run([str(BIN), "memory", *a, "--vault", str(vault)], capture_output=True, text=True,
                                    env=env)
    r = run("schedule", "--at", "03:30", "--model", "SmolLM2")
    assert r.returncode == 0, r.stderr
    units = tmp_path / "config" / "systemd" / "user"
    timer = (units / "hearth-memory.timer").read_text()
    assert "OnCalendar=*-*-* 03:30:00" in timer and "Persistent=true" in timer
    service = (units / "hearth-memory.service").read_text()
    assert "memory synthesize --model 'SmolLM2'" in service and str(vault) in service
    assert "--user enable --now hearth-memory.timer" in (tmp_path / "systemctl.log").read_text()
    assert run("unschedule").returncode == 0 and not (units / "hearth-memory.timer").exists()
    # no systemd user session: a tagged crontab line, other lines kept
    env = fake_tools(tmp_path / "c", systemd=False) if (tmp_path / "c").mkdir() is None else None
    (tmp_path / "c" / "cron").write_text("0 1 * * * backup\n")
    r = run("schedule", "--at", "4:05", "--model", "SmolLM2")
    assert r.returncode == 0, r.stderr
    cron = (tmp_path / "c" / "cron").read_text().splitlines()
    assert cron[0] == "0 1 * * * backup" and cron[1].startswith("5 4 * * * ") and cron[1].endswith("# hearth-memory")
    assert run("unschedule").returncode == 0
    assert (tmp_path / "c" / "cron").read_text() == "0 1 * * * backup\n"
    assert run("schedule", "--at", "25:00", "--model", "x").returncode == 2
    assert run("schedule", "--at", "03:00").returncode == 2  # no model
