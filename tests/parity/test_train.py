"""hearth train against mlx_lm.lora 0.32.2 (the oracle): with the same initial adapter
(random non-zero A and B written by the test, loaded by both through
--resume-adapter-file), the same data (a train and a valid set, so the validation draws
from numpy's generator interleave with the batch order as in mlx-lm) and the same seed,
every training and validation loss of the first 10 steps equals mlx-lm's within 1e-4
relative (measured: at most 3.3e-6 over the cases below, lr 1e-4; at lr 1e-3 Adam's
near-sign updates of near-zero gradients amplify float32 rounding to ~1e-3 by step 8 in
both directions, so the test stays at 1e-4). Float, bf16 and 4-bit bases: mlx-lm's model is
up-cast to float32 (quantized weights stay quantized, their scales float32) since hearth
trains in float32. mlx-lm runs in this process through its own lora.py functions (load,
load_dataset, train_model), as `mlx_lm.lora --train` does, with a callback that keeps the
unrounded losses.

Then the adapters: the one hearth wrote, loaded by mlx-lm (mlx_lm.load(adapter_path=)),
gives the logits of mlx-lm's own trained adapter within 1e-3 (both move the base logits by
far more: the test checks that), and hearth serves it (hearth trace --adapter-path) within
the LoRA parity tolerance (test_lora.REF_TOL).
"""
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_helpers import _to_float32, mlx_logits, train_keys  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
TINY = os.path.join(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")), "tiny")
LOSS_RTOL = 1e-4
ROUTER_RTOL = 3e-4  # Gemma 4's MoE with its routers trained (see CASES)
LOGIT_TOL = 1e-3
REF_TOL = 2e-3  # test_lora.py: hearth's served logits with an adapter vs mlx-lm's
IDS = [5, 17, 300, 42, 9, 77, 123, 11, 250, 3]
WORDS = "the cat sat on a mat while dogs ran over green hills and birds sang songs of old".split()


def model_dir(name):
    path = os.path.join(TINY, name)
    if not os.path.isdir(path):
        pytest.fail(f"tiny model missing: {path}; run tools/make_tiny_models.py", pytrace=False)
    return path


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(int(rng.integers(lo, hi))))


def make_data(d, fmt, seed=1):
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    for name, n in (("train", 12), ("valid", 4)):
        with open(os.path.join(d, f"{name}.jsonl"), "w") as f:
            for _ in range(n):
                if fmt == "text":
                    row = {"text": sentence(rng, 5, 40)}
                elif fmt == "completion":
                    row = {"prompt": sentence(rng, 3, 12), "completion": sentence(rng, 3, 20)}
                else:
                    row = {"messages": [{"role": "system", "content": sentence(rng, 2, 6)},
                                        {"role": "user", "content": sentence(rng, 3, 12)},
                                        {"role": "assistant", "content": sentence(rng, 3, 20)}]}
                f.write(json.dumps(row) + "\n")
    return d


