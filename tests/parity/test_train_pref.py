"""hearth train --method dpo|orpo against an MLX autograd oracle of TRL's losses.

The issue names TRL's DPOTrainer and ORPOTrainer (PyTorch) as the oracle; torch cannot be
installed here, and mlx-lm-lora (the MLX package with DPO and ORPO trainers) defines both
losses differently from TRL (its ORPO has no NLL term and no log(1 - p) in the odds; its
DPO and ORPO masks cover the prompt's tokens and one padding target). So the oracle is
this file: TRL's definitions written out over mlx-lm's own model (float32), gradients by
mx.grad, the step by mlx's Adam (as mlx_lm.lora steps and hearth's sft is checked):

- tokens (TRL's maybe_apply_chat_template + DPOTrainer.tokenize_row, with the HF
  tokenizer): prompt and each response tokenized alone without special tokens, EOS after
  each response; conversational rows rendered by the chat template first (the prompt with
  the generation prompt, the response as the rest of the render of prompt + response);
- DPO (loss_type "sigmoid"): c, r = the summed log-probs of the chosen / rejected response
  tokens, ref_c, ref_r the same under the frozen base (a second mlx-lm model without the
  adapter); loss = mean over pairs of -log sigmoid(beta ((c - r) - (ref_c - ref_r)));
  rewards/chosen = mean beta (c - ref_c), and so on;
- ORPO: mc, mr = the mean log-probs of the response tokens; log_odds = (mc - mr) -
  (log1p(-exp(mc)) - log1p(-exp(mr))); loss = NLL - lambda mean(log sigmoid(log_odds)),
  where NLL is the chosen sequences' cross-entropy averaged over every non-padding target
  token of the batch, the prompt's included (TRL's concatenated_forward labels the chosen
  input ids where the attention mask is 1); rewards/chosen = mean lambda mc.

The data order is hearth's (the sft one: numpy's legacy generator seeded with --seed, a
permutation of the batches per epoch, a permutation of the validation batches before each
evaluation). With the same initial adapter (random non-zero A and B), every reported
training loss and metric and every validation loss of 10 steps equals the oracle's within
1e-4 relative.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_helpers import _to_float32  # noqa: E402
from test_train import BIN, hearth_train, make_init_adapter, model_dir, sentence  # noqa: E402

RTOL = 1e-4
DPO_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
            "logps/rejected")
ORPO_KEYS = DPO_KEYS + ("nll_loss", "log_odds_ratio", "log_odds_chosen")


def make_pref_data(d, chat, seed=2):
    """8 training and 4 validation pairs of random words: strings, or message lists"""
    rng = np.random.default_rng(seed)

    def pair():
        p, c, r = sentence(rng, 3, 10), sentence(rng, 2, 12), sentence(rng, 2, 12)
        if not chat:
            return {"prompt": p, "chosen": c, "rejected": r}
        return {"prompt": [{"role": "system", "content": sentence(rng, 2, 5)}, {"role": "user", "content": p}],
                "chosen": [{"role": "assistant", "content": c}], "rejected": [{"role": "assistant", "content": r}]}

    os.makedirs(d, exist_ok=True)
    for name, n in (("train", 8), ("valid", 4)):
        rows = [pair() for _ in range(n)]
        with open(os.path.join(d, f"{name}.jsonl"), "w") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
    return d


def trl_tokenize(tok, row):
    """(prompt + chosen ids, prompt + rejected ids, prompt length) as TRL builds them."""
    p, c, r = row["prompt"], row["chosen"], row["rejected"]
    if isinstance(p, list):
        pt = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        c = tok.apply_chat_template(p + c, tokenize=False)
        r = tok.apply_chat_template(p + r, tokenize=False)
        assert c.startswith(pt) and r.startswith(pt)
        p, c, r = pt, c[len(pt):], r[len(pt):]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    pi = ids(p)
    return pi + ids(c) + [tok.eos_token_id], pi + ids(r) + [tok.eos_token_id], len(pi)


def seq_logps(model, ids, off):
    """(sum of the response tokens' log-probs, their count, sum over every target token)"""
    import mlx.core as mx
    x = mx.array([ids])
    logits = model(x[:, :-1])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tok_lp = mx.take_along_axis(lp, x[0, 1:, None], axis=-1)[:, 0]
    first = max(off - 1, 0)  # target i is ids[i + 1]: the response's start at ids[off]
    return tok_lp[first:].sum(), len(ids) - 1 - first, tok_lp.sum()


def oracle(model_path, data, init, method, iters, bs, lr, num_layers, rank, scale, beta, seed, steps_per_eval):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_path)  # TRL's processing_class
    model, _ = load(model_path)
    _to_float32(model)
    model.freeze()
    linear_to_lora_layers(model, len(model.layers) if num_layers < 0 else num_layers,
                          {"rank": rank, "scale": scale, "dropout": 0.0})
    model.load_weights(init, strict=False)
    ref, _ = load(model_path)  # the frozen base: the same weights without the adapter
    _to_float32(ref)

    def rows(name):
        return [trl_tokenize(tok, json.loads(line)) for line in open(os.path.join(data, name))]

    train, valid = rows("train.jsonl"), rows("valid.jsonl")
    ref_lp = {}

    def ref_of(ex):
        key = (tuple(ex[0]), tuple(ex[1]))
        if key not in ref_lp:
            ref_lp[key] = tuple(float(seq_logps(ref, s, ex[2])[0]) for s in ex[:2])
        return ref_lp[key]

    def loss_fn(batch):
        n = len(batch)
        out, m = 0.0, {k: 0.0 for k in ORPO_KEYS}
        if method == "dpo":
            for ex in batch:
                rc, rr = ref_of(ex)
                c, r = seq_logps(model, ex[0], ex[2])[0], seq_logps(model, ex[1], ex[2])[0]
                out = out - nn.log_sigmoid(beta * ((c - r) - (rc - rr))) / n
                m["rewards/chosen"] += beta * (c - rc) / n
                m["rewards/rejected"] += beta * (r - rr) / n
                m["rewards/accuracies"] += (beta * (c - rc) > beta * (r - rr)).astype(mx.float32) / n
                m["logps/chosen"] += c / n
                m["logps/rejected"] += r / n
        else:
            nll_tokens = sum(len(ex[0]) - 1 for ex in batch)
            nll = 0.0
            for ex in batch:
                sc, kc, allc = seq_logps(model, ex[0], ex[2])
                sr, kr, _ = seq_logps(model, ex[1], ex[2])
                mc, mr = sc / kc, sr / kr
                log_odds = (mc - mr) - (mx.log1p(-mx.exp(mc)) - mx.log1p(-mx.exp(mr)))
                ratio = nn.log_sigmoid(log_odds)
                nll = nll - allc / nll_tokens
                out = out - beta * ratio / n
                m["rewards/chosen"] += beta * mc / n
                m["rewards/rejected"] += beta * mr / n
                m["rewards/accuracies"] += (beta * mc > beta * mr).astype(mx.float32) / n
                m["logps/chosen"] += mc / n
                m["logps/rejected"] += mr / n
                m["log_odds_ratio"] += ratio / n
                m["log_odds_chosen"] += log_odds / n
            out = out + nll
            m["nll_loss"] = nll
        m["rewards/margins"] = m["rewards/chosen"] - m["rewards/rejected"]
        return out, m

    grad_fn = nn.value_and_grad(model, lambda b: loss_fn(b)[0])
    opt = optim.Adam(learning_rate=lr)
    np.random.seed(seed)
    nb, n_vb = len(train) // bs, len(valid) // bs
    pos, perm, reports = nb, None, []
    for it in range(1, iters + 1):
        if pos == nb:
            perm, pos = np.random.permutation(nb), 0
        if it == 1 or it % steps_per_eval == 0 or it == iters:
            vperm = np.random.permutation(n_vb)
            vl = [float(loss_fn(valid[b * bs:(b + 1) * bs])[0]) for b in vperm]
            reports.append({"step": it - 1, "val_loss": sum(vl) / len(vl)})
        batch = train[perm[pos] * bs:(perm[pos] + 1) * bs]
        pos += 1
        _, metrics = loss_fn(batch)
        loss, grads = grad_fn(batch)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        keys = DPO_KEYS if method == "dpo" else ORPO_KEYS
        reports.append({"step": it, "loss": float(loss), **{k: float(metrics[k]) for k in keys}})
    return reports


