"""Every verb's missing-file and bad-flag paths, in one table: stderr is one line of the
README's form `hearth: <file or flag>: <problem>` (then the usage for a usage error), exit
status 1 for a missing file and 2 for a bad flag, nothing on stdout, no crash. The
problem text for a missing file is the C library's own (os.strerror(ENOENT) from Python,
not hearth), or "no such file or directory" for a model path no model name matches.
"""
import errno
import os
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, CACHE, REAL_GGUFS

MODEL = str(CACHE / "models" / REAL_GGUFS["smollm2"])
EMBED = str(CACHE / "models" / "all-MiniLM-L6-v2")
ENOENT = os.strerror(errno.ENOENT)  # "No such file or directory"
MISSING_MODEL = "no such file or directory"
NO_ADAPTER = "not a folder"  # an adapter is a folder with adapter_config.json
TINY = str(CACHE / "tiny" / "llama-f32")
CORPUS = Path(__file__).resolve().parents[2] / "bench" / "cpu_quality" / "corpus" / "prose.txt"  # any text file

# (argv after `hearth`, the <file> the message must name, the problem it must state)
MISSING_FILES = [
    (["info", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["tokenize", "nope.gguf", "hi"], "nope.gguf", MISSING_MODEL),
    (["tokenize", MODEL, "--file", "nope.txt"], "nope.txt", ENOENT),
    (["detokenize", "nope.gguf", "[1]"], "nope.gguf", MISSING_MODEL),
    (["template", "nope.gguf", "--messages", "m.json"], "nope.gguf", MISSING_MODEL),
    (["template", MODEL, "--messages", "nope.json"], "nope.json", ENOENT),
    (["generate", "nope.gguf", "hi"], "nope.gguf", MISSING_MODEL),
    (["chat", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["serve", "--model", "nope.gguf", "--port", "0"], "nope.gguf", MISSING_MODEL),
    (["bench", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["embed", "nope.gguf", "--text", "hi"], "nope.gguf", MISSING_MODEL),
    (["embed", EMBED, "--file", "nope.txt"], "nope.txt", ENOENT),
    (["trace", "nope.gguf", "--ids", "[1,2,3,4]"], "nope.gguf", MISSING_MODEL),
    (["tensors", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["tensors", MODEL, "output_norm.weight", "--out", "/nonexistent-dir/x.f32"], "/nonexistent-dir/x.f32", ENOENT),
    (["fit", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["fit", "./nope"], "./nope", MISSING_MODEL),
    (["rm", "nope-org/nope-model"], "nope-org/nope-model", "not in the Hugging Face cache"),
    (["template", MODEL, "--messages", "m.json", "--tools", "nope.json"], "nope.json", ENOENT),
    (["generate", MODEL, "hi", "--json-schema", "nope.json"], "nope.json", ENOENT),
    (["generate", MODEL, "hi", "--grammar", "nope.gbnf"], "nope.gbnf", ENOENT),
    (["generate", MODEL, "hi", "--adapter-path", "nope-adapter"], "nope-adapter", NO_ADAPTER),
    # checked before the model loads and generates (it was reported only after the text)
    (["generate", MODEL, "hi", "--prompt-cache-file", "/nonexistent-dir/p.hkv"], "/nonexistent-dir/p.hkv", ENOENT),
    (["trace", MODEL, "--ids", "[1,2,3,4]", "--adapter-path", "nope-adapter"], "nope-adapter", NO_ADAPTER),
    (["serve", "--model", MODEL, "--adapter-path", "nope-adapter", "--port", "0"], "nope-adapter", NO_ADAPTER),
    (["serve", "--model", MODEL, "--draft-model", "nope.gguf", "--port", "0"], "nope.gguf", MISSING_MODEL),
    (["perplexity", "nope.gguf", "--data-path", str(CORPUS)], "nope.gguf", MISSING_MODEL),
    (["perplexity", MODEL, "--data-path", "nope.jsonl"], "nope.jsonl", ENOENT),
    (["fuse", "nope.gguf"], "nope.gguf", MISSING_MODEL),
    (["fuse", TINY, "--adapter-path", "nope-adapter"], "nope-adapter", NO_ADAPTER),
    (["convert", "nope.gguf", "--out", "/nonexistent-dir/x"], "nope.gguf", MISSING_MODEL),
    (["convert", TINY, "--out", "/nonexistent-dir/x"], "/nonexistent-dir/x", ENOENT),
    (["convert", TINY, "--out", "/nonexistent-dir/x", "-q", "--plan", "nope.json"], "nope.json", ENOENT),
    (["upload", "nope-dir", "--repo", "org/name"], "nope-dir", ENOENT),
]

VERBS_WITH_MODEL = ["info", "tokenize", "detokenize", "template", "generate", "chat", "bench", "trace", "tensors",
                    "fit", "embed"]
BAD_FLAGS = [([verb, MODEL, "--no-such-flag"], "--no-such-flag") for verb in VERBS_WITH_MODEL + ["perplexity", "convert"]]
BAD_FLAGS += [([verb, "--no-such-flag"], "--no-such-flag")
              for verb in ("serve", "ls", "evals", "pull", "rm", "upload", "fuse", "memory")]
BAD_FLAGS += [(["harness", "pi", "--no-such-flag"], "--no-such-flag"),
              # `hearth` alone takes serve's flags: checked before it probes the machine or downloads
              (["--no-such-flag"], "--no-such-flag"), (["--no-open", "--no-download", "--port", "x"], "--port"),
              (["perplexity", MODEL, "--data-path", str(CORPUS), "--sequence-length", "x"], "--sequence-length"),
              (["memory", "search", "x", "--threads", "x"], "--threads")]
BAD_FLAGS += [
    (["serve", "--port", "notaport"], "--port"),
    (["serve", "--max-sequences", "0"], "--max-sequences"),
    (["fit", MODEL, "--kv-budget", "lots"], "--kv-budget"),
    (["fit", MODEL, "--max-sequences=x"], "--max-sequences"),
]
BAD_FLAGS += [(["convert", TINY, "--out", "/nonexistent-dir/x", "-q", "--target-bpw", "4.5", "--calibration-data",
                str(CORPUS), "--candidate-bits", bad], "--candidate-bits")
              for bad in ("4,3", "4,7", "4:48", "", "4,,5", "2:128,2:64,2:32,3:128,3:64,3:32,4:128,4:64,4:32", "x")]


def run(argv):
    p = subprocess.run([str(BIN), *argv], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in p.stderr and p.returncode >= 0, f"crashed: {p.returncode} {p.stderr}"
    return p


@pytest.mark.parametrize("argv,file,problem", MISSING_FILES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_missing_file_names_the_file(argv, file, problem, tmp_path):
    if argv[0] == "template" and "m.json" in argv:
        argv = [a if a != "m.json" else str(tmp_path / "m.json") for a in argv]
        (tmp_path / "m.json").write_text('[{"role": "user", "content": "hi"}]')
    p = run(argv)
    assert p.returncode == 1, p.stderr
    assert p.stdout == ""
    first = p.stderr.splitlines()[0]
    assert first.startswith(f"hearth: {file}: {problem}"), first


@pytest.mark.parametrize("argv,flag", BAD_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_flag_is_a_usage_error_naming_it(argv, flag):
    p = run(argv)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert lines[0].startswith(f"hearth: {flag}: "), lines[0]
    assert lines[1].startswith("usage: hearth"), p.stderr


# A --plan file hearth cannot use: one line naming the file and what is wrong in it
BAD_PLANS = [
    ('{"quantization": {"bits": 4', "line 1"),
    ('[4]', "no quantization section"),
    ('{"quantization": {"group_size": 64}}', "no quantization section"),
    ('{"bits": 7}', '"bits" must be'),
    ('{"bits": 4, "group_size": 48}', '"group_size" must be'),
    ('{"bits": 4, "mode": "mxfp4"}', '"mode" must be'),
    ('{"bits": 4, "model.layers.0.mlp.down_proj": {"bits": 9}}', "module 'model.layers.0.mlp.down_proj'"),
    ('{"bits": 4, "model.layers.0.mlp.down_proj": {"bits": 4, "group_size": "64"}}', '"group_size" must be'),
    ('{"bits": 4, "model.layers.0.mlp.down_proj": {"bits": 4, "scale": 2}}', "takes \"bits\""),
    ('{"bits": 4, "model.layers.0.mlp.down_proj": 8}', "expected"),
    ('{"bits": 4, "bits": 8}', "duplicate"),
]


@pytest.mark.parametrize("text,problem", BAD_PLANS, ids=[t for t, _ in BAD_PLANS])
def test_bad_plan_names_the_file(text, problem, tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "out"
    plan.write_text(text)
    p = run(["convert", TINY, "--out", str(out), "-q", "--plan", str(plan)])
    assert p.returncode == 1 and p.stdout == "", p.stderr
    first = p.stderr.splitlines()[0]
    assert first.startswith(f"hearth: {plan}: ") and problem in first, first
    assert not out.exists()


# The flags every engine-running verb parses through one shared parser (src/cli/common.c
# cli_parse_engine_flag): each verb's --help must list them, or a user never finds them
# (--device was missing from all four usage texts).
ENGINE_FLAGS = ["--device", "--kv-quant", "--deterministic", "--cuda-exact", "--expert-offload"]


@pytest.mark.parametrize("verb", ["generate", "chat", "bench", "serve", "fit"])
def test_help_lists_the_engine_flags(verb):
    p = subprocess.run([BIN, verb, "--help"], capture_output=True, text=True, timeout=30)
    text = p.stdout + p.stderr
    assert f"hearth {verb}" in text, text
    missing = [f for f in ENGINE_FLAGS if f not in text]
    assert not missing, f"hearth {verb} --help does not list {missing}"