def make_init_adapter(model, path, rank, num_layers, seed=0):
    """Random A ~ U(+-1/sqrt(in)) (mlx-lm's init) and B ~ N(0, 0.01) (non-zero, so A's
    gradient is too) for every attention and MLP projection of the last num_layers layers
    that the layer has (mlx-lm's own LoRA layers give the shapes: Gemma 4's differ per layer,
    and its shared-KV layers have no k and v), drawn layer by layer in train_keys order."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers
    m, _ = load(model)
    L = len(m.layers)
    keys = train_keys(model)
    linear_to_lora_layers(m, L if num_layers < 0 else num_layers,
                          {"rank": rank, "scale": 1.0, "dropout": 0.0, "keys": list(keys)})
    shapes = {k: v.shape for k, v in tree_flatten(m.parameters()) if k.endswith((".lora_a", ".lora_b"))}
    prefix = "language_model.model." if any(k.startswith("language_model.") for k in shapes) else "model."
    rng = np.random.default_rng(seed)
    w = {}
    for layer in range(L - (L if num_layers < 0 else num_layers), L):
        for p in keys:
            a, b = f"{prefix}layers.{layer}.{p}.lora_a", f"{prefix}layers.{layer}.{p}.lora_b"
            if a not in shapes:
                continue
            if len(shapes[a]) == 3:  # the routed experts (LoRASwitchLinear): [E, r, in] and [E, out, r]
                (e, r, i), (_, o, _) = shapes[a], shapes[b]
                w[a] = mx.array((rng.uniform(-1, 1, (e, r, i)) / np.sqrt(i)).astype(np.float32))
                w[b] = mx.array(rng.normal(0, 0.01, (e, o, r)).astype(np.float32))
                continue
            (i, r), (_, o) = shapes[a], shapes[b]
            w[a] = mx.array((rng.uniform(-1, 1, (i, r)) / np.sqrt(i)).astype(np.float32))
            w[b] = mx.array(rng.normal(0, 0.01, (r, o)).astype(np.float32))
    mx.save_safetensors(str(path), w)
    return str(path)


def mlx_lora(model, data, adapter_path, resume, **kw):
    """mlx_lm.lora --train, in process, returning its reports unrounded."""
    import mlx.core as mx  # noqa: F401
    from mlx_lm import lora as L
    from mlx_lm.tuner.callbacks import TrainingCallback
    args = dict(L.CONFIG_DEFAULTS)
    # hearth adapts the attention and MLP projections and Gemma 4's per-layer input gate and
    # projection: mlx-lm's default but on the MoE families (routers and experts: not trained)
    args["lora_parameters"] = dict(args["lora_parameters"], keys=list(train_keys(model)))
    args.update(model=model, train=True, data=data, adapter_path=str(adapter_path), resume_adapter_file=resume, **kw)
    args = types.SimpleNamespace(**args)

    class Keep(TrainingCallback):
        rows = []

        def on_train_loss_report(self, info):
            self.rows.append({"step": info["iteration"], "loss": info["train_loss"]})

        def on_val_loss_report(self, info):
            self.rows.append({"step": info["iteration"], "val_loss": info["val_loss"]})

    np.random.seed(args.seed)  # what lora.run does first
    m, tok = L.load(args.model)
    _to_float32(m)  # hearth trains in float32: so does the oracle (bf16 / f16 params and scales up-cast)
    train, valid, _ = L.load_dataset(args, tok)
    keep = Keep()
    keep.rows = []
    L.train_model(args, m, train, valid, keep)
    return keep.rows


def hearth_train(model, data, adapter_path, resume, extra=()):
    cmd = [BIN, "train", model, "--data", data, "--adapter-path", str(adapter_path), "--threads", "2"] + list(extra)
    if resume:
        cmd += ["--resume-adapter-file", resume]
    p = subprocess.run(cmd, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode()
    rows = [json.loads(line) for line in open(os.path.join(adapter_path, "metrics.jsonl"))]
    # the run's final record (hearth train-watch stops at it) is no report of mlx-lm's
    assert rows[-1].get("done") is True and "error" not in rows[-1], rows[-1]
    return rows[:-1]


CASES = [  # model, data format, num_layers, mask_prompt
    ("llama-f32", "text", -1, False),
    ("qwen3-f32", "text", 2, False),
    ("llama-f32", "chat", 2, True),
    ("qwen3-f32", "completion", -1, True),
    ("llama-q4g64", "text", -1, False),  # QLoRA: a quantized base, dequantized once
    ("qwen3-bf16", "chat", -1, False),
    ("minicpm-f32", "text", -1, False),  # scaled embeddings, block outputs and normed rows
    ("minicpm-q4g64", "completion", 2, True),
    # Gemma 3: (1 + w) norms, post-attention / post-MLP norms, GELU(tanh) gate, scaled
    # embeddings, sliding-window layers (window 16: the sequences here are longer) with the
    # local RoPE base
    ("gemma3-f32", "text", -1, False),
    ("gemma3-q4g64", "chat", 2, True),
    # Gemma 4: per-layer head_dim and KV heads, values = keys on full layers, value norms,
    # KV shared by the last layers (their gradient reaches the layer that made it), per-layer
    # inputs (their gate and projection trained too, as mlx_lm.lora's default keys have them),
    # double-wide MLPs, the layer scalar, the final logit softcap. Layers 1-5: with layer 0's
    # per-layer pairs trained as well, 10 steps amplify float32 rounding (each step's gradient
    # matches mlx-lm's within 5e-5 of the tensor's largest, test_one_sgd_step_is_mlx_lms_gradient
    # on every layer; the loss curves part from the fourth report on, 1e-3 by the ninth, in both
    # directions); without layer 0 they stay within 2e-6
    ("gemma4-f32", "text", 5, False),
    ("gemma4-q4g64", "chat", 3, True),
    # Qwen3-MoE: the routed experts (and the router) stay frozen, the gradient flows through
    # them and through the router's softmax and renormalised top-k weights; layer 1 is dense
    ("qwen3_moe-f32", "text", -1, False),
    ("qwen3_moe-q4g64", "chat", 2, True),
    # Qwen3.5: Gated DeltaNet layers (frozen: the gradient goes back through the delta rule,
    # the conv and the gates), gated attention with partial RoPE
    ("qwen3_5-f32", "text", -1, False),
    ("qwen3_5-q4g64", "chat", 3, True),
    ("qwen3_5_moe-f32", "text", -1, False),  # + routed experts beside a gated shared expert
    # Gemma 4's experts beside its MLP, routed from the residual: with every layer trained, 10
    # steps move some token's router logits across a tie (a different expert is picked; 0.18%
    # of the loss at step 4 for the f32 model), so the last two layers here, and with their
    # routers trained too (mlx_lm.lora's default keys) a validation token can still flip: its
    # tolerance is ROUTER_RTOL (training losses within 4.2e-5 measured, the step 9 validation
    # 2.4e-4); the gradient test below covers every layer
    ("gemma4_moe-q4g64", "chat", 2, True),
]


@pytest.mark.parametrize("name,fmt,num_layers,mask", CASES)
def test_losses_and_adapter_match_mlx_lora(tmp_path, name, fmt, num_layers, mask):
    model = model_dir(name)
    data = make_data(str(tmp_path / "data"), fmt)
    rank, iters, bs, lr, seed = 8, 10, 2, 1e-4, 3
    init = make_init_adapter(model, tmp_path / "init.safetensors", rank, num_layers)
    ref = mlx_lora(model, data, tmp_path / "mlx", init, iters=iters, batch_size=bs, learning_rate=lr,
                   num_layers=num_layers, steps_per_report=1, steps_per_eval=4, seed=seed, mask_prompt=mask)
    flags = ["--iters", str(iters), "--batch-size", str(bs), "--learning-rate", str(lr), "--num-layers",
             str(num_layers), "--steps-per-report", "1", "--steps-per-eval", "4", "--seed", str(seed)]
    ours = hearth_train(model, data, tmp_path / "ours", init, flags + (["--mask-prompt"] if mask else []))
    assert [sorted(r) for r in ours] != []
    ours = [{k: r[k] for k in ("step", "loss", "val_loss") if k in r} for r in ours]
    assert [(r["step"], "loss" in r) for r in ours] == [(r["step"], "loss" in r) for r in ref]
    for a, b in zip(ref, ours):
        k = "loss" if "loss" in a else "val_loss"
        tol = ROUTER_RTOL if "gemma4_moe" in name else LOSS_RTOL
        assert abs(a[k] - b[k]) <= tol * abs(a[k]), f"step {a['step']} {k}: mlx-lm {a[k]}, hearth {b[k]}"
    print(f"{name} {fmt}: worst relative loss difference", max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(ref, ours) for k in ("loss", "val_loss") if k in a))
    assert ours[-1]["loss"] < ours[0 if "loss" in ours[0] else 1]["loss"]  # it trained

    # the adapter hearth wrote, in mlx-lm and in hearth, against mlx-lm's own
    base, _ = mlx_logits(model, IDS)
    theirs, _ = mlx_logits(model, IDS, tmp_path / "mlx")
    mine, _ = mlx_logits(model, IDS, tmp_path / "ours")
    shift = np.abs(theirs - base).max()
    assert shift > 50 * LOGIT_TOL  # the adapter matters
    # within 1e-3, or 1e-3 of the adapter's own effect where that is larger: Gemma 4's 10
    # Adam steps drift up to 7.9e-3 apart on a shift of ~14, from Adam's near-sign steps on
    # float32 rounding, not from the gradients: those agree with mlx-lm's within 2e-5
    # (test_one_sgd_step_is_mlx_lms_gradient)
    assert np.abs(mine - theirs).max() < max(LOGIT_TOL, 1e-3 * shift)
    p = subprocess.run([BIN, "trace", model, "--ids", json.dumps(IDS), "--last", "4", "--top", "20", "--steps", "0",
                        "--threads", "2", "--adapter-path", str(tmp_path / "ours")], capture_output=True, timeout=600,
                       env=dict(os.environ, HEARTH_CPU="scalar"))  # the reference tier, as test_lora.py
    assert p.returncode == 0, p.stderr.decode()
    served = json.loads(p.stdout)
    worst = max(abs(float(mine[row["pos"]][i]) - v) for row in served["prompt"] for i, v in row["top"])
    assert worst < REF_TOL  # hearth serving its adapter gives mlx-lm's logits with it


@pytest.mark.parametrize("name,num_layers", [("llama-f32", -1), ("gemma3-f32", 2), ("gemma4-f32", -1),
                                             ("gemma4-q4g64", 3), ("qwen3_moe-q4g64", -1), ("qwen3_5-f32", -1),
                                             ("qwen3_5-bf16", 3), ("qwen3_5_moe-q4g64", 3), ("gemma4_moe-f32", -1),
                                             ("gemma4_moe-q4g64", 2)])
def test_one_sgd_step_is_mlx_lms_gradient(tmp_path, name, num_layers):
    """One SGD step at learning rate 1 moves each LoRA tensor by minus its gradient: the
    whole model's backward (every layer's ops, Gemma 4's shared-KV layers handing their
    keys' and values' gradients down, the softcapped cross-entropy) against MLX autograd
    through mlx-lm's model, tensor by tensor within 1e-4 of the tensor's largest value (Gemma
    4's MoE model: 3e-4)."""
    import mlx.core as mx
    model = model_dir(name)
    data = make_data(str(tmp_path / "data"), "text")
    init = make_init_adapter(model, tmp_path / "init.safetensors", 8, num_layers)
    common = dict(iters=1, batch_size=2, learning_rate=1.0, num_layers=num_layers, steps_per_report=1,
                  steps_per_eval=100, seed=3)
    mlx_lora(model, data, tmp_path / "mlx", init, optimizer="sgd", **common)
    hearth_train(model, data, tmp_path / "ours", init, ["--iters", "1", "--batch-size", "2", "--learning-rate", "1",
                                                        "--num-layers", str(num_layers), "--steps-per-eval", "100",
                                                        "--seed", "3", "--optimizer", "sgd"])
    a, b, i0 = (mx.load(str(p)) for p in (tmp_path / "mlx" / "adapters.safetensors",
                                          tmp_path / "ours" / "adapters.safetensors", init))
    assert sorted(a) == sorted(b) == sorted(i0)
    # Gemma 4's mixture-of-experts block amplifies float32 rounding more (worst 1.1e-4 measured
    # over every layer; the router's per-expert scales left out of its backward give 2.6e-3 to
    # 4.5e-3 in the top layer alone)
    tol = 3e-4 if "gemma4_moe" in name else 1e-4
    worst = 0.0
    for k in a:
        ga, gb = np.asarray(i0[k]) - np.asarray(a[k]), np.asarray(i0[k]) - np.asarray(b[k])
        assert np.abs(ga).max() > 0, k
        worst = max(worst, np.abs(ga - gb).max() / np.abs(ga).max())
        assert np.abs(ga - gb).max() <= tol * np.abs(ga).max(), k
    print(f"{name}: worst gradient difference {worst:.2e} of the tensor's largest")


def train_both(tmp_path, model_a, out_a, model_b, out_b, iters):
    """hearth train on two forms of the same weights (model_a's shapes give the initial
    adapter), the same data, init and flags: both runs' reports"""
    data = make_data(str(tmp_path / "data"), "text")
    init = make_init_adapter(model_a, tmp_path / "init.safetensors", 8, -1)
    flags = ["--iters", str(iters), "--batch-size", "2", "--learning-rate", "1e-4", "--num-layers", "-1",
             "--steps-per-report", "1"]
    return (hearth_train(model_a, data, tmp_path / out_a, init, flags),
            hearth_train(model_b, data, tmp_path / out_b, init, flags))


def test_qwen3_5_in_hf_layout_trains_as_mlx_layout(tmp_path):
    """A Qwen3.5 checkpoint as transformers saves it (norms stored as offsets from 1, conv1d
    [C, 1, K]; mlx-lm adds the 1 and moves the conv at load) trains as the mlx-lm layout of the
    same weights does: the same losses, the same adapter."""
    import shutil

    import mlx.core as mx
    from safetensors.numpy import load_file, save_file
    src = model_dir("qwen3_5-f32")
    hf = tmp_path / "hf"
    shutil.copytree(src, hf)
    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
             ".k_norm.weight")
    for f in hf.glob("*.safetensors"):
        w = load_file(str(f))
        for k in list(w):
            if k.endswith(norms):
                w[k] = (w[k] - 1.0).astype(np.float32)
            elif k.endswith("conv1d.weight"):
                w[k] = np.ascontiguousarray(np.transpose(w[k], (0, 2, 1)))
        save_file(w, str(f), metadata={"format": "pt"})
    a, b = train_both(tmp_path, src, "mlx", str(hf), "hf_out", 4)
    assert [r.get("loss", r.get("val_loss")) for r in a] == pytest.approx([r.get("loss", r.get("val_loss")) for r in b],
                                                                           rel=1e-5)
    wa, wb = mx.load(str(tmp_path / "mlx" / "adapters.safetensors")), mx.load(str(tmp_path / "hf_out" /
                                                                                   "adapters.safetensors"))
    assert sorted(wa) == sorted(wb)
    for k in wa:
        assert np.abs(np.asarray(wa[k]) - np.asarray(wb[k])).max() < 1e-5, k


