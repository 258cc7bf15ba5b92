"""A tiny Qwen3.5 with a multi-token-prediction head, and the head's reference (tests of
`--speculate mtp`: tests/parity/test_mtp.py, tests/api/test_speculative.py).

The head is vLLM's Qwen3.5 / Qwen3-Next MTP proposer rebuilt from mlx-lm's parts: at position
i it reads the embedding of token i + 1 and the model's final-normed hidden row of position i,
x = fc([rmsnorm(embedding); rmsnorm(hidden)]), runs one full-attention decoder layer (mlx-lm's
own qwen3_5.DecoderLayer with the mtp.layers.0 weights), then mtp.norm and the model's
lm_head; its argmax proposes token i + 2. A proposal after the first reads the head's own
output row of the step before in place of the model's hidden row.

make_checkpoint copies the tiny Qwen3.5 into the Hugging Face layout (the only one that keeps
mtp.*; tests/parity/test_config_formats.py hf_layout_copy) and gives it a head whose fc is
fitted (ridge least squares) to point at the greedy continuation's next-but-one tokens, beside
random attention and MLP weights that move the proposals: proposals are often right, and a
head computed another way accepts other tokens.
"""
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
SRC = os.path.join(CACHE, "tiny", "qwen3_5-f32")
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MAX_TOKENS = 40
RIDGE = 3.0
LAYER = 0.1  # the layer's output scale: how far it moves the proposals
BLOCK = 16  # the KV block: a hybrid's proposal never crosses the block edge after its state


