"""hearth convert against mlx_lm.convert on the tiny float models.

The oracle is mlx-lm's own converter (mlx_lm.convert.convert, quantize=True) on the same
input folder: every tensor of hearth's output (packed weights, scales, biases, the copied
norms) must be byte-identical to mlx-lm's, with the same dtype and shape, and config.json
must say the same thing. Then hearth loads both outputs and computes the same logits.
"""
import glob
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))

# every family at the widths and groups the issue names; MLX's other widths on one family;
# bf16 input (mlx quantizes in float32 and rounds scales/biases to bf16)
CASES = [(f"{fam}-f32", b, g) for fam in ("llama", "qwen3", "gemma3") for b in (4, 8) for g in (32, 64)]
CASES += [("llama-f32", 2, 32), ("qwen3-f32", 3, 32), ("gemma3-f32", 5, 64), ("llama-f32", 6, 64),
          ("llama-bf16", 4, 64), ("gemma3-bf16", 8, 32), ("gemma4-f32", 4, 64), ("gemma4-bf16", 8, 32)]


def tiny(name):
    path = os.path.join(CACHE, "tiny", name)
    if not os.path.isfile(os.path.join(path, "config.json")):
        pytest.fail(f"{path} missing: run tools/get_models.sh", pytrace=False)
    return path


def hearth(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"hearth {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()}")
    return p


def tensors(folder):
    import mlx.core as mx

    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        out.update(mx.load(f))
    return out


def mlx_convert(src, dst, bits, group, recipe=None):
    import contextlib
    import io

    from mlx_lm.convert import convert

    with contextlib.redirect_stdout(io.StringIO()):  # its [INFO] lines
        convert(src, str(dst), quantize=True, q_bits=bits, q_group_size=group, quant_predicate=recipe)


def assert_same_output(src, mine, theirs):
    import mlx.core as mx

    a, b = tensors(mine), tensors(theirs)
    assert sorted(a) == sorted(b)
    assert any(k.endswith(".scales") for k in b)
    for k in b:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(np.array(a[k].view(mx.uint8)), np.array(b[k].view(mx.uint8))), k
    assert json.load(open(mine / "config.json")) == json.load(open(theirs / "config.json"))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert open(mine / f, "rb").read() == open(os.path.join(src, f), "rb").read(), f
    # hearth serves the result: it loads, and computes what it computes on mlx-lm's output
    ids = "[1, 5, 9, 200, 17, 3]"
    t1 = hearth("trace", str(mine), "--ids", ids, "--steps", "4").stdout
    t2 = hearth("trace", str(theirs), "--ids", ids, "--steps", "4").stdout
    assert t1 == t2 and json.loads(t1)["steps"]


@pytest.mark.parametrize("name,bits,group", CASES, ids=[f"{n}-q{b}g{g}" for n, b, g in CASES])
def test_convert_matches_mlx_lm(name, bits, group, tmp_path):
    src = tiny(name)
    mine, theirs = tmp_path / "hearth", tmp_path / "mlx"
    hearth("convert", src, "--out", str(mine), "-q", "--q-bits", str(bits), "--q-group-size", str(group))
    mlx_convert(src, theirs, bits, group)
    assert_same_output(src, mine, theirs)


RECIPES = [(f"{fam}-f32", "mixed_4_6") for fam in ("llama", "qwen3", "gemma3")] + [("qwen3-f32", "mixed_3_6"),
                                                                                    ("llama-f32", "mixed_2_6"),
                                                                                    ("gemma4-f32", "mixed_4_6")]


