"""Makes tests/data/cpu_quant/*.bin: small weight matrices in every GGUF block format and
MLX affine layout, with their float32 dequantization computed by the reference
implementations (gguf.quants.dequantize, mx.dequantize). test_cpu_matmul.c checks the CPU
backend's reference dequantizer against them bit for bit.

Run: .venv/bin/python tools/make_cpu_quant_fixtures.py   (gguf 0.19.0, mlx 0.32.4)

File layout (little endian u32 fields):
  rows, k, data_bytes, data,
  bits, group, sb_dtype (0 f32, 1 f16, 2 bf16), sb_bytes, scales, biases   (MLX only; bits=0 for GGUF)
  rows*k float32 expected
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "cpu_quant")
ROWS, K = 2, 256
# byte offsets of the f16 scale fields in each block: random bytes there could be inf/NaN,
# whose payloads are not worth comparing, so they get finite random values instead.
GGUF = {
    "q4_0": (Q.Q4_0, [0]), "q4_1": (Q.Q4_1, [0, 2]), "q5_0": (Q.Q5_0, [0]), "q5_1": (Q.Q5_1, [0, 2]),
    "q8_0": (Q.Q8_0, [0]), "q2_k": (Q.Q2_K, [80, 82]), "q3_k": (Q.Q3_K, [108]),
    "q4_k": (Q.Q4_K, [0, 2]), "q5_k": (Q.Q5_K, [0, 2]), "q6_k": (Q.Q6_K, [208]),
}


def write(name, rows, k, data, expected, mlx=None):
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(struct.pack("<III", rows, k, len(data)) + data)
        if mlx is None:
            f.write(struct.pack("<IIII", 0, 0, 0, 0))
        else:
            bits, group, sbt, scales, biases = mlx
            f.write(struct.pack("<IIII", bits, group, sbt, len(scales)) + scales + biases)
        f.write(np.ascontiguousarray(expected, dtype=np.float32).tobytes())


def gguf_cases(rng):
    for name, (qt, f16_offsets) in GGUF.items():
        bs, ts = quants.GGML_QUANT_SIZES[qt]
        nblk = ROWS * K // bs
        blocks = rng.integers(0, 256, size=(nblk, ts), dtype=np.uint8)
        for off in f16_offsets:
            vals = (rng.standard_normal(nblk) * 0.05).astype(np.float16)
            blocks[:, off:off + 2] = vals.view(np.uint8).reshape(nblk, 2)
        data = blocks.reshape(ROWS, -1)
        expected = quants.dequantize(data, qt).reshape(ROWS, K)
        write(name, ROWS, K, data.tobytes(), expected)


def mlx_cases(rng):
    import mlx.core as mx
    for bits, group, sbt in [(2, 32, 1), (3, 64, 2), (4, 32, 1), (4, 128, 0), (6, 64, 1), (8, 64, 2)]:
        w = mx.array(rng.standard_normal((ROWS, K)).astype(np.float32))
        q, s, b = mx.quantize(w, group_size=group, bits=bits)
        dt = [mx.float32, mx.float16, mx.bfloat16][sbt]
        s, b = s.astype(dt), b.astype(dt)
        # mx.dequantize computes in the scales' dtype (f16/bf16 results are rounded to it);
        # the matmul reference works in f32, so the oracle gets the same values upcast.
        expected = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
        mx.eval(expected)
        raw = lambda a: np.array(a.view(mx.uint16) if sbt else a).tobytes()
        write(f"mlx{bits}_g{group}", ROWS, K, np.array(q).tobytes(), np.array(expected),
              (bits, group, sbt, raw(s), raw(b)))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(1234)
    gguf_cases(rng)
    mlx_cases(rng)
    print("wrote", sorted(os.listdir(OUT)), file=sys.stderr)


if __name__ == "__main__":
    main()
