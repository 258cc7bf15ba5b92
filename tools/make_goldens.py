#!/usr/bin/env python3
"""make_goldens.py: records forward-pass goldens with mlx-lm (the reference) for every tiny model
in $HEARTH_CACHE/tiny and for the two real GGUF models (dequantized with the `gguf` package and
loaded into the matching mlx-lm model), into tests/parity/goldens/<model>.json.
Per prompt: ids, top-20 logits at the last 4 prompt positions, 64 (tiny models) or 32 (real
GGUFs) greedy steps with top-5 logits.
Never reads hearth's output: every number here comes from mlx-lm, HF tokenizers or sentencepiece.
"""
import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

REPO = Path(__file__).resolve().parent.parent
GOLDENS = REPO / "tests" / "parity" / "goldens"
TEMPLATES = REPO / "tests" / "parity" / "templates"
REFERENCE = "mlx-lm 0.32.2, mlx 0.32.4"
TOP_PROMPT = 20   # top logits kept per prompt position
LAST_POSITIONS = 4
GREEDY_STEPS = 32      # real GGUF models (the issue asks 32 there)
TINY_GREEDY_STEPS = 64 # tiny models: 64-token continuations
TOP_STEP = 5
DIGITS = 5        # decimals kept; f32 logits of these models are exact to ~1e-5 at best

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
# Three prompts: plain English (tokenizer adds BOS where the model does), a chat turn rendered
# by the model's own template, and a longer mixed one (code, CJK, emoji, accents) whose length
# passes the tiny gemma3's 16-token sliding window during prefill.
RAW_PROMPTS = {
    "plain": "The quick brown fox jumps over the lazy dog.",
    "mixed": ("def add(a, b):\n    return a + b\n\n# 机器学习 is machine learning; 東京 is Tokyo. "
              "Emoji 😀👍🏽 and accents: café, naïve, Zürich. Numbers: 3.14159, 2025, 1,000,000.\n"
              "print(add(40, 2))  # prints 42\n"),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def rounded(values):
    return [round(float(v), DIGITS) for v in values]


def top_k(row, k):
    """Top-k (ids, values) of one logits row, ties broken by lower id like a stable sort."""
    row = np.asarray(row, dtype=np.float32)
    order = np.lexsort((np.arange(row.size), -row))[:k]
    return [int(i) for i in order], rounded(row[order])


def run_model(model, ids, record=True, steps=GREEDY_STEPS):
    """Prefill `ids` in one call through mlx-lm's prompt cache, then GREEDY_STEPS greedy steps
    (EOS is not a stop: the goldens always hold all steps)."""
    from mlx_lm.models.cache import make_prompt_cache
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[0].astype(mx.float32)
    mx.eval(logits)
    out = {}
    if record:
        full = np.array(logits)
        out["last_logits"] = []
        for pos in range(max(0, len(ids) - LAST_POSITIONS), len(ids)):
            tids, tvals = top_k(full[pos], TOP_PROMPT)
            out["last_logits"].append({"position": pos, "top_ids": tids, "top_logits": tvals})
    row = np.array(logits[-1])
    n_steps = steps
    greedy, steps = [], []
    for _ in range(n_steps):
        tids, tvals = top_k(row, TOP_STEP)
        nxt = tids[0]
        greedy.append(nxt)
        steps.append({"top_ids": tids, "top_logits": tvals})
        logits = model(mx.array([[nxt]]), cache=cache)[0].astype(mx.float32)
        row = np.array(logits[-1])
    out["greedy_ids"] = greedy
    if record:
        out["greedy_steps"] = steps
    return out


def to_float32(model):
    """Upcast every floating parameter (norms, embeddings, quantization scales/biases) so mlx
    computes in f32: the same numbers as the checkpoint, accumulated like hearth's reference tier."""
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.bfloat16, mx.float16) else p,
                          model.parameters()))
    mx.eval(model.parameters())
    return model


def render_template(template_text, messages, bos, eos):
    """Chat template rendered like transformers does (trim_blocks, lstrip_blocks, tojson)."""
    import jinja2

    def raise_exception(msg):
        raise jinja2.TemplateError(msg)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template_text).render(messages=messages, add_generation_prompt=True,
                                                 bos_token=bos or "", eos_token=eos or "")


