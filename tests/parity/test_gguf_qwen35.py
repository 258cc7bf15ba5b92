"""Qwen3.5 (dense and MoE) and Qwen3-MoE from GGUF, as llama.cpp's converter writes them
(architectures qwen35, qwen35moe, qwen3moe).

The tiny qwen3_5-f32 / qwen3_5_moe-f32 / qwen3_moe-f32 models (mlx-lm's weights) are written
to GGUF here with the `gguf` package, doing what llama.cpp's convert_hf_to_gguf.py
(conversion/qwen.py: Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3MoeModel in the llama.cpp
vendored by llama-cpp-python 0.3.36) does to a Hugging Face checkpoint: A_log stored as
ssm_a = -exp(A_log), the conv1d kernel squeezed, the norms with 1 added (mlx-lm's weights
already hold that sum), the value heads reordered from grouped-by-key-head to tiled
(_LinearAttentionVReorderBase) in every tensor that carries them, the experts stacked
[experts, rows, cols], routers, norms and the conv kernel left in F32. Tensor names and
metadata keys are gguf-py's for those architectures.

Oracles: llama.cpp itself (llama-cpp-python on the libraries bench/cpu_vs_llamacpp builds,
LLAMA_CPP_LIB_PATH, default $HEARTH_CACHE/bench/llamacpp/lib) must give mlx-lm's golden
logits from the f32 files, which shows each file is what llama.cpp means by its
architecture; then hearth must give the same logits and greedy tokens from it, and agree
with llama.cpp on Q8_0 files. Without llama.cpp's libraries those tests skip; hearth's
comparison with the mlx-lm goldens still runs.
"""
import json
import os
import subprocess

import numpy as np
import pytest

CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
MODEL = os.path.join(CACHE, "tiny", "qwen3_5-f32")
# realpath: the test cache links to the real one, and libllama finds libggml beside itself
LLAMA_LIB = os.path.realpath(os.environ.get("LLAMA_CPP_LIB_PATH", os.path.join(CACHE, "bench", "llamacpp", "lib")))
# the reference tier's bound (test_forward_parity.REF_TOL); llama.cpp's f32 CPU path (f32
# KV cache) sums in another order: both measured 5.3e-6 from the golden on this model
REF_TOL = 2e-3
LLAMA_TOL = 1e-4
# Q8_0: llama.cpp multiplies int8 weights by int8-quantized activations; hearth's reference
# tier uses the exact dequantized weights with float32 activations, its fast tier int8 ones
# per 32 values as llama.cpp. Measured worst over the 4 prompts (top logits ~10): qwen35
# 1.3e-2 (reference) / 2.0e-2 (fast), qwen35moe 4.1e-2 / 1.2e-2 (its routers stay F32, as the
# converter leaves them, but near-equal expert scores move with the activations); bound 0.1
Q8_TOL = 0.1


