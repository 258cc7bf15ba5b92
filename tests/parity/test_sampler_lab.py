"""XTC against mlx-lm's sampler (mlx_lm.sample_utils.apply_xtc, with its apply_top_p /
apply_min_p before it as make_sampler chains them): on the same rows of logits, the set of
tokens hearth's sampler can draw and their probabilities must equal what mlx-lm's chain
leaves for categorical sampling at the same temperature, with the exempt ids (mlx_lm.server
passes the encoded "\\n" and the EOS ids) kept. XTC fires with probability 1 on both sides
so the comparison is deterministic. hearth's side is tests/parity/helpers/sampler_dist.c
(sampler_distribution), built against libhearth.a (HEARTH_MAKE_BUILD as in
test_gguf_dequant.py). top_k stays 0: hearth filters top-k before top-p, mlx-lm after XTC.
"""
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hearth_process import compile_helper

mx = pytest.importorskip("mlx.core")
from mlx_lm.sample_utils import apply_min_p, apply_top_p, apply_xtc  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
V = 2000
ROWS = 40
# (temperature, top_p, min_p, xtc_threshold, exempt ids)
CASES = [
    (1.0, 0.0, 0.0, 0.1, []),
    (1.0, 0.0, 0.0, 0.05, [0, 3, 5]),
    (0.7, 0.0, 0.0, 0.1, [1]),
    (1.3, 0.0, 0.0, 0.02, []),
    (1.0, 0.9, 0.0, 0.1, []),
    (1.0, 0.0, 0.05, 0.08, [2]),
]


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    return compile_helper("tests/parity/helpers/sampler_dist.c", tmp_path_factory.mktemp("helper") / "sampler_dist")


def logit_rows(seed):
    """Peaked rows (a few tokens hold most of the mass, so several pass the threshold)
    and flatter ones (none or one passes)."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 2, size=(ROWS, V)).astype(np.float32)
    for i in range(ROWS):
        k = 1 + i % 6  # 1..6 strong tokens
        top = rng.choice(V, size=k, replace=False)
        rows[i, top] += rng.uniform(6, 12, size=k).astype(np.float32)
    rows[:, :6] += 8  # the low ids are often among the strong ones: exempt ids matter
    return rows


def mlx_distribution(logits, temp, top_p, min_p, thr, exempt):
    """make_sampler's chain up to categorical_sampling, as probabilities."""
    lp = mx.array(logits) - mx.logsumexp(mx.array(logits), axis=-1, keepdims=True)  # generate_step's logprobs
    if 0 < top_p < 1:
        lp = apply_top_p(lp, top_p)
    if min_p:
        lp = apply_min_p(lp, min_p)
    lp = apply_xtc(lp, 1.0, thr, exempt)  # uniform(0,1) > 1.0 never holds: XTC always fires
    return np.array(mx.softmax(lp * (1.0 / temp), axis=-1)).astype(np.float64)


@pytest.mark.parametrize("case", CASES, ids=[f"t{c[0]}-p{c[1]}-m{c[2]}-x{c[3]}-e{len(c[4])}" for c in CASES])
def test_xtc_matches_mlx_lm(helper, tmp_path, case):
    temp, top_p, min_p, thr, exempt = case
    rows = logit_rows(CASES.index(case))
    src, out = tmp_path / "logits.f32", tmp_path / "probs.f64"
    rows.tofile(src)
    args = [str(helper), str(V), str(src), str(out), str(temp), str(top_p), "0", str(min_p), "1.0", str(thr)]
    if exempt:
        args.append(",".join(map(str, exempt)))
    subprocess.run(args, check=True)
    ours = np.fromfile(out, dtype=np.float64).reshape(ROWS, V)
    all_theirs = mlx_distribution(rows, temp, top_p, min_p, thr, exempt)
    # threshold 0.5: no two tokens can both be above it, so XTC drops nothing
    all_full = mlx_distribution(rows, temp, top_p, min_p, 0.5, [])
    cut_rows = 0
    for i in range(ROWS):
        theirs = all_theirs[i]
        # mlx-lm's float32 softmax leaves far-tail tokens at ~1e-30 where hearth's e^-40
        # candidate floor drops them: the kept sets are compared above 1e-12
        kept_ours, kept_theirs = set(np.flatnonzero(ours[i] > 1e-12)), set(np.flatnonzero(theirs > 1e-12))
        assert kept_ours == kept_theirs, f"row {i}: only hearth {sorted(kept_ours - kept_theirs)[:10]}, " \
                                         f"only mlx-lm {sorted(kept_theirs - kept_ours)[:10]}"
        # float32 softmax on mlx-lm's side (hearth sums in double): 1e-4 relative
        np.testing.assert_allclose(ours[i], theirs, rtol=1e-4, atol=1e-9, err_msg=f"row {i}")
        full = set(np.flatnonzero(all_full[i] > 1e-12))
        cut_rows += kept_theirs != full
        for t in exempt:  # an exempt id that the filters kept is never dropped by XTC
            if t in full:
                assert t in kept_ours
    assert cut_rows >= ROWS // 4, f"XTC dropped tokens in only {cut_rows} of {ROWS} rows: the case tests nothing"