@pytest.mark.parametrize("name,recipe", RECIPES, ids=[f"{n}-{r}" for n, r in RECIPES])
def test_convert_recipe_matches_mlx_lm(name, recipe, tmp_path):
    """mlx_lm.convert's --quant-predicate recipes: per-module widths and their config entries."""
    src = tiny(name)
    mine, theirs = tmp_path / "hearth", tmp_path / "mlx"
    hearth("convert", src, "--out", str(mine), "-q", "--q-group-size", "64", "--quant-predicate", recipe)
    mlx_convert(src, theirs, 4, 64, recipe)
    assert_same_output(src, mine, theirs)
    widths = {v["bits"] for k, v in json.load(open(mine / "config.json"))["quantization"].items() if isinstance(v, dict)}
    assert len(widths) == 2  # both of the recipe's widths are used


def test_convert_float_copy(tmp_path):
    """Without -q the float tensors are copied unchanged and the config has no quantization."""
    src = tiny("qwen3-f32")
    hearth("convert", src, "--out", str(tmp_path / "out"))
    a, b = tensors(tmp_path / "out"), tensors(src)
    assert sorted(a) == sorted(b)
    assert all(np.array_equal(np.array(a[k]), np.array(b[k])) for k in b)
    assert "quantization" not in json.load(open(tmp_path / "out" / "config.json"))


def test_convert_bad_input(tmp_path):
    src = tiny("llama-f32")
    (tmp_path / "exists").mkdir()
    cases = [
        (["--out", str(tmp_path / "exists")], "already exists"),
        (["--out", str(tmp_path / "b"), "-q", "--q-bits", "7"], "--q-bits 7"),
        (["--out", str(tmp_path / "c"), "-q", "--q-group-size", "48"], "--q-group-size 48"),
        (["--out", str(tmp_path / "f"), "-q", "--quant-predicate", "mixed_5_7"], "--quant-predicate mixed_5_7"),
    ]
    p = hearth("convert", tiny("llama-q4g64"), "--out", str(tmp_path / "a"), check=False)
    assert p.returncode == 1 and "already quantized" in p.stderr.decode()
    for args, needle in cases:
        p = hearth("convert", src, *args, check=False)
        msg = p.stderr.decode()
        assert p.returncode == 1 and msg.startswith("hearth: ") and needle in msg, (args, msg)
    # a side file that cannot be read fails the conversion and leaves no half-written folder
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    (broken / "zz.json").symlink_to(tmp_path / "nowhere")
    p = hearth("convert", str(broken), "--out", str(tmp_path / "e"), "-q", check=False)
    assert p.returncode == 1 and p.stderr.decode().startswith("hearth: ") and "zz.json" in p.stderr.decode()
    assert not (tmp_path / "e").exists()
    # stacked expert weights (MoE) are refused, not left float where mlx-lm would quantize them
    import mlx.core as mx

    moe = tmp_path / "moe"
    shutil.copytree(src, moe)
    weights = mx.load(str(moe / "model.safetensors"))
    weights["model.layers.0.mlp.switch_mlp.up_proj.weight"] = mx.zeros((4, 128, 64))
    mx.save_safetensors(str(moe / "model.safetensors"), weights)
    index = json.load(open(moe / "model.safetensors.index.json"))
    index["weight_map"] = {k: "model.safetensors" for k in weights}
    json.dump(index, open(moe / "model.safetensors.index.json", "w"))
    p = hearth("convert", str(moe), "--out", str(tmp_path / "h"), "-q", check=False)
    assert p.returncode == 1 and "expert weights" in p.stderr.decode() and not (tmp_path / "h").exists()
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"text": "a few words"}\n' * 40)
    p = hearth("convert", src, "--out", str(tmp_path / "g"), "-q", "--target-bpw", "4", "--candidate-bits", "4,8",
               "--calibration-data", str(calib), check=False)
    assert p.returncode == 1 and "below the cheapest candidate" in p.stderr.decode()
    for bad in ("4,3", "4,4:64", "4:48", "4:", "9"):  # not ascending in bits per weight, no such group or width
        p = hearth("convert", src, "--out", str(tmp_path / "g"), "-q", "--target-bpw", "6", "--candidate-bits", bad,
                   "--calibration-data", str(calib), check=False)
        assert p.returncode == 2 and "--candidate-bits" in p.stderr.decode(), bad
    plan = tmp_path / "plan.json"
    for text, why in (("{", "line 1"), ('{"quantization": {"group_size": 64}}', "no quantization section")):
        plan.write_text(text)
        p = hearth("convert", src, "--out", str(tmp_path / "g"), "-q", "--plan", str(plan), check=False)
        assert p.returncode == 1 and why in p.stderr.decode() and "plan.json" in p.stderr.decode(), text
    p = hearth("convert", src, "--out", str(tmp_path / "g"), "--plan", str(plan), check=False)
    assert p.returncode == 2 and "--plan goes with -q" in p.stderr.decode()
    p = hearth("convert", src, "--out", str(tmp_path / "g"), "-q", "--target-bpw", "6", check=False)
    assert p.returncode == 2 and "--calibration-data" in p.stderr.decode()
    assert not (tmp_path / "g").exists()
    gguf = sorted(glob.glob(os.path.join(CACHE, "models", "*.gguf")))
    assert gguf, f"real GGUF models missing in {CACHE}/models: run tools/get_models.sh"
    p = hearth("convert", gguf[0], "--out", str(tmp_path / "d"), check=False)
    assert p.returncode == 1 and "GGUF input" in p.stderr.decode()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def parse_report(text):
    """hearth convert --target-bpw's table: (candidates as (bits, group)), module -> (params,
    KL per candidate, the chosen (bits, group))."""
    lines = text.splitlines()
    cands = [tuple(int(x) for x in c.split("@")[1].replace("-bit", "").split("/")) for c in lines[0].split()[2:-1]]
    rows = {}
    for line in lines[1:]:
        f = line.split()
        if len(f) == len(cands) + 3 and f[0].startswith(("model.", "lm_head")):
            rows[f[0]] = (float(f[1]), [float(x) for x in f[2:-1]], tuple(int(x) for x in f[-1].split("/")))
    return cands, rows


