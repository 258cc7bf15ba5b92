"""Gemma 4 (gemma4_text) configs hearth must refuse with a message naming the problem, and a
Gemma 4 checkpoint with its multimodal wrapper (model_type gemma4: text_config, the text
model's weights under model.language_model., towers beside them) whose text part loads and
gives the golden's greedy tokens. The oracle for the wrapper is the tiny gemma4-f32 model's
mlx-lm golden: the same weights under other names must give the same tokens.
"""
import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
SRC = os.path.join(CACHE, "tiny", "gemma4-f32")


def trace(model, ids="[2, 10, 11]", steps=1):
    return subprocess.run([BIN, "trace", str(model), "--ids", ids, "--last", "1", "--top", "1", "--steps", str(steps),
                           "--step-top", "1"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HEARTH_CPU": "scalar"})


def with_config(tmp_path, edit):
    assert os.path.isdir(SRC), f"{SRC} missing: run tools/make_tiny_models.py"
    for name in os.listdir(SRC):
        if name != "config.json":
            os.symlink(os.path.join(SRC, name), os.path.join(tmp_path, name))
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    edit(cfg)
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    return tmp_path


def set_keys(**kv):
    return lambda cfg: cfg.update(kv)


FULL_LAST = ["sliding_attention"] * 4 + ["full_attention"] * 2
CASES = {
    "layer_types_length": (set_keys(layer_types=["sliding_attention"] * 5), ["layer_types lists 5 layers", "6"]),
    "layer_type_unknown": (set_keys(layer_types=["sliding_attention"] * 5 + ["chunked_attention"]),
                           ["layer_types[5]", "chunked_attention"]),
    "shared_without_source": (set_keys(layer_types=FULL_LAST), ["layer 4", "shares KV", "full"]),
    "shared_count": (set_keys(num_kv_shared_layers=6), ["num_kv_shared_layers 6"]),
    # the weights hold 2 shared layers: with none, layer 4 must have its own k_proj
    "no_shared_layers": (set_keys(num_kv_shared_layers=0), ["missing tensor", "layers.4.self_attn.k_proj.weight"]),
    "global_head_dim": (set_keys(global_head_dim=64), ["layers.3.self_attn.q_proj.weight", "shape"]),
    "per_layer_width": (set_keys(hidden_size_per_layer_input=16), ["embed_tokens_per_layer.weight", "shape"]),
    "rope_type": (lambda cfg: cfg["rope_parameters"]["full_attention"].update(rope_type="yarn"),
                  ["full_attention", "yarn", "not supported"]),
    "global_kv_heads": (set_keys(num_global_key_value_heads=3), ["num_global_key_value_heads 3"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_refused_naming_the_problem(case, tmp_path):
    edit, needles = CASES[case]
    out = trace(with_config(tmp_path, edit))
    assert out.returncode != 0, out.stdout
    for n in needles:
        assert n in out.stderr, (n, out.stderr)


def test_multimodal_wrapper_loads_the_text_model(tmp_path):
    """model_type gemma4 with the text config in text_config and the weights as a Gemma 4
    checkpoint names them (model.language_model.*), plus a vision tower tensor that is not
    loaded: greedy tokens equal the tiny model's golden."""
    from safetensors.numpy import load_file, save_file
    import numpy as np
    assert os.path.isdir(SRC), f"{SRC} missing: run tools/make_tiny_models.py"
    for name in os.listdir(SRC):
        if name not in ("config.json", "model.safetensors", "model.safetensors.index.json"):
            os.symlink(os.path.join(SRC, name), os.path.join(tmp_path, name))
    weights = load_file(os.path.join(SRC, "model.safetensors"))
    renamed = {"model.language_model." + k[len("model."):]: v for k, v in weights.items()}
    renamed["model.vision_tower.patch_embedder.weight"] = np.zeros((4, 4), np.float32)
    save_file(renamed, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "mlx"})
    text = json.load(open(os.path.join(SRC, "config.json")))
    cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
           "vocab_size": text["vocab_size"], "vision_config": {"model_type": "gemma4_vision"}}
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    golden = json.load(open(os.path.join(REPO, "tests", "parity", "goldens", "gemma4-f32.json")))
    p = golden["prompts"][0]
    out = trace(tmp_path, json.dumps(p["ids"]), len(p["greedy_ids"]) - 1)
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)
    ours = [s["token"] for s in t["steps"]] + [t["steps"][-1]["top"][0][0]]
    assert ours == p["greedy_ids"]
    # and says what it left out
    info = subprocess.run([BIN, "info", str(tmp_path), "--json"], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["not_loaded"] == ["vision_tower"]
    text = subprocess.run([BIN, "info", str(tmp_path)], capture_output=True, text=True, timeout=60).stdout
    assert "not loaded    vision_tower (the text model runs without them)" in text, text


def test_hugging_face_expert_layout(tmp_path):
    """The MoE experts as a Hugging Face Gemma 4 checkpoint stores them (before mlx-lm's
    sanitize): experts.gate_up_proj [experts, 2 * moe_ffn, hidden] (each expert's gate rows,
    then its up rows) and experts.down_proj, bare parameters. mlx-lm loads the folder (its
    sanitize splits them back) and gives the tiny gemma4_moe model's golden tokens; so must
    hearth."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    src = os.path.join(CACHE, "tiny", "gemma4_moe-f32")
    assert os.path.isdir(src), f"{src} missing: run tools/make_tiny_models.py"
    for name in os.listdir(src):
        if name not in ("model.safetensors", "model.safetensors.index.json"):
            os.symlink(os.path.join(src, name), os.path.join(tmp_path, name))
    weights = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, v in weights.items():
        if k.endswith(".experts.switch_glu.gate_proj.weight"):
            base = k[: -len(".switch_glu.gate_proj.weight")]
            up = weights[base + ".switch_glu.up_proj.weight"]
            out[base + ".gate_up_proj"] = np.concatenate([v, up], axis=-2)
        elif k.endswith(".experts.switch_glu.down_proj.weight"):
            out[k[: -len(".switch_glu.down_proj.weight")] + ".down_proj"] = v
        elif ".switch_glu.up_proj." not in k:
            out[k] = v
    save_file(out, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    golden = json.load(open(os.path.join(REPO, "tests", "parity", "goldens", "gemma4_moe-f32.json")))
    p = golden["prompts"][0]
    # the oracle reads the new layout too
    from mlx_lm import load
    import mlx.core as mx
    model, _ = load(str(tmp_path))
    logits = model(mx.array([p["ids"]]))[0, -1]
    assert int(mx.argmax(logits).item()) == p["greedy_ids"][0]
    t = trace(tmp_path, json.dumps(p["ids"]), len(p["greedy_ids"]) - 1)
    assert t.returncode == 0, t.stderr
    t = json.loads(t.stdout)
    assert [s["token"] for s in t["steps"]] + [t["steps"][-1]["top"][0][0]] == p["greedy_ids"]
