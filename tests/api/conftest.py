"""Shared fixtures for the HTTP API tests: start `hearth serve` on a free loopback port and
give back its base URL. Generic on purpose (any model, any flags); the tests own the checks.
A missing binary or model FAILS with the command that fixes it, never a silent skip.
"""
import contextlib
import json
import shutil
import os
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import isolate_cache, free_port, need, running, server_process  # noqa: E402

isolate_cache()  # before CACHE below: tests never write into the user's cache

REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(os.environ.get("HEARTH_BIN", REPO / "bin" / "hearth"))
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
# The default model of `hearth serve` / `make run` (tools/get_models.sh fetches it).
SMOLLM2 = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextlib.contextmanager
def server(model, *flags, ready_timeout=60, env=None):
    """Runs `hearth serve --model <model> <flags>` on a free port; yields the base URL
    (http://127.0.0.1:PORT). stderr is kept in proc.log_path for failure messages.
    env: extra environment variables (e.g. HEARTH_CPU=scalar for the reference tier)."""
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    port = free_port()
    cmd = [str(BIN), "serve", "--port", str(port), "--threads", "1"]
    if model is not None:
        cmd += ["--model", str(model)]
    with open(f"/tmp/hearth-serve-{port}.log", "w+b") as log:
        server.last_log = log.name
        with running(cmd + [str(f) for f in flags], port, log, {**os.environ, **(env or {})}, ready_timeout) as base:
            yield base


@pytest.fixture(scope="session")
def smollm2():
    return need(SMOLLM2, "default model", "run tools/get_models.sh (or `make run`)")


@pytest.fixture(scope="module")
def smollm2_server(smollm2):
    """One server with the default model, shared by a test module. It runs the reference
    kernels (float32 activations) so its greedy tokens equal the mlx-lm goldens exactly;
    the fast kernels' agreement is measured in tests/parity/test_forward_parity.py."""
    with server(smollm2, env={"HEARTH_CPU": "scalar"}) as base:
        yield base


# ---- the reference: the real mlx_lm.server (PyPI mlx-lm) on loopback ----------------

PYTHON = REPO / ".venv" / "bin" / "python"
TINY = CACHE / "tiny"


@contextlib.contextmanager
def upstream_server(model, *flags, ready_timeout=120):
    """Runs the real `mlx_lm server --model <model>` (offline, CPU) on a free port and
    yields its base URL. Waits for the model to answer one request, not for /health:
    upstream's /health says ok before the model has loaded."""
    need(PYTHON, "project virtualenv", "run tools/deps.sh")
    need(model, "model", "run tools/make_tiny_models.py (tiny models) or tools/get_models.sh")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [str(PYTHON), "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]

    def answers_completion():
        # text completion with 1 token: proves the model is loaded
        req = urllib.request.Request(base + "/v1/completions", data=b'{"prompt": "a", "max_tokens": 1}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200

    with open(f"/tmp/mlx-lm-server-{port}.log", "w+b") as log, \
            server_process(cmd + [str(f) for f in flags], log, env, answers_completion, ready_timeout,
                           "mlx_lm server", poll=0.2):
        yield base


def hf_tokenizer(model):
    """The HF transformers tokenizer of a model (tests/parity/conftest.py's, loaded by path:
    the two suites run as separate pytest sessions)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("parity_conftest", REPO / "tests/parity/conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.hf_tokenizer(str(model))


def prompt_ids(tok, msgs):
    """A chat's prompt tokens as transformers renders and tokenizes them, with the
    enable_thinking mlx_lm.server passes (its TokenizerWrapper: whether mlx-lm finds thinking
    markers in the vocabulary; Gemma 4's template reads it)."""
    from mlx_lm.tokenizer_utils import _infer_thinking
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False,
                                   enable_thinking=_infer_thinking(tok)[0] is not None)
    return tok(text, add_special_tokens=False)["input_ids"]


def expected_cached(cached_ids, ids):
    """Tokens a request with `ids` takes from hearth's prefix cache after a request computed
    `cached_ids`: the longest common prefix, never covering the last prompt token."""
    common = 0
    while common < min(len(ids), len(cached_ids)) and ids[common] == cached_ids[common]:
        common += 1
    return min(common, len(ids) - 1)


def with_template(source, template, out):
    """A copy of model `source` in `out` (weights linked) whose chat template is `template`
    and whose tokenizer_config names no tool_parser_type, so the tool format is inferred
    from that template as for a real repo of that family."""
    need(source, "tiny model", "run tools/make_tiny_models.py")
    out.mkdir()
    for f in source.iterdir():
        if f.suffix == ".safetensors":
            (out / f.name).symlink_to(f)
        else:
            shutil.copy(f, out / f.name)
    shutil.copy(template, out / "chat_template.jinja")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.pop("tool_parser_type", None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return out