# ---------------------------------------------------------------- tiny models (mlx-lm format)

def tiny_prompts(model_dir):
    from tokenizers import Tokenizer
    from mlx_lm.tokenizer_utils import load as load_wrapper
    hf = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    chat_text = load_wrapper(model_dir).apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    prompts = [{"name": "plain", "text": RAW_PROMPTS["plain"], "add_special_tokens": True},
               {"name": "chat", "messages": CHAT, "text": chat_text, "add_special_tokens": False},
               {"name": "mixed", "text": RAW_PROMPTS["mixed"], "add_special_tokens": True}]
    # Hybrid models (recurrent state per sequence) also get a prompt longer than one engine
    # step (256 tokens) and many KV blocks, so the state carries across prefill chunks.
    if json.loads((model_dir / "config.json").read_text()).get("model_type", "").startswith("qwen3_5"):
        prompts.append({"name": "long", "text": RAW_PROMPTS["mixed"] * 3, "add_special_tokens": True})
    for p in prompts:
        p["ids"] = hf.encode(p["text"], add_special_tokens=p["add_special_tokens"]).ids
    return prompts, lambda ids: hf.decode(ids, skip_special_tokens=False)


def golden_tiny(cache, name, command):
    from mlx_lm import load
    model_dir = cache / "tiny" / name
    prompts, decode = tiny_prompts(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    native_dtype = config.get("torch_dtype", "float32")
    model, _ = load(str(model_dir))
    to_float32(model)
    native = None
    if native_dtype != "float32":
        native, _ = load(str(model_dir))
    for p in prompts:
        p.update(run_model(model, p["ids"], steps=TINY_GREEDY_STEPS))
        p["greedy_text"] = decode(p["greedy_ids"])
        if native is not None:
            p["native_greedy_ids"] = run_model(native, p["ids"], record=False, steps=TINY_GREEDY_STEPS)["greedy_ids"]
    files = sorted(f.name for f in model_dir.iterdir() if f.is_file())
    return {
        "reference": REFERENCE, "command": command, "model": f"tiny/{name}",
        "model_files": {f: sha256(model_dir / f) for f in files},
        "compute_dtype": "float32",
        "notes": ("logits from mlx-lm with every floating parameter upcast to float32 after loading "
                  "(checkpoint values unchanged); native_greedy_ids: greedy ids of the model as "
                  f"mlx-lm loads it ({native_dtype} activations), informational. Greedy ignores EOS."),
        "prompts": prompts,
    }


# ---------------------------------------------------------------- real GGUF models

def gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute_rope(w, n_head):
    """Inverse of convert_hf_to_gguf's LlamaModel.permute, which interleaves the two rotary
    halves of each head's rows; mlx-lm's llama (rope_traditional=False) wants HF's layout."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LLAMA_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
               "ffn_norm": "post_attention_layernorm"}
GEMMA3_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}


def gguf_weights(reader, arch, config):
    """Every tensor dequantized to float32 by the gguf package, renamed to mlx-lm/HF names."""
    from gguf.quants import dequantize
    names = LLAMA_NAMES if arch == "llama" else GEMMA3_NAMES
    out = {}
    for t in reader.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims fastest-first
        if t.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            key = "model.norm.weight"
        elif t.name == "output.weight":
            key = "lm_head.weight"
        else:
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
            if not m or m.group(2) not in names:
                raise SystemExit(f"make_goldens: unexpected GGUF tensor {t.name}")
            key = f"model.layers.{m.group(1)}.{names[m.group(2)]}.weight"
            if arch == "llama" and m.group(2) == "attn_q":
                w = unpermute_rope(w, config["num_attention_heads"])
            elif arch == "llama" and m.group(2) == "attn_k":
                w = unpermute_rope(w, config["num_key_value_heads"])
        if arch == "gemma3" and key.endswith("norm.weight"):
            # convert_hf_to_gguf stores Gemma3's RMSNorm weights as 1 + w; mlx-lm adds the 1 itself.
            w = w - 1.0
        out[key] = mx.array(w)
    return out


def gguf_config(reader, arch):
    g = lambda k, d=None: gguf_field(reader, f"{arch}.{k}", d)  # noqa: E731
    heads = int(g("attention.head_count"))
    cfg = {"hidden_size": int(g("embedding_length")), "num_hidden_layers": int(g("block_count")),
           "intermediate_size": int(g("feed_forward_length")), "num_attention_heads": heads,
           "num_key_value_heads": int(g("attention.head_count_kv", heads)),
           "rms_norm_eps": float(np.float32(g("attention.layer_norm_rms_epsilon"))),
           "rope_theta": float(g("rope.freq_base")), "max_position_embeddings": int(g("context_length")),
           "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data)}
    if arch == "llama":
        cfg.update(model_type="llama", head_dim=int(g("rope.dimension_count")), tie_word_embeddings=True)
    else:
        head_dim = int(g("attention.key_length"))
        # Not in the GGUF; these are Gemma 3 270M's config.json values (HF defaults for gemma3_text).
        cfg.update(model_type="gemma3_text", head_dim=head_dim, query_pre_attn_scalar=head_dim,
                   rope_local_base_freq=10000.0, sliding_window=int(g("attention.sliding_window")),
                   sliding_window_pattern=6)
    return cfg


class GGUFTokenizer:
    """Prompt ids for a GGUF vocabulary from independent implementations: HF `tokenizers`
    (byte-level BPE built from tokens + merges) or `sentencepiece` (SPM model rebuilt from
    tokens + scores + types). Control tokens written in the text are matched like HF's
    added tokens."""

    def __init__(self, reader, pre):
        self.tokens = [str(t) for t in gguf_field(reader, "tokenizer.ggml.tokens")]
        self.types = list(gguf_field(reader, "tokenizer.ggml.token_type"))
        self.bos = int(gguf_field(reader, "tokenizer.ggml.bos_token_id"))
        self.eos = int(gguf_field(reader, "tokenizer.ggml.eos_token_id"))
        self.add_bos = bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False))
        self.kind = gguf_field(reader, "tokenizer.ggml.model")
        specials = [i for i, t in enumerate(self.types) if t in (3, 4) and self.tokens[i]]
        self.special_ids = {self.tokens[i]: i for i in specials}
        alternation = "|".join(re.escape(s) for s in sorted(self.special_ids, key=len, reverse=True))
        self.split_re = re.compile(f"({alternation})")
        if self.kind == "gpt2":
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers
            merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges")]
            vocab = {t: i for i, t in enumerate(self.tokens)}
            self.hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
            if pre != "smollm":
                raise SystemExit(f"make_goldens: no pre-tokenizer mapping for GGUF pre '{pre}'")
            # llama.cpp's "smollm" pre-tokenizer: single digits, then GPT-2's regex.
            self.hf.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
            self.hf.decoder = decoders.ByteLevel()
            self.encode_plain = lambda s: self.hf.encode(s, add_special_tokens=False).ids
            self.engine = "HF tokenizers (BPE from GGUF tokens+merges)"
        elif self.kind == "llama":
            import sentencepiece as spm
            from sentencepiece import sentencepiece_model_pb2 as pb
            scores = list(gguf_field(reader, "tokenizer.ggml.scores"))
            m = pb.ModelProto()
            m.trainer_spec.model_type = pb.TrainerSpec.BPE
            m.trainer_spec.vocab_size = len(self.tokens)
            m.trainer_spec.byte_fallback = True
            m.trainer_spec.unk_id = int(gguf_field(reader, "tokenizer.ggml.unknown_token_id"))
            m.trainer_spec.bos_id, m.trainer_spec.eos_id = self.bos, self.eos
            m.trainer_spec.pad_id = int(gguf_field(reader, "tokenizer.ggml.padding_token_id", -1))
            m.normalizer_spec.name = "identity"
            m.normalizer_spec.add_dummy_prefix = bool(gguf_field(reader, "tokenizer.ggml.add_space_prefix", True))
            m.normalizer_spec.remove_extra_whitespaces = False
            m.normalizer_spec.escape_whitespaces = True
            for tok, score, typ in zip(self.tokens, scores, self.types):
                piece = m.pieces.add()
                piece.piece, piece.score, piece.type = tok, float(score), int(typ)
            self.sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
            self.encode_plain = lambda s: self.sp.encode(s)
            self.engine = "sentencepiece (BPE model rebuilt from GGUF tokens+scores+types)"
        else:
            raise SystemExit(f"make_goldens: GGUF tokenizer model '{self.kind}' not handled")

    def encode(self, text, add_special_tokens):
        ids = [self.bos] if add_special_tokens and self.add_bos else []
        for part in self.split_re.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                ids.extend(self.encode_plain(part))
        return ids

    def decode(self, ids):
        if self.kind == "gpt2":
            return self.hf.decode(ids, skip_special_tokens=False)
        return "".join(self.tokens[i] if self.types[i] in (3, 4) else self.sp.decode([i]) for i in ids)


GGUF_MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": dict(golden="smollm2-135m-instruct-q4_1", template="smollm2"),
    "gemma-3-270m-q4_k_m.gguf": dict(golden="gemma-3-270m-q4_k_m", template="gemma3"),
}


def golden_gguf(cache, fname, command):
    import importlib
    from gguf import GGUFReader
    path = cache / "models" / fname
    reader = GGUFReader(str(path))
    arch = gguf_field(reader, "general.architecture")
    config = gguf_config(reader, arch)
    tok = GGUFTokenizer(reader, gguf_field(reader, "tokenizer.ggml.pre", "default"))
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = gguf_weights(reader, arch, config)
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    template = (TEMPLATES / f"{GGUF_MODELS[fname]['template']}.jinja").read_text()
    chat_text = render_template(template, CHAT, tok.tokens[tok.bos], tok.tokens[tok.eos])
    prompts = [{"name": "plain", "text": RAW_PROMPTS["plain"], "add_special_tokens": True},
               {"name": "chat", "messages": CHAT, "text": chat_text, "add_special_tokens": False},
               {"name": "mixed", "text": RAW_PROMPTS["mixed"], "add_special_tokens": True}]
    for p in prompts:
        p["ids"] = tok.encode(p["text"], p["add_special_tokens"])
        p.update(run_model(model, p["ids"]))
        p["greedy_text"] = tok.decode(p["greedy_ids"])
    return {
        "reference": REFERENCE, "command": command, "model": f"models/{fname}",
        "model_files": {fname: sha256(path)}, "compute_dtype": "float32",
        "model_config": config, "tokenizer": tok.engine,
        "notes": ("every GGUF tensor dequantized to float32 with gguf 0.19.0 (gguf.quants.dequantize), "
                  "renamed to HF names" + (", q/k rows un-permuted" if arch == "llama" else
                                           ", norm weights minus 1") +
                  f", loaded into mlx_lm.models.{config['model_type']}. Greedy ignores EOS."),
        "prompts": prompts,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated golden names (default: all)")
    ap.add_argument("--no-gguf", action="store_true", help="tiny models only")
    args = ap.parse_args()
    cache = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
    command = " ".join([".venv/bin/python", "tools/make_goldens.py"] + sys.argv[1:])
    tiny_dir = cache / "tiny"
    if not tiny_dir.is_dir():
        raise SystemExit(f"make_goldens: no {tiny_dir}; run tools/get_models.sh")
    jobs = [(d.name, lambda d=d: golden_tiny(cache, d.name, command))
            for d in sorted(tiny_dir.iterdir()) if d.is_dir()]
    if not args.no_gguf:
        for fname, info in GGUF_MODELS.items():
            if not (cache / "models" / fname).exists():
                raise SystemExit(f"make_goldens: no {cache / 'models' / fname}; run tools/get_models.sh")
            jobs.append((info["golden"], lambda f=fname: golden_gguf(cache, f, command)))
    GOLDENS.mkdir(parents=True, exist_ok=True)
    for name, job in jobs:
        if args.only and name not in args.only.split(","):
            continue
        golden = job()
        out = GOLDENS / f"{name}.json"
        out.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n")
        chat = next(p for p in golden["prompts"] if p["name"] == "chat")
        print(f"{out.relative_to(REPO)}: {out.stat().st_size // 1024} KiB; chat greedy: {chat['greedy_text']!r}")


if __name__ == "__main__":
    main()
