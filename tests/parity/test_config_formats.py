"""Model configs as transformers 5 writes them.

transformers 5 saves RoPE settings as "rope_parameters" (one object, or one per layer type
for Gemma 3) instead of rope_theta / rope_scaling / rope_local_base_freq. The oracle for
the format is transformers itself (AutoConfig.save_pretrained rewrites a tiny model's
config); the oracle for the numbers is the mlx-lm golden of the same weights: with the
RoPE settings read right, greedy tokens are unchanged (the tiny models use non-default
bases and llama3 scaling, so a reader that fell back to defaults would diverge).
"""
import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))


def v5_copy(src, dst):
    from transformers import AutoConfig

    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    AutoConfig.from_pretrained(src).save_pretrained(dst)
    cfg = json.load(open(os.path.join(dst, "config.json")))
    assert "rope_parameters" in cfg and "rope_theta" not in cfg and "rope_scaling" not in cfg, cfg
    # mlx-lm's quantization block is not part of the transformers config
    orig = json.load(open(os.path.join(src, "config.json")))
    for k in ("quantization", "quantization_config"):
        if k in orig:
            cfg[k] = orig[k]
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-f32", "gemma3-f32"])
def test_transformers5_rope_parameters(name, tmp_path):
    src = os.path.join(CACHE, "tiny", name)
    assert os.path.isdir(src), f"{src} missing: run tools/get_models.sh"
    v5_copy(src, str(tmp_path))
    golden = json.load(open(os.path.join(REPO, "tests", "parity", "goldens", name + ".json")))
    p = golden["prompts"][0]
    steps = len(p["greedy_ids"]) - 1
    out = subprocess.run([BIN, "trace", str(tmp_path), "--ids", json.dumps(p["ids"]), "--last", "1", "--top", "1",
                          "--steps", str(steps), "--step-top", "1"], capture_output=True, timeout=600,
                         env={**os.environ, "HEARTH_CPU": "scalar"})
    assert out.returncode == 0, out.stderr.decode()
    t = json.loads(out.stdout)
    ours = [s["token"] for s in t["steps"]]
    ours.append(t["steps"][-1]["top"][0][0])
    assert ours == p["greedy_ids"]


def trace_with_config(tmp_path, model, mutate):
    """`hearth trace` on a copy of a tiny model whose config.json went through mutate(cfg);
    returns the finished process."""
    src = os.path.join(CACHE, "tiny", model)
    assert os.path.isdir(src), f"{src} missing: run tools/make_tiny_models.py"
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), os.path.join(tmp_path, name))
    cfg = json.load(open(os.path.join(src, "config.json")))
    mutate(cfg)
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    return subprocess.run([BIN, "trace", str(tmp_path), "--ids", "[1, 2, 3]", "--last", "1"], capture_output=True,
                          timeout=120)


