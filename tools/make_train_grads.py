#!/usr/bin/env python3
"""make_train_grads.py: the autograd oracle for the training ops' backwards
(src/train/train_ops.c): MLX's autograd (mx.vjp), on the CPU in float64. Draws random
float32 inputs, runs each op forward in float64 against a random upstream gradient and
writes inputs, outputs and gradients (cast to float32) to
tests/data/train/op_grads.safetensors, which tests/unit/test_train_ops.c reads.
Deterministic (seed 0): rerun after changing a case. PyTorch's autograd, the oracle the
issue names, checks the file: tests/parity/test_train_op_grads.py recomputes every case
with torch in float64 and holds the file to it within 1e-5.

    .venv/bin/python tools/make_train_grads.py [out.safetensors]
"""
import math
import sys

import mlx.core as mx
import numpy as np

mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
out = {}
F64 = mx.float64


def put(name, t):
    out[name] = np.asarray(t.astype(mx.float32) if isinstance(t, mx.array) else t, dtype=np.float32)


def rnd(*shape, scale=1.0):
    """a float32 draw, held in float64"""
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32)).astype(F64)


def vjp(f, primals, cotangent):
    outs, grads = mx.vjp(f, primals, [cotangent])
    return outs[0], grads


def rotate(x, pos0, inv_freq, adjacent):
    """x [T, H, hd]: HF/MLX rotate-half RoPE, or adjacent pairs (GGUF llama)."""
    T, H, hd = x.shape
    th = (mx.arange(T).astype(F64) + pos0)[:, None] * inv_freq[None, :]
    c, s = mx.cos(th)[:, None, :], mx.sin(th)[:, None, :]
    if adjacent:
        a, b = x[..., 0::2], x[..., 1::2]
        return mx.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(T, H, hd)
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return mx.concatenate([a * c - b * s, a * s + b * c], axis=-1)


# linear + LoRA: two shapes, one with tails (K, N not multiples of 8/16, M not of 4)
for name, (M, K, N, r) in {"lin1": (6, 27, 13, 4), "lin2": (9, 40, 35, 8)}.items():
    x, w, a, b = rnd(M, K), rnd(N, K, scale=0.2), rnd(K, r, scale=0.3), rnd(r, N, scale=0.3)
    scale = 2.0
    dy = rnd(M, N)
    y, (dx, ga, gb) = vjp(lambda x, a, b: x @ w.T + scale * (x @ a) @ b, [x, a, b], dy)
    for k, v in dict(x=x, w=w, a=a, b=b, y=y, dy=dy, dx=dx, ga=ga, gb=gb).items():
        put(f"{name}.{k}", v)
    put(f"{name}.scale", np.array([scale]))

# RMSNorm
x, w, dy = rnd(7, 48), rnd(48), rnd(7, 48)
eps = 1e-5
y, (dx,) = vjp(lambda x: x * mx.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w, [x], dy)
for k, v in dict(x=x, w=w, y=y, dy=dy, dx=dx).items():
    put(f"norm.{k}", v)

# RoPE, both pair conventions, positions from 3
T, H, hd = 7, 3, 16
inv_freq = mx.array((1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float32) / hd))).astype(np.float32)).astype(F64)
put("rope.inv_freq", inv_freq)
for adj in (0, 1):
    x, dy = rnd(T, H, hd), rnd(T, H, hd)
    y, (dx,) = vjp(lambda x: rotate(x, 3, inv_freq, adj), [x], dy)
    for k, v in dict(x=x, y=y, dy=dy, dx=dx).items():
        put(f"rope{adj}.{k}", v)

# causal attention with grouped KV heads
T, Hq, Hkv, hd = 11, 4, 2, 8
q, k, v, do = rnd(T, Hq * hd), rnd(T, Hkv * hd), rnd(T, Hkv * hd), rnd(T, Hq * hd)
scale = 1 / math.sqrt(hd)
causal = mx.array(np.triu(np.full((T, T), -np.inf), 1)).astype(F64)


