"""hearth train -c FILE (mlx_lm.lora's YAML config) against mlx_lm.lora 0.32.2 itself: the oracle
reads the same file through its own main() (its YAML loader, its merge with the command line,
its defaults), and hearth's resolved settings (`hearth fit --train -c ... --json`, "config": the
adapter_config.json the run would write) must agree key by key; the file written as block
YAML, flow YAML and indented JSON (a run's own adapter_config.json) reads the same; flags on
the command line win over the file on both sides; one training run from a config matches
mlx_lm.lora's losses step by step; keys hearth cannot honour and broken YAML are errors naming
the file and the line or key."""
import json
import subprocess
import sys

import pytest

from test_train import BIN, LOSS_RTOL, hearth_train, make_data, make_init_adapter, mlx_lora, model_dir


def mlx_resolve(argv):
    """The arguments mlx_lm.lora's main() would train with for this command line."""
    from mlx_lm import lora as L
    got = {}
    run, saved = L.run, sys.argv
    L.run = lambda args: got.update(vars(args))
    sys.argv = ["mlx_lm.lora"] + list(argv)
    try:
        L.main()
    finally:
        L.run, sys.argv = run, saved
    return got


def hearth_resolve(argv):
    p = subprocess.run([BIN, "fit", "--train", "--json"] + list(argv), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["config"], p.stderr


SHARED = ["model", "data", "adapter_path", "optimizer", "num_layers", "batch_size", "iters", "mask_prompt",
          "max_seq_length", "steps_per_report", "steps_per_eval", "save_every", "val_batches",
          "grad_accumulation_steps", "seed", "grad_checkpoint", "resume_adapter_file"]


def assert_same(theirs, mine):
    for k in SHARED:
        assert bool(theirs[k]) == mine[k] if isinstance(mine[k], bool) else theirs[k] == mine[k], \
            (k, theirs[k], mine[k])
    for k in ("rank", "scale"):
        assert theirs["lora_parameters"][k] == mine["lora_parameters"][k], k
    ls = theirs.get("lr_schedule")
    if ls:  # the schedule's first argument is the initial rate on both sides
        assert ls["name"] == mine["lr_schedule"]["name"]
        assert [float(a) for a in ls["arguments"]] == pytest.approx(mine["lr_schedule"]["arguments"], rel=1e-12)
        assert ls.get("warmup", 0) == mine["lr_schedule"].get("warmup", 0)
        assert float(ls.get("warmup_init", 0.0)) == pytest.approx(mine["lr_schedule"].get("warmup_init", 0.0))
    else:
        assert float(theirs["learning_rate"]) == pytest.approx(mine["learning_rate"], rel=1e-12)
    wd = theirs["optimizer_config"].get(theirs["optimizer"], {}).get("weight_decay")
    if wd is not None:
        assert mine["optimizer_config"][theirs["optimizer"]]["weight_decay"] == pytest.approx(wd)


def block_yaml(model, data):
    return f"""# a config as mlx-lm's examples/lora_config.yaml writes one
model: "{model}"
train: true
fine_tune_type: lora
optimizer: adamw
optimizer_config:
  adamw:
    weight_decay: 0.05      # comment after a value
data: '{data}'
seed: 7
num_layers: -1
batch_size: 2
iters: 1_2
val_batches: 3
learning_rate: 2e-4
steps_per_report: 1
steps_per_eval: 4
save_every: 50
max_seq_length: 512
grad_accumulation_steps: 1
grad_checkpoint: no
mask_prompt: False
resume_adapter_file: ~
lora_parameters:
  # all of them, as mlx-lm needs
  rank: 4
  dropout: 0.0
  scale: 10.0
lr_schedule:
  name: cosine_decay
  warmup: 3
  warmup_init: 1.0e-7
  arguments:
    - 2e-4
    - 100
    - 1e-6
"""


def flow_yaml(model, data):
    return f"""---
model: {model}
data: {data}
optimizer: adamw
optimizer_config: {{adamw: {{weight_decay: 0.05}}, sgd: {{}}}}
seed: 7
num_layers: -1
batch_size: 2
iters: 12
val_batches: 3
learning_rate: 0.0002
steps_per_report: 1
steps_per_eval: 4
save_every: 50
max_seq_length: 512
lora_parameters: {{rank: 4, dropout: 0.0, scale: 10.0}}
lr_schedule: {{name: cosine_decay, warmup: 3, warmup_init: 1.0e-7,
               arguments: [2e-4, 100, 1e-6]}}
"""


@pytest.fixture
def folder(tmp_path):
    return model_dir("llama-f32"), make_data(str(tmp_path / "data"), "completion")


@pytest.mark.parametrize("form", ["block", "flow", "json"])
def test_config_reads_as_mlx_lm_reads_it(tmp_path, folder, form):
    model, data = folder
    text = block_yaml(model, data) if form != "flow" else flow_yaml(model, data)
    if form == "json":  # the same settings as indented JSON (what a run's adapter_config.json is)
        import yaml
        from mlx_lm import lora as L
        text = json.dumps(yaml.load(block_yaml(model, data), L.yaml_loader), indent=4)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    theirs = mlx_resolve(["-c", str(cfg)])
    mine, _ = hearth_resolve(["-c", str(cfg)])
    assert_same(theirs, mine)
    assert mine["iters"] == 12 and mine["lora_parameters"]["rank"] == 4 and mine["num_layers"] == -1


def test_command_line_wins_over_the_file(tmp_path, folder):
    model, data = folder
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(block_yaml(model, data))
    flags = ["--iters", "5", "--batch-size", "3", "--num-layers", "2", "--seed", "11", "--optimizer", "sgd",
             "--mask-prompt", "--grad-checkpoint", "--max-seq-length", "256"]
    theirs = mlx_resolve(["-c", str(cfg)] + flags)
    mine, _ = hearth_resolve(["-c", str(cfg)] + flags)
    assert_same(theirs, mine)
    assert (mine["iters"], mine["batch_size"], mine["optimizer"], mine["mask_prompt"]) == (5, 3, "sgd", True)
    # the model on the command line wins too (mlx-lm: --model)
    other = model_dir("qwen3-f32")
    theirs = mlx_resolve(["-c", str(cfg), "--model", other])
    mine, _ = hearth_resolve([other, "-c", str(cfg)])
    assert theirs["model"] == mine["model"] == other


def test_a_run_from_a_config_matches_mlx_lora(tmp_path, folder):
    model, data = folder
    init = make_init_adapter(model, tmp_path / "init.safetensors", 4, -1)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(block_yaml(model, data).replace("iters: 1_2", "iters: 8")
                   + "resume_adapter_file_unused: 1\n")
    theirs = mlx_resolve(["-c", str(cfg), "--resume-adapter-file", str(init)])
    kw = {k: v for k, v in theirs.items() if k not in ("model", "data", "adapter_path", "resume_adapter_file", "train")}
    ref = mlx_lora(model, data, tmp_path / "mlx", str(init), **kw)
    ours = hearth_train(model, data, tmp_path / "ours", str(init), ["-c", str(cfg)])
    ours = [r for r in ours if "loss" in r or "val_loss" in r]
    assert [(r["step"], "loss" in r) for r in ours] == [(r["step"], "loss" in r) for r in ref]
    for a, b in zip(ref, ours):
        k = "loss" if "loss" in a else "val_loss"
        assert abs(a[k] - b[k]) <= LOSS_RTOL * abs(a[k]), (a, b)
    # the unknown key is named, not silently dropped
    p = subprocess.run([BIN, "fit", "--train", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert "resume_adapter_file_unused: unknown key" in p.stderr


def test_keys_pick_the_modules_as_mlx_lora(tmp_path, folder):
    """lora_parameters.keys: hearth trains the listed modules only, and its losses follow
    mlx_lm.lora's with the same config and initial pairs; the written config lists them."""
    import mlx.core as mx
    model, data = folder
    keys = ["self_attn.v_proj", "mlp.down_proj"]
    full = make_init_adapter(model, tmp_path / "full.safetensors", 4, -1)
    init = tmp_path / "init.safetensors"
    mx.save_safetensors(str(init), {k: v for k, v in mx.load(full).items() if any(f".{m}." in k for m in keys)})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(block_yaml(model, data).replace("iters: 1_2", "iters: 6").replace(
        "  scale: 10.0\n", "  scale: 10.0\n  keys: [self_attn.v_proj, mlp.down_proj, mlp.gate]\n"))
    theirs = mlx_resolve(["-c", str(cfg), "--resume-adapter-file", str(init)])
    kw = {k: v for k, v in theirs.items() if k not in ("model", "data", "adapter_path", "resume_adapter_file", "train")}
    ref = mlx_lora(model, data, tmp_path / "mlx", str(init), **kw)
    ours = hearth_train(model, data, tmp_path / "ours", str(init), ["-c", str(cfg)])
    ours = [r for r in ours if "loss" in r or "val_loss" in r]
    assert len(ours) == len(ref) > 3
    for a, b in zip(ref, ours):
        k = "loss" if "loss" in a else "val_loss"
        assert abs(a[k] - b[k]) <= LOSS_RTOL * abs(a[k]), (a, b)
    written = mx.load(str(tmp_path / "ours" / "adapters.safetensors"))
    assert sorted(written) == sorted(mx.load(str(init)))  # mlp.gate names no module of a dense model: ignored
    conf = json.loads((tmp_path / "ours" / "adapter_config.json").read_text())
    assert conf["lora_parameters"]["keys"] == keys + ["mlp.gate"]
    # keys that name no module of the model: refused, listing the model's
    cfg.write_text(block_yaml(model, data).replace("  scale: 10.0\n", "  scale: 10.0\n  keys: [attn.nowhere]\n"))
    p = subprocess.run([BIN, "train", model, "-c", str(cfg), "--adapter-path", str(tmp_path / "bad")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "lora_parameters.keys: no module of" in p.stderr and "self_attn.q_proj" in p.stderr
    assert not (tmp_path / "bad" / "adapters.safetensors").exists()


@pytest.mark.parametrize("text,needle", [
    ("fine_tune_type: full\n", "fine_tune_type: full is not supported"),
    ("lora_parameters: {rank: 8, dropout: 0.1, scale: 20}\n", "lora_parameters.dropout"),
    ("lora_parameters:\n  rank: 8\n  keys: self_attn.q_proj\n", "lora_parameters.keys: need a list"),
    ("optimizer: adamw\noptimizer_config:\n  adamw:\n    betas: [0.8, 0.9]\n", "optimizer_config.adamw.betas"),
    ("iters: ten\n", "iters: need a whole number"),
    ("iters: 10\niters: 11\n", "line 2: duplicate key 'iters'"),
    ("lora_parameters:\n\trank: 8\n", "line 2: a tab in the indentation"),
    ("data: 'unclosed\n", "line 1: a quoted string is not closed"),
    ("base: &b 1\nother: *b\n", "line 1: "),
    ("lr_schedule: {name: cosine_decay, arguments: [1e-5, 10]\n", "line 1: a [ or { is never closed"),
    ("- just\n- a list\n", "must be a mapping"),
    ("lr_schedule:\n  name: cosine_decay\n", "lr_schedule: needs its arguments"),
])
def test_bad_config_names_the_file_and_the_problem(tmp_path, folder, text, needle):
    model, data = folder
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    p = subprocess.run([BIN, "train", model, "--data", data, "-c", str(cfg), "--adapter-path", str(tmp_path / "a")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert str(cfg) in p.stderr and needle in p.stderr, p.stderr
    assert not (tmp_path / "a").exists()  # nothing trained, nothing written


def test_missing_config_file(tmp_path, folder):
    model, data = folder
    p = subprocess.run([BIN, "train", model, "--data", data, "-c", str(tmp_path / "none.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "none.yaml" in p.stderr
