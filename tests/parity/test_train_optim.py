"""hearth train's optimizer options against mlx_lm.lora 0.32.2 (the oracle, run in this process
as test_train.py runs it): --optimizer adamw and sgd with a weight decay (mlx-lm's
optimizer_config), --grad-accumulation-steps and --grad-checkpoint. Same initial adapter, data
and seed on both sides; every training and validation loss within test_train.LOSS_RTOL and the
trained adapters within a tolerance far below what the option changes (each option is also run
off, so a flag hearth ignored would fail). --grad-checkpoint must not change a single bit of the
losses, and `hearth fit --train` must predict fewer saved activations with it."""
import json
import os
import subprocess

import numpy as np
import pytest

from test_train import BIN, LOSS_RTOL, hearth_train, make_data, make_init_adapter, mlx_lora, model_dir


def pref_data(tmp_path, seed):
    """A folder with six random preference pairs in train.jsonl."""
    rng = np.random.default_rng(seed)
    words = "the cat sat on a mat while dogs ran over green hills".split()

    def s(lo, hi):
        return " ".join(rng.choice(words) for _ in range(int(rng.integers(lo, hi))))
    d = tmp_path / "pref"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps({"prompt": s(3, 8), "chosen": s(3, 10), "rejected": s(3, 10)})
                                           + "\n" for _ in range(6)))
    return d


def adapters(path):
    from safetensors.numpy import load_file
    return load_file(os.path.join(path, "adapters.safetensors"))


def max_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def run_both(tmp_path, tag, model, data, init, mlx_kw, flags, iters=8):
    common = dict(iters=iters, batch_size=2, num_layers=-1, steps_per_report=1, steps_per_eval=4, seed=3)
    ref = mlx_lora(model, data, tmp_path / f"mlx-{tag}", init, **common, **mlx_kw)
    base = ["--iters", str(iters), "--batch-size", "2", "--num-layers", "-1", "--steps-per-report", "1",
            "--steps-per-eval", "4", "--seed", "3"]
    ours = hearth_train(model, data, tmp_path / f"ours-{tag}", init, base + flags)
    ours = [{k: r[k] for k in ("step", "loss", "val_loss") if k in r} for r in ours]
    assert [(r["step"], "loss" in r) for r in ours] == [(r["step"], "loss" in r) for r in ref]
    for a, b in zip(ref, ours):
        k = "loss" if "loss" in a else "val_loss"
        assert abs(a[k] - b[k]) <= LOSS_RTOL * abs(a[k]), f"{tag} step {a['step']} {k}: mlx-lm {a[k]}, hearth {b[k]}"
    return ours, adapters(tmp_path / f"mlx-{tag}"), adapters(tmp_path / f"ours-{tag}")


@pytest.fixture
def setup(tmp_path):
    model = model_dir("llama-f32")
    data = make_data(str(tmp_path / "data"), "text")
    init = make_init_adapter(model, tmp_path / "init.safetensors", 8, -1)
    return model, data, init


def test_adamw_weight_decay_matches_mlx(tmp_path, setup):
    model, data, init = setup
    lr = 1e-4
    _, _, plain = run_both(tmp_path, "adam", model, data, init, dict(learning_rate=lr), ["--learning-rate", str(lr)])
    _, theirs, mine = run_both(tmp_path, "adamw", model, data, init,
                               dict(learning_rate=lr, optimizer="adamw", optimizer_config={"adamw": {"weight_decay": 5.0}}),
                               ["--learning-rate", str(lr), "--optimizer", "adamw", "--weight-decay", "5"])
    # 8 steps of p *= 1 - 5e-4 shrink the adapter by ~0.4%: far above the two sides' rounding
    assert max_diff(mine, theirs) * 20 < max_diff(mine, plain), (max_diff(mine, theirs), max_diff(mine, plain))
    cfg = json.load(open(tmp_path / "ours-adamw" / "adapter_config.json"))
    assert cfg["optimizer"] == "adamw" and cfg["optimizer_config"] == {"adamw": {"weight_decay": 5.0}}


