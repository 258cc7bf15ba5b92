"""hearth perplexity against mlx-lm itself, and its KL statistics against numpy.

The oracle is mlx_lm.perplexity's own load_data (its numpy seeded permutation, concatenation
and cut into rows) and eval_ppl, fed the dataset rows the way mlx_lm.tuner.datasets builds
them (create_dataset over the parsed .jsonl rows: what HF `datasets` hands it for a local
file; `datasets` itself is not installed). KL: numpy over mlx-lm's logits of both models on
the same rows. The data file is generated here with more tokens than the rows use, so the
seeded choice and order of rows matter.
"""
import json
import os
import random
import subprocess
import types

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("HEARTH_BIN", os.path.join(REPO, "bin", "hearth"))
CACHE = os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth"))
TINY = os.path.join(CACHE, "tiny")
L, ROWS = 64, 6  # small rows keep each run well under a second on 2 cores
WORDS = ("the a cat dog river mountain blue quickly runs sleeps under over bright data model token 42 7 "
         "hello world , . ! ?").split()


def tiny(name):
    path = os.path.join(TINY, name)
    if not os.path.isfile(os.path.join(path, "config.json")):
        pytest.fail(f"{path} missing: run tools/get_models.sh", pytrace=False)
    return path


def hearth(*args, env=None, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=120, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"hearth {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()}")
    return p


@pytest.fixture
def env(tmp_path):
    """A private HEARTH_CACHE, so the evals rows these runs record are the test's own."""
    return dict(os.environ, HEARTH_CACHE=str(tmp_path / "cache"))


def write_rows(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def text_rows(n=120, seed=7):
    r = random.Random(seed)
    return [{"text": " ".join(r.choice(WORDS) for _ in range(r.randint(3, 40)))} for _ in range(n)]


def chat_rows(n=60, seed=8):
    r = random.Random(seed)
    say = lambda: " ".join(r.choice(WORDS) for _ in range(r.randint(2, 20)))  # noqa: E731
    return [{"messages": [{"role": "user", "content": say()}, {"role": "assistant", "content": say()}]}
            for _ in range(n)]


def mlx_rows(model_dir, rows, seq_len=L, num_samples=ROWS, seed=123):
    """mlx_lm.perplexity's data rows (mlx array) and the loaded model."""
    import mlx.core as mx
    import mlx_lm.perplexity as P
    from mlx_lm.tuner.datasets import create_dataset
    from mlx_lm.utils import load

    model, tok = load(model_dir)
    real = P.load_dataset
    P.load_dataset = lambda args, t: (create_dataset(rows, t, types.SimpleNamespace()), [], [])
    try:
        np.random.seed(seed)  # what mlx_lm.perplexity.main does before load_data
        mx.random.seed(seed)
        data = P.load_data(tok, "unused", num_samples, seq_len)
    finally:
        P.load_dataset = real
    return model, data


def run_ppl(model, data_path, *extra, env=None):
    p = hearth("perplexity", model, "--data-path", data_path, "--sequence-length", str(L), "--num-samples",
               str(ROWS), "--json", *extra, env=env)
    return json.loads(p.stdout)


# Float32 models: mlx-lm and hearth both compute in float32; the difference is summation
# order (measured ~5e-6 relative in perplexity). 1e-4 relative perplexity = 1e-4 absolute
# in the mean loss; the standard error follows the same factor.
@pytest.mark.parametrize("name", ["llama-f32", "qwen3-f32", "gemma3-f32"])
def test_perplexity_matches_mlx_lm(name, tmp_path, env):
    from mlx_lm.perplexity import eval_ppl

    model_dir = tiny(name)
    rows = text_rows()
    data_path = write_rows(tmp_path / "data.jsonl", rows)
    model, data = mlx_rows(model_dir, rows)
    want_ppl, want_se = eval_ppl(model, data, batch_size=8)
    got = run_ppl(model_dir, data_path, env=env)
    assert got["rows"] == data.shape[0] and got["tokens"] == data.shape[0] * (L - 1)
    assert abs(got["perplexity"] - want_ppl) <= 1e-4 * want_ppl, (got, want_ppl)
    assert abs(got["standard_error"] - want_se) <= 1e-4 * want_se, (got, want_se)
    # the run is in the evals database, and `hearth evals` lists it
    runs = json.loads(hearth("evals", "--json", env=env).stdout)
    assert runs[0]["kind"] == "perplexity" and runs[0]["context"] == L
    assert runs[0]["details"]["perplexity"] == pytest.approx(got["perplexity"], rel=1e-12)
    assert "perplexity" in hearth("evals", env=env).stdout.decode()


def test_perplexity_chat_rows_and_txt(tmp_path, env):
    """"messages" rows go through the chat template (mlx-lm's ChatDataset); a .txt file is one
    text row per line (HF datasets' text loader)."""
    from mlx_lm.perplexity import eval_ppl

    model_dir = tiny("qwen3-f32")
    rows = chat_rows()
    model, data = mlx_rows(model_dir, rows)
    want_ppl, _ = eval_ppl(model, data, batch_size=8)
    got = run_ppl(model_dir, write_rows(tmp_path / "chat.jsonl", rows), env=env)
    assert abs(got["perplexity"] - want_ppl) <= 1e-4 * want_ppl

    lines = [r["text"] for r in text_rows(seed=9)]
    (tmp_path / "data.txt").write_text("\n".join(lines) + "\n")
    model, data = mlx_rows(model_dir, [{"text": t} for t in lines], seed=5)
    want_ppl, _ = eval_ppl(model, data, batch_size=8)
    got = run_ppl(model_dir, str(tmp_path / "data.txt"), "--seed", "5", env=env)
    assert abs(got["perplexity"] - want_ppl) <= 1e-4 * want_ppl


def mlx_logprobs(model, data):
    import mlx.core as mx

    logits = model(data[:, :-1]).astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True), dtype=np.float64).reshape(
        -1, logits.shape[-1])


