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


def test_unsupported_rope_type_is_refused(tmp_path):
    """A RoPE scaling hearth does not implement (yarn) must be an error naming it, not a
    silent fallback to plain RoPE that would give wrong logits."""
    src = os.path.join(CACHE, "tiny", "llama-f32")
    assert os.path.isdir(src), f"{src} missing: run tools/get_models.sh"
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(os.path.join(src, name), os.path.join(tmp_path, name))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    json.dump(cfg, open(os.path.join(tmp_path, "config.json"), "w"))
    out = subprocess.run([BIN, "trace", str(tmp_path), "--ids", "[1, 2, 3]", "--last", "1"], capture_output=True, timeout=120)
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "yarn" in err and "not supported" in err, err


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
