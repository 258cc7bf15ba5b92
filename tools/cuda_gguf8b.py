#!/usr/bin/env python3
"""cuda_gguf8b.py: writes a random-weight GGUF with the exact Llama-3.1-8B shapes (or
Qwen3-8B's) in F16, Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, Q5_0 or Q5_1 layout, with numpy only (the GPU machine has no `gguf`
package and nothing can be fetched there).

No float is quantized: every block is written directly as random but valid bytes (random
nibbles / int8 quants / 6-bit scales, sane fp16 d and dmin), since the weights are random
anyway. Bytes come from a pool of random blocks, tiled with a per-tensor rotation, so a
16 GB file is written at disk speed. Q4_K_M follows llama.cpp's choice of types for that
file type (read from its quantizer for the facts only): Q6_K for output.weight and for
attn_v / ffn_down of the layers where i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2; Q4_K for
every other matrix, token_embd included; norms F32. The other k-quant mixes are simpler
stand-ins with the same structure (the formats are what the GPU kernels care about): Q5_K_M
is Q5_K with Q6_K where Q4_K_M has it; Q3_K_M Q3_K with Q5_K there and output Q6_K; Q2_K
Q2_K with Q3_K there and output Q6_K; Q5_0 / Q5_1 one format with output Q6_K.

The tokenizer is a stand-in SentencePiece ("llama") vocabulary of distinct pieces (both
hearth and llama.cpp need one to open the file; no text is tokenized by the benchmarks).

Usage: cuda_gguf8b.py OUT.gguf f16|q4_0|q8_0|q4_k_m|q5_k_m|q3_k_m|q2_k|q5_0|q5_1 [--arch llama|qwen3|tiny]
"""
import struct
import sys
import time

import numpy as np

GGUF_ALIGN = 32
T_F32, T_F16, T_Q4_0, T_Q8_0, T_Q4_K, T_Q6_K = 0, 1, 2, 8, 12, 14
T_Q5_0, T_Q5_1, T_Q2_K, T_Q3_K, T_Q5_K = 6, 7, 10, 11, 13
BLOCK = {T_F32: (1, 4), T_F16: (1, 2), T_Q4_0: (32, 18), T_Q8_0: (32, 34), T_Q4_K: (256, 144), T_Q6_K: (256, 210),
         T_Q5_0: (32, 22), T_Q5_1: (32, 24), T_Q2_K: (256, 84), T_Q3_K: (256, 110), T_Q5_K: (256, 176)}
FILE_TYPE = {"f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q3_k_m": 12, "q2_k": 10, "q5_0": 8,
             "q5_1": 9}
# (base type, type of the "more bits" tensors, type of output.weight)
MIX = {"f16": (T_F16, T_F16, T_F16), "q8_0": (T_Q8_0, T_Q8_0, T_Q8_0), "q4_0": (T_Q4_0, T_Q4_0, T_Q6_K),
       "q4_k_m": (T_Q4_K, T_Q6_K, T_Q6_K), "q5_k_m": (T_Q5_K, T_Q6_K, T_Q6_K), "q3_k_m": (T_Q3_K, T_Q5_K, T_Q6_K),
       "q2_k": (T_Q2_K, T_Q3_K, T_Q6_K), "q5_0": (T_Q5_0, T_Q5_0, T_Q6_K), "q5_1": (T_Q5_1, T_Q5_1, T_Q6_K)}

SHAPES = {
    "llama": dict(hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256,
                  rope_base=500000.0, eps=1e-5, ctx=131072),
    # a small shape of the same structure, for checking the writer on a CPU
    "tiny": dict(hidden=256, ffn=512, layers=8, heads=4, kv_heads=2, head_dim=64, vocab=1000,
                 rope_base=500000.0, eps=1e-5, ctx=2048),
    "qwen3": dict(hidden=4096, ffn=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                  rope_base=1000000.0, eps=1e-6, ctx=40960),
}


def kv_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


