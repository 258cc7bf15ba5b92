"""LoRA / DoRA adapters: hearth's logits with an adapter against mlx-lm with the same
adapter loaded (mlx_lm.load(adapter_path=...)), on float and quantized bases of every
family; the PEFT format against the same adapter in MLX form (and against transformers +
PEFT, PyTorch on the CPU); a GGUF base (q/k rows permuted for adjacent-pair RoPE);
and the all-or-nothing validation errors.

The adapters are made at test time by mlx-lm's own tuner (linear_to_lora_layers) with random
non-zero A and B (lora_helpers.py), never copied into the repository.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from lora_helpers import make_mlx_adapter, mlx_logits, make_peft_adapter, peft_logits

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
TINY = os.path.join(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")), "tiny")
IDS = [5, 17, 300, 42, 9, 77, 123, 11, 250, 3]
STEPS = 6
# The reference tier's tolerance (test_forward_parity.REF_TOL: f32 sums in another order
# than mlx); the adapter adds rank-4 products of the same size. Measured worst 4.2e-5.
REF_TOL = 2e-3


def model_dir(name):
    path = os.path.join(TINY, name)
    if not os.path.isdir(path):
        pytest.fail(f"tiny model missing: {path}; run tools/make_tiny_models.py", pytrace=False)
    return path


def trace(model, adapter=None, ids=IDS, steps=STEPS):
    cmd = [BIN, "trace", model, "--ids", json.dumps(ids), "--last", "4", "--top", "20", "--steps", str(steps),
           "--step-top", "5", "--threads", "2"]
    if adapter:
        cmd += ["--adapter-path", str(adapter)]
    p = subprocess.run(cmd, capture_output=True, env=dict(os.environ, HEARTH_CPU="scalar"), timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def worst_diff(ref, ours):
    """Largest |ours - ref| over hearth's top-20 logits of the last prompt positions."""
    return max(abs(float(ref[row["pos"]][i]) - v) for row in ours["prompt"] for i, v in row["top"])


# (model, fine_tune_type, num_layers, keys): every family, float and quantized bases, DoRA on
# a float and a quantized base, an adapter on some layers and some projections only
CASES = [
    ("llama-f32", "lora", -1, None),
    ("llama-q4g32", "dora", 2, None),
    ("qwen3-q4g64", "lora", 2, None),
    ("qwen3-bf16", "lora", -1, ("self_attn.q_proj", "self_attn.v_proj")),
    ("gemma3-bf16", "lora", -1, None),
    ("gemma3-f32", "dora", -1, ("self_attn.o_proj", "mlp.down_proj")),
    ("minicpm-f32", "lora", -1, None),
    ("qwen3_moe-f32", "lora", -1, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                   "self_attn.o_proj")),
    # the hybrid and the shared-KV family: attention layers are not numbered as the KV
    # pool numbers them, and adapters follow the model's layer numbers
    ("qwen3_5-f32", "lora", -1, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                 "self_attn.o_proj", "mlp.down_proj")),
    ("qwen3_5_moe-f32", "lora", -1, None),  # the seven projections
    # mlx-lm's own default (no keys: every linear layer of the block), which on Qwen3.5 adapts
    # the Gated DeltaNet projections too (linear_attn.in_proj_qkv/z/b/a, out_proj)
    ("qwen3_5-f32", "lora", -1, "all"),
    ("qwen3_5-q4g64", "dora", 3, "all"),
    ("gemma4-f32", "lora", -1, ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj")),
    ("gemma4-bf16", "dora", -1, None),
    # mlx-lm's default keys on the mixture-of-experts families and Gemma 4: the routers (mlp.gate,
    # router.proj), the routed experts (LoRASwitchLinear's stacked pairs), the shared expert and
    # its gate, and Gemma 4's per-layer input projections, on float and quantized bases
    ("qwen3_moe-f32", "lora", -1, "all"),
    ("qwen3_moe-q4g64", "lora", 2, "all"),
    ("qwen3_5_moe-q4g64", "lora", -1, "all"),
    ("gemma4_moe-f32", "lora", -1, "all"),
    ("gemma4-q4g64", "lora", 3, "all"),
    # DoRA on the dense ones (mlx-lm has none for the experts)
    ("qwen3_5_moe-f32", "dora", -1, ("mlp.gate", "mlp.shared_expert.up_proj", "mlp.shared_expert_gate")),
    ("gemma4-f32", "dora", -1, ("per_layer_input_gate", "per_layer_projection")),
]


