"""`hearth harness pi|claude|codex` on golden before/after files (tests/parity/goldens/harness/),
with HOME pointed at a temporary folder: the write gives exactly the after file (the user's
keys, tables and comments kept), --remove gives exactly the before file back, a second write
changes nothing and still removes to the original, files the write created are deleted
again, a broken or clashing file is refused and left as it was. Oracles for the formats:
Python's json and tomllib parse what was written."""
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "goldens" / "harness"
FILES = {"claude": ".claude/settings.json", "pi": ".pi/agent/models.json", "codex": ".codex/config.toml"}
EXT = {"claude": "json", "pi": "json", "codex": "toml"}


def harness(hearth_bin, home, tiny, *args):
    env = dict(os.environ, HOME=str(home))
    return subprocess.run([str(hearth_bin), "harness", *args, "--model", str(tiny)], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture
def tiny(tiny_models):
    return tiny_models["llama-f32"]


@pytest.mark.parametrize("agent", ["claude", "pi", "codex"])
def test_golden_write_and_remove(hearth_bin, tiny, tmp_path, agent):
    target = tmp_path / FILES[agent]
    target.parent.mkdir(parents=True)
    before = (GOLDEN / f"{agent}_before.{EXT[agent]}").read_bytes()
    after = (GOLDEN / f"{agent}_after.{EXT[agent]}").read_bytes()
    target.write_bytes(before)
    args = [agent, "--ctx", "32768", "--base-url", "http://127.0.0.1:8080/"]
    r = harness(hearth_bin, tmp_path, tiny, *args)
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == after
    parsed = tomllib.loads(after.decode()) if agent == "codex" else json.loads(after)
    if agent == "codex":
        assert parsed["model_providers"]["hearth"]["wire_api"] == "responses"
        assert parsed["profiles"]["hearth"]["model_provider"] == "hearth"
        assert parsed["model"] == "gpt-5-codex" and "docs" in parsed["mcp_servers"]  # the user's, intact
    elif agent == "pi":
        p = parsed["providers"]["hearth"]
        assert p["api"] == "openai-completions" and p["baseUrl"] == "http://127.0.0.1:8080/v1"
        assert p["models"][0]["contextWindow"] == 32768 and "ollama" in parsed["providers"]
        # pi has no live model list for a models.json provider: the command says how to switch
        assert "fixed model list (llama-f32)" in r.stdout and "hearth harness pi --model" in r.stdout
    else:
        assert parsed["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080"
        assert parsed["env"]["ANTHROPIC_AUTH_TOKEN"] and parsed["env"]["BASH_DEFAULT_TIMEOUT_MS"] == "120000"
    r = harness(hearth_bin, tmp_path, tiny, *args)  # again: the same file
    assert r.returncode == 0 and target.read_bytes() == after
    r = harness(hearth_bin, tmp_path, tiny, agent, "--remove")
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == before  # the user's own values back, not the first write's
    r = harness(hearth_bin, tmp_path, tiny, agent, "--remove")  # nothing left to take back
    assert r.returncode == 0 and target.read_bytes() == before


def test_fresh_home_creates_and_removes(hearth_bin, tiny, tmp_path):
    for agent in FILES:
        r = harness(hearth_bin, tmp_path, tiny, agent)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / FILES[agent]).exists()
    # without --ctx, fit's choice: the tiny model allows 131072 and this machine holds it
    models = json.loads((tmp_path / FILES["pi"]).read_text())
    assert models["providers"]["hearth"]["models"][0]["contextWindow"] >= 32768
    for agent in FILES:
        assert harness(hearth_bin, tmp_path, tiny, agent, "--remove").returncode == 0
        assert not (tmp_path / FILES[agent]).exists()


def test_refuses_broken_or_clashing_files(hearth_bin, tiny, tmp_path):
    settings = tmp_path / FILES["claude"]
    settings.parent.mkdir(parents=True)
    settings.write_text('{"env": {"A": 1},,}')
    r = harness(hearth_bin, tmp_path, tiny, "claude")
    assert r.returncode != 0 and str(settings) in r.stderr and "not valid JSON" in r.stderr
    assert settings.read_text() == '{"env": {"A": 1},,}'
    config = tmp_path / FILES["codex"]
    config.parent.mkdir(parents=True)
    shutil.copy(GOLDEN / "codex_before.toml", config)
    config.write_text(config.read_text() + '\n[model_providers.hearth]\nname = "mine"\n')
    mine = config.read_text()
    r = harness(hearth_bin, tmp_path, tiny, "codex")
    assert r.returncode != 0 and "[model_providers.hearth]" in r.stderr and config.read_text() == mine
    r = harness(hearth_bin, tmp_path, tiny, "vim")
    assert r.returncode == 2 and "pi, claude or codex" in r.stderr