def unit_of(module):
    """hearth's measuring unit of a module: its transformer layer, else the module itself."""
    m = re.match(r"(.*?(?:^|\.)layers\.\d+)\.", module)
    return m.group(1) if m else module


def stored_bits(params, cand, scale_width=64):
    """A unit's bits at candidate (bits, group): the weights plus a scale and a bias per group
    (float32 ones, 64 bits a group, for the tiny float32 models)."""
    return int(params) * cand[0] + int(params) // cand[1] * scale_width


def exact_knapsack(cands, rows, spare_bits, fixed=None):
    """The least summed KL with the bits above the cheapest candidate within spare_bits: an
    exact dynamic program over whole bits (numpy), the oracle for hearth's gridded one.
    fixed: (unit, candidate) that unit must take."""
    best = np.zeros(int(spare_bits) + 1)
    for unit, (params, kl, _) in rows.items():
        nxt = np.full_like(best, np.inf)
        for c, k in zip(cands, kl):
            if fixed and unit == fixed[0] and c != fixed[1]:
                continue
            cost = stored_bits(params, c) - stored_bits(params, cands[0])
            if cost < len(best):
                nxt[cost:] = np.minimum(nxt[cost:], best[: len(best) - cost] + k)
        best = nxt
    return best[-1]


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-f32", "gemma3-f32"])
def test_target_bpw_beats_uniform_of_the_same_bytes(name, tmp_path):
    """--target-bpw 7 over widths 4/5/6/8 (f32 scales: 1 bit per weight at group 64) holds the
    budget of uniform 6-bit, records every choice in config.json, solves the knapsack over
    its measured sensitivities (against an exact numpy DP), and on held-out text adds less
    KL than uniform 6-bit (hearth perplexity --kl-divergence against the float model)."""
    src = tiny(name)
    words = "the a cat dog river blue quickly runs under bright data model token 42 hello world".split()
    rng = np.random.default_rng(5)
    calib, held = tmp_path / "calib.jsonl", tmp_path / "held.jsonl"
    for path in (calib, held):
        path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, rng.integers(3, 40)))}) + "\n"
                                for _ in range(120)))
    mixed, uniform = tmp_path / "mixed", tmp_path / "uniform"
    p = hearth("convert", src, "--out", str(mixed), "-q", "--target-bpw", "7", "--candidate-bits", "4,5,6,8",
               "--calibration-data", str(calib), "--n-calibration", "4", "--calibration-length", "64")
    cands, rows = parse_report(p.stdout.decode())
    assert cands == [(4, 64), (5, 64), (6, 64), (8, 64)] and rows
    q = json.load(open(mixed / "config.json"))["quantization"]
    widths = {k: v["bits"] for k, v in q.items() if isinstance(v, dict)}
    assert {k: rows[unit_of(k)][2][0] for k in widths} == widths  # every module at its unit's width
    assert sorted({unit_of(k) for k in widths}) == sorted(rows)
    # the budget, from the file itself: packed words + scales + biases over the weights' size
    t = tensors(mixed)
    bits = sum(t[k + s].nbytes * 8 for k in widths for s in (".weight", ".scales", ".biases"))
    params = sum(r[0] for r in rows.values())
    assert params == sum(t[k + ".scales"].size * 64 for k in widths)
    assert bits / params <= 7.0
    chosen = sum(r[1][cands.index(r[2])] for r in rows.values())
    # the plan is solved with the largest unit fixed at each of its candidates, and the plan
    # measured whole with the least KL is kept: the report lists each, the kept one least
    big = max(rows, key=lambda u: rows[u][0])
    whole = {tuple(int(x) for x in m[0].split("-bit/")): float(m[1])
             for m in re.findall(rf"plan with {re.escape(big)} at (\d+-bit/\d+): .* measured whole ([0-9.]+)",
                                 p.stdout.decode())}
    assert rows[big][2] in whole and whole[rows[big][2]] == min(whole.values()), whole
    opt = exact_knapsack(cands, rows, (7.0 - 5.0) * params, fixed=(big, rows[big][2]))
    # the exact optimum (the report's KLs are rounded to 1e-6: 22 of them, 1e-5 slack)
    assert chosen <= opt + 1e-5
    # mlx-lm loads the folder with each module at the width chosen for it
    from mlx_lm.utils import load

    model, _ = load(str(mixed))
    loaded = {k: mod.bits for k, mod in model.named_modules() if hasattr(mod, "bits")}
    assert loaded == widths
    hearth("convert", src, "--out", str(uniform), "-q", "--q-bits", "6")

    def kl(model):
        out = hearth("perplexity", str(model), "--data-path", str(held), "--sequence-length", "64", "--num-samples",
                     "6", "--kl-divergence", "--reference", src, "--json").stdout
        return json.loads(out)["kl_divergence"]["mean"]

    assert kl(mixed) < kl(uniform)


