"""tests/data/train/op_grads.safetensors (the reference tests/unit/test_train_ops.c checks
every training op's backward against, written by tools/make_train_grads.py from MLX's
autograd) against PyTorch's autograd: each op recomputed here in float64 with torch from the
file's own inputs and upstream gradients, torch.autograd.grad giving the input gradients.
Every stored output and gradient equals torch's within 1e-5 of the tensor's largest
magnitude (the file holds float64 results cast to float32: ~6e-8 of it). So the unit test's
reference is tied to the autograd the issue names as well as to MLX's.
"""
import math
import os

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5


@pytest.fixture(scope="module")
def ref():
    from safetensors.numpy import load_file
    return load_file(os.path.join(REPO, "tests", "data", "train", "op_grads.safetensors"))


def t64(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def check(ref, name, ours):
    """every stored tensor name.k against torch's value for k"""
    for k, v in ours.items():
        want, got = ref[f"{name}.{k}"].astype(np.float64), v.detach().numpy()
        assert want.shape == got.shape, (name, k, want.shape, got.shape)
        err = np.abs(want - got).max() / max(np.abs(got).max(), 1e-30)
        assert err <= TOL, f"{name}.{k}: stored vs torch autograd {err:.2e} of its largest magnitude"


def vjp(f, inputs, dy):
    y = f(*inputs)
    return y, torch.autograd.grad(y, inputs, dy)


@pytest.mark.parametrize("name", ["lin1", "lin2"])
def test_linear_lora(ref, name):
    x, a, b = (t64(ref[f"{name}.{k}"], True) for k in "xab")
    w, dy, scale = t64(ref[f"{name}.w"]), t64(ref[f"{name}.dy"]), float(ref[f"{name}.scale"][0])
    y, (dx, ga, gb) = vjp(lambda x, a, b: x @ w.T + scale * (x @ a) @ b, [x, a, b], dy)
    check(ref, name, dict(y=y, dx=dx, ga=ga, gb=gb))


def test_rms_norm(ref):
    x, w, dy = t64(ref["norm.x"], True), t64(ref["norm.w"]), t64(ref["norm.dy"])
    eps = 1e-5  # make_train_grads.py's
    y, (dx,) = vjp(lambda x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w, [x], dy)
    check(ref, "norm", dict(y=y, dx=dx))


@pytest.mark.parametrize("adjacent", [0, 1])
def test_rope(ref, adjacent):
    name = f"rope{adjacent}"
    x, dy, inv_freq = t64(ref[f"{name}.x"], True), t64(ref[f"{name}.dy"]), t64(ref["rope.inv_freq"])
    T, H, hd = x.shape
    pos0 = 3  # make_train_grads.py's first position

    def rotate(x):
        th = (torch.arange(T, dtype=torch.float64) + pos0)[:, None] * inv_freq[None, :]
        c, s = torch.cos(th)[:, None, :], torch.sin(th)[:, None, :]
        if adjacent:
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(T, H, hd)
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)

    y, (dx,) = vjp(rotate, [x], dy)
    check(ref, name, dict(y=y, dx=dx))


def check_attention(ref, name, **mask):
    """torch's scaled_dot_product_attention (mask: is_causal or attn_mask) over the file's
    q, k, v: 4 query heads over 2 KV heads of 8 (make_train_grads.py)"""
    q, k, v = (t64(ref[f"{name}.{n}"], True) for n in "qkv")
    do = t64(ref[f"{name}.dout"])
    T, hd = q.shape[0], 8
    Hq, Hkv = q.shape[1] // hd, k.shape[1] // hd
    y, (dq, dk, dv) = vjp(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q.reshape(T, Hq, hd).transpose(0, 1), k.reshape(T, Hkv, hd).transpose(0, 1).repeat_interleave(Hq // Hkv, 0),
        v.reshape(T, Hkv, hd).transpose(0, 1).repeat_interleave(Hq // Hkv, 0), **mask,
        scale=1 / math.sqrt(hd)).transpose(0, 1).reshape(T, Hq * hd), [q, k, v], do)
    check(ref, name, dict(out=y, dq=dq, dk=dk, dv=dv))


def test_causal_attention_grouped_kv(ref):
    check_attention(ref, "attn", is_causal=True)


def test_silu_gate(ref):
    g, u, dh = t64(ref["silu.g"], True), t64(ref["silu.u"], True), t64(ref["silu.dh"])
    h, (dg, du) = vjp(lambda g, u: torch.nn.functional.silu(g) * u, [g, u], dh)
    check(ref, "silu", dict(h=h, dg=dg, du=du))


def test_sliding_window_attention(ref):
    T, W = ref["wattn.q"].shape[0], int(ref["wattn.window"][0])
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    check_attention(ref, "wattn", attn_mask=(j <= i) & (j > i - W))  # transformers' sliding-window mask


def test_gelu_tanh_gate(ref):
    g, u, dh = t64(ref["gelu.g"], True), t64(ref["gelu.u"], True), t64(ref["gelu.dh"])
    h, (dg, du) = vjp(lambda g, u: torch.nn.functional.gelu(g, approximate="tanh") * u, [g, u], dh)
    check(ref, "gelu", dict(h=h, dg=dg, du=du))


@pytest.mark.parametrize("name", ["xent", "xcap"])
def test_masked_cross_entropy(ref, name):
    h, w, weight = t64(ref[f"{name}.h"], True), t64(ref[f"{name}.w"]), ref[f"{name}.weight"]
    targets = torch.tensor(ref[f"{name}.targets"].astype(np.int64))
    mask = torch.tensor(weight > 0)
    cap = float(ref["xcap.softcap"][0]) if name == "xcap" else None

    def xent(h):  # the mean over the rows that count (weight 0: masked); xcap: softcapped logits
        z = h @ w.T
        if cap:
            z = torch.tanh(z / cap) * cap
        return torch.nn.functional.cross_entropy(z[mask], targets[mask])

    loss, (dh,) = vjp(xent, [h], torch.tensor(1.0, dtype=torch.float64))
    assert np.allclose(weight[weight > 0], 1 / mask.sum().item())  # the file's weights are that mean's
    check(ref, name, dict(dh=dh, loss=loss.reshape(1)))


def test_gated_delta_rule(ref):
    q, k, v, g, beta = (t64(ref[f"delta.{n}"], True) for n in ("q", "k", "v", "g", "beta"))
    dy = t64(ref["delta.dy"])
    T, Dk = q.shape
    Dv = v.shape[1]

    def rule(q, k, v, g, beta):  # mlx-lm's gated_delta_ops step, written in torch
        S, ys = torch.zeros(Dv, Dk, dtype=torch.float64), []
        for t in range(T):
            S = S * g[t]
            delta = (v[t] - S @ k[t]) * beta[t]
            S = S + delta[:, None] * k[t][None, :]
            ys.append(S @ q[t])
        return torch.stack(ys)

    y, (dq, dk, dv, dg, dbeta) = vjp(rule, [q, k, v, g, beta], dy)
    check(ref, "delta", dict(y=y, dq=dq, dk=dk, dv=dv, dg=dg, dbeta=dbeta))
