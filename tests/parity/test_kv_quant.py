"""int8 KV (`--kv-quant int8`): what storing keys and values as int8 with one float scale
per position and head costs in prediction quality, and what it saves in memory.

Quality: tests/parity/helpers/kvq_helper.c runs the same text (the English, Markdown/URL,
numbers and code files of tests/parity/corpus/tokenizer, teacher-forced, every position's
logits) through one engine with float KV and one with int8 KV, and reports KL(float ||
int8) of the next-token distributions and how often the argmax agrees. The float-KV engine
is the oracle: its own agreement with mlx-lm is tests/parity/test_forward_parity.py's job.

Bounds (measured 2026-11-29 on 512 tokens with AVX-512 and AVX2 kernels, and on 1536 tokens
for docs/server.md): SmolLM2-135M mean KL 0.0046-0.0052 nats, p99 0.019-0.029, argmax
agreement 95-96%; Gemma 3 270M mean KL 0.009, p99 0.074, agreement 95%. The bounds below
leave about 2x on the mean and p99 (another text slice or kernel level moves them by
~20%); a real fault is far outside them: dropping the scale, reading another row, or a
sign error makes the distributions unrelated (KL of several nats, agreement near 0).

Memory: the KV pool `hearth fit` predicts shrinks by exactly what the layout says (head_dim
float32 -> head_dim int8 + one float32 scale, per position, KV head, K and V), with the
model's sizes read from its GGUF metadata by the gguf package.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import CACHE, REAL_GGUFS, gguf_summary

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HEARTH_BIN", ROOT / "bin" / "hearth"))
CORPUS = ROOT / "tests" / "parity" / "corpus" / "tokenizer"
TEXT_FILES = ["english.txt", "markdown_urls.txt", "numbers.txt", "code.txt"]
TOKENS = 512          # teacher-forced positions per model (a multiple of 8)
GREEDY_STEPS = 16
KV_BLOCK = 16         # src/kv/kv_cache.h KV_BLOCK_SIZE

BOUNDS = {  # model: (mean KL, p99 KL, min argmax agreement)
    "smollm2": (0.012, 0.06, 0.90),
    "gemma3": (0.02, 0.15, 0.88),
}


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    lib = BIN.parent.parent / "lib" / "libhearth.so"
    if not lib.exists():
        pytest.fail(f"{lib} missing: build it with `make lib` (the same BUILD/LIBDIR as HEARTH_BIN={BIN})",
                    pytrace=False)
    exe = tmp_path_factory.mktemp("kvq") / "kvq_helper"
    build = subprocess.run(["cc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-I", str(ROOT / "include"),
                            str(ROOT / "tests/parity/helpers/kvq_helper.c"), "-L", str(lib.parent), "-lhearth",
                            f"-Wl,-rpath,{lib.parent}", "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("kvq_text") / "text.txt"
    path.write_text("".join((CORPUS / f).read_text() for f in TEXT_FILES))
    return path


def model_path(key):
    path = CACHE / "models" / REAL_GGUFS[key]
    if not path.exists():
        pytest.fail(f"model missing: {path}; run tools/get_models.sh", pytrace=False)
    return path


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
def test_int8_kv_kl_and_agreement(helper, text, key):
    p = subprocess.run([str(helper), str(model_path(key)), str(text), str(TOKENS), str(GREEDY_STEPS), "2"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    print(f"\n{key}: {json.dumps(r)}")
    mean_bound, p99_bound, agree_bound = BOUNDS[key]
    assert r["tokens"] == TOKENS
    assert r["kl_mean"] < mean_bound
    assert r["kl_p99"] < p99_bound
    assert r["argmax_agreement"] >= agree_bound
    # not a no-op: int8 rounding must move the distributions a little somewhere
    assert r["kl_max"] > 0
    assert r["engine_bytes_quant"] < r["engine_bytes_float"]


def gguf_kv_shape(path):
    fields = gguf_summary(path)["scalars"]  # as gguf.GGUFReader reads them
    arch = fields["general.architecture"]

    def num(key):
        return fields.get(f"{arch}.{key}")

    layers, heads, kv_heads = num("block_count"), num("attention.head_count"), num("attention.head_count_kv")
    head_dim = num("attention.key_length") or num("embedding_length") // heads
    return layers, kv_heads or heads, head_dim


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
@pytest.mark.parametrize("ctx", [1024, 4096])
def test_int8_kv_pool_shrinks_as_predicted(key, ctx):
    model = model_path(key)
    layers, kv_heads, head_dim = gguf_kv_shape(model)
    fits = {}
    for q in ("none", "int8"):
        p = subprocess.run([str(BIN), "fit", str(model), "--json", "--ctx", str(ctx), "--max-sequences", "1", "--kv-quant", q],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        fits[q] = json.loads(p.stdout)
    rows = 2 * layers * (-(-ctx // KV_BLOCK)) * KV_BLOCK * kv_heads  # one sequence: one context of blocks
    saved = rows * (4 * head_dim - (head_dim + 4))
    assert fits["none"]["kv_pool_bytes"] - fits["int8"]["kv_pool_bytes"] == saved
    assert fits["none"]["engine_bytes"] - fits["int8"]["engine_bytes"] == saved  # nothing else moves
    # the bandwidth model reads fewer KV bytes per decoded token too
    assert fits["int8"]["decode_bytes_per_token"] < fits["none"]["decode_bytes_per_token"]


def test_unknown_kv_quant_is_an_error():
    p = subprocess.run([str(BIN), "fit", str(model_path("smollm2")), "--kv-quant", "int3"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "--kv-quant takes none, int8, fp8 or f16" in p.stderr


@pytest.mark.parametrize("quant", ["fp8", "f16"])
def test_gpu_only_kv_is_refused_on_the_cpu(quant):
    """fp8 and f16 KV exist only in the CUDA pool: the CPU engine names the flag and the way out."""
    p = subprocess.run([str(BIN), "generate", str(model_path("smollm2")), "--device", "cpu", "--kv-quant", quant,
                        "hi", "--max-tokens", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and f"--kv-quant {quant}" in p.stderr and "--device cuda" in p.stderr, p.stderr