def test_target_bpw_candidates_open_by_group_size(tmp_path):
    """A candidate whose group size does not divide a module's input width is closed to that
    module's unit (the report shows "-" for it) and the unit takes one that fits; the modules
    quantized are those uniform -q quantizes at the smallest group, never fewer (the tiny
    llama: 64-wide inputs everywhere but down_proj's 128, so 4:128 fits no unit). The
    shapes come from the model's config.json and the output is read by mlx-lm."""
    import mlx.core as mx
    from mlx_lm.utils import load

    src = tiny("llama-f32")
    cfg = json.load(open(os.path.join(src, "config.json")))
    assert cfg["hidden_size"] % 128 and cfg["intermediate_size"] % 128 == 0  # the shapes this case needs
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"line {i}: the quick brown fox jumps over the lazy dog"}) + "\n"
                             for i in range(60)))
    mixed, uniform = tmp_path / "mixed", tmp_path / "uniform"
    # float32 scales: 4/128 is 4.5 bits per weight, 4/64 5, 8/64 9
    p = hearth("convert", src, "--out", str(mixed), "-q", "--target-bpw", "6", "--candidate-bits", "4:128,4,8",
               "--calibration-data", str(calib), "--n-calibration", "2", "--calibration-length", "32")
    lines = p.stdout.decode().splitlines()
    units = [line.split() for line in lines[1:] if line.startswith(("model.", "lm_head"))]
    assert units and all(u[2] == "-" and u[3] != "-" and u[4] != "-" for u in units), lines
    hearth("convert", src, "--out", str(uniform), "-q", "--q-bits", "4", "--q-group-size", "64")
    t, tu = tensors(mixed), tensors(uniform)
    assert sorted(k for k in t if k.endswith(".scales")) == sorted(k for k in tu if k.endswith(".scales"))
    model, _ = load(str(mixed))
    got = {k: m.group_size for k, m in model.named_modules() if hasattr(m, "bits")}
    assert got and set(got.values()) == {64}, got