def reorder_v_heads(x, axis, n_k, per_k, head_dim):
    """convert_hf_to_gguf's _reorder_v_heads: along `axis`, [k0: v0..v(r-1), k1: ...] ->
    [v0 of k0, v0 of k1, ..., v1 of k0, ...]."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(n_k, per_k, head_dim, *rest).swapaxes(0, 1).reshape(n_k * per_k * head_dim, *rest)
    return np.moveaxis(x, 0, axis)


ARCH = {"qwen3_5-f32": "qwen35", "qwen3_5_moe-f32": "qwen35moe", "qwen3_moe-f32": "qwen3moe"}


def write_gguf(path, outtype, tweak=None, model="qwen3_5-f32"):
    """outtype "f32", or "q8_0": the matrices the converter's --outtype q8_0 quantizes in Q8_0
    (gguf.quants, the numpy port of ggml's quantizer).
    tweak(what, value) -> value changes the file for the bad-input cases."""
    import gguf
    import mlx.core as mx

    src = os.path.join(CACHE, "tiny", model)
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(os.path.join(src, "model.safetensors")).items()}
    w = {k.replace("language_model.", "", 1): v for k, v in w.items()}
    tweak = tweak or (lambda what, value: value)
    n_layers, hd = cfg["num_hidden_layers"], cfg["head_dim"]
    hybrid = "linear_num_key_heads" in cfg
    rp = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0)}

    g = gguf.GGUFWriter(path, tweak("arch", ARCH[model]))
    g.add_block_count(n_layers)
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_key_length(hd)
    g.add_value_length(hd)
    g.add_rope_freq_base(rp["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "num_experts" in cfg:
        g.add_expert_count(cfg["num_experts"])
        g.add_expert_used_count(cfg["num_experts_per_tok"])
        g.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            g.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if hybrid:
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        r = nv // nk
        g.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        g.add_ssm_state_size(dk)
        g.add_ssm_group_count(nk)
        g.add_ssm_time_step_rank(nv)
        g.add_ssm_inner_size(dv * nv)
        g.add_full_attention_interval(cfg["full_attention_interval"])
        g.add_array(f"{ARCH[model]}.attention.recurrent_layers", [t == "linear_attention" for t in cfg["layer_types"]])
        g.add_rope_dimension_count(int(hd * rp["partial_rotary_factor"]))
        g.add_rope_dimension_sections(list(rp["mrope_section"]) + [0])
    g.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if outtype == "q8_0" else gguf.LlamaFileType.ALL_F32)

    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    vocab = dict(tok["model"]["vocab"])
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [None] * cfg["vocab_size"]
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("qwen2")
    g.add_token_list(tokens)
    g.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    g.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_add_bos_token(False)

    def t(name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        # the converter keeps 1-D tensors, norms, routers, the conv kernel and non-".weight"
        # tensors in F32 (conversion/base.py), quantizes the rest
        keep = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight", "_norm.weight")
        if outtype == "q8_0" and arr.ndim >= 2 and name.endswith(".weight") and not name.endswith(keep):
            q8 = gguf.GGMLQuantizationType.Q8_0
            g.add_tensor(name, gguf.quants.quantize(arr, q8), raw_dtype=q8)
        else:
            g.add_tensor(name, arr)

    t("token_embd.weight", w["model.embed_tokens.weight"])
    t("output_norm.weight", w["model.norm.weight"])
    t("output.weight", w["lm_head.weight"])
    for i in range(n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        # llama.cpp's qwen35 calls the MLP's norm post_attention_norm, qwen3moe ffn_norm
        t(b + ("post_attention_norm" if hybrid else "ffn_norm") + ".weight", w[p + "post_attention_layernorm.weight"])
        if p + "mlp.gate.weight" in w:
            m = p + "mlp."
            t(b + "ffn_gate_inp.weight", w[m + "gate.weight"])
            for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                t(b + gg + ".weight", w[m + "switch_mlp." + hf + ".weight"])
            if m + "shared_expert_gate.weight" in w:
                for hf, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"),
                               ("down_proj", "ffn_down_shexp")):
                    t(b + gg + ".weight", w[m + "shared_expert." + hf + ".weight"])
                t(b + "ffn_gate_inp_shexp.weight", w[m + "shared_expert_gate.weight"].reshape(-1))  # ggml {n_embd}
        else:
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                t(b + gg + ".weight", w[p + "mlp." + hf + ".weight"])
        la = p + "linear_attn."
        if la + "A_log" in w:
            qkv = w[la + "in_proj_qkv.weight"]
            qk = 2 * nk * dk
            t(b + "attn_qkv.weight", np.concatenate([qkv[:qk], reorder_v_heads(qkv[qk:], 0, nk, r, dv)]))
            t(b + "attn_gate.weight", reorder_v_heads(w[la + "in_proj_z.weight"], 0, nk, r, dv))
            t(b + "ssm_beta.weight", reorder_v_heads(w[la + "in_proj_b.weight"], 0, nk, r, 1))
            t(b + "ssm_alpha.weight", reorder_v_heads(w[la + "in_proj_a.weight"], 0, nk, r, 1))
            t(b + "ssm_a", reorder_v_heads(tweak("ssm_a", -np.exp(w[la + "A_log"])), 0, nk, r, 1))
            t(b + "ssm_dt.bias", reorder_v_heads(w[la + "dt_bias"], 0, nk, r, 1))
            conv = w[la + "conv1d.weight"].reshape(w[la + "conv1d.weight"].shape[0], -1)  # [C, K, 1] -> [C, K]
            t(b + "ssm_conv1d.weight", np.concatenate([conv[:qk], reorder_v_heads(conv[qk:], 0, nk, r, dv)]))
            t(b + "ssm_norm.weight", w[la + "norm.weight"])
            t(b + "ssm_out.weight", reorder_v_heads(w[la + "out_proj.weight"], 1, nk, r, dv))
        else:
            sa = p + "self_attn."
            for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"),
                           ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                t(b + gg + ".weight", w[sa + hf + ".weight"])
    tweak("kv", g.kv_data[0])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def gguf_maker(tmp_path_factory, write):
    """get(model, outtype) -> the path of that tiny model's GGUF, written by
    write(path, outtype, model=...) on first use."""
    made = {}

    def get(model, outtype):
        if (model, outtype) not in made:
            if not os.path.isfile(os.path.join(CACHE, "tiny", model, "config.json")):
                pytest.fail(f"{model} missing: run tools/make_tiny_models.py", pytrace=False)
            made[model, outtype] = str(tmp_path_factory.mktemp("gguf") / f"{model}-{outtype}.gguf")
            write(made[model, outtype], outtype, model=model)
        return made[model, outtype]
    return get


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """{(model, outtype): path}, written on first use."""
    return gguf_maker(tmp_path_factory, write_gguf)


def golden_prompts(model="qwen3_5-f32"):
    return json.load(open(os.path.join(REPO, "tests", "parity", "goldens", f"{model}.json")))["prompts"]


def diff(golden_row, ours_top):
    ours = dict((i, v) for i, v in ours_top)
    return max(abs(ours[i] - v) for i, v in zip(golden_row["top_ids"], golden_row["top_logits"]) if i in ours)


LLAMA_CODE = r"""
import json, sys
import numpy as np
import llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=512, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0)
out = []
for ids in json.loads(sys.stdin.read()):
    m.reset()
    m.eval(ids)
    rows = np.array(m.scores[len(ids) - 4:len(ids)])
    out.append([[[int(i), float(r[i])] for i in np.argsort(-r)[:20]] for r in rows])