def test_kl_against_itself_is_zero(tmp_path, env):
    model_dir = tiny("llama-f32")
    data_path = write_rows(tmp_path / "data.jsonl", text_rows())
    got = run_ppl(model_dir, data_path, "--kl-divergence", "--reference", model_dir, env=env)["kl_divergence"]
    # the reference's log-probs are kept as float32: a KL of ~1e-8 is that rounding
    assert abs(got["mean"]) < 1e-6 and abs(got["p99"]) < 1e-6 and got["top1_agreement"] == 1.0


def test_kl_against_quantized_sibling(tmp_path, env):
    """llama-q4g64 against llama-f32: hearth's statistics vs numpy over mlx-lm's logits."""
    ref_dir, q_dir = tiny("llama-f32"), tiny("llama-q4g64")
    rows = text_rows()
    data_path = write_rows(tmp_path / "data.jsonl", rows)
    ref_model, data = mlx_rows(ref_dir, rows)
    q_model, _ = mlx_rows(q_dir, rows)
    lr, lq = mlx_logprobs(ref_model, data), mlx_logprobs(q_model, data)
    kl = (np.exp(lr) * (lr - lq)).sum(-1)
    want = {"mean": kl.mean(), "median": np.median(kl), "p99": np.percentile(kl, 99),
            "top1_agreement": float((lr.argmax(-1) == lq.argmax(-1)).mean())}

    saved = str(tmp_path / "ref.logprobs")
    got = run_ppl(q_dir, data_path, "--kl-divergence", "--reference", ref_dir, "--reference-logits", saved,
                  env=env)["kl_divergence"]
    # hearth's CPU kernels for quantized weights take int8 activations where mlx-lm keeps
    # float32: on this random-weight model (logits in the tens) that moves the q4 model's
    # logits, so the statistics agree to 5% (mean, median, p99) and top-1 to 5 points.
    for k in ("mean", "median", "p99"):
        assert abs(got[k] - want[k]) <= 0.05 * abs(want[k]), (k, got, want)
    assert abs(got["top1_agreement"] - want["top1_agreement"]) <= 0.05, (got, want)

    # a later run reads the saved reference instead of re-running it
    again = run_ppl(q_dir, data_path, "--kl-divergence", "--reference-logits", saved, env=env)["kl_divergence"]
    assert again == got
    # other tokens (another seed picks other rows) are refused, not compared
    p = hearth("perplexity", q_dir, "--data-path", data_path, "--sequence-length", str(L), "--num-samples",
               str(ROWS), "--seed", "1", "--kl-divergence", "--reference-logits", saved, env=env, check=False)
    assert p.returncode == 1 and p.stderr.decode().startswith(f"hearth: {saved}: saved for other tokens")
    # so are the same tokens scored from another position (--second-half: llama-perplexity's rule)
    p = hearth("perplexity", q_dir, "--data-path", data_path, "--sequence-length", str(L), "--num-samples",
               str(ROWS), "--second-half", "--kl-divergence", "--reference-logits", saved, env=env, check=False)
    assert p.returncode == 1 and "scored from position 0" in p.stderr.decode()


def test_perplexity_bad_input(tmp_path, env):
    model_dir = tiny("llama-f32")
    cases = {
        "missing.jsonl": None,
        "bad.jsonl": '{"text": "fine"}\n{not json\n',
        "nokey.jsonl": '{"body": "x"}\n',
        "short.jsonl": '{"text": "too short"}\n',
        "data.csv": "text\nx\n",
    }
    for name, body in cases.items():
        path = tmp_path / name
        if body is not None:
            path.write_text(body)
        p = hearth("perplexity", model_dir, "--data-path", str(path), "--sequence-length", str(L), env=env,
                   check=False)
        msg = p.stderr.decode()
        assert p.returncode == 1 and msg.startswith("hearth: ") and str(path) in msg, (name, p.returncode, msg)
    p = hearth("perplexity", model_dir, "--data-path", str(tmp_path / "bad.jsonl"), "--kl-divergence", env=env,
               check=False)
    assert p.returncode == 2 and "--reference" in p.stderr.decode()


