"""The CLI's output contracts against independent oracles.

hearth info/tokenize/template/tensors on the tiny mlx-lm models and the real GGUFs,
compared with config.json + mlx-lm, gguf.GGUFReader, HF tokenizers/transformers and
gguf's numpy dequantizers; and bad files: a clean error naming the file, never a crash.
"""
import glob
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import gguf_reader, gguf_summary, hf_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
TINY = sorted(d for d in glob.glob(os.path.join(CACHE, "tiny", "*")) if os.path.isfile(os.path.join(d, "config.json")))
GGUFS = sorted(glob.glob(os.path.join(CACHE, "models", "*.gguf")))
CONVERSATIONS = sorted(glob.glob(os.path.join(REPO, "tests", "parity", "corpus", "conversations", "*.json")))


def hearth(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"hearth {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()}")
    return p


def test_models_present():
    assert os.path.exists(BIN), f"{BIN} missing: run make"
    assert len(TINY) >= 18, f"tiny models missing in {CACHE}/tiny: run tools/get_models.sh"
    assert len(GGUFS) >= 2, f"real GGUF models missing in {CACHE}/models: run tools/get_models.sh"


@pytest.mark.parametrize("model", TINY, ids=os.path.basename)
def test_info_matches_config_and_mlx(model):
    info = json.loads(hearth("info", model, "--json").stdout)
    cfg = json.load(open(os.path.join(model, "config.json")))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        assert info[key] == cfg[key], key
    assert info["num_key_value_heads"] == cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    assert info["architecture"] == cfg["model_type"]
    q = cfg.get("quantization")
    if q:
        assert info["quantization"]["format"] == "mlx"
        assert (info["quantization"]["bits"], info["quantization"]["group_size"]) == (q["bits"], q["group_size"])
    else:
        assert info["quantization"]["format"] == "none"
    # parameter count: mlx-lm's own count of the loaded model (quantized weights unpacked)
    import mlx.core as mx
    import mlx.utils
    from mlx_lm.utils import load_model

    m, _ = load_model(__import__("pathlib").Path(model))
    n = 0
    for name, p in mlx.utils.tree_flatten(m.parameters()):
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        # mixed precision: a module's own entry in the quantization config overrides the default
        # bits (mlx-lm keeps a MoE router at 8 bits beside 4-bit experts)
        bits = (q.get(name[: -len(".weight")]) or q)["bits"] if q else 0
        n += p.size * 32 // bits if q and p.dtype == mx.uint32 else p.size
    assert info["parameters"] == n


@pytest.mark.parametrize("path", GGUFS, ids=os.path.basename)
def test_info_matches_gguf_reader(path):
    r = gguf_summary(path)  # what gguf.GGUFReader reads of the header
    field = r["scalars"].__getitem__

    info = json.loads(hearth("info", path, "--json").stdout)
    arch = field("general.architecture")
    assert info["architecture"] == arch
    assert info["num_hidden_layers"] == field(f"{arch}.block_count")
    assert info["hidden_size"] == field(f"{arch}.embedding_length")
    assert info["num_attention_heads"] == field(f"{arch}.attention.head_count")
    assert info["context_length"] == field(f"{arch}.context_length")
    assert info["tensors"] == len(r["tensors"])
    assert info["parameters"] == sum(int(np.prod(shape)) for _, shape in r["tensors"])
    assert info["vocab_size"] == r["array_lengths"]["tokenizer.ggml.tokens"]
    assert info["chat_template"]["present"] == ("tokenizer.chat_template" in r["scalars"])


TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n\nnewlines", "Ünïcödé 日本語 العربية 👩‍👩‍👧 e\u0301",
         "def f(x):\n    return x ** 2  # code", "", "<|im_start|>user\nhi<|im_end|>"]


@pytest.mark.parametrize("model", [m for m in TINY if m.endswith("-f32")] + GGUFS, ids=os.path.basename)
def test_tokenize_cli_matches_hf(model):
    tok = hf_tokenizer(model)
    for text in TEXTS:
        for special in (True, False):
            args = ["tokenize", model, text] + ([] if special else ["--no-special"])
            got = json.loads(hearth(*args).stdout)
            want = tok(text, add_special_tokens=special)["input_ids"]
            assert got == want, (text, special)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out = hearth("detokenize", model, json.dumps(ids)).stdout.decode()
        assert out == tok.decode(ids), text


@pytest.mark.parametrize("model", [m for m in TINY if m.endswith("-f32")] + GGUFS, ids=os.path.basename)
def test_template_cli_matches_transformers(model, tmp_path):
    tok = hf_tokenizer(model)
    if not tok.chat_template:  # e.g. the Gemma 3 GGUF: hearth must say so, not invent one
        p = hearth("template", model, "--messages", CONVERSATIONS[0], check=False)
        assert p.returncode == 1 and b"no chat template" in p.stderr
        return
    assert CONVERSATIONS, "tests/parity/corpus/conversations is empty"
    compared = 0
    for conv_path in CONVERSATIONS:
        conv = json.load(open(conv_path))
        extra = dict(conv.get("extra") or {})
        gens = [extra.pop("add_generation_prompt")] if "add_generation_prompt" in extra else [True, False]
        for gen in gens:
            try:
                want = tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                               add_generation_prompt=gen, **extra)
            except Exception:  # the template refuses this conversation: hearth must refuse too
                want = None
            args = ["template", model, "--messages", conv_path] + ([] if gen else ["--no-generation-prompt"])
            p = hearth(*args, check=False)
            if want is None:
                assert p.returncode == 1 and p.stderr, conv_path
            else:
                assert p.returncode == 0, (conv_path, p.stderr.decode())
                assert p.stdout.decode() == want, (conv_path, gen)
                compared += 1
    assert compared > 0


@pytest.mark.parametrize("path", GGUFS, ids=os.path.basename)
def test_tensors_cli_dequant_matches_gguf(path, tmp_path):
    import gguf
    from gguf.quants import dequantize

    r = gguf_reader(path)
    seen = set()
    for t in sorted(r.tensors, key=lambda t: t.n_elements):  # the smallest tensor of every type present
        if t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        out = tmp_path / "t.f32"
        hearth("tensors", path, t.name, "--out", str(out))
        want = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        got = np.fromfile(out, dtype=np.float32)
        assert got.shape == want.shape, t.name
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name


def assert_clean_error(p, *needles):
    assert p.returncode == 1, f"expected a clean error (exit 1), got {p.returncode}: {p.stderr.decode()}"
    msg = p.stderr.decode()
    assert msg.startswith("hearth: "), msg
    for n in needles:
        assert n in msg, (n, msg)


def test_bad_gguf_files(tmp_path):
    src = GGUFS[0]
    data = open(src, "rb").read()
    cases = {
        "truncated.gguf": data[: len(data) // 3],
        "header-only.gguf": data[:64],
        "wrong-magic.gguf": b"GGUX" + data[4:4096],
        "empty.gguf": b"",
        "huge-count.gguf": data[:8] + (2**62).to_bytes(8, "little") + data[16:4096],
    }
    for name, blob in cases.items():
        f = tmp_path / name
        f.write_bytes(blob)
        assert_clean_error(hearth("info", str(f), check=False), name)


def test_bad_safetensors_models(tmp_path):
    base = next(m for m in TINY if m.endswith("-f32"))

    def variant(name, edit):
        d = tmp_path / name
        shutil.copytree(base, d)
        edit(d)
        return str(d)

    def set_cfg(key, value):
        def edit(d):
            cfg = json.load(open(d / "config.json"))
            cfg[key] = value
            json.dump(cfg, open(d / "config.json", "w"))
        return edit

    def truncate(d):
        st = next(p for p in d.iterdir() if p.suffix == ".safetensors")
        st.write_bytes(st.read_bytes()[:-100])

    def bad_header_len(d):
        st = next(p for p in d.iterdir() if p.suffix == ".safetensors")
        b = st.read_bytes()
        st.write_bytes((2**63).to_bytes(8, "little") + b[8:])

    cases = [
        (variant("vocab", set_cfg("vocab_size", 12345)), ["vocab_size", "embed_tokens"]),
        (variant("layers", set_cfg("num_hidden_layers", 7)), ["7 layers"]),
        (variant("hidden", set_cfg("hidden_size", "big")), ["hidden_size"]),
        (variant("truncated", truncate), [".safetensors"]),
        (variant("headerlen", bad_header_len), [".safetensors"]),
        (variant("badjson", lambda d: (d / "config.json").write_text("{not json")), ["config.json"]),
    ]
    for model, needles in cases:
        assert_clean_error(hearth("info", model, check=False), *needles)


def test_unknown_model_lists_candidates():
    p = hearth("info", "no-such-model-anywhere", check=False)
    assert_clean_error(p, "no model matches 'no-such-model-anywhere'")


def test_bench_batch_reports_each_count():
    """hearth bench --batch B1,B2: one JSON report per count from one engine, each with
    aggregate rates for that many concurrent requests; the step time is B / decode rate; a
    bad count is a usage error naming the value, not a crash."""
    model = next(m for m in TINY if m.endswith("llama-bf16"))
    p = hearth("bench", model, "--batch", "1,3", "-p", "24", "-n", "6", "-r", "1", "-t", "1", "--json")
    rows = [json.loads(line) for line in p.stdout.decode().splitlines() if line.strip()]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["prompt_tokens"] == 24 and r["gen_tokens"] == 6 and r["device"] == "cpu"
        assert r["decode_tps"] > 0 and r["prefill_tps"] > 0
        assert r["decode_step_ms"] == pytest.approx(1e3 * r["batch"] / r["decode_tps"], rel=1e-6)
        assert 0 < r["roofline_fraction"] and r["decode_bytes_per_step"] > 0
        assert 0 < r["load_s"] < 60  # the one engine's load, the same in each report
    assert rows[0]["load_s"] == rows[1]["load_s"]
    # one step reads the weights once: three rows' step reads more than one row's, less than 3x
    assert rows[0]["decode_bytes_per_step"] < rows[1]["decode_bytes_per_step"] < 3 * rows[0]["decode_bytes_per_step"]
    for bad in ("0", "2,x", "1025", ""):
        q = hearth("bench", model, "--batch", bad, "-p", "8", "-n", "4", check=False)
        assert q.returncode != 0 and b"--batch" in q.stderr and b"Traceback" not in q.stderr
    q = hearth("bench", model, "--batch", "2", "--temp", "0.7", check=False)
    assert q.returncode != 0 and b"greedy" in q.stderr


def test_no_hugepages_flag_on_any_command():
    """--no-hugepages is every command's (taken out before the command's own flags): the
    same tokens as the HF tokenizer with it, in any position, and the same greedy text."""
    model = next(m for m in TINY if m.endswith("llama-f32"))
    want = hf_tokenizer(model)("Hello there", add_special_tokens=True)["input_ids"]
    for args in (["--no-hugepages", "tokenize", model, "Hello there"],
                 ["tokenize", model, "Hello there", "--no-hugepages"]):
        assert json.loads(hearth(*args).stdout) == want, args
    gen = ["generate", model, "Hello there", "--max-tokens", "6", "--temp", "0"]
    assert hearth(*gen, "--no-hugepages").stdout == hearth(*gen).stdout
