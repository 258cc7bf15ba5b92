"""tools/gpu_models.py, the random-weight benchmark models of the new families (Qwen3.5-9B,
Qwen3.5-35B-A3B, Qwen3-30B-A3B, Gemma-4-E4B, Gemma-4-26B-A4B; the CPU rows' Qwen3.5-0.8B and
Gemma-4-E2B), checked on the CPU.

Oracles: mlx-lm 0.32.2 builds each model from the written config.json and quantizes it
(lazily: at the real scale nothing is computed) — its tensor names and shapes must be the
writer's, at both scales; it loads the small files with strict weight loading and runs them.
gguf-py's tables for the architecture name every tensor and key the GGUF writer uses, and it
reads and dequantizes the small files; llama.cpp (llama-cpp-python, when its libraries are
built) loads them and gives finite logits. hearth runs every small file on the CPU, and its
decode byte count takes only a token's experts and the shared expert (from the file's tensor
sizes).
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_models as gm  # noqa: E402
from test_gguf_qwen35 import llama_cpp_python  # noqa: E402

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
GGUF_MODELS = [n for n, s in gm.MODELS.items() if s["gguf"]]
HEARTH_GGUF_MODELS = [n for n, s in gm.MODELS.items() if s["gguf"] in gm.HEARTH_GGUF]


def tokenizer_dir(name):
    d = os.path.join(CACHE, "tiny", gm.MODELS[name]["tok"])
    if not os.path.isfile(os.path.join(d, "tokenizer.json")):
        pytest.fail(f"{d} missing: run tools/make_tiny_models.py", pytrace=False)
    return d


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(name, "mlx" | "gguf") -> the small model's path, written on first use."""
    made = {}

    def get(name, fmt, **over):
        key = (name, fmt, json.dumps(over, sort_keys=True))
        if key not in made:
            d = tmp_path_factory.mktemp(name)
            if over:  # a variant of the small config
                gm.MODELS[name + "+"] = dict(gm.MODELS[name], small=dict(gm.MODELS[name]["small"], **over))
                name_ = name + "+"
            else:
                name_ = name
            try:
                if fmt == "mlx":
                    gm.write_mlx(name_, str(d / "m"), tokenizer_dir(name), "small", 1 << 20)
                    made[key] = str(d / "m")
                else:
                    gm.write_gguf(name_, str(d / "m.gguf"), "small", 1 << 20)
                    made[key] = str(d / "m.gguf")
            finally:
                gm.MODELS.pop(name + "+", None)
        return made[key]
    return get


def mlx_lm_manifest(config):
    """{name: shape} of the parameters mlx-lm 0.32.2 makes for this config, quantized as the
    config says (mlx arrays are lazy: a 35B model costs nothing here)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes, quantize_model

    config = json.loads(json.dumps(config))
    q = config.pop("quantization")
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16)
    model, _ = quantize_model(model, config, group_size=q["group_size"], bits=q["bits"])
    return {k: list(v.shape) for k, v in tree_flatten(model.parameters())}


@pytest.mark.parametrize("scale", ["small", "full"])
@pytest.mark.parametrize("name", list(gm.MODELS))
def test_mlx_tensors_are_mlx_lms(name, scale):
    c = gm.model_config(name, scale)
    ts = gm.mlx_tensors(c)
    ours = {n: shape for n, _, shape, _ in gm.mlx_layout(ts)}
    ref = mlx_lm_manifest(dict(c, quantization=gm.quantization_block(c, ts)))
    assert sorted(set(ref) - set(ours)) == [], "tensors mlx-lm has and the writer lacks"
    assert sorted(set(ours) - set(ref)) == [], "tensors the writer adds"
    assert {n: s for n, s in ours.items() if ref[n] != s} == {}, "shapes that differ"


def test_real_shapes_are_the_published_sizes():
    """The parameter counts the names promise (dense weights, all experts), from the shapes."""
    def params(name):
        return sum(int(np.prod(s)) for _, _, s in gm.mlx_tensors(gm.model_config(name)))
    # published totals: Qwen3.5-9B ~9.0e9 with its vision tower (the text part is ~8.9e9 here),
    # Qwen3-30B-A3B 30.5e9, Qwen3.5-35B-A3B ~35e9, Gemma-4-26B-A4B ~25-26e9 (text),
    # Gemma-4-E4B ~7.9e9 with the per-layer tables (4e9 "effective"), Qwen3.5-0.8B ~0.85e9 with its
    # vision tower (0.75e9 text), Gemma-4-E2B ~5.1e9 with vision and audio (2.3e9 "effective")
    for name, lo, hi in (("qwen35_9b", 8.5e9, 9.7e9), ("qwen3_30b_a3b", 30.0e9, 31.0e9),
                         ("qwen35_35b_a3b", 33e9, 36e9), ("gemma4_26b_a4b", 24e9, 27e9),
                         ("gemma4_e4b", 6.5e9, 8.5e9), ("qwen35_0_8b", 0.7e9, 0.85e9), ("gemma4_e2b", 4.2e9, 5.1e9)):
        assert lo < params(name) < hi, (name, params(name))


@pytest.mark.parametrize("name", list(gm.MODELS))
def test_small_mlx_model_loads_and_runs_in_mlx_lm(small, name):
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(small(name, "mlx"))  # strict: every tensor named and shaped as mlx-lm wants
    # Run in float32 (the 4-bit words stay as written; their bf16 scales and the bf16 norms
    # are up-cast exactly): mlx's CPU quantized matmul is ~10x slower with bf16 activations
    # (12 s against ~1 s for gemma4_e4b's 160 tokens), and bf16 has float32's exponent
    # range, so whether the logits are finite and of sane spread does not depend on it.
    model.set_dtype(mx.float32)
    logits = model(mx.array([[1, 2, 3, 4, 5, 6, 7, 8] * 20]))
    assert logits.shape == (1, 160, gm.model_config(name, "small")["vocab_size"])
    assert bool(mx.all(mx.isfinite(logits)).item())
    # std ~0.02 weights keep the activations sane through every layer (not collapsed to 0)
    assert 0.01 < float(mx.std(logits.astype(mx.float32)).item()) < 10


def gguf_names(arch, n_layers):
    import gguf

    a = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = set()
    for t in gguf.MODEL_TENSORS[a]:
        pattern = gguf.TENSOR_NAMES[t]
        for i in range(n_layers) if "{bid}" in pattern else [None]:
            names.add(pattern.format(bid=i))
    return names


@pytest.mark.parametrize("name", GGUF_MODELS)
@pytest.mark.parametrize("scale", ["small", "full"])
def test_gguf_names_and_keys_are_gguf_pys(name, scale):
    """Every tensor is one gguf-py lists for the architecture (with .weight/.bias), every
    architecture key is one of gguf-py's key patterns."""
    import gguf

    c = gm.model_config(name, scale)
    arch = gm.MODELS[name]["gguf"]
    allowed = gguf_names(arch, c["num_hidden_layers"])
    for n, _, _ in gm.gguf_tensors(c, arch):
        base = n.rsplit(".", 1)[0] if n.endswith((".weight", ".bias", ".scale")) else n
        assert base in allowed, n
    patterns = set()
    for group in (gguf.Keys.General, gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope, gguf.Keys.SSM,
                  gguf.Keys.Tokenizer):
        patterns |= {v.replace("{arch}", arch) for k, v in vars(group).items()
                     if isinstance(v, str) and not k.startswith("_")}
    keys = []
    for item in gm.gguf_meta(c, arch, name).items:
        (n,) = struct.unpack_from("<Q", item)
        keys.append(item[8:8 + n].decode())
    assert [k for k in keys if k not in patterns] == []