class Meta:
    def __init__(self):
        self.items = []

    def add(self, key, vtype, payload):
        self.items.append(kv_str(key) + struct.pack("<I", vtype) + payload)

    def u32(self, k, v):
        self.add(k, 4, struct.pack("<I", v))

    def i32(self, k, v):
        self.add(k, 5, struct.pack("<i", v))

    def f32(self, k, v):
        self.add(k, 6, struct.pack("<f", v))

    def str(self, k, v):
        self.add(k, 8, kv_str(v))

    def boolean(self, k, v):
        self.add(k, 7, struct.pack("<?", v))

    def arr(self, k, etype, blob, count):
        self.add(k, 9, struct.pack("<IQ", etype, count) + blob)


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(shape, arch, kind):
    """(name, [ne0, ne1], ggml type): ne0 is the row length (k), ne1 the rows (n)."""
    c = SHAPES[shape]
    h, f, L, qd, kd, V = c["hidden"], c["ffn"], c["layers"], c["heads"] * c["head_dim"], \
        c["kv_heads"] * c["head_dim"], c["vocab"]
    base, hi, six = MIX[kind]  # llama.cpp keeps output.weight in Q6_K for the quantized mixes
    out = [("token_embd.weight", [h, V], base), ("output_norm.weight", [h], T_F32), ("output.weight", [h, V], six)]
    for i in range(L):
        more = hi != base and use_more_bits(i, L)
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", [h], T_F32),
                (p + "attn_q.weight", [h, qd], base),
                (p + "attn_k.weight", [h, kd], base),
                (p + "attn_v.weight", [h, kd], hi if more else base),
                (p + "attn_output.weight", [qd, h], base),
                (p + "ffn_norm.weight", [h], T_F32),
                (p + "ffn_gate.weight", [h, f], base),
                (p + "ffn_up.weight", [h, f], base),
                (p + "ffn_down.weight", [f, h], hi if more else base)]
        if arch == "qwen3":
            out += [(p + "attn_q_norm.weight", [c["head_dim"]], T_F32),
                    (p + "attn_k_norm.weight", [c["head_dim"]], T_F32)]
    return out


def nbytes(shape, t):
    n = int(np.prod(shape))
    be, bb = BLOCK[t]
    assert n % be == 0
    return n // be * bb


def f16_bits(a):
    return np.asarray(a, dtype=np.float16).view(np.uint16)


