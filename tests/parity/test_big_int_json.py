"""A model folder whose tokenizer_config.json holds an integer beyond int64, as transformers
writes it (model_max_length = int(1e30) for a tokenizer with no limit): Python's json reads
it, so does transformers, and so must hearth — the folder loads, tokenizes and renders its
chat template (kept in that file) exactly as transformers does. Before the fix hearth
refused the folder ("invalid JSON ... too big integer")."""
import json
import os
import subprocess

import pytest

BIG = 1000000000000000019884624838656  # int(1e30), what transformers writes


@pytest.fixture
def big_int_model(tiny_models, tmp_path):
    src = tiny_models["llama-f32"]
    dst = tmp_path / "llama-bigint"
    dst.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                 "tokenizer.json"):
        if (src / name).exists():
            os.symlink(src / name, dst / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = BIG
    cfg["chat_template"] = (src / "chat_template.jinja").read_text()
    text = json.dumps(cfg, indent=2)
    assert str(BIG) in text and json.loads(text)["model_max_length"] == BIG  # Python reads the big integer
    (dst / "tokenizer_config.json").write_text(text)
    return dst


def test_folder_with_big_integer_loads_like_transformers(big_int_model, hearth_bin):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(big_int_model))
    assert hf.model_max_length == BIG
    for text in ["Hello world", "The capital of France is Paris.\n\n  spaces  "]:
        p = subprocess.run([hearth_bin, "tokenize", str(big_int_model), text], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == hf(text)["input_ids"]


def test_chat_template_from_big_integer_config(big_int_model, hearth_bin, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(big_int_model))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    f = tmp_path / "m.json"
    f.write_text(json.dumps(msgs))
    p = subprocess.run([hearth_bin, "template", str(big_int_model), "--messages", str(f)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == want.rstrip("\n")


def test_other_json_errors_still_name_the_file(big_int_model, hearth_bin):
    (big_int_model / "config.json").unlink()
    (big_int_model / "config.json").write_text('{"hidden_size": 12345678901234567890123, }')
    p = subprocess.run([hearth_bin, "tokenize", str(big_int_model), "hi"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "config.json" in p.stderr and "invalid JSON" in p.stderr