def run_err(args):
    p = subprocess.run([BIN, "train"] + args, capture_output=True, timeout=120)
    return p.returncode, p.stderr.decode()


def test_errors_are_clear(tmp_path):
    model = model_dir("llama-f32")
    data = make_data(str(tmp_path / "data"), "text")
    rc, err = run_err([model, "--data", data, "--method", "dpo"])
    assert rc == 1 and "--method dpo needs preference data" in err  # test_train_pref.py trains dpo / orpo
    rc, err = run_err([model, "--data", str(tmp_path / "nowhere")])
    assert rc == 1 and "train.jsonl" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"text": "a b c"}\n{"text": oops}\n')
    rc, err = run_err([model, "--data", str(bad)])
    assert rc == 1 and "train.jsonl:2" in err
    (bad / "train.jsonl").write_text('{"question": "a b c"}\n')
    rc, err = run_err([model, "--data", str(bad)])
    assert rc == 1 and "unsupported data format" in err
    rc, err = run_err([model, "--data", data, "--batch-size", "50"])
    assert rc == 1 and "fewer than --batch-size 50" in err
    rc, err = run_err([model, "--data", data, "--num-layers", "9"])
    assert rc == 1 and "only 3 layers" in err
    rc, err = run_err([model, "--data", data, "--iters", "0"])
    assert rc == 2
    rc, err = run_err([model, "--data", data, "--num-layers", "-1", "--resume-adapter-file", str(bad / "train.jsonl")])
    assert rc == 1 and "train.jsonl" in err
    # a model training does not handle is refused by name (an encoder: BERT)
    bert = os.path.join(os.path.dirname(TINY), "models", "all-MiniLM-L6-v2")
    if not os.path.isdir(bert):
        pytest.fail(f"missing {bert}: run tools/get_models.sh", pytrace=False)
    rc, err = run_err([bert, "--data", data])
    assert rc == 1 and "architecture 'bert' is not supported" in err, err


