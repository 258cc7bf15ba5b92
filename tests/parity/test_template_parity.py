"""Chat-template parity: hearth's Jinja interpreter (src/tok/template) against the
reference, jinja2 configured exactly as transformers' apply_chat_template does it
(transformers.utils.chat_template_utils). Every real template in templates/ is
rendered for every conversation in corpus/conversations/ with and without
add_generation_prompt, plus ~150 small synthetic templates that each exercise one
feature. Output must be byte-identical; when jinja2 raises, hearth must fail too.

hearth is driven through tests/parity/helpers/tpl_helper.c, compiled here against
libhearth.a ($HEARTH_LIB or <repo>/lib; run `make lib` first), one process
for all cases (JSON lines in and out)."""
import json
import pathlib
import subprocess
import tempfile

import pytest
from hearth_process import compile_helper

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
TEMPLATES = sorted((HERE / "templates").glob("*.jinja"))
CONVERSATIONS = sorted((HERE / "corpus" / "conversations").glob("*.json"))
BOS, EOS = "<s>", "</s>"

from transformers.utils import chat_template_utils as ctu  # noqa: E402

from template_cases import SYNTHETIC, SYNTHETIC_CONTEXT  # noqa: E402


def _load_conversation(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        return data, None, {}
    # corpus format: {"messages": [...], "tools": [...] | null, "extra": {template kwargs}}
    unknown = set(data) - {"messages", "tools", "extra"}
    assert not unknown, f"{path.name}: unknown keys {sorted(unknown)}"
    return data["messages"], data.get("tools"), dict(data.get("extra") or {})


def _describe(e):
    # raise_exception() raises the base TemplateError; its text must reach the user verbatim
    if type(e).__name__ == "TemplateError":
        return f"raise_exception: {e}"
    return f"{type(e).__name__}: {e}"


def _oracle_real(src, messages, tools, agp, extra):
    """The reference render and the exact variables transformers hands the template."""
    kwargs = dict(bos_token=BOS, eos_token=EOS, **extra)
    try:
        out = ctu.render_jinja_template(
            conversations=[messages], tools=tools, chat_template=src, add_generation_prompt=agp, **kwargs
        )[0][0]
        ok = True
    except Exception as e:  # jinja2 TemplateError, TypeError, ... all mean "must fail"
        out, ok = _describe(e), False
    # hearth gets the raw messages and applies tpl_chat_prepare_messages itself (the
    # helper's "chat" flag), so transformers' reasoning aliasing is under test too
    context = dict(messages=messages, tools=tools, documents=None, add_generation_prompt=agp, **kwargs)
    return ok, out, context


def _oracle_synthetic(src, context):
    try:
        return True, ctu._compile_jinja_template(src).render(**context)
    except Exception as e:
        return False, _describe(e)


def _build_cases():
    cases = []
    for t in TEMPLATES:
        src = t.read_text(encoding="utf-8")
        for c in CONVERSATIONS:
            messages, tools, extra = _load_conversation(c)
            # a conversation may pin add_generation_prompt; otherwise both values are tried
            agps = (bool(extra.pop("add_generation_prompt")),) if "add_generation_prompt" in extra else (False, True)
            for agp in agps:
                cid = f"{t.stem}|{c.stem}|agp={int(agp)}"
                cases.append(("real", cid, src, (messages, tools, agp, extra)))
    for i, entry in enumerate(SYNTHETIC):
        src, ctx = (entry, {}) if isinstance(entry, str) else entry
        cases.append(("synthetic", f"syn{i:03d}", src, dict(SYNTHETIC_CONTEXT, **ctx)))
    return cases


CASES = _build_cases()


def _helper_binary(tmp):
    return compile_helper("tests/parity/helpers/tpl_helper.c", pathlib.Path(tmp) / "tpl_helper")


@pytest.fixture(scope="module")
def results():
    expected, lines = {}, []
    for kind, cid, src, data in CASES:
        if kind == "real":
            ok, out, context = _oracle_real(src, *data)
        else:
            context = data
            ok, out = _oracle_synthetic(src, context)
        expected[cid] = (ok, out)
        lines.append(json.dumps({"template": src, "context": context, "chat": kind == "real"}, ensure_ascii=False))
    with tempfile.TemporaryDirectory() as tmp:
        exe = _helper_binary(tmp)
        r = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.fail(f"tpl_helper crashed (rc={r.returncode}):\n{r.stderr[-4000:]}")
    got_lines = r.stdout.rstrip("\n").split("\n")  # not splitlines(): outputs may hold U+2028
    assert len(got_lines) == len(CASES), f"helper answered {len(got_lines)} of {len(CASES)} cases"
    got = {cid: json.loads(line) for (_, cid, _, _), line in zip(CASES, got_lines)}
    return expected, got


@pytest.mark.parametrize("cid", [c[1] for c in CASES])
def test_template_case(results, cid):
    expected, got = results
    ok, out = expected[cid]
    g = got[cid]
    if ok:
        assert g["ok"], f"jinja2 rendered but hearth failed: {g.get('error')}\nexpected: {out!r}"
        assert g["out"] == out
    else:
        assert not g["ok"], f"jinja2 raised ({out}) but hearth rendered {g.get('out')!r}"
        assert g.get("status") == "template_error", g
        if out.startswith("raise_exception: "):
            assert g["error"] == out[len("raise_exception: "):]


def test_parity_summary(results):
    """Prints the counts the report quotes; fails if any case mismatched."""
    expected, got = results
    real = [c[1] for c in CASES if c[0] == "real"]
    syn = [c[1] for c in CASES if c[0] == "synthetic"]

    def bad(ids):
        return [i for i in ids if (got[i]["ok"] != expected[i][0]) or (expected[i][0] and got[i]["out"] != expected[i][1])]

    br, bs = bad(real), bad(syn)
    print(f"\ntemplate parity: {len(TEMPLATES)} templates x {len(CONVERSATIONS)} conversations x add_generation_prompt = {len(real)} real "
          f"cases ({sum(1 for i in real if expected[i][0])} render, rest raise), {len(br)} mismatches; "
          f"{len(syn)} synthetic cases, {len(bs)} mismatches")
    assert not br and not bs, f"mismatches: {(br + bs)[:20]}"
