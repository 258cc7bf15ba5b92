"""Tokenizer parity on tokenizer.json files built and trained here with HF `tokenizers`
itself, one per family of components the real models do not exercise: Metaspace
(first/always/never, split), byte fallback, Unicode normalizers, Replace/Strip/Prepend,
every Split behavior and invert, Whitespace/WhitespaceSplit/Digits/Punctuation,
added tokens with lstrip/rstrip/single_word/normalized, Roberta/Bert/Template
post-processors, subword prefix/suffix with BPEDecoder. The oracle is the same
`tokenizers.Tokenizer` object that wrote the file."""
import os

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from test_tokenizer_parity import corpus_texts, helper, run_helper  # noqa: F401 (fixture)


def _train_texts():
    return corpus_texts() * 2


def _bpe(byte_fallback=False, prefix=None, suffix=None, vocab=600, alphabet=None):
    kw = {}
    if prefix:
        kw["continuing_subword_prefix"] = prefix
    if suffix:
        kw["end_of_word_suffix"] = suffix
    model = models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True, **kw)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>", "<mask>"],
                                  initial_alphabet=alphabet or [], limit_alphabet=120, **kw)
    return model, trainer


def metaspace_first():
    model, trainer = _bpe(byte_fallback=True)
    t = Tokenizer(model)
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    t.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                   decoders.ByteFallback(), decoders.Fuse()])
    trainer_tokens = [f"<0x{b:02X}>" for b in range(256)]
    t.train_from_iterator(_train_texts(), trainer)
    t.add_tokens(trainer_tokens)
    # Metaspace "first" must not prepend after an added token in the middle of the text.
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return t


def metaspace_always_nosplit():
    model, trainer = _bpe()
    t = Tokenizer(model)
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(left=True, right=False)])
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=False)
    t.decoder = decoders.Metaspace(prepend_scheme="always")
    t.train_from_iterator(_train_texts(), trainer)
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return t


def unicode_normalizers():
    model, trainer = _bpe(prefix="##", suffix=None)
    t = Tokenizer(model)
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                         normalizers.Replace(Regex(r"\d+"), "0"), normalizers.NFC()])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.Punctuation()])
    t.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    t.train_from_iterator(_train_texts(), trainer)
    return t


def splits_and_suffix():
    model, trainer = _bpe(suffix="</w>")
    t = Tokenizer(model)
    t.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Prepend("^"), normalizers.Replace("\t", "    ")])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[,.;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split("-", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[\p{L}]+"), behavior="isolated", invert=True),
    ])
    t.decoder = decoders.BPEDecoder(suffix="</w>")
    t.train_from_iterator(_train_texts(), trainer)
    return t


def roberta_like():
    model, trainer = _bpe(vocab=800, alphabet=pre_tokenizers.ByteLevel.alphabet())
    t = Tokenizer(model)
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(_train_texts(), trainer)
    t.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    t.add_tokens([AddedToken("hello", single_word=True), AddedToken(" the end", rstrip=True, normalized=True),
                  AddedToken("XYZ", normalized=False)])
    t.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    return t


def bert_like():
    model = models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=12)
    trainer = trainers.WordPieceTrainer(vocab_size=700, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    t = Tokenizer(model)
    t.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")])
    t.decoder = decoders.WordPiece()
    t.train_from_iterator(_train_texts(), trainer)
    t.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                            processors.BertProcessing(("[SEP]", 2), ("[CLS]", 1))])
    return t


BUILDERS = [metaspace_first, metaspace_always_nosplit, unicode_normalizers, splits_and_suffix, roberta_like, bert_like]


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_synthetic_tokenizer(helper, tmp_path, build):  # noqa: F811
    tok = build()
    tok.save(os.path.join(tmp_path, "tokenizer.json"))
    ref = Tokenizer.from_file(os.path.join(tmp_path, "tokenizer.json"))
    texts = corpus_texts() + ["hello world hello-world <mask> the end  XYZ x<mask>y", "a - b, c. d\t e 123 4.5",
                              "  \t  lead", "ⅷ ﬁ ㍿ Å Ǆ"]
    reqs = [{"text": t, "add_special": a} for t in texts for a in (0, 1)]
    got = run_helper(helper, str(tmp_path), reqs)
    bad_ids, bad_dec = [], []
    for req, res in zip(reqs, got):
        want = ref.encode(req["text"], add_special_tokens=bool(req["add_special"])).ids
        if res.get("ids") != want:
            bad_ids.append((req, res.get("ids") or res.get("error"), want))
            continue
        want_dec = ref.decode(want, skip_special_tokens=False).split("\0")[0]
        if res["decoded"] != want_dec or ("\0" not in req["text"] and res["streamed"] != res["decoded"]):
            bad_dec.append((req["text"], res["decoded"], res["streamed"], want_dec))
    print(f"{build.__name__}: {len(reqs)} encodes, {len(bad_ids)} id mismatches, {len(bad_dec)} decode/stream mismatches")
    assert not bad_ids, f"{len(bad_ids)} id mismatches, first: {bad_ids[:2]}"
    assert not bad_dec, f"{len(bad_dec)} decode mismatches, first: {bad_dec[:2]}"