@pytest.mark.parametrize("name,kind,num_layers,keys", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_mlx_adapter_matches_mlx_lm(tmp_path, name, kind, num_layers, keys):
    model = model_dir(name)
    kw = {"keys": None if keys == "all" else keys} if keys else {}
    ad = make_mlx_adapter(model, tmp_path / "ad", dora=kind == "dora", num_layers=num_layers, **kw)
    ref, greedy = mlx_logits(model, IDS, ad, steps=STEPS)
    base, _ = mlx_logits(model, IDS)
    # the adapter must matter, or the comparison proves nothing
    assert np.abs(ref - base).max() > 0.5
    ours = trace(model, ad)
    worst = worst_diff(ref, ours)
    print(f"{name} {kind}: worst |logit - mlx-lm| {worst:.2e}")
    assert worst < REF_TOL
    assert [s["token"] for s in ours["steps"]] == greedy


def mlx_to_peft(mlx_dir, out_dir):
    """The same adapter in PEFT's layout: lora_A.weight = lora_a^T, lora_B.weight = lora_b^T,
    lora_alpha = scale * r (PEFT scales by alpha / r), DoRA magnitudes as
    lora_magnitude_vector."""
    import mlx.core as mx
    cfg = json.loads((mlx_dir / "adapter_config.json").read_text())
    lp = cfg["lora_parameters"]
    w = mx.load(str(mlx_dir / "adapters.safetensors"))
    out, targets = {}, set()
    for k, v in w.items():
        stem, leaf = k.rsplit(".", 1)
        targets.add(stem.rsplit(".", 1)[1])
        name = {"lora_a": "lora_A.weight", "lora_b": "lora_B.weight", "m": "lora_magnitude_vector"}[leaf]
        out[f"base_model.model.{stem}.{name}"] = v.T if leaf != "m" else v
    out_dir.mkdir()
    mx.save_safetensors(str(out_dir / "adapter_model.safetensors"), out)
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": lp["rank"], "lora_alpha": lp["scale"] * lp["rank"],
        "target_modules": sorted(targets), "use_dora": cfg["fine_tune_type"] == "dora", "lora_dropout": 0.0}))
    return out_dir


@pytest.mark.parametrize("name,kind", [("llama-f32", "lora"), ("qwen3-q8g64", "dora")])
def test_peft_format_matches_mlx_lm(tmp_path, name, kind):
    model = model_dir(name)
    ad = make_mlx_adapter(model, tmp_path / "mlx", dora=kind == "dora",
                          keys=("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"))
    peft = mlx_to_peft(ad, tmp_path / "peft")
    ref, greedy = mlx_logits(model, IDS, ad, steps=STEPS)
    ours = trace(model, peft)
    assert worst_diff(ref, ours) < REF_TOL
    assert [s["token"] for s in ours["steps"]] == greedy


def test_peft_adapter_matches_transformers_peft(tmp_path):
    """An adapter PEFT saved itself (LoRA and DoRA), served by hearth, against transformers +
    PEFT's float32 logits with it loaded."""
    model = model_dir("llama-f32")
    base = peft_logits(model, None, IDS)
    for dora in (False, True):
        ad = make_peft_adapter(model, tmp_path / f"peft{int(dora)}", dora=dora)
        ref = peft_logits(model, ad, IDS)
        assert np.abs(ref - base).max() > 0.5  # the adapter matters
        worst = worst_diff(ref, trace(model, ad, steps=0))
        print(f"dora={dora}: worst |logit - PEFT| {worst:.2e}")
        assert worst < REF_TOL


