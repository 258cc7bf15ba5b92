"""`hearth serve --prompt-cache-dir` (src/engine/prompt_cache.c): the prefix cache outlives
the process. A request answered by one server is saved in the folder when that server
stops (SIGTERM); a new server on the
same folder gives the same request back with every prompt token but the last from the
cache (oracle: HF transformers' chat template and tokenizer, expected_cached) and the same
answer, bit for bit (HEARTH_CPU=scalar), as the first server. A conversation's newer turn
replaces the file of its older turn; --prompt-cache-bytes bounds the folder; a damaged file
or another model's is refused at start (logged), left in place, and the server serves."""
import json
import os

from conftest import expected_cached, hf_tokenizer, need, prompt_ids, server
from test_prefix_cache import LONG_SYSTEM, NO_EOS, SCALAR, TINY_LLAMA, answer, cached, chat, messages, wait_idle

TINY_QWEN = TINY_LLAMA.parent / "qwen3-f32"


def hkv(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".hkv"))


def log_text():
    return open(server.last_log, errors="replace").read()


def test_cache_survives_a_restart(tmp_path):
    tiny = need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")
    tok = hf_tokenizer(tiny)
    folder = tmp_path / "pc"
    msgs = messages("What is the first word?")
    with server(tiny, "--prompt-cache-dir", folder, env=SCALAR) as base:
        first = chat(base, msgs, 8, logit_bias=NO_EOS)
        assert cached(first) == 0
        wait_idle(base)
    assert len(hkv(folder)) == 1
    with server(tiny, "--prompt-cache-dir", folder, env=SCALAR) as base:
        assert "prompt cache" in log_text() and "1 files" in log_text()
        again = chat(base, msgs, 8, logit_bias=NO_EOS)
        ids = prompt_ids(tok, msgs)
        assert cached(again) == expected_cached(ids, ids) == len(ids) - 1
        assert answer(again) == answer(first)
        # the next turn extends the saved history: its file replaces the older one
        turn2 = msgs + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "And the second?"}]
        chat(base, turn2, 8, logit_bias=NO_EOS)
        wait_idle(base)
    assert len(hkv(folder)) == 1


def test_bound_and_refused_files(tmp_path):
    tiny = need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")
    qwen = need(TINY_QWEN, "tiny qwen3 f32 model", "run tools/make_tiny_models.py")
    folder = tmp_path / "pc"
    with server(qwen, "--prompt-cache-dir", folder, env=SCALAR) as base:
        chat(base, messages("Say something short."), 4)
        wait_idle(base)
    foreign = hkv(folder)
    assert len(foreign) == 1
    (folder / "zz-damaged.hkv").write_bytes(b"HEARTHKV" + b"\0" * 200)
    os.utime(folder / "zz-damaged.hkv", (1000, 1000))  # older: the log names the newest refusal first
    # every file is larger than 1 KiB: each one saved is deleted again by the bound
    with server(tiny, "--prompt-cache-dir", folder, "--prompt-cache-bytes", "1K", env=SCALAR) as base:
        log = log_text()
        assert "2 files refused" in log and "another model" in log, log
        body = chat(base, messages("Is this a list?"), 4)
        assert body["choices"][0]["message"]["content"] is not None
        wait_idle(base)
    assert hkv(folder) == sorted(foreign + ["zz-damaged.hkv"])  # refused files are left alone
    with server(tiny, "--prompt-cache-bytes", "1M") as base:  # without the folder: a warning
        assert "ignored without it" in log_text()


def test_bad_folder_is_an_error(tmp_path):
    tiny = need(TINY_LLAMA, "tiny llama f32 model", "run tools/make_tiny_models.py")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN), "serve", "--model", str(tiny), "--port", "1", "--prompt-cache-dir",
                        str(blocker / "sub")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and str(blocker / "sub") in r.stderr


def test_hybrid_cache_survives_a_restart(tmp_path):
    """Qwen3.5 (Gated DeltaNet layers): the file holds the KV and the recurrent state at the
    last block boundary the prefix cache kept a state snapshot for, and a new server starts
    the same request after it with the same answer, bit for bit."""
    tiny = need(TINY_LLAMA.parent / "qwen3_5-f32", "tiny qwen3_5 f32 model", "run tools/make_tiny_models.py")
    tok = hf_tokenizer(tiny)
    folder = tmp_path / "pc"
    msgs = messages("What is the first word?")
    with server(tiny, "--prompt-cache-dir", folder, env=SCALAR) as base:
        first = chat(base, msgs, 8, logit_bias=NO_EOS)
        wait_idle(base)
    assert len(hkv(folder)) == 1
    with server(tiny, "--prompt-cache-dir", folder, env=SCALAR) as base:
        again = chat(base, msgs, 8, logit_bias=NO_EOS)
        n = len(prompt_ids(tok, msgs))
        assert cached(again) % 16 == 0 and n - 1 - 16 < cached(again) <= n - 1, (cached(again), n)
        assert answer(again) == answer(first)