def test_gguf_base_trains_like_safetensors_base(tmp_path):
    """A GGUF llama's q/k rows are permuted for adjacent-pair RoPE: hearth trains in that
    order and permutes B's columns on loading and saving, so the same weights as an f32 GGUF
    give the same losses and write the same adapter (HF order) as the safetensors folder."""
    import mlx.core as mx
    model = model_dir("llama-f32")
    gguf = tmp_path / "llama.gguf"
    p = subprocess.run([BIN, "convert", model, "--out", str(gguf), "--outtype", "f32"], capture_output=True)
    assert p.returncode == 0, p.stderr.decode()
    a, b = train_both(tmp_path, model, "st", str(gguf), "gguf", 6)
    for x, y in zip(a, b):
        k = "loss" if "loss" in x else "val_loss"
        assert abs(x[k] - y[k]) <= LOSS_RTOL * abs(x[k])
    wa, wb = mx.load(str(tmp_path / "st" / "adapters.safetensors")), mx.load(str(tmp_path / "gguf" / "adapters.safetensors"))
    assert sorted(wa) == sorted(wb)
    for k in wa:
        assert np.abs(np.asarray(wa[k]) - np.asarray(wb[k])).max() < 1e-4, k


@pytest.mark.parametrize("name", ["llama-f32", "gemma3-f32", "minicpm-f32", "gemma4-f32", "gemma4_moe-f32",
                                  "qwen3_moe-f32", "qwen3_5-f32", "qwen3_5_moe-f32"])
def test_default_modules_are_mlx_lora_defaults(tmp_path, name):
    """hearth train with its defaults writes a pair for exactly the modules mlx_lm.lora's own
    default (no lora_parameters.keys: every linear layer of the block) adapts, with the same
    tensor names and shapes, on every family it trains."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers
    model = model_dir(name)
    m, _ = load(model)
    linear_to_lora_layers(m, 2, {"rank": 8, "scale": 20.0, "dropout": 0.0})
    ref = {k: tuple(v.shape) for k, v in tree_flatten(m.trainable_parameters()) if k.endswith((".lora_a", ".lora_b"))}
    ref = {k: v for k, v in ref.items() if ".lora_" in k}
    data = make_data(str(tmp_path / "data"), "text")
    hearth_train(model, data, tmp_path / "ours", None, ["--iters", "1", "--batch-size", "1", "--num-layers", "2"])
    ours = {k: tuple(v.shape) for k, v in mx.load(str(tmp_path / "ours" / "adapters.safetensors")).items()}
    assert ours == ref, (sorted(set(ref) ^ set(ours))[:8], [(k, ref[k], ours[k]) for k in ref if k in ours
                                                              and ref[k] != ours[k]][:4])
