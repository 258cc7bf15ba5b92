"""The `hearth` Python package (python/), installed by `make python-test` into
build/python/site (or anywhere on sys.path). Oracles: the `hearth generate` CLI for the
same prompt, seed and sampling (the same tokens, so the same text); HF `tokenizers` and
transformers' chat template for tokenize/detokenize/chat_template; sentence-transformers'
goldens (tests/parity/goldens/embed_minilm.json) for embed; and the package against itself
only where the property is about the binding (streaming joins to generate's text,
cancellation, the GIL, batch vs one at a time in deterministic mode)."""
import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "parity"))
from conftest import BIN, CACHE, hf_tokenizer  # noqa: E402

try:
    import hearth
except ImportError as e:  # a failure, never a skip: make python-test installs it
    pytest.fail(f"the hearth package is not importable ({e}): run `make python-test` or "
                "`pip install ./python`", pytrace=False)

SMOLLM2 = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = CACHE / "tiny" / "llama-f32"
MINILM = CACHE / "models" / "all-MiniLM-L6-v2"


def need(path):
    if not Path(path).exists():
        pytest.fail(f"{path} missing: run tools/get_models.sh and tools/make_tiny_models.py", pytrace=False)
    return str(path)


@pytest.fixture(scope="module")
def smollm2():
    return hearth.Model.open(need(SMOLLM2))


@pytest.fixture(scope="module")
def engine(smollm2):
    return hearth.Engine(smollm2, threads=2, ctx=2048)