def _stub_torch_and_load(path):
    from test_tokenizer_parity import _gguf_oracle
    return _gguf_oracle(path)


def _write_gguf(path, arch, model, tokens, types, merges=None, scores=None, pre=None, add_bos=None, bos=1):
    import gguf
    w = gguf.GGUFWriter(path, arch)
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges:
        w.add_token_merges(merges)
    if scores:
        w.add_token_scores(scores)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(3 - bos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_byte_level(pre):
    def build(path):
        model, trainer = _bpe(vocab=700, alphabet=pre_tokenizers.ByteLevel.alphabet())
        t = Tokenizer(model)
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.train_from_iterator(_train_texts(), trainer)
        j = __import__("json").loads(t.to_str())
        vocab = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
        # transformers appends its class-default specials (GPT-2: <|endoftext|>) when a
        # file lacks them, past the model's vocabulary; real files carry them, so do we.
        tokens = [k for k, _ in vocab] + ["<|im_start|>", "<think>", "<|endoftext|>"]
        types = [3 if k in ("<unk>", "<s>", "</s>", "<mask>") else 1 for k, _ in vocab] + [3, 4, 3]
        merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        _write_gguf(path, "llama", "gpt2", tokens, types, merges=merges, pre=pre, add_bos=True)
    build.__name__ = f"gguf_gpt2_{pre}"
    return build


def _gguf_sentencepiece(arch):
    def build(path):
        model, trainer = _bpe(vocab=700, byte_fallback=True)
        t = Tokenizer(model)
        t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
        t.train_from_iterator(_train_texts(), trainer)
        vocab = sorted(__import__("json").loads(t.to_str())["model"]["vocab"].items(), key=lambda kv: kv[1])
        tokens = [k for k, _ in vocab]
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if arch == "gemma3" else tokens[:4]
        tokens = specials + byte_tokens + [k for k in tokens[4:] if k not in byte_tokens] + ["  ", "<start_of_turn>", "<mask>"]
        types = [3] * 4 + [6] * 256 + [1] * (len(tokens) - 263) + [1, 3, 3]
        scores = [0.0] * 260 + [-float(i) for i in range(len(tokens) - 260)]
        _write_gguf(path, arch, "llama", tokens, types, scores=scores, bos=2 if arch == "gemma3" else 1)
    build.__name__ = f"gguf_llama_{arch}"
    return build


GGUF_BUILDERS = [_gguf_byte_level(p) for p in ("llama-bpe", "qwen2", "gpt-4o", "tekken", "smollm")] + \
                [_gguf_sentencepiece(a) for a in ("gemma3", "llama", "phi3")]


@pytest.mark.parametrize("build", GGUF_BUILDERS, ids=lambda b: b.__name__)
def test_synthetic_gguf(helper, tmp_path, build):  # noqa: F811
    path = os.path.join(tmp_path, "vocab.gguf")
    build(path)
    ref = _stub_torch_and_load(path)
    texts = corpus_texts() + ["<|im_start|>user <think>x</think>", "<start_of_turn>  a  b"]
    reqs = [{"text": t, "add_special": a} for t in texts for a in (0, 1)]
    got = run_helper(helper, path, reqs)
    bad_ids, bad_dec = [], []
    for req, res in zip(reqs, got):
        want = ref.encode(req["text"], add_special_tokens=bool(req["add_special"])).ids
        if res.get("ids") != want:
            bad_ids.append((req, res.get("ids") or res.get("error"), want))
            continue
        want_dec = ref.decode(want, skip_special_tokens=False).split("\0")[0]
        if res["decoded"] != want_dec or ("\0" not in req["text"] and res["streamed"] != res["decoded"]):
            bad_dec.append((req["text"], res["decoded"], res["streamed"], want_dec))
    print(f"{build.__name__}: {len(reqs)} encodes, {len(bad_ids)} id mismatches, {len(bad_dec)} decode/stream mismatches")
    assert not bad_ids, f"{len(bad_ids)} id mismatches, first: {bad_ids[:2]}"
    assert not bad_dec, f"{len(bad_dec)} decode mismatches, first: {bad_dec[:2]}"