def test_gguf_base_matches_safetensors_base(tmp_path):
    """A GGUF llama's q/k rows are permuted for adjacent-pair RoPE: the adapter's B rows must
    follow. The f32 GGUF holds the same weights, so logits agree with the safetensors base
    (and so with mlx-lm) to f32 rounding."""
    model = model_dir("llama-f32")
    gguf = tmp_path / "llama.gguf"
    p = subprocess.run([BIN, "convert", model, "--out", str(gguf), "--outtype", "f32"], capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    ad = make_mlx_adapter(model, tmp_path / "ad", dora=True)
    ref, greedy = mlx_logits(model, IDS, ad, steps=STEPS)
    ours = trace(str(gguf), ad)
    assert worst_diff(ref, ours) < REF_TOL
    assert [s["token"] for s in ours["steps"]] == greedy


def run_err(model, adapter):
    p = subprocess.run([BIN, "trace", model, "--ids", "[1,2,3]", "--last", "1", "--steps", "0", "--adapter-path",
                        str(adapter)], capture_output=True, timeout=300)
    assert p.returncode != 0
    return p.stderr.decode()


def edit_config(ad, **changes):
    cfg = json.loads((ad / "adapter_config.json").read_text())
    for k, v in changes.items():
        if k == "rank":
            cfg["lora_parameters"]["rank"] = v
        else:
            cfg[k] = v
    (ad / "adapter_config.json").write_text(json.dumps(cfg))


def test_validation_errors_name_the_mismatch(tmp_path):
    llama = model_dir("llama-f32")
    ad = make_mlx_adapter(llama, tmp_path / "ad", num_layers=2)
    # rank in the config differs from the tensors'
    edit_config(ad, rank=8)
    err = run_err(llama, ad)
    assert "rank 4 in the tensors, 8 in adapter_config.json" in err, err
    # an adapter made for another model: base shapes differ
    qwen_ad = make_mlx_adapter(model_dir("qwen3-f32"), tmp_path / "qwen")
    err = run_err(llama, qwen_ad)
    assert "base weight is" in err or "layers" in err, err
    # num_layers says the last 1 layer, the tensors cover 2
    ad2 = make_mlx_adapter(llama, tmp_path / "ad2", num_layers=2)
    edit_config(ad2, num_layers=1)
    assert "num_layers 1 covers only the last layers" in run_err(llama, ad2)
    # a full fine-tune is not an adapter
    edit_config(ad2, fine_tune_type="full", num_layers=2)
    assert "fine_tune_type full is not an adapter" in run_err(llama, ad2)
    # PEFT: a tensor for a module target_modules does not list
    peft = mlx_to_peft(make_mlx_adapter(llama, tmp_path / "m3"), tmp_path / "peft")
    cfg = json.loads((peft / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj"]
    (peft / "adapter_config.json").write_text(json.dumps(cfg))
    assert "which target_modules does not list" in run_err(llama, peft)
    # no adapter files at all, and no folder
    (tmp_path / "empty").mkdir()
    assert "no adapters.safetensors (MLX) or adapter_model.safetensors (PEFT)" in run_err(llama, tmp_path / "empty")
    assert "not a folder" in run_err(llama, tmp_path / "nowhere")
    # a broken config
    (ad / "adapter_config.json").write_text("{")
    assert "adapter_config.json" in run_err(llama, ad)


def test_moe_and_per_layer_refusals(tmp_path):
    """The new modules are refused by name where they cannot apply: DoRA on the routed experts
    (a hand-made magnitude; mlx-lm refuses it too), expert pairs in PEFT's layout, a router
    pair on a model without experts, a per-layer input pair on a Gemma 4 without per-layer
    inputs, and an expert pair whose expert count is not the model's."""
    import mlx.core as mx
    moe = model_dir("qwen3_moe-f32")
    ad = make_mlx_adapter(moe, tmp_path / "ad", keys=("mlp.switch_mlp.up_proj",))
    w = mx.load(str(ad / "adapters.safetensors"))
    # DoRA: magnitudes beside the expert pairs, config says dora
    dora = dict(w)
    for k in list(w):
        if k.endswith(".lora_b"):
            dora[k[:-len("lora_b")] + "m"] = mx.ones((w[k].shape[1],))
    mx.save_safetensors(str(ad / "adapters.safetensors"), dora)
    edit_config(ad, fine_tune_type="dora")
    assert "DoRA on the routed experts is not supported" in run_err(moe, ad)
    # eight experts in the model, four in the pairs
    mx.save_safetensors(str(ad / "adapters.safetensors"), {k: v[:4] for k, v in w.items()})
    edit_config(ad, fine_tune_type="lora")
    assert "with the model's 8 experts" in run_err(moe, ad)
    # PEFT's layout for the experts
    peft = tmp_path / "peft"
    peft.mkdir()
    mx.save_safetensors(str(peft / "adapter_model.safetensors"),
                        {k.replace(".lora_a", ".lora_A.weight").replace(".lora_b", ".lora_B.weight"): v
                         for k, v in w.items()})
    (peft / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                          "target_modules": ["up_proj"]}))
    assert "PEFT adapters on the routed experts are not supported" in run_err(moe, peft)
    # a router pair on a dense model, per-layer input pairs on a Gemma 4 without them
    r = make_mlx_adapter(moe, tmp_path / "router", keys=("mlp.gate",))
    assert "adapts mlp.gate, which layer 0 of this model does not have" in run_err(model_dir("qwen3-f32"), r)
    ple = make_mlx_adapter(model_dir("gemma4-f32"), tmp_path / "ple", keys=("per_layer_input_gate",))
    assert "adapts per_layer_input_gate, which layer" in run_err(model_dir("gemma4_moe-f32"), ple)


def safetensors_bytes(folder):
    """Every tensor of a folder's *.safetensors as (dtype, shape, raw bytes)."""
    import glob
    import mlx.core as mx
    out = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        for k, v in mx.load(f).items():
            out[k] = (str(v.dtype), tuple(v.shape), np.array(v.view(mx.uint8)).tobytes())
    return out


@pytest.mark.parametrize("name", ["llama-q4g64", "qwen3-q3g32", "gemma3-q8g32", "minicpm-q4g64", "llama-f32",
                                  "qwen3-bf16", "qwen3_5-q4g64", "qwen3_moe-q4g64", "qwen3_5_moe-f32", "gemma4_moe-q4g64",
                                  "gemma4-f32"])
def test_fuse_is_byte_identical_to_mlx_lm_fuse(tmp_path, name):
    """hearth fuse against mlx_lm.fuse with the same adapter: every tensor byte for byte
    (quantized bases dequantized, summed and re-quantized with their own bits and groups).
    Qwen3.5, the MoE families and Gemma 4 with mlx-lm's default keys: Gated DeltaNet
    projections, routers, routed experts (per-expert pairs into the stacked weights), shared
    experts and per-layer input projections fuse too."""
    model = model_dir(name)
    kw = {"keys": None} if name.startswith(("qwen3_5", "qwen3_moe", "gemma4")) else {}
    ad = make_mlx_adapter(model, tmp_path / "ad", num_layers=2, **kw)
    py = os.path.join(REPO, ".venv", "bin", "python")
    p = subprocess.run([py, "-m", "mlx_lm", "fuse", "--model", model, "--adapter-path", str(ad), "--save-path",
                        str(tmp_path / "ref")], capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    p = subprocess.run([BIN, "fuse", model, "--adapter-path", str(ad), "--save-path", str(tmp_path / "ours")],
                       capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    ref, ours = safetensors_bytes(tmp_path / "ref"), safetensors_bytes(tmp_path / "ours")
    assert sorted(ref) == sorted(ours)
    differing = [k for k in ref if ref[k] != ours[k]]
    assert not differing, differing[:5]
    # and the adapter changed what it covers (the fuse did something)
    base = safetensors_bytes(model)
    assert any(base[k] != ours[k] for k in ours if "q_proj" in k)
    if name.startswith("qwen3_5-"):
        assert any(base[k] != ours[k] for k in ours if "linear_attn.in_proj_qkv" in k)
    if "moe" in name:
        assert any(base[k] != ours[k] for k in ours if "switch_" in k)


def test_fuse_refusals(tmp_path):
    model = model_dir("llama-f32")
    dora = make_mlx_adapter(model, tmp_path / "dora", dora=True)

    def fuse(*args):
        p = subprocess.run([BIN, "fuse", model, *map(str, args)], capture_output=True)
        assert p.returncode != 0
        return p.stderr.decode()

    assert "fusing a DoRA adapter is not done yet" in fuse("--adapter-path", dora, "--save-path", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    (tmp_path / "exists").mkdir()
    assert "already exists" in fuse("--adapter-path", dora, "--save-path", tmp_path / "exists")
    assert "--export-gguf is not supported" in fuse("--export-gguf")


def test_generate_applies_the_adapter(tmp_path):
    """hearth generate --adapter-path: the greedy text is the detokenized greedy ids that
    trace (checked against mlx-lm above) gives with the same adapter, and not the base's."""
    model = model_dir("llama-f32")
    ad = make_mlx_adapter(model, tmp_path / "ad")
    env = dict(os.environ, HEARTH_CPU="scalar")

    def generate(*extra):
        p = subprocess.run([BIN, "generate", model, "Tell me", "--no-chat-template", "--max-tokens", "6", "--threads",
                            "2", *extra], capture_output=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        return p.stdout.decode()

    ids = json.loads(subprocess.run([BIN, "tokenize", model, "Tell me"], capture_output=True, check=True).stdout)
    greedy = [s["token"] for s in trace(model, ad, ids=ids, steps=6)["steps"]]
    text = subprocess.run([BIN, "detokenize", model, json.dumps(greedy)], capture_output=True, check=True).stdout
    with_adapter = generate("--adapter-path", str(ad))
    assert with_adapter == text.decode().rstrip("\n") or with_adapter == text.decode()
    assert with_adapter != generate()


def test_gdn_adapter_on_an_attention_layer_is_refused(tmp_path):
    """A Gated DeltaNet projection's pair on a layer that has none (Qwen3.5's every third layer
    is full attention) is refused by name, not applied somewhere else."""
    import mlx.core as mx
    model = model_dir("qwen3_5-f32")
    ad = make_mlx_adapter(model, tmp_path / "ad", keys=None)
    w = mx.load(str(ad / "adapters.safetensors"))
    moved = {k.replace("layers.1.linear_attn", "layers.2.linear_attn"): v for k, v in w.items()}
    mx.save_safetensors(str(ad / "adapters.safetensors"), moved)
    err = run_err(model, ad)
    assert "layers.2.linear_attn.in_proj_" in err and "layer 2 is a full-attention layer" in err, err