def test_unsupported_rope_type_is_refused(tmp_path):
    """A RoPE scaling hearth does not implement (yarn) must be an error naming it, not a
    silent fallback to plain RoPE that would give wrong logits."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    out = trace_with_config(tmp_path, "llama-f32", lambda c: c.update(rope_scaling=yarn))
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "yarn" in err and "not supported" in err, err


LONGROPE_BAD = [
    ("long_factor too short", lambda r: r.update(long_factor=[1.0, 2.0]), "long_factor, a number or 8 numbers"),
    ("long_factor not positive", lambda r: r["long_factor"].__setitem__(3, 0), "long_factor[3] is not a positive"),
    ("no original length", lambda r: r.pop("original_max_position_embeddings"), "original_max_position_embeddings"),
]


@pytest.mark.parametrize("case", LONGROPE_BAD, ids=[c[0] for c in LONGROPE_BAD])
def test_bad_longrope_is_refused(tmp_path, case):
    """longrope (llama_longrope-f32, a golden model) with a broken rope_scaling names the key."""
    _, mutate, expect = case
    out = trace_with_config(tmp_path, "llama_longrope-f32", lambda c: mutate(c["rope_scaling"]))
    assert out.returncode != 0
    assert expect in out.stderr.decode(), out.stderr.decode()


# ---- qwen3_5: a hybrid model's config that hearth cannot run must say what is wrong ----
QWEN3_5_BAD = [
    ("no linear_num_value_heads", lambda c: c.pop("linear_num_value_heads"), "linear_num_value_heads"),
    ("key heads not dividing value heads", lambda c: c.update(linear_num_key_heads=3), "key heads"),
    ("layer_types against the interval", lambda c: c["layer_types"].reverse(), "layer_types[0]"),
    ("layer_types too short", lambda c: c["layer_types"].pop(), "layer_types must list 6"),
    ("yarn rope", lambda c: c["rope_parameters"].update(rope_type="yarn"), "yarn"),
    ("odd partial rope", lambda c: c["rope_parameters"].update(partial_rotary_factor=0.1), "partial_rotary_factor"),
    ("a full layer's weights for a linear one", lambda c: c.update(full_attention_interval=2,
                                                                     layer_types=None), "missing tensor"),
]


QWEN3_5_BAD += [  # on the MoE model
    ("moe: no shared expert width", lambda c: c.pop("shared_expert_intermediate_size"),
     "shared_expert_intermediate_size"),
    ("moe: more experts per token than experts", lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok"),
    ("moe: expert count against the weights", lambda c: c.update(num_experts=6), "mlp.gate.weight' has shape [8,64]"),
]


@pytest.mark.parametrize("case", QWEN3_5_BAD, ids=[c[0] for c in QWEN3_5_BAD])
def test_qwen3_5_bad_config_is_a_clear_error(case, tmp_path):
    src = os.path.join(CACHE, "tiny", "qwen3_5_moe-f32" if case[0].startswith("moe:") else "qwen3_5-f32")
    assert os.path.isdir(src), f"{src} missing: run tools/get_models.sh"
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), os.path.join(tmp_path, name))
    cfg = json.load(open(os.path.join(src, "config.json")))
    case[1](cfg)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    out = subprocess.run([BIN, "trace", str(tmp_path), "--ids", "[1, 2, 3]", "--last", "1"], capture_output=True,
                         timeout=120)
    assert out.returncode not in (0, -6, -11), out  # an error, not a crash
    err = out.stderr.decode()
    assert case[2] in err and str(tmp_path) in err, err


def hf_layout_copy(src, dst):
    """The tiny qwen3_5 as a Hugging Face checkpoint of Qwen3.5 stores it: text config nested
    under text_config (model_type qwen3_5_text), weights under model.language_model.* and
    lm_head, conv1d as [channels, 1, width], and the layer, final and q/k norm weights as
    offsets from 1 (mlx-lm's sanitize adds the 1 back; the gated norm is stored as is)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors", "model.safetensors.index.json"):
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    cfg = json.load(open(os.path.join(src, "config.json")))
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "quantization", "quantization_config")}
    text["model_type"] = "qwen3_5_text"
    json.dump({"model_type": "qwen3_5", "architectures": cfg["architectures"], "text_config": text,
               "tie_word_embeddings": cfg["tie_word_embeddings"]}, open(os.path.join(dst, "config.json"), "w"))
    out = {}
    for k, v in load_file(os.path.join(src, "model.safetensors")).items():
        if "conv1d.weight" in k:
            v = np.ascontiguousarray(np.moveaxis(v, 2, 1))
        if k.endswith(("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight",
                       "q_norm.weight", "k_norm.weight")):
            v = (v - 1.0).astype(v.dtype)
        k = k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")
        out[k] = v
    # the multi-token-prediction head real checkpoints carry (unused: mlx-lm drops mtp.*)
    rng = np.random.default_rng(0)
    out["mtp.fc.weight"] = rng.standard_normal((cfg["hidden_size"], 2 * cfg["hidden_size"])).astype(np.float32)
    out["mtp.layers.0.input_layernorm.weight"] = np.zeros(cfg["hidden_size"], np.float32)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def test_qwen3_5_hf_checkpoint_layout(tmp_path):
    """hearth reads the HF layout of the same weights (offsets from 1, nested names, the other
    conv1d axis order) and gives the golden's greedy tokens; mlx-lm, loading the same folder,
    gives them too (so the copy is the same model)."""
    src = os.path.join(CACHE, "tiny", "qwen3_5-f32")
    assert os.path.isdir(src), f"{src} missing: run tools/get_models.sh"
    hf_layout_copy(src, str(tmp_path))
    golden = json.load(open(os.path.join(REPO, "tests", "parity", "goldens", "qwen3_5-f32.json")))
    p = golden["prompts"][0]
    steps = 16
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache
    model, _ = load(str(tmp_path))
    cache, ids, mlx_ids = make_prompt_cache(model), p["ids"], []
    for _ in range(steps):
        nxt = int(mx.argmax(model(mx.array([ids]), cache=cache)[0, -1]).item())
        mlx_ids.append(nxt)
        ids = [nxt]
    assert mlx_ids == p["greedy_ids"][:steps]
    out = subprocess.run([BIN, "trace", str(tmp_path), "--ids", json.dumps(p["ids"]), "--last", "1", "--top", "1",
                          "--steps", str(steps - 1), "--step-top", "1"], capture_output=True, timeout=600,
                         env={**os.environ, "HEARTH_CPU": "scalar"})
    assert out.returncode == 0, out.stderr.decode()
    t = json.loads(out.stdout)
    ours = [s["token"] for s in t["steps"]] + [t["steps"][-1]["top"][0][0]]
    assert ours == p["greedy_ids"][:steps]