def read_logprobs(path):
    """A --save-logits file (docs/cli.md): magic, int32 vocab, rows, L, first scored position,
    the tokens, then float32 log-softmax rows, one per scored position."""
    raw = open(path, "rb").read()
    assert raw[:8] == b"HRTHLP02"
    vocab, rows, seq_len, first = np.frombuffer(raw, np.int32, 4, 8)
    body = 24 + 4 * rows * seq_len
    tokens = np.frombuffer(raw, np.int32, rows * seq_len, 24).reshape(rows, seq_len)
    return tokens, np.frombuffer(raw, np.float32, offset=body).reshape(-1, vocab).astype(np.float64)


def test_kl_statistics_match_numpy(tmp_path, env):
    """The statistics themselves, exactly: numpy over the two saved log-prob files gives the
    same mean, median, p99 (numpy's linear percentile, as llama-perplexity) and top-1."""
    ref_dir, q_dir = tiny("llama-f32"), tiny("llama-q8g32")
    data_path = write_rows(tmp_path / "data.jsonl", text_rows())
    ref, mine = str(tmp_path / "ref.lp"), str(tmp_path / "q.lp")
    run_ppl(ref_dir, data_path, "--save-logits", ref, env=env)
    got = run_ppl(q_dir, data_path, "--kl-divergence", "--reference-logits", ref, "--save-logits", mine, env=env)
    tr, lr = read_logprobs(ref)
    tq, lq = read_logprobs(mine)
    vocab = json.load(open(os.path.join(ref_dir, "config.json")))["vocab_size"]
    assert (tr == tq).all() and lr.shape == (ROWS * (L - 1), vocab)
    kl = (np.exp(lr) * (lr - lq)).sum(-1)
    k = got["kl_divergence"]
    # hearth's own log-probs are double before they are stored as float32: 1e-6 relative
    for name, want in (("mean", kl.mean()), ("median", np.median(kl)), ("p99", np.percentile(kl, 99))):
        assert abs(k[name] - want) <= 1e-6 * abs(want) + 1e-9, (name, k, want)
    assert k["top1_agreement"] == pytest.approx((lr.argmax(-1) == lq.argmax(-1)).mean(), abs=1e-12)
    # the perplexity agrees with the saved log-probs at the next tokens
    nll = -np.take_along_axis(lq, tq[:, 1:].reshape(-1, 1), 1).mean()
    assert got["mean_loss"] == pytest.approx(nll, rel=1e-6)


def test_second_half_scores_llama_perplexity_positions(tmp_path, env):
    """--second-half: the same rows, only positions L/2 .. L-2 scored (llama-perplexity's
    rule); each is what the full run gives at that position, and the loss is their mean."""
    model_dir = tiny("llama-q8g32")
    data_path = write_rows(tmp_path / "data.jsonl", text_rows())
    full, half = str(tmp_path / "full.lp"), str(tmp_path / "half.lp")
    run_ppl(model_dir, data_path, "--save-logits", full, env=env)
    got = run_ppl(model_dir, data_path, "--second-half", "--save-logits", half, env=env)
    tf, lf = read_logprobs(full)
    th, lh = read_logprobs(half)
    assert (tf == th).all() and got["first_scored"] == L // 2 and got["tokens"] == ROWS * (L - 1 - L // 2)
    want = lf.reshape(ROWS, L - 1, -1)[:, L // 2:]
    assert np.array_equal(lh.reshape(want.shape), want)
    nll = -np.take_along_axis(want, tf[:, L // 2 + 1:, None], 2).mean()
    assert got["mean_loss"] == pytest.approx(nll, rel=1e-6)


def test_perplexity_of_a_gguf_model(tmp_path, env):
    """A GGUF model (the tiny qwen3 written as F32 GGUF by hearth convert) takes its EOS from
    the GGUF vocabulary; its perplexity is mlx-lm's on the source folder."""
    from mlx_lm.perplexity import eval_ppl

    src = tiny("qwen3-f32")
    rows = text_rows()
    gguf_path = str(tmp_path / "qwen3.gguf")
    hearth("convert", src, "--out", gguf_path, "--outtype", "f32", env=env)
    model, data = mlx_rows(src, rows)
    want_ppl, _ = eval_ppl(model, data, batch_size=8)
    got = run_ppl(gguf_path, write_rows(tmp_path / "data.jsonl", rows), env=env)
    assert abs(got["perplexity"] - want_ppl) <= 1e-4 * want_ppl