def test_sgd_matches_mlx(tmp_path, setup):
    model, data, init = setup
    # small steps: this tiny random model's gradients are large, and from lr 5e-4 on plain SGD
    # makes the loss chaotic on both sides (float rounding grows past 1e-4 within a few steps)
    lr = 5e-5
    _, theirs, mine = run_both(tmp_path, "sgd", model, data, init,
                               dict(learning_rate=lr, optimizer="sgd", optimizer_config={"sgd": {"weight_decay": 5.0}}),
                               ["--learning-rate", str(lr), "--optimizer", "sgd", "--weight-decay", "5"])
    from safetensors.numpy import load_file
    init_w = load_file(init)
    assert max_diff(mine, theirs) * 20 < max_diff(mine, init_w)


@pytest.mark.parametrize("opt,lr,wd", [("muon", 2e-4, None), ("muon", 2e-4, 0.5), ("adafactor", 1e-4, None)])
def test_muon_and_adafactor_match_mlx(tmp_path, setup, opt, lr, wd):
    """MLX's Muon (momentum, Nesterov, 5 Newton-Schulz steps on each LoRA matrix, the tall
    ones' rate scaled) and Adafactor (factored second moments, relative steps: mlx_lm.lora
    passes the learning rate but Adafactor's default ignores it), each against Adam from the
    same start: the adapter must be far closer to mlx-lm's than to Adam's."""
    model, data, init = setup
    _, _, plain = run_both(tmp_path, f"adam-{opt}", model, data, init, dict(learning_rate=lr),
                           ["--learning-rate", str(lr)])
    kw = dict(learning_rate=lr, optimizer=opt)
    flags = ["--learning-rate", str(lr), "--optimizer", opt]
    if wd is not None:
        kw["optimizer_config"] = {opt: {"weight_decay": wd}}
        flags += ["--weight-decay", str(wd)]
    _, theirs, mine = run_both(tmp_path, opt, model, data, init, kw, flags)
    assert max_diff(mine, theirs) * 20 < max_diff(mine, plain), (max_diff(mine, theirs), max_diff(mine, plain))


