"""Speculative decoding in `hearth generate` and `hearth chat` (--speculate lookup, the
default, and --draft-model): their one request runs through the batch scheduler, which
proposes tokens and verifies them. Lossless: the text with speculation is byte for byte the
text without (--speculate none, the plain hearth_generate path), greedy and with a seed, on
the reference kernels (HEARTH_CPU=scalar) for tiny models of several families and formats
and for SmolLM2; greedy SmolLM2 on the default kernels too. The stderr line with the
proposed / accepted counts shows speculation actually ran. Flags that cannot combine are
refused with a message naming them.
"""
import json
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
SMOL = os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TINY = os.path.join(CACHE, "tiny")
SCALAR = {"HEARTH_CPU": "scalar"}
# repeats itself, so that an answer copying it gives prompt lookup something to find
LIST = ("Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, "
        "apple, banana, cherry, date, elderberry, fig, grape.")
STATS = re.compile(r"speculative decoding \((\w+)\): (\d+) tokens proposed, (\d+) accepted")


def need(path, what):
    if not os.path.exists(path):
        pytest.skip(f"{what} not found at {path} (tools/make_tiny_models.py, tools/get_models.sh)")
    if not os.path.exists(BIN):
        pytest.skip(f"hearth binary not found at {BIN} (run make or set HEARTH_BIN)")


def run(*args, env=None, stdin=None):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, timeout=600, input=stdin,
                       env={**os.environ, **(env or {})})
    return p.returncode, p.stdout, p.stderr.decode()


def spec_stats(err):
    m = STATS.search(err)
    assert m, err
    return m.group(1), int(m.group(2)), int(m.group(3))


def same_with_and_without(model, *args, env=SCALAR, extra_on=()):
    rc0, off, err0 = run("generate", model, *args, "--speculate", "none", env=env)
    rc1, on, err1 = run("generate", model, *args, *(extra_on or ("--speculate", "lookup")), env=env)
    assert rc0 == 0, err0
    assert rc1 == 0, err1
    assert not STATS.search(err0)  # none: the plain path, no batch
    assert on == off, (on, off)
    assert len(off) > 0
    return spec_stats(err1)


TINY_MODELS = ["llama-f32", "qwen3-q4g64", "gemma3-q8g32", "minicpm-bf16", "llama-q5g64", "gemma4-q8g64",
               "qwen3_moe-q4g64", "qwen3_5-q4g64", "gemma4_moe-f32"]  # qwen3_5: hybrid (state backup + replay)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_greedy_and_seeded_are_lossless(name):
    model = os.path.join(TINY, name)
    need(model, "tiny model")
    base = ["a b c d a b c d a b c d a b", "--no-chat-template", "--max-tokens", "40", "--threads", "2"]
    kind, proposed, accepted = same_with_and_without(model, *base, "--temp", "0")
    assert kind == "lookup" and 0 <= accepted <= proposed
    same_with_and_without(model, *base, "--temp", "0.8", "--top-p", "0.9", "--seed", "11")


def test_smollm2_scalar_greedy_seeded_and_stops():
    need(SMOL, "SmolLM2")
    base = [LIST, "--max-tokens", "48", "--threads", "2"]
    kind, proposed, accepted = same_with_and_without(SMOL, *base)
    assert kind == "lookup" and proposed > 0 and 0 < accepted <= proposed  # it copies the list
    _, proposed, _ = same_with_and_without(SMOL, *base, "--temp", "0.7", "--seed", "5")
    assert proposed > 0
    same_with_and_without(SMOL, *base, "--stop", "cherry, date")  # a stop string inside accepted runs


def test_smollm2_default_kernels_greedy():
    need(SMOL, "SmolLM2")
    _, proposed, _ = same_with_and_without(SMOL, LIST, "--max-tokens", "48", "--threads", "2", env={})
    assert proposed > 0


def test_smollm2_json_schema_constraint(tmp_path):
    need(SMOL, "SmolLM2")
    schema = tmp_path / "s.json"
    schema.write_text('{"type":"object","properties":{"fruits":{"type":"array","items":{"type":"string"}}},'
                      '"required":["fruits"]}')
    same_with_and_without(SMOL, "List these fruits as JSON: apple, banana, cherry, apple, banana, cherry.",
                          "--json-schema", schema, "--max-tokens", "40", "--threads", "2")