def pool(t, rng, n_blocks):
    """n_blocks random valid blocks of type t as one byte array."""
    be, bb = BLOCK[t]
    if t == T_F16:
        return rng.normal(0, 0.02, n_blocks).astype(np.float16).view(np.uint8)
    if t == T_F32:
        return np.ones(n_blocks, np.float32).view(np.uint8)
    b = rng.integers(0, 256, (n_blocks, bb), dtype=np.uint8)
    if t == T_Q4_0:  # d (f16) then 16 bytes of nibbles: |w| <= 8 d ~ 0.03
        b[:, 0:2] = f16_bits(rng.uniform(2e-3, 4e-3, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q8_0:  # d (f16) then 32 int8 quants: |w| <= 127 d ~ 0.03
        b[:, 0:2] = f16_bits(rng.uniform(1e-4, 2.5e-4, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q4_K:  # d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        b[:, 0:2] = f16_bits(rng.uniform(2e-5, 6e-5, n_blocks)).view(np.uint8).reshape(-1, 2)
        b[:, 2:4] = f16_bits(rng.uniform(2e-5, 6e-5, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q6_K:  # ql[128], qh[64], int8 scales[16], d (f16)
        b[:, 208:210] = f16_bits(rng.uniform(2e-5, 6e-5, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t in (T_Q5_0, T_Q5_1):  # d (Q5_1: then m), qh, 16 bytes of nibbles: |w| <= 16 d ~ 0.03
        b[:, 0:2] = f16_bits(rng.uniform(1e-3, 2e-3, n_blocks)).view(np.uint8).reshape(-1, 2)
        if t == T_Q5_1:
            b[:, 2:4] = f16_bits(rng.uniform(-0.03, -0.015, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q2_K:  # scales[16], qs[64], d, dmin: d sc q <= 45 d
        b[:, 80:82] = f16_bits(rng.uniform(3e-4, 7e-4, n_blocks)).view(np.uint8).reshape(-1, 2)
        b[:, 82:84] = f16_bits(rng.uniform(1e-4, 1e-3, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q3_K:  # hmask[32], qs[64], scales[12], d: |d (sc - 32)(q - 4)| <= 128 d
        b[:, 108:110] = f16_bits(rng.uniform(1e-4, 2.5e-4, n_blocks)).view(np.uint8).reshape(-1, 2)
    elif t == T_Q5_K:  # d, dmin, scales[12], qh[32], qs[128]: d sc q <= 1953 d
        b[:, 0:2] = f16_bits(rng.uniform(8e-6, 1.6e-5, n_blocks)).view(np.uint8).reshape(-1, 2)
        b[:, 2:4] = f16_bits(rng.uniform(8e-6, 1.6e-5, n_blocks)).view(np.uint8).reshape(-1, 2)
    return b.reshape(-1)


def standin_vocab(m, V):
    """A stand-in SentencePiece ("llama") vocabulary of V distinct pieces: <unk> <s> </s>, the
    256 byte pieces, then "\u2581t<i>" (both hearth and llama.cpp need one to open a file)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"\u2581t{i}" for i in range(V - len(toks))]
    blob = b"".join(kv_str(t) for t in toks)
    types = np.full(V, 1, np.int32)
    types[0], types[1:3], types[3:259] = 2, 3, 6
    m.str("tokenizer.ggml.model", "llama")
    m.arr("tokenizer.ggml.tokens", 8, blob, V)
    m.arr("tokenizer.ggml.scores", 6, (-np.arange(V, dtype=np.float32)).tobytes(), V)
    m.arr("tokenizer.ggml.token_type", 5, types.tobytes(), V)
    m.u32("tokenizer.ggml.bos_token_id", 1)
    m.u32("tokenizer.ggml.eos_token_id", 2)
    m.u32("tokenizer.ggml.unknown_token_id", 0)


def write_file(path, m, ts, rng, pool_bytes):
    """Write a GGUF of metadata m and tensors ts [(name, ggml shape, type[, bytes])], each
    tensor's bytes given or tiled from a pool of pool_bytes of random valid blocks of its type;
    returns the file size."""
    infos, off = [], 0
    for name, shape, t, *_ in ts:
        infos.append(kv_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
                     + struct.pack("<IQ", t, off))
        off += nbytes(shape, t)
        off = (off + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
    header = b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(m.items)) + b"".join(m.items) + b"".join(infos)
    header += b"\0" * ((-len(header)) % GGUF_ALIGN)
    pools = {}
    with open(path, "wb") as fo:
        fo.write(header)
        pos = 0
        for idx, (name, shape, t, *given) in enumerate(ts):
            n = nbytes(shape, t)
            if given:
                assert len(given[0]) == n, name
                fo.write(given[0])
                pos += n
                pad = (-pos) % GGUF_ALIGN
                fo.write(b"\0" * pad)
                pos += pad
                continue
            if t not in pools:
                pools[t] = pool(t, rng, pool_bytes // BLOCK[t][1])
            p = pools[t]
            bb = BLOCK[t][1]
            rot = (idx * 7919 % (len(p) // bb)) * bb  # rotation by whole blocks, so every
            # slice of the pool starts and ends on a block boundary
            done = 0
            while done < n:
                start = (rot + done) % len(p)
                take = min(n - done, len(p) - start)
                fo.write(p[start:start + take].tobytes())
                done += take
            pos += n
            pad = (-pos) % GGUF_ALIGN
            fo.write(b"\0" * pad)
            pos += pad
    return len(header) + pos


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in FILE_TYPE:
        sys.exit(__doc__)
    path, kind = sys.argv[1], sys.argv[2]
    shape = sys.argv[sys.argv.index("--arch") + 1] if "--arch" in sys.argv else "llama"
    c = SHAPES[shape]
    arch = "qwen3" if shape == "qwen3" else "llama"
    rng = np.random.default_rng(8)
    t0 = time.time()

    m = Meta()
    m.str("general.architecture", arch)
    m.str("general.name", f"random-{arch}-8b-{kind}")
    m.u32("general.file_type", FILE_TYPE[kind])
    m.u32("general.quantization_version", 2)
    m.u32("general.alignment", GGUF_ALIGN)
    m.u32(f"{arch}.block_count", c["layers"])
    m.u32(f"{arch}.context_length", c["ctx"])
    m.u32(f"{arch}.embedding_length", c["hidden"])
    m.u32(f"{arch}.feed_forward_length", c["ffn"])
    m.u32(f"{arch}.attention.head_count", c["heads"])
    m.u32(f"{arch}.attention.head_count_kv", c["kv_heads"])
    m.u32(f"{arch}.attention.key_length", c["head_dim"])
    m.u32(f"{arch}.attention.value_length", c["head_dim"])
    m.u32(f"{arch}.rope.dimension_count", c["head_dim"])
    m.f32(f"{arch}.rope.freq_base", c["rope_base"])
    m.f32(f"{arch}.attention.layer_norm_rms_epsilon", c["eps"])
    m.u32(f"{arch}.vocab_size", c["vocab"])
    standin_vocab(m, c["vocab"])

    ts = tensors(shape, arch, kind)
    POOL_BYTES = (96 << 20) if shape != "tiny" else (1 << 20)  # larger than the L2 by far; tiles of it repeat inside big tensors
    size = write_file(path, m, ts, rng, POOL_BYTES)
    print(f"{path}: {kind} {arch}, {len(ts)} tensors, {size / 1e9:.2f} GB in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