print(json.dumps(out))
"""


def llama_cpp_tops(path, prompts):
    """llama.cpp's top-20 logits at each prompt's last 4 positions (f32 KV cache)."""
    return llama_cpp_run(LLAMA_CODE, path, [q["ids"] for q in prompts])


def llama_cpp_python():
    """(the .venv python that has llama-cpp-python, the environment that points it at the
    llama.cpp libraries in LLAMA_LIB); skips the test without either."""
    if not os.path.isfile(os.path.join(LLAMA_LIB, "libllama.so")):
        pytest.skip(f"llama.cpp libraries not in {LLAMA_LIB}: run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    venv_python = os.path.join(REPO, ".venv", "bin", "python")
    if subprocess.run([venv_python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('llama_cpp') is None)"]
                      ).returncode:
        pytest.skip("llama-cpp-python is not installed in .venv: run bench/cpu_vs_llamacpp/install_llamacpp.sh")
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=LLAMA_LIB,  # libllama's RUNPATH names its build folder, not this one
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [LLAMA_LIB, os.environ.get("LD_LIBRARY_PATH")])))
    return venv_python, env


def llama_cpp_run(code, path, payload):
    """Runs `code` (python, argv[1] = path, payload as JSON on stdin) with llama-cpp-python on
    the llama.cpp libraries in LLAMA_LIB; returns its stdout as JSON. Skips without them."""
    venv_python, env = llama_cpp_python()
    p = subprocess.run([venv_python, "-c", code, path], input=json.dumps(payload), capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def hearth_trace(path, q, level="scalar"):
    env = dict(os.environ)
    if level:
        env["HEARTH_CPU"] = level
    p = subprocess.run([BIN, "trace", path, "--ids", json.dumps(q["ids"]), "--last", "4", "--top", "20",
                        "--steps", str(len(q["greedy_ids"]) - 1), "--step-top", "5", "--threads", "2"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("model", list(ARCH))
def test_llama_cpp_reads_the_file_as_mlx_lm_computes(gguf_files, model):
    """The oracle for the file: llama.cpp's logits at the golden prompts' last positions."""
    if model == "qwen3_moe-f32":
        pytest.skip("the tiny qwen3_moe has a dense layer (mlp_only_layers), which llama.cpp's qwen3moe cannot load; "
                    "its expert tensors are the ones qwen3_5_moe-f32 checks")
    worst = llama_cpp_beside_goldens(gguf_files(model, "f32"), golden_prompts(model))
    print(f"\n{ARCH[model]} f32 GGUF: worst |llama.cpp - mlx-lm golden| {worst:.2e}")
    assert worst < LLAMA_TOL


def llama_cpp_beside_goldens(path, prompts):
    """llama.cpp on the file: the goldens' best token at each prompt's last positions
    (asserted); returns the worst gap over the goldens' top logits."""
    worst = 0.0
    for q, rows in zip(prompts, llama_cpp_tops(path, prompts)):
        for gl, ours in zip(q["last_logits"], rows):
            assert ours[0][0] == gl["top_ids"][0], (q["name"], gl["position"])
            worst = max(worst, diff(gl, ours))
    return worst


def hearth_beside_golden(path, q):
    """hearth's reference tier on the file for golden prompt q: its greedy tokens (asserted
    equal) and (the trace, the worst gap over the golden's top logits)."""
    out, worst = hearth_trace(path, q), 0.0
    for gl, ol in zip(q["last_logits"], out["prompt"]):
        assert gl["position"] == ol["pos"]
        worst = max(worst, diff(gl, ol["top"]))
    ours = [s["token"] for s in out["steps"]] + [out["steps"][-1]["top"][0][0]]
    assert ours == q["greedy_ids"], (q["name"], ours, q["greedy_ids"])
    return out, worst