def test_smollm2_json_schema_proposals_cut_by_the_grammar(tmp_path):
    """Lookup copies the prompt's "apple 3, banana 5" into proposals that the schema's
    layout forbids after a few tokens: a constrained row's proposal is cut at its first
    forbidden token (scheduler.c propose); the text is still the plain run's."""
    need(SMOL, "SmolLM2")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({
        "type": "object", "required": ["items"], "additionalProperties": False,
        "properties": {"items": {"type": "array", "items": {
            "type": "object", "required": ["name", "n"], "additionalProperties": False,
            "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0}}}}}}))
    _, proposed, accepted = same_with_and_without(
        SMOL, "Write JSON for this list: apple 3, banana 5, cherry 7, apple 3, banana 5, cherry 7, apple 3, banana 5.",
        "--json-schema", schema, "--max-tokens", "120", "--threads", "2")
    assert proposed > 0 and accepted > 0


def test_draft_model_equals_plain_run():
    model, draft = os.path.join(TINY, "qwen3-f32"), os.path.join(TINY, "qwen3-q8g64")
    need(model, "tiny model")
    need(draft, "tiny model")
    for n in ("3", "5"):
        kind, proposed, accepted = same_with_and_without(
            model, "one two three one two three one two", "--no-chat-template", "--max-tokens", "30",
            "--threads", "2", extra_on=("--draft-model", draft, "--num-draft-tokens", n))
        assert kind == "draft" and proposed > 0 and 0 <= accepted <= proposed


def test_chat_is_lossless_and_reports():
    need(SMOL, "SmolLM2")
    turns = (LIST + "\nNow say it again.\n").encode()
    rc0, off, err0 = run("chat", SMOL, "--max-tokens", "40", "--threads", "2", "--speculate", "none",
                         env=SCALAR, stdin=turns)
    rc1, on, err1 = run("chat", SMOL, "--max-tokens", "40", "--threads", "2", "--speculate", "lookup", env=SCALAR,
                        stdin=turns)
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    assert on == off and b"apple" in on
    assert not STATS.search(err0)
    kind, proposed, accepted = spec_stats(err1)
    assert kind == "lookup" and proposed > 0 and accepted > 0


@pytest.mark.parametrize("args,message", [
    (["--speculate", "lookup", "--prompt-cache-file", "/tmp/x.kv"], "--prompt-cache-file: no speculative decoding"),
    (["--draft-model", "m", "--speculate", "none"], "not with --speculate none"),
    (["--num-draft-tokens", "4"], "--num-draft-tokens goes with --draft-model"),
    (["--num-draft-tokens", "-1", "--draft-model", "m"], "--num-draft-tokens: invalid value '-1'"),
    (["--speculate", "ngram"], "--speculate: 'ngram' is not lookup, suffix, mtp or none"),
    (["--speculate"], "--speculate: needs a value"),
])
def test_refused_combinations(args, message):
    if not os.path.exists(BIN):
        pytest.skip(f"hearth binary not found at {BIN}")
    for verb in (["generate", "model", "hi"], ["chat", "model"]):
        if verb[0] == "chat" and "--prompt-cache-file" in args:
            continue
        rc, out, err = run(*verb, *args)
        assert rc == 2 and message in err, err


def test_draft_with_another_tokenizer_is_refused():
    model = os.path.join(TINY, "qwen3-f32")
    need(model, "tiny model")
    need(SMOL, "SmolLM2")
    rc, out, err = run("generate", model, "hi", "--draft-model", SMOL, "--max-tokens", "4")
    assert rc == 1 and "tokenizer" in err and "Traceback" not in err, err


def test_prompt_cache_file_keeps_the_plain_path(tmp_path):
    model = os.path.join(TINY, "llama-f32")
    need(model, "tiny model")
    cache = tmp_path / "p.hkv"
    for _ in range(2):  # writes the file, then resumes from it
        rc, out, err = run("generate", model, "a b c a b c a b", "--no-chat-template", "--max-tokens", "8",
                           "--prompt-cache-file", cache, env=SCALAR)
        assert rc == 0 and "prompt cache:" in err and not STATS.search(err), err
    rc, off, _ = run("generate", model, "a b c a b c a b", "--no-chat-template", "--max-tokens", "8",
                     "--speculate", "none", env=SCALAR)
    assert out == off  # the resumed run's text is the fresh one's


def test_default_is_the_plain_path():
    """Without --speculate / --draft-model, generate runs the plain hearth_generate path (the
    library's and the Python package's text on every kernel tier): no batch, no stats line."""
    model = os.path.join(TINY, "llama-f32")
    need(model, "tiny model")
    rc, out, err = run("generate", model, "a b c a b c a b", "--no-chat-template", "--max-tokens", "8")
    rc0, off, _ = run("generate", model, "a b c a b c a b", "--no-chat-template", "--max-tokens", "8",
                      "--speculate", "none")
    assert rc == 0 and rc0 == 0 and not STATS.search(err), err
    assert out == off