def cli_generate(*args):
    r = subprocess.run([str(BIN), "generate", need(SMOLLM2), *args, "--threads", "2", "--ctx", "2048"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("sampling,flags", [
    ({}, []),
    ({"temperature": 0.9, "seed": 11}, ["--temp", "0.9", "--seed", "11"]),
    ({"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3}, ["--temp", "0.7", "--top-p", "0.9", "--top-k", "40",
                                                                  "--seed", "3"]),
])
def test_generate_equals_the_cli(engine, sampling, flags):
    prompt = "Write a haiku about a lighthouse."
    got = engine.generate(prompt, max_tokens=40, **sampling)
    assert got == cli_generate(prompt, "--max-tokens", "40", *flags)
    assert got.info["completion_tokens"] <= 40 and got.info["prompt_tokens"] > 10
    raw = engine.generate("The capital of France is", chat_template=False, max_tokens=12, **sampling)
    assert raw == cli_generate("The capital of France is", "--no-chat-template", "--max-tokens", "12", *flags)


def test_tokenizer_and_template_match_transformers():
    model = hearth.Model.open(need(TINY))
    tok = hf_tokenizer(str(TINY))
    for text in ["hello world", "  spaces\tand\nnewlines ", "émoji 🎉 and 中文", "<|im_start|>user"]:
        ids = model.tokenize(text)
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
        assert model.detokenize(ids) == tok.decode(ids)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert model.chat_template(msgs) == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert model.chat_template(msgs, add_generation_prompt=False) == \
        tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)


def test_stream_joins_to_generate_sync_and_async(engine):
    whole = engine.generate("Name three rivers.", max_tokens=30, temperature=0.8, seed=5)
    s = engine.stream("Name three rivers.", max_tokens=30, temperature=0.8, seed=5)
    pieces = list(s)
    assert len(pieces) > 3 and "".join(pieces) == whole and s.info == dict(s.info, completion_tokens=30)

    async def collect():
        return [p async for p in engine.stream("Name three rivers.", max_tokens=30, temperature=0.8, seed=5)]
    assert "".join(asyncio.run(collect())) == whole


def test_breaking_the_iterator_cancels(engine):
    t0 = time.monotonic()
    full = engine.generate("Tell me a long story about a dragon.", max_tokens=200, ignore_eos=True)
    full_s = time.monotonic() - t0
    s = engine.stream("Tell me a long story about a dragon.", max_tokens=200, ignore_eos=True)
    t0 = time.monotonic()
    got = []
    for piece in s:
        got.append(piece)
        if len(got) == 3:
            break
    broke_s = time.monotonic() - t0
    assert not s._thread.is_alive()  # the worker ended, not left generating
    assert full.startswith("".join(got))
    assert broke_s < full_s / 3, (broke_s, full_s)  # stopped at the next token, not after 200

    async def first_two():
        out = []
        async for p in engine.stream("Tell me a long story about a dragon.", max_tokens=200, ignore_eos=True):
            out.append(p)
            if len(out) == 2:
                break
        return out
    assert full.startswith("".join(asyncio.run(first_two())))
    assert engine.generate("Say hi.", max_tokens=4)  # the engine is free again


def test_gil_released_during_generate(engine):
    done = threading.Event()
    counter = 0

    def work():
        engine.generate("Tell me about the sea.", max_tokens=48, ignore_eos=True)
        done.set()
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        counter += 1  # runs only while the C code does not hold the GIL
    t.join()
    # a held GIL would let this loop run only at the interpreter's 5 ms switch points
    # (a few hundred times); released, it spins millions of times in the ~1 s of decode
    assert counter > 100_000, counter


def test_batch_equals_one_at_a_time(smollm2):
    e = hearth.Engine(smollm2, threads=2, ctx=1024, max_sequences=4, deterministic=True)
    prompts = ["What is 2+2?", "Name a fruit.", "Say hello in French.", "What color is the sky?", "Count to 3."]
    alone = [e.generate(p, max_tokens=16) for p in prompts]
    together = e.batch(prompts, max_tokens=16)
    assert together == alone
    assert [r.info["completion_tokens"] for r in together] == [r.info["completion_tokens"] for r in alone]
    e.close()


def test_embed_matches_sentence_transformers():
    g = json.load(open(REPO / "tests" / "parity" / "goldens" / "embed_minilm.json", encoding="utf-8"))
    items = [i for i in g["items"] if i["tokens"] < g["max_seq_length"]][:12]
    ref = np.array([np.frombuffer(base64.b64decode(i["embedding_f32_b64"]), dtype="<f4") for i in items])
    e = hearth.Engine(hearth.Model.open(need(MINILM)), threads=2)
    got = np.array(e.embed([i["text"] for i in items]))
    assert got.shape == ref.shape == (len(items), 384)
    cos = np.sum(got * ref, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, cos  # test_embed.py's bound: float32 on both sides
    with pytest.raises(hearth.Error, match="cannot generate"):
        e.generate("hi")


def test_sessions_resume_and_refuse(smollm2, tmp_path):
    e = hearth.Engine(smollm2, threads=2, ctx=2048, deterministic=True)
    system = "You are a helpful assistant who answers in one sentence. " * 12
    path = str(tmp_path / "s.hkv")
    n = e.save_session(path, "What is a lighthouse?", system=system)
    fresh = e.generate("What is a lighthouse?", system=system, max_tokens=20)
    assert e.load_session(path) == n
    resumed = e.generate("What is a lighthouse?", system=system, max_tokens=20)
    assert resumed.info["cached_tokens"] == n - 1 and fresh.info["cached_tokens"] == 0
    assert resumed == fresh
    e.load_session(None)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(hearth.Error, match="checksum"):
        e.load_session(path)
    e.close()


def test_fit_and_errors(smollm2):
    report = hearth.fit(smollm2, ctx=4096)
    assert report["predicted_peak_bytes"] > 50e6 and "fits" in report
    with pytest.raises(hearth.Error) as err:
        hearth.Model.open("/nonexistent/model.gguf")
    assert "/nonexistent/model.gguf" in str(err.value)
    with pytest.raises(ValueError, match="kv_quant"):
        hearth.Engine(smollm2, kv_quant="int3")
    with pytest.raises(TypeError, match="unknown sampling"):
        hearth.Engine(smollm2, ctx=256).generate("hi", temprature=1)
