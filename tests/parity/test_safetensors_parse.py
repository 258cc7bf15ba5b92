"""Parity: hearth's safetensors catalog (src/io/safetensors.c, through st_set_open)
against two independent readers: the `safetensors` package (numpy) and mx.load.

For every tensor, name, dtype, shape and the exact bytes at hearth's offset must match
what the oracle returns. Covers files written by safetensors.numpy (every numpy dtype,
scalars, empty tensors, a sharded set with an index) and mlx (bf16), plus the real
models in the hearth cache (all-MiniLM-L6-v2, the tiny models made by tools/).
"""
import json
import os
import pathlib
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from test_mlx_dequant import helper  # noqa: F401  (the compiled st_dequant fixture)

CACHE = pathlib.Path(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")))
ST_NAMES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
            "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16",
            "uint8": "U8", "bool": "BOOL"}


def hearth_catalog(helper, model_dir):
    r = subprocess.run([str(helper), "--list", str(model_dir)], capture_output=True, text=True)
    assert r.returncode == 0, f"st_set_open({model_dir}) failed: {r.stderr}"
    cat = {}
    for line in r.stdout.splitlines():
        name, dtype, shape, fname, off, nbytes = line.split()
        shape = () if shape == "-" else tuple(int(x) for x in shape.split(","))
        assert name not in cat, f"{name} listed twice"
        cat[name] = (dtype, shape, fname, int(off), int(nbytes))
    return cat


def file_bytes(model_dir, fname, off, nbytes, _cache={}):
    path = str(pathlib.Path(model_dir) / fname)
    if path not in _cache:
        _cache[path] = pathlib.Path(path).read_bytes()
    return _cache[path][off:off + nbytes]


def mlx_oracle(files):
    """name -> (dtype name, shape, raw bytes) from mx.load."""
    out = {}
    for f in files:
        for name, a in mx.load(str(f)).items():
            dname = str(a.dtype).split(".")[-1]
            raw = np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)
            out[name] = (ST_NAMES[dname], tuple(a.shape), raw.tobytes())
    return out


def numpy_oracle(files):
    out = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as sf:
            for name in sf.keys():
                a = sf.get_tensor(name)
                out[name] = (ST_NAMES[str(a.dtype)], tuple(a.shape), a.tobytes())
    return out


def compare(helper, model_dir, oracle):
    cat = hearth_catalog(helper, model_dir)
    assert set(cat) == set(oracle), f"names differ: {sorted(set(cat) ^ set(oracle))[:10]}"
    for name, (dtype, shape, raw) in oracle.items():
        hd, hs, fname, off, nbytes = cat[name]
        assert (hd, hs) == (dtype, shape), f"{name}: hearth {hd}{list(hs)}, oracle {dtype}{list(shape)}"
        assert nbytes == len(raw), f"{name}: {nbytes} bytes, oracle {len(raw)}"
        assert file_bytes(model_dir, fname, off, nbytes) == raw, f"{name}: bytes differ"
    return len(cat)


def test_every_numpy_dtype_sharded(helper, tmp_path):
    rng = np.random.default_rng(5)
    shard1 = {f"t.{d}": (rng.standard_normal((3, 5)) * 100).astype(d)
              for d in ("float64", "float32", "float16", "int64", "int32", "int16", "int8")}
    shard2 = {f"t.{d}": rng.integers(0, 200, size=(2, 1, 3)).astype(d) for d in ("uint64", "uint32", "uint16", "uint8")}
    shard2["t.bool"] = rng.integers(0, 2, size=(7,)).astype(bool)
    shard2["t.scalar"] = np.array(3.5, dtype=np.float32)
    shard2["t.empty"] = np.zeros((0, 4), dtype=np.float32)
    save_file(shard1, str(tmp_path / "model-00001-of-00002.safetensors"), metadata={"format": "np"})
    save_file(shard2, str(tmp_path / "model-00002-of-00002.safetensors"))
    wm = {k: "model-00001-of-00002.safetensors" for k in shard1}
    wm.update({k: "model-00002-of-00002.safetensors" for k in shard2})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    files = sorted(tmp_path.glob("*.safetensors"))
    assert compare(helper, tmp_path, numpy_oracle(files)) == len(wm)


def test_mlx_written_bf16(helper, tmp_path):
    tensors = {"a.bf16": mx.random.normal((4, 9)).astype(mx.bfloat16), "a.f16": mx.arange(6).astype(mx.float16),
               "a.u32": mx.arange(10).astype(mx.uint32)}
    mx.save_safetensors(str(tmp_path / "model.safetensors"), tensors)
    assert compare(helper, tmp_path, mlx_oracle([tmp_path / "model.safetensors"])) == 3


def cached_models():
    dirs = []
    if (CACHE / "models").is_dir():
        dirs += [p.parent for p in sorted((CACHE / "models").glob("*/model.safetensors"))]
    if (CACHE / "tiny").is_dir():
        dirs += sorted(p for p in (CACHE / "tiny").iterdir() if list(p.glob("*.safetensors")))
    return dirs


@pytest.mark.parametrize("model_dir", cached_models() or [None], ids=lambda p: p.name if p else "none")
def test_cached_models(helper, model_dir):
    if model_dir is None:
        pytest.fail(f"no safetensors models under {CACHE}: run tools/get_models.sh (all-MiniLM-L6-v2)")
    n = compare(helper, model_dir, mlx_oracle(sorted(model_dir.glob("*.safetensors"))))
    assert n > 0
