"""hearth convert --outtype q6_k | q4_k_m: every tensor byte-identical to llama.cpp's quantizer.

The oracle is llama.cpp itself: llama_model_quantize (ctypes, default parameters, no
importance matrix) on the F32 GGUF hearth writes of the same model, which picks each
tensor's type (Q6_K / Q4_K, Q6_K for the output and Q4_K_M's use_more_bits layers, Q8_0 /
Q5_0 / F16 fallbacks for rows not in 256-blocks) and quantizes it. Where llama.cpp's libraries
are absent (CI) that test skips, and the golden test compares with the sha256 llama.cpp gave
(tools/make_kquant_goldens.py wrote tests/parity/data/kquant_sha256.json). Models: the tiny qwen3
(hidden 128: most rows fall back; ffn_down's 256 is K-quantized), the tiny llama (tied
embeddings: token_embd takes the output's type) and a 256/512-wide probe model of edge rows
(kquant_oracle.kquant_model).
"""
import json
import os

import numpy as np
import pytest
from kquant_oracle import CACHE, digests, have_llama_cpp, kquant_model, llama_quantize, tensor_bytes, LLAMA_LIB
from test_convert import hearth

TINY = os.path.join(CACHE, "tiny")
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "kquant_sha256.json")
MODELS = ["qwen3-f32", "llama-f32", "probe"]
CASES = [(m, t) for m in MODELS for t in ("q6_k", "q4_k_m")]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """model name -> (float folder, hearth's F32 GGUF of it)."""
    d = tmp_path_factory.mktemp("kquant")
    if not os.path.isfile(os.path.join(TINY, "qwen3-f32", "config.json")):
        pytest.fail(f"{TINY} missing: run tools/get_models.sh", pytrace=False)
    out = {}
    for name in MODELS:
        src = kquant_model(str(d / "probe"), os.path.join(TINY, "qwen3-f32")) if name == "probe" else os.path.join(
            TINY, name)
        f32 = str(d / f"{name}.gguf")
        hearth("convert", src, "--out", f32, "--outtype", "f32")
        out[name] = (src, f32)
    return out


def convert(src, outtype, tmp_path, threads=None):
    out = str(tmp_path / f"hearth-{outtype}-{threads}.gguf")
    hearth("convert", src, "--out", out, "--outtype", outtype, *(["--threads", str(threads)] if threads else []))
    return out


@pytest.mark.parametrize("name,outtype", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_kquant_tensors_equal_llama_cpp(sources, name, outtype, tmp_path):
    if not have_llama_cpp():
        pytest.skip(f"llama.cpp libraries not in {LLAMA_LIB}: run bench/cpu_vs_llamacpp/install_llamacpp.sh "
                    "(test_kquant_tensors_match_goldens checks the same bytes by their recorded sha256)")
    src, f32 = sources[name]
    want_path = str(tmp_path / f"llama-{outtype}.gguf")
    llama_quantize(f32, want_path, outtype)
    got, want = tensor_bytes(convert(src, outtype, tmp_path)), tensor_bytes(want_path)
    assert sorted(got) == sorted(want)
    for t in want:
        assert got[t][0] == want[t][0], f"{t}: hearth wrote {got[t][0]}, llama.cpp {want[t][0]}"
        assert got[t][1] == want[t][1], f"{t} ({want[t][0]}): bytes differ from llama.cpp's"
    kinds = {k for k, _ in want.values()}
    if name != "llama-f32":  # the tiny llama's rows (64, 128) all fall back; the others hold K-quants
        assert "Q6_K" in kinds and (outtype == "q6_k" or "Q4_K" in kinds), kinds


@pytest.mark.parametrize("name,outtype", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_kquant_tensors_match_goldens(sources, name, outtype, tmp_path):
    golden = json.load(open(GOLDENS))[name]
    src, f32 = sources[name]
    if digests(f32) != golden["source"]:
        pytest.skip(f"{src}: float weights differ from those the goldens were made from "
                    "(rerun tools/make_kquant_goldens.py with llama.cpp)")
    for threads in (None, 1, 3):  # tensors are split over threads by whole blocks: the same bytes
        got = digests(convert(src, outtype, tmp_path, threads))
        assert sorted(got) == sorted(golden[outtype])
        for t, want in golden[outtype].items():
            assert got[t] == want, f"{t} (--threads {threads}): hearth {got[t]}, llama.cpp {want}"


@pytest.mark.parametrize("outtype,bound", [("q6_k", 0.02), ("q4_k_m", 0.12)])
def test_kquant_dequantizes_close_to_the_source(sources, outtype, bound, tmp_path):
    """Sanity, not the oracle: the gguf package's dequantizer gives back each probe tensor
    within a relative RMS error typical of the type (6-bit ~1%, 4-bit ~8%: a uniform step of
    range/63 or range/15 has RMS step/sqrt(12))."""
    import gguf
    from gguf.quants import dequantize

    src, f32 = sources["probe"]
    want = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(f32).tensors}
    for t in gguf.GGUFReader(convert(src, outtype, tmp_path)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue
        x = want[t.name].reshape(-1)
        y = dequantize(np.asarray(t.data), t.tensor_type).reshape(-1)
        rel = np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x ** 2))
        assert rel < bound, f"{t.name} ({t.tensor_type.name}): relative RMS error {rel:.4f}"


def test_kquant_file_type_and_refusals(sources, tmp_path):
    import gguf

    src, _ = sources["qwen3-f32"]
    for outtype, ftype in (("q6_k", 18), ("q4_k_m", 15)):  # llama.h's LLAMA_FTYPE_MOSTLY_*
        r = gguf.GGUFReader(convert(src, outtype, tmp_path))
        assert r.fields["general.file_type"].contents() == ftype
        assert r.fields["general.quantization_version"].contents() == 2
    p = hearth("convert", src, "--out", str(tmp_path / "x.gguf"), "--outtype", "q4_k_s", check=False)
    assert p.returncode == 1 and "q6_k, q4_k_m" in p.stderr.decode() and not (tmp_path / "x.gguf").exists()