@pytest.mark.parametrize("model", list(ARCH))
def test_hearth_reads_the_file_as_mlx_lm_computes(gguf_files, model):
    """hearth on the GGUF: the golden's logits (reference tier) and its greedy tokens."""
    worst = max(hearth_beside_golden(gguf_files(model, "f32"), q)[1] for q in golden_prompts(model))
    print(f"\n{ARCH[model]} f32 GGUF: worst |hearth - mlx-lm golden| {worst:.2e}")
    assert worst < REF_TOL


@pytest.mark.parametrize("model", ["qwen3_5-f32", "qwen3_5_moe-f32"])
@pytest.mark.parametrize("level", ["scalar", None], ids=["reference", "fast"])
def test_q8_0_file_hearth_equals_llama_cpp(gguf_files, level, model):
    """A Q8_0 file: hearth's logits (both tiers) beside llama.cpp's on the same file, same
    best token at every compared position."""
    worst = hearth_beside_llama_cpp(gguf_files(model, "q8_0"), golden_prompts(model), level)
    print(f"\n{ARCH[model]} Q8_0 GGUF, {level or 'fast'} tier: worst |hearth - llama.cpp| over the top-5 logits "
          f"{worst:.2e}")
    assert worst < Q8_TOL


def hearth_beside_llama_cpp(path, prompts, level, llama_path=None):
    """hearth (tier `level`) on a file and llama.cpp on it (or on llama_path): the same best
    token at each prompt's last 4 positions (asserted); returns the worst gap over llama.cpp's
    top-5 logits."""
    worst = 0.0
    for q, rows in zip(prompts, llama_cpp_tops(llama_path or path, prompts)):
        out = hearth_trace(path, q, level)
        for lrow, ol in zip(rows, out["prompt"]):
            ours = dict((i, v) for i, v in ol["top"])
            assert ol["top"][0][0] == lrow[0][0], (q["name"], ol["pos"], ol["top"][:3], lrow[:3])
            worst = max([worst] + [abs(ours[i] - v) for i, v in lrow[:5] if i in ours])
    return worst


def flip_first_recurrent(kv):
    v = kv["qwen35.attention.recurrent_layers"]
    v.value[0] = not v.value[0]


BAD = {  # name: (what: value -> value, the words the error must hold)
    "no ssm.group_count": ({"kv": lambda kv: kv.pop("qwen35.ssm.group_count")}, "qwen35.ssm.group_count"),
    "recurrent_layers against the interval": ({"kv": flip_first_recurrent}, "recurrent_layers[0] disagrees"),
    "value heads not a multiple": ({"kv": lambda kv: kv.__setitem__("qwen35.ssm.group_count", type(
        kv["qwen35.ssm.group_count"])(3, kv["qwen35.ssm.group_count"].type))}, "linear attention is inconsistent"),
    "positive ssm_a": ({"ssm_a": lambda a: -a}, "must be negative"),
    "qwen35moe without experts": ({"arch": lambda a: "qwen35moe"}, "needs the integer key 'qwen35moe.expert_count'"),
    "qwen35 keys under gemma4": ({"arch": lambda a: "gemma4"}, "gemma4.attention.sliding_window_pattern"),
    "an unknown architecture": ({"arch": lambda a: "gemma9"}, "architecture 'gemma9' is not supported"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_qwen35_gguf_is_refused(tmp_path, name):
    """A qwen35 GGUF hearth cannot run names what is wrong (the key, tensor or architecture)."""
    if not os.path.isfile(os.path.join(MODEL, "config.json")):
        pytest.fail(f"{MODEL} missing: run tools/make_tiny_models.py", pytrace=False)
    changes, expect = BAD[name]
    p = hearth_on_bad_file(str(tmp_path / "bad.gguf"), write_gguf, changes)
    assert p.returncode != 0 and expect in p.stderr, p.stderr


def hearth_on_bad_file(path, write, changes, **kw):
    """Writes an f32 file through write(path, "f32", tweak=..., **kw) with changes ({what:
    value -> value}; "kv" changes the metadata dict in place) and runs hearth on it."""
    def tweak(what, value):
        f = changes.get(what)
        if f is None:
            return value
        out = f(value)
        return value if what == "kv" else out

    write(path, "f32", tweak=tweak, **kw)
    return subprocess.run([BIN, "trace", path, "--ids", "[1, 2, 3]", "--last", "1"], capture_output=True, text=True,
                          timeout=120)