@pytest.mark.parametrize("name", GGUF_MODELS)
def test_small_gguf_reads_in_gguf_py(small, name):
    import gguf

    r = gguf.GGUFReader(small(name, "gguf"))
    c = gm.model_config(name, "small")
    assert r.fields["general.architecture"].contents() == gm.MODELS[name]["gguf"]
    types = {t.tensor_type for t in r.tensors}
    assert gguf.GGMLQuantizationType.Q4_K in types and gguf.GGMLQuantizationType.Q6_K in types
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(w).all(), t.name
        if t.name.endswith("ssm_a"):
            assert (w < 0).all()  # -exp(A_log): hearth and llama.cpp both need it negative
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_K:
            assert 0.005 < w.std() < 0.1, t.name
    assert sum(1 for t in r.tensors if t.name.startswith("blk.0.")) > 5
    assert r.fields[f"{gm.MODELS[name]['gguf']}.block_count"].contents() == c["num_hidden_layers"]


LLAMA_CODE = r"""
import sys
import numpy as np
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, logits_all=True, verbose=False, n_threads=1)
m.eval(list(range(3, 40)))
s = np.array(m.scores[:37])
print(np.isfinite(s).all(), float(s.std()))
"""


@pytest.mark.parametrize("name", GGUF_MODELS)
def test_small_gguf_runs_in_llama_cpp(small, name):
    """llama.cpp reads the file as its architecture (the same writer makes the file llama-bench
    measures on the GPU)."""
    py, env = llama_cpp_python()
    p = subprocess.run([py, "-c", LLAMA_CODE, small(name, "gguf")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    finite, std = p.stdout.split()
    assert finite == "True" and float(std) > 0


def hearth_bench(path):
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"no hearth binary at {BIN}", pytrace=False)
    p = subprocess.run([BIN, "bench", path, "--device", "cpu", "-p", "48", "-n", "8", "-r", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,fmt", [(n, "mlx") for n in gm.MODELS] + [(n, "gguf") for n in HEARTH_GGUF_MODELS])
def test_small_model_runs_in_hearth(small, name, fmt):
    j = hearth_bench(small(name, fmt))
    assert j["decode_tps"] > 0 and j["prefill_tps"] > 0 and j["decode_bytes_per_token"] > 0


def st_bytes(path, part):
    """Bytes of the safetensors tensors whose names contain `part`."""
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__" and part in k)


def test_decode_bytes_count_a_tokens_experts_and_the_shared_expert(small):
    """The roofline's bytes per token (hearth bench --json, the same count as hearth fit): a
    model with twice the experts at the same top-k reads only its larger router more; a
    model with a wider shared expert reads all of that expert's extra bytes."""
    base = small("qwen35_35b_a3b", "mlx")
    more = small("qwen35_35b_a3b", "mlx", num_experts=16)
    wide = small("qwen35_35b_a3b", "mlx", shared_expert_intermediate_size=512)
    b0, b1, b2 = (hearth_bench(p)["decode_bytes_per_token"] for p in (base, more, wide))
    router = st_bytes(more, "mlp.gate.") - st_bytes(base, "mlp.gate.")
    assert st_bytes(more, "switch_mlp") == 2 * st_bytes(base, "switch_mlp")
    assert b1 - b0 == pytest.approx(router)
    shared = st_bytes(wide, "mlp.shared_expert.") - st_bytes(base, "mlp.shared_expert.")
    assert shared > 0 and b2 - b0 == pytest.approx(shared)


def run_phase(tmp_path, device):
    env = dict(os.environ, H=BIN, NF_DEVICE=device, NF_SCALE="small", NF_PREFILL="96", NF_CTX="32", NF_GEN="8",
               NF_REPS="1", NF_DIR=str(tmp_path / "models"), NF_MODELS="qwen35_35b_a3b gemma4_26b_a4b",
               LLAMA_SERVER_DIR=str(tmp_path / "llama"), PHASE_BUDGET="240", TINY=os.path.join(CACHE, "tiny"),
               # no llama.cpp build (minutes of a 2-core CI) where a developer's tree has the sources
               LLAMACPP_SRC_TGZ=str(tmp_path / "no-llamacpp-src.tgz"),
               PATH=os.pathsep.join([os.path.join(REPO, ".venv", "bin"), os.environ["PATH"]]))
    env.pop("OUT", None)
    log = tmp_path / "log"
    pre = subprocess.Popen([os.path.join(REPO, "tools", "gpu_run.d", "newfam-bench.pre.sh"), str(log)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p = subprocess.run([os.path.join(REPO, "tools", "gpu_run.d", "newfam-bench.sh"), str(log)], env=env,
                           capture_output=True, text=True, timeout=300)
    finally:
        pre.wait(timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import results_file
    return p.stdout, results_file.read(str(log / "cuda_newfam.md"))["rows"], os.listdir(tmp_path / "models")


def test_phase_dry_run_on_the_cpu(tmp_path):
    """tools/gpu_run.d/newfam-bench.sh with a CPU hearth and the small models: its models are
    written by the .pre.sh, measured, deleted, and every (model, format) has a row."""
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"no hearth binary at {BIN}", pytrace=False)
    out, rows, left = run_phase(tmp_path, "cpu")
    got = {(r["model"], r["format"]): r for r in rows}
    assert set(got) == {("qwen35_35b_a3b", "gguf"), ("qwen35_35b_a3b", "mlx"), ("gemma4_26b_a4b", "gguf"),
                        ("gemma4_26b_a4b", "mlx")}
    rows = list(got.values())
    for r in rows:
        assert r["status"] == "ok" and r["decode_tps"] > 0 and r["prefill_tps"] > 0, r
        assert r["gen_tokens"] == 8 and r["decode_context"] == 32 and r["prefill_tokens"] == 96
        assert 0 < r["roofline_fraction"] and 0 < r["load_s"] < 60
    assert "| qwen35_35b_a3b | mlx |" in out
    assert not [f for f in left if not f.endswith((".ready", ".gone"))], "models left on the disk"


def test_phase_prints_a_refusal_as_the_row(tmp_path):
    """A model hearth refuses on the device (here: --device cuda on a build without CUDA) is a
    row 'refused: <message>', not a crash."""
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"no hearth binary at {BIN}", pytrace=False)
    if "cuda" in subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.lower():
        pytest.skip("this hearth has the CUDA backend: the refusal case needs a CPU-only build")
    out, rows, _ = run_phase(tmp_path, "cuda")
    assert len(rows) == 4
    for r in rows:
        assert r["status"].startswith("refused: "), r
        assert "cuda" in r["status"], r
    assert out.count("| refused: ") == 8  # as each row finishes, and the table again at the end


@pytest.mark.parametrize("rc,status", [("2", "refused: "), ("124", "timed out: "), ("139", "crashed (signal 11): ")])
def test_a_row_says_why_a_run_gave_no_result(tmp_path, rc, status):
    sys.path.insert(0, os.path.join(REPO, "bench", "cuda"))
    import newfam_rows

    for kind in ("decode", "prefill"):
        (tmp_path / f"qwen35_9b-mlx.{kind}.json").write_text("")
        (tmp_path / f"qwen35_9b-mlx.{kind}.log").write_text("loading\nhearth: the reason\n")
        (tmp_path / f"qwen35_9b-mlx.{kind}.rc").write_text(rc + "\n")
    r = newfam_rows.row(str(tmp_path), "qwen35_9b", "mlx")
    assert r["status"] == status + "the reason"
    assert newfam_rows.line(r).startswith(f"| qwen35_9b | mlx | {status}the reason |")
