"""Shared pytest fixtures for the parity tests: where the hearth binary, the model cache, the
goldens and the corpora are. A missing model or binary FAILS the test with the command that
fixes it (never a silent skip). Holds no test logic and computes no expected values.
"""
import contextlib
import functools
import glob
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import isolate_cache  # noqa: E402

isolate_cache()  # before CACHE below: tests never write into the user's cache

REPO = Path(__file__).resolve().parent.parent.parent
PARITY = REPO / "tests" / "parity"
BIN = Path(os.environ.get("HEARTH_BIN", REPO / "bin" / "hearth"))
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))

# What tools/get_models.sh puts in the cache; names are fixed so tests can parametrize on them.
REAL_GGUFS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
REAL_DIRS = {"minilm": "all-MiniLM-L6-v2"}
TINY_FAMILIES = ("llama", "qwen3", "gemma3")
TINY_FORMS = ("f32", "bf16", "q4g64", "q4g32", "q8g64", "q8g32")
# tools/make_tiny_models.py's EXTRA_FORMS: one of MLX's other widths per family
TINY_EXTRA = ("llama-q5g64", "llama_longrope-f32", "qwen3-q3g32", "gemma3-q6g64", "minicpm-f32", "minicpm-bf16", "minicpm-q4g64",
              "qwen3_moe-f32", "qwen3_moe-q4g64",
              "qwen3_5-f32", "qwen3_5-bf16", "qwen3_5-q4g64", "qwen3_5-q8g64", "qwen3_5_moe-f32", "qwen3_5_moe-q4g64", "qwen3_5-mixed",
              "gemma4-f32", "gemma4-bf16", "gemma4-q4g64", "gemma4-q8g64",
              "gemma4_moe-f32", "gemma4_moe-q4g64", "gemma4-mixed46")
TINY_MODELS = tuple(f"{family}-{form}" for family in TINY_FAMILIES for form in TINY_FORMS) + TINY_EXTRA
# Golden file name (tests/parity/goldens/<name>.json) for each real GGUF.
REAL_GOLDENS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma-3-270m-q4_k_m"}

FIX_MODELS = "run tools/get_models.sh (or `make parity`)"


@functools.lru_cache(maxsize=4)
def _gguf_reader(path, mtime_ns, size):
    import gguf
    return gguf.GGUFReader(path)


def gguf_reader(path):
    """gguf.GGUFReader(path), parsed once per file per test session: parsing Gemma 3's
    262k-entry vocabulary takes ~30 s, and several test files read the same real GGUFs.
    Keyed by path, mtime and size, so a file rewritten in place is parsed again."""
    st = os.stat(path)
    return _gguf_reader(str(path), st.st_mtime_ns, st.st_size)