def attention(q, k, v, mask):
    """q [T, Hq*hd], k, v [T, Hkv*hd] (T, Hq, Hkv, hd: the case's) with an additive mask"""
    qh = q.reshape(T, Hq, hd).transpose(1, 0, 2)
    kh = mx.repeat(k.reshape(T, Hkv, hd).transpose(1, 0, 2), Hq // Hkv, axis=0)
    vh = mx.repeat(v.reshape(T, Hkv, hd).transpose(1, 0, 2), Hq // Hkv, axis=0)
    s = (qh @ kh.transpose(0, 2, 1)) * scale + mask
    return (mx.softmax(s, axis=-1) @ vh).transpose(1, 0, 2).reshape(T, Hq * hd)


o, (dq, dk, dv) = vjp(lambda q, k, v: attention(q, k, v, causal), [q, k, v], do)
for kk, vv in dict(q=q, k=k, v=v, out=o, dout=do, dq=dq, dk=dk, dv=dv).items():
    put(f"attn.{kk}", vv)

# SiLU-gated product
g, u, dh = rnd(50, scale=3.0), rnd(50), rnd(50)
h, (dg, du) = vjp(lambda g, u: g * mx.sigmoid(g) * u, [g, u], dh)
for kk, vv in dict(g=g, u=u, h=h, dh=dh, dg=dg, du=du).items():
    put(f"silu.{kk}", vv)

# cross-entropy over an lm_head, averaged over the rows that count (weight 0: masked)
M, D, V = 6, 16, 40
hh, w = rnd(M, D), rnd(V, D, scale=0.5)
targets = rng.integers(0, V, M).astype(np.int32)
mask = mx.array([0, 1, 1, 0, 1, 1]).astype(F64)


def xent(hh):
    z = hh @ w.T
    ce = mx.logsumexp(z, axis=-1) - mx.take_along_axis(z, mx.array(targets)[:, None], axis=-1)[:, 0]
    return (ce * mask).sum() / mask.sum()


loss, (dhh,) = vjp(xent, [hh], mx.array(1.0).astype(F64))
for kk, vv in dict(h=hh, w=w, weight=mask / mask.sum(), dh=dhh).items():
    put(f"xent.{kk}", vv)
put("xent.loss", loss.reshape(1))

# sliding-window causal attention (Gemma's sliding layers: query i sees keys i - W + 1 .. i,
# mlx-lm's create_causal_mask(window_size=W)); drawn after the cases above so theirs stay put
T, Hq, Hkv, hd, W = 13, 4, 2, 8, 5
q, k, v, do = rnd(T, Hq * hd), rnd(T, Hkv * hd), rnd(T, Hkv * hd), rnd(T, Hq * hd)
ii, jj = np.arange(T)[:, None], np.arange(T)[None, :]
window = mx.array(np.where((jj <= ii) & (jj > ii - W), 0.0, -np.inf)).astype(F64)

o, (dq, dk, dv) = vjp(lambda q, k, v: attention(q, k, v, window), [q, k, v], do)
for kk, vv in dict(q=q, k=k, v=v, out=o, dout=do, dq=dq, dk=dk, dv=dv).items():
    put(f"wattn.{kk}", vv)
put("wattn.window", np.array([W]))

# GELU(tanh)-gated product (Gemma's MLP: MLX's gelu_approx)
g, u, dh = rnd(50, scale=3.0), rnd(50), rnd(50)
h, (dg, du) = vjp(lambda g, u: 0.5 * g * (1 + mx.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))) * u, [g, u], dh)
for kk, vv in dict(g=g, u=u, h=h, dh=dh, dg=dg, du=du).items():
    put(f"gelu.{kk}", vv)

# the same cross-entropy over softcapped logits (Gemma 4: cap tanh(z / cap))
M, D, V, cap = 6, 16, 40, 2.0
hh, w = rnd(M, D), rnd(V, D, scale=0.5)
cap_targets = rng.integers(0, V, M).astype(np.int32)
mask = mx.array([1, 1, 0, 1, 1, 1]).astype(F64)


def xent_cap(hh):
    z = mx.tanh((hh @ w.T) / cap) * cap
    ce = mx.logsumexp(z, axis=-1) - mx.take_along_axis(z, mx.array(cap_targets)[:, None], axis=-1)[:, 0]
    return (ce * mask).sum() / mask.sum()


loss, (dhh,) = vjp(xent_cap, [hh], mx.array(1.0).astype(F64))
for kk, vv in dict(h=hh, w=w, weight=mask / mask.sum(), dh=dhh).items():
    put(f"xcap.{kk}", vv)
put("xcap.loss", loss.reshape(1))
put("xcap.softcap", np.array([cap]))

# the gated delta rule over a short sequence from a zero state (Qwen3.5's Gated DeltaNet, as
# mlx-lm's gated_delta_ops steps it): Dk 20 (a vector body and a tail), Dv 3
T, Dv, Dk = 6, 3, 20
q, k, v, dy = rnd(T, Dk, scale=0.3), rnd(T, Dk, scale=0.3), rnd(T, Dv), rnd(T, Dv)
g = mx.array(rng.uniform(0.6, 1.0, T).astype(np.float32)).astype(F64)
beta = mx.array(rng.uniform(0.2, 0.9, T).astype(np.float32)).astype(F64)


def delta_rule(q, k, v, g, beta):
    S, ys = mx.zeros((Dv, Dk)).astype(F64), []
    for t in range(T):
        S = S * g[t]
        delta = (v[t] - (S * k[t][None, :]).sum(-1)) * beta[t]
        S = S + k[t][None, :] * delta[:, None]
        ys.append((S * q[t][None, :]).sum(-1))
    return mx.stack(ys)


y, (dq, dk, dv, dg, dbeta) = vjp(delta_rule, [q, k, v, g, beta], dy)
for kk, vv in dict(q=q, k=k, v=v, g=g, beta=beta, dy=dy, y=y, dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta).items():
    put(f"delta.{kk}", vv)

arrays = {k: mx.array(v) for k, v in out.items()}
arrays["xent.targets"] = mx.array(targets)
arrays["xcap.targets"] = mx.array(cap_targets)
path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/train/op_grads.safetensors"
mx.save_safetensors(path, arrays)
print(f"wrote {len(arrays)} tensors to {path}")