@pytest.mark.parametrize("opt", ["adam", "muon"])
def test_dora_matches_mlx(tmp_path, setup, opt):
    """--fine-tune-type dora against mlx_lm.lora's DoRALinear: m starts at the base's row norms,
    the output is scaled by m / ||W + scale (A B)^T|| (held constant in the backward), and m
    trains beside A and B. Losses step by step, and A, B and m far closer to mlx-lm's than a
    LoRA run's A and B are; the adapter then loads in hearth (its DoRA magnitudes)."""
    model, data, init = setup
    lr = 1e-4
    flags = ["--learning-rate", str(lr), "--optimizer", opt]
    _, _, plain = run_both(tmp_path, f"lora-{opt}", model, data, init, dict(learning_rate=lr, optimizer=opt), flags)
    _, theirs, mine = run_both(tmp_path, f"dora-{opt}", model, data, init,
                               dict(learning_rate=lr, optimizer=opt, fine_tune_type="dora"),
                               flags + ["--fine-tune-type", "dora"])
    assert sorted(mine) == sorted(theirs) and any(k.endswith(".m") for k in mine)
    assert max_diff(mine, theirs) * 20 < max_diff(plain, mine), (max_diff(mine, theirs), max_diff(plain, mine))
    cfg = json.load(open(tmp_path / f"ours-dora-{opt}" / "adapter_config.json"))
    assert cfg["fine_tune_type"] == "dora"
    assert json.load(open(tmp_path / f"ours-dora-{opt}" / "peft" / "adapter_config.json"))["use_dora"] is True
    p = subprocess.run([BIN, "generate", model, "hi", "--max-tokens", "4", "--adapter-path",
                        str(tmp_path / f"ours-dora-{opt}")], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()


def test_grad_accumulation_matches_mlx(tmp_path, setup):
    model, data, init = setup
    lr = 1e-4
    _, _, plain = run_both(tmp_path, "acc1", model, data, init, dict(learning_rate=lr), ["--learning-rate", str(lr)],
                           iters=7)
    _, theirs, mine = run_both(tmp_path, "acc3", model, data, init, dict(learning_rate=lr, grad_accumulation_steps=3),
                               ["--learning-rate", str(lr), "--grad-accumulation-steps", "3"], iters=7)
    assert max_diff(mine, theirs) * 20 < max_diff(mine, plain)


def test_grad_checkpoint_same_bits_and_less_memory(tmp_path, setup):
    model, data, init = setup
    lr = 1e-4
    plain, _, a = run_both(tmp_path, "nockpt", model, data, init, dict(learning_rate=lr), ["--learning-rate", str(lr)])
    ckpt, _, b = run_both(tmp_path, "ckpt", model, data, init, dict(learning_rate=lr, grad_checkpoint=True),
                          ["--learning-rate", str(lr), "--grad-checkpoint"])
    assert plain == ckpt  # the same ops on the same inputs: every loss to the bit
    assert all(np.array_equal(a[k], b[k]) for k in a)

    def fit(*extra):
        p = subprocess.run([BIN, "fit", model, "--train", "--data", data, "--num-layers", "-1", "--json", *extra],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        return json.loads(p.stdout)

    off, on = fit(), fit("--grad-checkpoint")
    assert on["parts"]["saved_activations"] < off["parts"]["saved_activations"], (on, off)
    assert on["predicted_peak_bytes"] < off["predicted_peak_bytes"]


def test_bad_optimizer_flags(tmp_path, setup):
    model, data, _ = setup
    for flags, want in ((["--optimizer", "lion"], "unknown (adam, adamw, sgd, muon or adafactor)"),
                        (["--grad-accumulation-steps", "0"], "--grad-accumulation-steps")):
        p = subprocess.run([BIN, "train", model, "--data", data, *flags], capture_output=True, timeout=60)
        assert p.returncode in (1, 2) and want in p.stderr.decode(), p.stderr.decode()


@pytest.mark.parametrize("name,method,num_layers", [("qwen3-f32", "dpo", 2), ("qwen3-f32", "orpo", 2),
                                                    ("gemma4-f32", "dpo", 2), ("gemma4-f32", "orpo", 3),
                                                    ("qwen3_5-f32", "dpo", 3)])
def test_grad_checkpoint_preference_methods_same_bits(tmp_path, name, method, num_layers):
    """Preference pairs keep two activation slots; with --grad-checkpoint each slot keeps its
    layers' inputs, swapped with the slot: the losses and adapter are the same bits. Gemma 4:
    the keys and values its shared-KV layers read (made by layers below the trained ones
    here) are kept per slot too, and read again when the backward recomputes a layer."""
    model = model_dir(name)
    d = pref_data(tmp_path, 5)
    out = {}
    for tag, extra in (("plain", []), ("ckpt", ["--grad-checkpoint"])):
        rows = hearth_train(model, str(d), tmp_path / tag, None,
                            ["--method", method, "--iters", "4", "--num-layers", str(num_layers),
                             "--steps-per-report", "1"] + extra)
        out[tag] = ([r["loss"] for r in rows if "loss" in r], adapters(tmp_path / tag))
    assert out["plain"][0] == out["ckpt"][0] and len(out["plain"][0]) == 4
    assert all(np.array_equal(out["plain"][1][k], out["ckpt"][1][k]) for k in out["plain"][1])


def mlx_lora_lr(model, data, adapter_path, resume, **kw):
    """mlx_lm.lora in process (as test_train.mlx_lora), keeping each report's learning rate too."""
    import types
    from mlx_lm import lora as L
    from mlx_lm.tuner.callbacks import TrainingCallback
    from lora_helpers import _to_float32
    args = dict(L.CONFIG_DEFAULTS)
    args.update(model=model, train=True, data=data, adapter_path=str(adapter_path), resume_adapter_file=resume, **kw)
    args = types.SimpleNamespace(**args)

    class Keep(TrainingCallback):
        def __init__(self):
            self.rows = []

        def on_train_loss_report(self, info):
            self.rows.append({"step": info["iteration"], "loss": info["train_loss"],
                              "learning_rate": float(info["learning_rate"])})

    np.random.seed(args.seed)
    m, tok = L.load(args.model)
    _to_float32(m)
    train, valid, _ = L.load_dataset(args, tok)
    keep = Keep()
    L.train_model(args, m, train, valid, keep)
    return keep.rows


SCHEDULES = [  # mlx-lm's lr_schedule, hearth's flags
    ({"name": "cosine_decay", "arguments": [2e-4, 6, 1e-5], "warmup": 3, "warmup_init": 1e-6},
     ["--lr-schedule", "cosine_decay", "--lr-schedule-args", "2e-4,6,1e-5", "--warmup", "3", "--warmup-init", "1e-6"]),
    ({"name": "cosine_decay", "arguments": [2e-4, 5]}, ["--lr-schedule", "cosine_decay", "--lr-schedule-args", "2e-4,5"]),
    ({"name": "linear_schedule", "arguments": [2e-4, 1e-5, 7]},
     ["--lr-schedule", "linear_schedule", "--lr-schedule-args", "2e-4,1e-5,7"]),
    ({"name": "exponential_decay", "arguments": [2e-4, 0.7]},
     ["--lr-schedule", "exponential_decay", "--lr-schedule-args", "2e-4,0.7"]),
    ({"name": "step_decay", "arguments": [2e-4, 0.5, 3]},
     ["--lr-schedule", "step_decay", "--lr-schedule-args", "2e-4,0.5,3"]),
]


@pytest.mark.parametrize("sched,flags", SCHEDULES, ids=[s["name"] + ("+warmup" if "warmup" in s else "") for s, _ in SCHEDULES])
def test_lr_schedule_matches_mlx(tmp_path, setup, sched, flags):
    model, data, init = setup
    iters = 10
    ref = mlx_lora_lr(model, data, tmp_path / "mlx", init, iters=iters, batch_size=2, num_layers=-1, steps_per_report=1,
                      steps_per_eval=100, seed=3, lr_schedule=sched)
    ours = hearth_train(model, data, tmp_path / "ours", init,
                        ["--iters", str(iters), "--batch-size", "2", "--num-layers", "-1", "--steps-per-report", "1",
                         "--steps-per-eval", "100", "--seed", "3"] + flags)
    ours = [r for r in ours if "loss" in r]
    assert [r["step"] for r in ours] == [r["step"] for r in ref]
    for a, b in zip(ref, ours):
        assert abs(a["learning_rate"] - b["learning_rate"]) <= 1e-6 * a["learning_rate"], (a, b)
        assert abs(a["loss"] - b["loss"]) <= LOSS_RTOL * abs(a["loss"]), (a, b)
    assert len({round(r["learning_rate"], 12) for r in ours}) > 2  # the rate moved
    cfg = json.load(open(tmp_path / "ours" / "adapter_config.json"))
    assert cfg["lr_schedule"]["name"] == sched["name"] and cfg["lr_schedule"]["arguments"] == sched["arguments"]


def test_bad_lr_schedule_flags(tmp_path, setup):
    model, data, _ = setup
    for flags, want in ((["--lr-schedule", "warm"], "unknown"),
                        (["--lr-schedule", "cosine_decay", "--lr-schedule-args", "1e-4"], "takes 2 or 3"),
                        (["--lr-schedule", "cosine_decay", "--lr-schedule-args", "1e-4,0"], "at least 1"),
                        (["--lr-schedule-args", "1,2,3,4"], "1 to 3")):
        p = subprocess.run([BIN, "train", model, "--data", data, *flags], capture_output=True, timeout=60)
        assert p.returncode in (1, 2) and want in p.stderr.decode(), (flags, p.stderr.decode())


@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_resume_continues_bit_for_bit(tmp_path, method):
    """A run stopped at step 5 and continued with --resume to step 10 ends with the adapter of
    a run of 10 steps to the bit, with the same losses at every step: the resume state holds the
    LoRA tensors, their gradients mid-accumulation (3 batches a window, so step 5 is inside
    one), AdamW's moments, the data order and the schedule's position."""
    if method == "sft":
        model = model_dir("llama-f32")
        data = make_data(str(tmp_path / "data"), "text")
    else:
        model = model_dir("qwen3-f32")
        data = str(pref_data(tmp_path, 7))
    flags = ["--method", method, "--batch-size", "2" if method == "sft" else "1", "--num-layers", "2",
             "--steps-per-report", "1", "--save-every", "4", "--optimizer", "adamw", "--grad-accumulation-steps", "3",
             "--lr-schedule", "cosine_decay", "--lr-schedule-args", "1e-4,4", "--warmup", "1"]
    whole = hearth_train(model, data, tmp_path / "whole", None, flags + ["--iters", "10"])
    first = hearth_train(model, data, tmp_path / "split", None, flags + ["--iters", "5"])
    rest = hearth_train(model, data, tmp_path / "split", None, flags + ["--iters", "10", "--resume"])

    def losses(rows):
        return [(r["step"], r["loss"], r["learning_rate"]) for r in rows if "loss" in r]
    lines = [json.loads(x) for x in open(tmp_path / "split" / "metrics.jsonl")]
    assert len(losses(first)) == 5  # the resumed run appends to the same metrics.jsonl: rest holds all ten
    for x, y in zip(losses(whole), losses(lines)):  # steps 1-5, then 6-10 appended
        assert x == y, (x, y)
    assert len(losses(lines)) == 10
    a, b = adapters(tmp_path / "whole"), adapters(tmp_path / "split")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # a resume must be the same run: another rank is refused by name
    p = subprocess.run([BIN, "train", model, "--data", data, "--adapter-path", str(tmp_path / "split"), *flags,
                        "--iters", "12", "--resume", "--lora-rank", "4"], capture_output=True, timeout=60)
    assert p.returncode == 1 and "lora_rank" in p.stderr.decode(), p.stderr.decode()
    p = subprocess.run([BIN, "train", model, "--data", data, "--adapter-path", str(tmp_path / "split"), *flags,
                        "--iters", "10", "--resume"], capture_output=True, timeout=60)
    assert p.returncode == 1 and "ask for more --iters" in p.stderr.decode(), p.stderr.decode()
    # a damaged resume.bin is an error naming the file, never a crash: cut short, its data order
    # overwritten with garbage, its header line broken
    blob = (tmp_path / "split" / "resume.bin").read_bytes()
    head = blob.index(b"\n", len(b"HEARTH-TRAIN-RESUME-1\n")) + 1
    for bad, want in ((blob[:len(blob) // 2], "cut short"), (blob[:head + 2496] + b"\xff" * 64 + blob[head + 2560:], "damaged"),
                      (blob[:22] + b"x" + blob[23:], "not a hearth train resume file")):
        (tmp_path / "split" / "resume.bin").write_bytes(bad)
        p = subprocess.run([BIN, "train", model, "--data", data, "--adapter-path", str(tmp_path / "split"), *flags,
                            "--iters", "12", "--resume"], capture_output=True, timeout=60)
        assert p.returncode == 1 and want in p.stderr.decode() and "resume.bin" in p.stderr.decode(), p.stderr.decode()