CASES = [  # model, conversational rows, method, num_layers
    ("llama-f32", False, "dpo", -1),
    ("llama-f32", False, "orpo", -1),
    ("qwen3-f32", True, "dpo", 2),
    ("qwen3-f32", True, "orpo", -1),
    ("llama-q4g64", True, "orpo", 2),  # a quantized base
]


@pytest.mark.parametrize("name,chat,method,num_layers", CASES)
def test_losses_match_trl_definitions(tmp_path, name, chat, method, num_layers):
    model = model_dir(name)
    data = make_pref_data(str(tmp_path / "data"), chat)
    rank, scale, iters, bs, lr, beta, seed, spe = 8, 2.0, 10, 2, 1e-4, 0.1, 3, 4
    init = make_init_adapter(model, tmp_path / "init.safetensors", rank, num_layers)
    ref = oracle(model, data, init, method, iters, bs, lr, num_layers, rank, scale, beta, seed, spe)
    flags = ["--method", method, "--iters", str(iters), "--batch-size", str(bs), "--learning-rate", str(lr),
             "--num-layers", str(num_layers), "--lora-rank", str(rank), "--lora-scale", str(scale),
             "--steps-per-report", "1", "--steps-per-eval", str(spe), "--seed", str(seed),
             "--beta" if method == "dpo" else "--lambda", str(beta)]
    ours = hearth_train(model, data, tmp_path / "ours", init, flags)
    assert [(r["step"], "loss" in r) for r in ours] == [(r["step"], "loss" in r) for r in ref]
    worst, bad = 0.0, []
    for a, b in zip(ref, ours):
        for k, v in a.items():
            if k == "step":
                continue
            # DPO's rewards are beta (c - ref_c): differences of two float32 sums of
            # log-probs, each rounded to ~1e-7 of itself; they are held to 1e-4 of
            # beta |c| (the size of the terms they are made of), not of themselves
            scale_k = abs(v)
            if method == "dpo" and k.startswith("rewards/") and k != "rewards/accuracies":
                scale_k = max(scale_k, beta * max(abs(a["logps/chosen"]), abs(a["logps/rejected"])))
            scale_k = max(scale_k, 1e-30)
            worst = max(worst, abs(v - b[k]) / scale_k)
            if abs(v - b[k]) > RTOL * scale_k:
                bad.append(f"step {a['step']} {k}: oracle {v}, hearth {b[k]}")
    print(f"{name} {method} chat={chat}: worst relative difference {worst:.2e}")
    assert not bad, "\n".join(bad)
    losses = [r["loss"] for r in ours if "loss" in r]
    assert min(losses[5:]) < losses[0]  # it trained