def test_target_bpw_group_candidates_and_plan(tmp_path):
    """A candidate may name its group size ("4:32"): the report and config.json give each
    unit its (bits, group) and mlx-lm loads every module with them; each group's scale and
    bias are fitted (error-minimising), so every module dequantized by mlx (mx.dequantize)
    is at least as close to the float weights as mx.quantize's own at the same width and
    group, and closer summed over the model; --plan re-applies the recorded plan to the
    same bytes without measuring."""
    import mlx.core as mx
    from mlx_lm.utils import load

    src = tiny("llama-f32")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"line {i}: the quick brown fox jumps over the lazy dog"}) + "\n"
                             for i in range(60)))
    mixed = tmp_path / "mixed"
    # float32 scales: 4/64 is 5 bits per weight, 4/32 6, 8/64 9; a budget of 6 has room for some of each
    p = hearth("convert", src, "--out", str(mixed), "-q", "--target-bpw", "6", "--candidate-bits", "4,4:32,8",
               "--calibration-data", str(calib), "--n-calibration", "2", "--calibration-length", "32")
    cands, rows = parse_report(p.stdout.decode())
    assert cands == [(4, 64), (4, 32), (8, 64)]
    q = json.load(open(mixed / "config.json"))["quantization"]
    plan = {k: (v["bits"], v["group_size"]) for k, v in q.items() if isinstance(v, dict)}
    assert {k: rows[unit_of(k)][2] for k in plan} == plan
    assert len(set(plan.values())) > 1, plan
    model, _ = load(str(mixed))
    assert {k: (m.bits, m.group_size) for k, m in model.named_modules() if hasattr(m, "bits")} == plan

    t, floats = tensors(mixed), tensors(src)
    err_fit = err_mlx = 0.0
    for k, (bits, group) in plan.items():
        w = floats[k + ".weight"]
        mine = mx.dequantize(t[k + ".weight"], t[k + ".scales"], t[k + ".biases"], group_size=group, bits=bits)
        theirs = mx.dequantize(*mx.quantize(w, group_size=group, bits=bits), group_size=group, bits=bits)
        e_fit, e_mlx = mx.sum((mine - w) ** 2).item(), mx.sum((theirs - w) ** 2).item()
        assert e_fit <= e_mlx * (1 + 1e-5), k  # float32 sums of the same errors: 1e-5 relative
        err_fit, err_mlx = err_fit + e_fit, err_mlx + e_mlx
    assert err_fit < 0.95 * err_mlx

    again = tmp_path / "again"
    assert hearth("convert", src, "--out", str(again), "-q", "--plan", str(mixed / "config.json")).returncode == 0
    t2 = tensors(again)
    assert sorted(t2) == sorted(t) and all(np.array_equal(np.array(t2[k]), np.array(t[k])) for k in t)