def hearth(*args, env=None):
    bin_ = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
    return subprocess.run([bin_, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HEARTH_CPU": "scalar", **(env or {})})


def rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


class Head:
    """The reference head over a list of (token, hidden row) pairs at positions 0.."""

    def __init__(self, model, weights):
        import mlx.core as mx
        from mlx_lm.models import qwen3_5

        self.mx = mx
        lm = model.language_model
        self.embed = np.array(lm.model.embed_tokens.weight)
        self.head = np.array(lm.lm_head.weight)
        args = lm.args
        self.layer = qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)
        shifted = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")
        pre = "mtp.layers.0."
        self.layer.load_weights([(k[len(pre):], mx.array(v + 1.0 if k.endswith(shifted) else v))
                                 for k, v in weights.items() if k.startswith(pre)])
        self.fc = weights["mtp.fc.weight"]
        self.ne, self.nh = weights["mtp.pre_fc_norm_embedding.weight"], weights["mtp.pre_fc_norm_hidden.weight"]
        self.nf = weights["mtp.norm.weight"]

    def __call__(self, tokens, hidden):
        mx = self.mx
        z = np.concatenate([rms(self.embed[tokens], self.ne), rms(np.asarray(hidden), self.nh)], axis=-1)
        x = mx.array((z @ self.fc.T)[None].astype(np.float32))
        y = np.array(self.layer(x, mask="causal" if len(tokens) > 1 else None, cache=None))[0]
        out = rms(y, self.nf)
        return out @ self.head.T, out


def make_checkpoint(dst):
    sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
    from test_config_formats import hf_layout_copy

    """The tiny Qwen3.5 in the HF layout, with a multi-token-prediction head; returns the mlx-lm
    model, the head's weights, the prompt ids, the greedy continuation and its hidden rows."""
    import mlx.core as mx
    from mlx_lm import load
    from safetensors.numpy import load_file, save_file

    hf_layout_copy(SRC, dst)
    model, tok = load(dst)
    ids = [int(t) for t in json.loads(hearth("tokenize", dst, PROMPT).stdout)]
    seq = list(ids)
    for _ in range(MAX_TOKENS + 2):  # the greedy continuation, one whole forward each (no cache needed)
        seq.append(int(mx.argmax(model(mx.array([seq]))[0, -1]).item()))
    hid = np.array(model.language_model.model(mx.array([seq])))[0]  # final-normed rows
    cfg = model.language_model.args
    H, nh, hd, kv, F = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads, \
        cfg.intermediate_size
    rng = np.random.default_rng(7)
    w = {}
    def rand(*shape, s=0.08):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    pre = "mtp.layers.0."
    w[pre + "self_attn.q_proj.weight"] = rand(2 * nh * hd, H)
    w[pre + "self_attn.k_proj.weight"] = rand(kv * hd, H)
    w[pre + "self_attn.v_proj.weight"] = rand(kv * hd, H)
    w[pre + "self_attn.o_proj.weight"] = rand(H, nh * hd, s=LAYER)
    w[pre + "self_attn.q_norm.weight"] = rand(hd, s=0.1)
    w[pre + "self_attn.k_norm.weight"] = rand(hd, s=0.1)
    w[pre + "input_layernorm.weight"] = rand(H, s=0.1)
    w[pre + "post_attention_layernorm.weight"] = rand(H, s=0.1)
    w[pre + "mlp.gate_proj.weight"] = rand(F, H)
    w[pre + "mlp.up_proj.weight"] = rand(F, H)
    w[pre + "mlp.down_proj.weight"] = rand(H, F, s=LAYER)
    w["mtp.pre_fc_norm_embedding.weight"] = rand(H, s=0.5)
    w["mtp.pre_fc_norm_hidden.weight"] = rand(H, s=0.5)
    w["mtp.norm.weight"] = rand(H, s=0.5)
    # fc fitted so that fc · z_i points at lm_head's row of token i + 2 along the greedy text
    embed = np.array(model.language_model.model.embed_tokens.weight)
    head = np.array(model.language_model.lm_head.weight)
    n = len(seq) - 2
    z = np.concatenate([rms(embed[seq[1:n + 1]], w["mtp.pre_fc_norm_embedding.weight"]),
                        rms(hid[:n], w["mtp.pre_fc_norm_hidden.weight"])], axis=-1)
    target = head[seq[2:n + 2]] * 3.0
    # ridge: a small fc whose argmaxes do not hang on the hidden rows' last bits (an exact fit
    # of these few pairs is ill-conditioned: 1e-6 in a row flips its proposal)
    fc = np.linalg.solve(z.T @ z + RIDGE * np.eye(z.shape[1]), z.T @ target).T
    w["mtp.fc.weight"] = np.ascontiguousarray(fc, dtype=np.float32)  # save_file writes the buffer as it lies
    st = load_file(os.path.join(dst, "model.safetensors"))
    st = {k: v for k, v in st.items() if not k.startswith("mtp.")}
    st.update(w)
    os.remove(os.path.join(dst, "model.safetensors"))
    save_file(st, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    c = json.load(open(os.path.join(dst, "config.json")))
    c["text_config"]["mtp_num_hidden_layers"] = 1
    json.dump(c, open(os.path.join(dst, "config.json"), "w"))
    return model, w, ids, seq[len(ids):], hid


def replay(head, ids, out, hid, k_max, journal=True):
    """The scheduler's walk over the reference's proposals: (proposed, accepted). journal
    False: a hybrid's backend without a state journal (the GPU's), where the step after a
    rejection feeds the kept tokens again and proposes nothing."""
    seq = ids + out
    L, emitted, proposed, accepted, replaying = len(ids), 1, 0, 0, False
    while emitted < MAX_TOKENS:
        k = min(k_max, MAX_TOKENS - emitted - 1, (L // BLOCK + 1) * BLOCK - (L + 1))
        if k <= 0 or replaying:
            replaying = False
            L, emitted = L + 1, emitted + 1
            continue
        toks, rows = list(seq[1:L + 1]), [hid[i] for i in range(L)]
        drafts = []
        for j in range(k):
            logits, outs = head(toks, rows)
            drafts.append(int(np.argmax(logits[-1])))
            toks.append(drafts[-1])
            rows.append(outs[-1])
        a = 0
        while a < k and drafts[a] == seq[L + 1 + a]:
            a += 1
        proposed, accepted = proposed + k, accepted + a
        L, emitted = L + 1 + a, emitted + 1 + a
        replaying = not journal and a < k
    return proposed, accepted