def run_err(args):
    p = subprocess.run([BIN, "train"] + args, capture_output=True, timeout=120)
    return p.returncode, p.stderr.decode()


def test_preference_errors_are_clear(tmp_path):
    model = model_dir("llama-f32")
    data = make_pref_data(str(tmp_path / "data"), False)
    rc, err = run_err([model, "--data", data, "--method", "sft"])
    assert rc == 1 and "holds preference pairs" in err
    text = tmp_path / "text"
    text.mkdir()
    (text / "train.jsonl").write_text('{"text": "a b c"}\n')
    rc, err = run_err([model, "--data", str(text), "--method", "dpo"])
    assert rc == 1 and "--method dpo needs preference data" in err
    rc, err = run_err([model, "--data", data, "--method", "kto"])
    assert rc == 1 and "unknown (sft, dpo or orpo)" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
                                     '{"prompt": "a", "chosen": "b"}\n')
    rc, err = run_err([model, "--data", str(bad), "--num-layers", "-1"])
    assert rc == 1 and "train.jsonl:2" in err and "must be all strings" in err
    (bad / "train.jsonl").write_text('{"prompt": "a b c d e f g h", "chosen": "b", "rejected": "c"}\n')
    rc, err = run_err([model, "--data", str(bad), "--num-layers", "-1", "--max-seq-length", "4"])
    assert rc == 1 and "train.jsonl:1: no response token within --max-seq-length" in err