@contextlib.contextmanager
def oracle_saved(model, kind, version):
    """(path of) an oracle's result for the file `model`, kept for later sessions and for the
    other pytest-xdist workers of this one: keyed by the file's real path (the session's cache
    folder only links to the models: keyed by that link's path, no later session found it),
    size and mtime and the oracle package's version. Yields the path with a lock held, so a
    second worker waits for the first one's save; the caller saves there if nothing is. A file
    a test wrote is kept in this session's own cache folder, removed with it: its path is new
    in every session, so a saved copy would only pile up."""
    import fcntl

    real = os.path.realpath(model)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}|{st.st_size}|{st.st_mtime_ns}|{version}".encode())
    user = os.path.realpath(os.environ.get("HEARTH_TEST_CACHE_OF", CACHE))
    kept = CACHE / ("oracle" if real.startswith(user + os.sep) else "oracle-session")
    saved = kept / kind / key.hexdigest()[:24]
    saved.parent.mkdir(parents=True, exist_ok=True)
    with open(str(saved) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield saved


@functools.lru_cache(maxsize=None)
def gguf_summary(path):
    """What gguf.GGUFReader reads of a GGUF's header, for tests that need no tensor data:
    {"scalars": {key: value} (every non-array field, as ReaderField.contents() gives it),
    "array_lengths": {key: n} (array fields), "tensors": [[name, [shape...]], ...]}. Read by
    the reader once per file and kept as JSON (oracle_saved): one parse of Gemma 3's GGUF
    costs ~10 s of CPU, and the metadata tests, the tokenizer oracles (gguf_pre) and the
    tensor tests land on different workers."""
    import gguf
    from importlib.metadata import version

    with oracle_saved(path, "gguf-summary", f"gguf {version('gguf')}") as saved:
        saved = Path(str(saved) + ".json")
        if saved.is_file():
            return json.loads(saved.read_text(encoding="utf-8"))
        r = gguf_reader(path)
        summary = {"scalars": {k: f.contents() for k, f in r.fields.items() if f.types[0] != gguf.GGUFValueType.ARRAY},
                   "array_lengths": {k: len(f.data) for k, f in r.fields.items()
                                     if f.types[0] == gguf.GGUFValueType.ARRAY},
                   "tensors": [[t.name, [int(d) for d in t.shape]] for t in r.tensors]}
        tmp = Path(str(saved) + ".tmp")
        tmp.write_text(json.dumps(summary), encoding="utf-8")
        os.replace(tmp, saved)
        return summary


def _need(path, what, fix):
    if not Path(path).exists():
        pytest.fail(f"{what} missing: {path}; {fix}", pytrace=False)
    return Path(path)


@pytest.fixture(scope="session")
def repo_root():
    return REPO


@pytest.fixture(scope="session")
def hearth_cache():
    return CACHE


@pytest.fixture(scope="session")
def hearth_bin():
    """Path of the hearth binary (env HEARTH_BIN, default <repo>/bin/hearth)."""
    path = _need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not executable", pytrace=False)
    return path


@pytest.fixture(scope="session")
def real_models():
    """{"smollm2": <gguf path>, "gemma3": <gguf path>, "minilm": <model dir>}."""
    out = {k: _need(CACHE / "models" / f, f"real model {f}", FIX_MODELS) for k, f in REAL_GGUFS.items()}
    for k, d in REAL_DIRS.items():
        out[k] = _need(CACHE / "models" / d / "model.safetensors", f"real model {d}", FIX_MODELS).parent
    return out


@pytest.fixture(scope="session")
def real_ggufs(real_models):
    return {k: real_models[k] for k in REAL_GGUFS}


@pytest.fixture(scope="session")
def tiny_models():
    """{"llama-f32": <dir>, ..., "gemma3-q6g64": <dir>}: all 21 tiny mlx-lm model folders."""
    return {name: _need(CACHE / "tiny" / name / "config.json", f"tiny model {name}", FIX_MODELS).parent
            for name in TINY_MODELS}


@pytest.fixture(scope="session")
def tiny_model(request):
    """Use with indirect parametrization: @pytest.mark.parametrize("tiny_model", TINY_MODELS, indirect=True)."""
    name = request.param
    return _need(CACHE / "tiny" / name / "config.json", f"tiny model {name}", FIX_MODELS).parent


@functools.lru_cache(maxsize=None)
def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def load_golden(name):
    """tests/parity/goldens/<name>.json, checked against the model files it was made from
    (a regenerated tiny model with other bytes makes every number in the golden meaningless)."""
    path = _need(PARITY / "goldens" / f"{name}.json", f"golden {name}", "run tools/make_goldens.py")
    golden = json.loads(path.read_text(encoding="utf-8"))
    model = _need(CACHE / golden["model"], f"model of golden {name}", FIX_MODELS)
    folder = model if model.is_dir() else model.parent
    for fname, want in golden["model_files"].items():
        if fname == "README.md":
            continue  # model card text, not read by anyone
        got = _sha256(_need(folder / fname, f"file of golden {name}", FIX_MODELS))
        if got != want:
            pytest.fail(f"{folder / fname}: sha256 {got[:12]}.. differs from golden {name} ({want[:12]}..); "
                        "the cache was made by a different tools/make_tiny_models.py or mlx: "
                        "re-run tools/get_models.sh, or tools/make_goldens.py if the change is intended",
                        pytrace=False)
    return golden


@pytest.fixture(scope="session")
def golden():
    """golden(name) -> dict; see tools/make_goldens.py for the fields."""
    return load_golden


@pytest.fixture(scope="session")
def tokenizer_corpus():
    """{file name: text} of tests/parity/corpus/tokenizer/*.txt, read without newline translation."""
    files = sorted(glob.glob(str(PARITY / "corpus" / "tokenizer" / "*.txt")))
    if not files:
        pytest.fail("tests/parity/corpus/tokenizer/*.txt missing", pytrace=False)
    out = {}
    for f in files:
        with open(f, encoding="utf-8", newline="") as fh:
            out[os.path.basename(f)] = fh.read()
    return out


@pytest.fixture(scope="session")
def conversations():
    """{file name: {"messages": [...], "tools": [...] | None, "extra": {...}}}."""
    files = sorted(glob.glob(str(PARITY / "corpus" / "conversations" / "*.json")))
    if not files:
        pytest.fail("tests/parity/corpus/conversations/*.json missing", pytrace=False)
    return {os.path.basename(f): json.loads(Path(f).read_text(encoding="utf-8")) for f in files}


@functools.lru_cache(maxsize=None)
def hf_tokenizer(model):
    """The transformers tokenizer of a model folder or .gguf file (the oracle for tokenize,
    detokenize and apply_chat_template). transformers' GGUF reader imports torch only for
    tensor dtypes, which tokenizer conversion never touches; where torch is absent, a
    placeholder module stands in for that import (mixed_data.gguf_tokenizer). Built once per path (converting Gemma
    3's 262k-entry GGUF vocabulary takes ~30 s), then reloaded from transformers' own saved
    form; callers only read it."""
    from transformers import AutoTokenizer

    if not model.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(model)
    # The conversion's result, saved by transformers itself (tokenizer.json + config), is
    # reloaded by later sessions and by the other pytest-xdist workers of this one instead of
    # converting again (oracle_saved).
    import transformers

    with oracle_saved(model, "hf-gguf-tokenizer", transformers.__version__) as saved:
        if (saved / "tokenizer.json").is_file():
            return digits_first(model, AutoTokenizer.from_pretrained(str(saved)))
        import mixed_data

        tok = mixed_data.gguf_tokenizer(Path(model))
        tmp = Path(str(saved) + ".tmp")
        tok.save_pretrained(str(tmp))
        os.replace(tmp, saved)
        return digits_first(model, tok)


# tokenizer.ggml.pre names llama.cpp (llama-vocab.cpp) splits at every \p{N} character before
# GPT-2's regex: HF's Sequence of Digits(individual) and ByteLevel, SmolLM2's own tokenizer.json
DIGITS_FIRST_PRE = {"smollm", "codeshell", "exaone", "minerva", "mellum2"}


def gguf_pre(model):
    """The file's tokenizer.ggml.pre (None without one), as gguf.GGUFReader reads it."""
    return gguf_summary(model)["scalars"].get("tokenizer.ggml.pre")


def digits_first(model, tok):
    """transformers' GGUF conversion ignores tokenizer.ggml.pre for these names and keeps plain
    ByteLevel, which differs from llama.cpp (the format's reference) and from the model's own
    tokenizer on a numeral after a space (" ½", " ٣"): the oracle takes the pre-tokenizer they
    have. test_tokenizer_llamacpp checks hearth against llama.cpp itself where it is built."""
    from tokenizers import pre_tokenizers

    if gguf_pre(model) in DIGITS_FIRST_PRE:
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok
