"""`hearth generate --prompt-cache-file`: a resumed prompt gives exactly the text a fresh
prefill gives (--deterministic; greedy and seeded sampling, SmolLM2 with its chat template), the second run
loads all but the last prompt token, a longer prompt that extends the saved one reuses it,
and a damaged or foreign file makes the command fail with a message naming the file (the
file is left as it was)."""
import re
import subprocess

import pytest


def gen(hearth_bin, model, prompt, *extra):
    # --deterministic: batch-invariant numerics, so the last prompt token computed alone
    # (resumed) gives the logits it gets inside a prefill chunk (fresh); docs/server.md
    cmd = [str(hearth_bin), "generate", str(model), prompt, "--max-tokens", "24", "--threads", "2", "--deterministic",
           *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("sampling", [[], ["--temp", "0.8", "--seed", "7"]])
def test_resume_gives_the_same_text(hearth_bin, real_ggufs, tmp_path, sampling):
    model, cache = real_ggufs["smollm2"], tmp_path / "p.hkv"
    prompt = "Explain in two sentences why the sky is blue. " * 8
    fresh = gen(hearth_bin, model, prompt, *sampling)
    assert fresh.returncode == 0, fresh.stderr
    first = gen(hearth_bin, model, prompt, "--prompt-cache-file", str(cache), *sampling)
    assert first.returncode == 0, first.stderr
    assert "prompt cache: 0 of" in first.stderr and cache.stat().st_size > 0
    second = gen(hearth_bin, model, prompt, "--prompt-cache-file", str(cache), *sampling)
    assert second.returncode == 0, second.stderr
    m = re.search(r"prompt cache: (\d+) of (\d+) prompt tokens loaded", second.stderr)
    assert m and int(m.group(1)) == int(m.group(2)) - 1, second.stderr
    assert first.stdout == fresh.stdout and second.stdout == fresh.stdout
    # a prompt extending the saved conversation reuses the saved part
    longer = gen(hearth_bin, model, prompt + " And why are sunsets red?", "--prompt-cache-file", str(cache))
    m = re.search(r"prompt cache: (\d+) of (\d+) prompt tokens loaded", longer.stderr)
    assert longer.returncode == 0 and m and int(m.group(1)) > 100, longer.stderr


def test_damaged_or_foreign_file_fails(hearth_bin, real_ggufs, tiny_models, tmp_path):
    cache = tmp_path / "p.hkv"
    assert gen(hearth_bin, tiny_models["llama-f32"], "hello", "--prompt-cache-file", str(cache)).returncode == 0
    good = cache.read_bytes()
    other = gen(hearth_bin, tiny_models["qwen3-f32"], "hello", "--prompt-cache-file", str(cache))
    assert other.returncode != 0 and str(cache) in other.stderr and "another model" in other.stderr
    assert cache.read_bytes() == good  # not overwritten
    cache.write_bytes(good[: len(good) // 2])
    cut = gen(hearth_bin, tiny_models["llama-f32"], "hello", "--prompt-cache-file", str(cache))
    assert cut.returncode != 0 and "truncated" in cut.stderr and str(cache) in cut.stderr
    flipped = bytearray(good)
    flipped[-3] ^= 0x40
    cache.write_bytes(bytes(flipped))
    bad = gen(hearth_bin, tiny_models["llama-f32"], "hello", "--prompt-cache-file", str(cache))
    assert bad.returncode != 0 and "checksum" in bad.stderr
    int8 = gen(hearth_bin, tiny_models["llama-f32"], "hello", "--kv-quant", "int8", "--prompt-cache-file",
               str(tmp_path / "q.hkv"))
    assert int8.returncode == 0, int8.stderr
    cache.write_bytes(good)
    mixed = gen(hearth_bin, tiny_models["llama-f32"], "hello", "--kv-quant", "int8", "--prompt-cache-file", str(cache))
    assert mixed.returncode != 0 and "--kv-quant none" in mixed.stderr
