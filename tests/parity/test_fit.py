"""`hearth fit` against measurement: for each model we have at several contexts, the
predicted_peak_bytes of `hearth fit --json` must be within 2% (the issue's target) of the
peak RSS (VmHWM) of a separate process that creates the same engine and fills its whole KV
pool (`hearth generate` of a prompt one position short of the context, --max-tokens 1,
--report-memory): the pool is reserved untouched and only written blocks become resident,
so the peak is reached once every block is written. That process makes a constrained
request (--json, as a server's response_format does): fit's peak holds the vocabulary tables
constrained decoding builds at the first such request (grammar_bytes), so the measured
process builds them too. The measured side is the kernel's count of resident pages,
independent of hearth's arithmetic. Also checks the KV pool
against the formula from the model's own config.json, and that fit is deterministic.
Run with -s to see the accuracy table (model, ctx, threads, predicted, measured, error %).
"""
import json
import subprocess

import pytest

from conftest import CACHE, REAL_GGUFS

TOLERANCE = 0.02  # issue 7: predicted vs measured peak within 2%
# The tiny test models run in a ~8-16 MiB process whose own baseline (which code pages and
# heap the two processes' different paths touched) differs between the fit process and the
# measured one, and from run to run: the kernel maps a faulted library page's neighbours
# when they are in the page cache (fault-around), so the same binary on the same input
# measured 15.40-16.02 MB for qwen3-q4g64 at ctx 2048 (1 or 2 threads, huge pages on or
# off). For processes under 64 MiB the bound is absolute, on the medians of three runs.
SMALL_PROCESS = 64 << 20
SMALL_TOLERANCE_BYTES = 1 << 20
KV_BLOCK = 16     # src/kv/kv_cache.h KV_BLOCK_SIZE

# Filling the pool is a prefill of the whole context: real models at contexts a 2-core
# machine prefills in seconds, the tiny ones at longer ones.
CASES = [(f"models/{REAL_GGUFS[k]}", ctx, 2) for k in ("smollm2", "gemma3") for ctx in (256, 1024)]
CASES += [(f"tiny/{name}", ctx, 2) for name in ("llama-f32", "qwen3-q4g64", "gemma3-bf16", "gemma4-f32", "gemma4_moe-q4g64")
          for ctx in (256, 2048)]
CASES += [("tiny/qwen3_5-q4g64", ctx, 2) for ctx in (256, 2048)]  # hybrid: the recurrent-state pool too
CASES += [(f"models/{REAL_GGUFS['smollm2']}", 512, t) for t in (1, 4)]

ROWS = []


@pytest.fixture(scope="module", autouse=True)
def accuracy_table():
    yield
    if ROWS:
        print("\n| model | ctx | threads | predicted MiB | measured MiB | error % |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in ROWS:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3] / 2**20:.1f} | {r[4] / 2**20:.1f} | {r[5]:+.2f} |")
        print(f"worst |error|: {max(abs(r[5]) for r in ROWS):.2f}%")


def model_path(rel):
    path = CACHE / rel
    if not path.exists():
        pytest.fail(f"model missing: {path}; run tools/get_models.sh (or `make parity`)", pytrace=False)
    return path


def run_fit(hearth_bin, model, *args):
    p = subprocess.run([str(hearth_bin), "fit", str(model), "--json", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def filling_prompt(hearth_bin, model, n):
    """A text of exactly n tokens as `generate --no-chat-template` tokenizes it (with its
    special tokens): " the" repeated, the count corrected with `hearth tokenize`."""
    k = n
    for _ in range(4):
        text = "the" + " the" * (k - 1)
        p = subprocess.run([str(hearth_bin), "tokenize", str(model), text], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        got = len(json.loads(p.stdout))
        if got == n:
            return text
        k += n - got
    pytest.fail(f"no {n}-token prompt for {model}")


def measure_peak(hearth_bin, model, ctx, threads, *extra, fill=True, constrained=True):
    """The --report-memory line of `hearth generate`; constrained: with --json (any JSON
    object), which builds the grammar tables a server builds at its first constrained request."""
    prompt = filling_prompt(hearth_bin, model, ctx - 1) if fill else "hi"
    p = subprocess.run([str(hearth_bin), "generate", str(model), prompt, "--no-chat-template", "--max-tokens", "1", "--ctx", str(ctx),
                        "--threads", str(threads), "--report-memory", *(["--json"] if constrained else []), *extra],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    line = [l for l in p.stderr.splitlines() if l.startswith('{"peak_rss_bytes"')]
    assert line, f"no --report-memory line in: {p.stderr[-500:]}"
    return json.loads(line[-1])


@pytest.mark.parametrize("rel,ctx,threads", CASES)
def test_predicted_peak_within_2_percent(hearth_bin, rel, ctx, threads, extra=()):
    model = model_path(rel)
    # generate holds one sequence and does not speculate (fit assumes serve's 8 sequences and
    # prompt lookup, whose verify rows the engine sizes, unless told)
    fit = run_fit(hearth_bin, model, "--ctx", str(ctx), "--threads", str(threads), "--max-sequences", "1",
                  "--speculate", "none", *extra)
    measured = measure_peak(hearth_bin, model, ctx, threads, *extra)
    assert fit["context_length"] == ctx and fit["threads"] == threads and fit["max_sequences"] == 1
    # the engine reports the bytes it allocated: the same sizing as the prediction's engine part
    assert measured["engine_bytes"] == fit["engine_bytes"]
    peak = measured["peak_rss_bytes"]
    err = (fit["predicted_peak_bytes"] - peak) / peak
    ROWS.append((rel.split("/")[-1] + (" " + " ".join(extra) if extra else ""), ctx, threads,
                 fit["predicted_peak_bytes"], peak, 100 * err))
    # every check is also a row of the evals database (`hearth evals` lists them)
    rec = subprocess.run([str(hearth_bin), "evals", "add", "--kind", "fit-check", "--model", str(model), "--ctx",
                          str(ctx), "--predicted", str(fit["predicted_peak_bytes"]), "--measured", str(peak),
                          "--details", json.dumps({"threads": threads, "fit": fit})],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    if peak < SMALL_PROCESS:
        # both sides' baselines move by a few hundred KiB from run to run (above): compare the
        # medians of three runs of each
        preds = [fit["predicted_peak_bytes"]] + [
            run_fit(hearth_bin, model, "--ctx", str(ctx), "--threads", str(threads), "--max-sequences", "1",
                    "--speculate", "none", *extra)["predicted_peak_bytes"] for _ in range(2)]
        peaks = [peak] + [measure_peak(hearth_bin, model, ctx, threads, *extra)["peak_rss_bytes"] for _ in range(2)]
        pred, peak = sorted(preds)[1], sorted(peaks)[1]
        assert abs(pred - peak) <= SMALL_TOLERANCE_BYTES, f"median predicted {pred} vs median measured {peak}: {preds} {peaks}"
    else:
        assert abs(err) <= TOLERANCE, f"predicted {fit['predicted_peak_bytes']} vs measured {peak} ({100 * err:+.2f}%)"
    # the parts: the engine's, the grammar tables (and their build's temporaries), the runtime
    parts = ("weights_bytes", "kv_pool_bytes", "scratch_bytes", "buffers_bytes", "grammar_bytes", "runtime_overhead_bytes")
    assert sum(fit[k] for k in parts) == fit["predicted_peak_bytes"]
    assert fit["grammar_bytes"] == sum(fit["grammar"][k] for k in ("vocab_tables_bytes", "build_temporary_bytes")) > 0


# int8 KV (--kv-quant int8): the same contract with the smaller pool
INT8_CASES = [(f"models/{REAL_GGUFS[k]}", ctx, 2) for k in ("smollm2", "gemma3") for ctx in (256, 1024)]
INT8_CASES += [("tiny/llama-f32", 2048, 2)]


@pytest.mark.parametrize("rel,ctx,threads", INT8_CASES)
def test_int8_kv_predicted_peak_within_2_percent(hearth_bin, rel, ctx, threads):
    test_predicted_peak_within_2_percent(hearth_bin, rel, ctx, threads, ("--kv-quant", "int8"))


def test_grammar_tables_are_the_constrained_processes_difference(hearth_bin):
    """The grammar tables alone: the same filled-context process run with and without a
    constraint (--json) differs in peak RSS by what fit's grammar_bytes says (tables plus
    the build's temporaries; within 1 MiB or 10%), SmolLM2 at a context where the running
    engine, not the load, makes the peak. fit's start figure leaves them out (built at the
    first constrained request), its peak holds them."""
    model = model_path(f"models/{REAL_GGUFS['smollm2']}")
    fit = run_fit(hearth_bin, model, "--ctx", "1024", "--threads", "2", "--max-sequences", "1", "--speculate", "none")
    assert fit["predicted_peak_bytes"] - fit["weights_load_peak_bytes"] > 2 * fit["grammar_bytes"]  # the run's peak
    diffs = []
    for _ in range(3):
        con = measure_peak(hearth_bin, model, 1024, 2)["peak_rss_bytes"]
        free = measure_peak(hearth_bin, model, 1024, 2, constrained=False)["peak_rss_bytes"]
        diffs.append(con - free)
    diff = sorted(diffs)[1]
    g = fit["grammar_bytes"]
    print(f"\ngrammar: predicted {g} bytes, measured difference {diff} (runs {diffs})")
    assert abs(diff - g) <= max(1 << 20, g // 10), (g, diffs)


def kv_layer_shapes(cfg):
    """(KV heads, head_dim) of each layer that keeps a cache, from config.json. Gemma 4 as
    mlx-lm's gemma4_text.py reads it (make_cache, Attention): only the layers before the last
    num_kv_shared_layers keep one; a full-attention layer has global_head_dim and, with
    attention_k_eq_v, num_global_key_value_heads; a sliding one head_dim and
    num_key_value_heads. Every other family: each layer alike."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    if cfg["model_type"] != "gemma4_text":
        return [(kv_heads, head_dim)] * cfg["num_hidden_layers"]
    own = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    full_heads = cfg["num_global_key_value_heads"] if cfg.get("attention_k_eq_v") else kv_heads
    return [(full_heads, cfg["global_head_dim"]) if t == "full_attention" else (kv_heads, head_dim)
            for t in cfg["layer_types"][:own]]


@pytest.mark.parametrize("name", ["llama-f32", "gemma3-bf16", "gemma4-f32"])
def test_kv_pool_matches_config(hearth_bin, name):
    """K and V for every layer that keeps a cache, block-rounded positions, float32, from
    config.json; the rest is the block tables (one int32 per block per sequence, plus the
    free list)."""
    model = model_path(f"tiny/{name}")
    cfg = json.loads((model / "config.json").read_text())
    shapes = kv_layer_shapes(cfg)
    # the default pool holds every sequence's whole context (these fit: no cut to free memory)
    for ctx, batch in ((100, 1), (2048, 2), (512, 5)):
        fit = run_fit(hearth_bin, model, "--ctx", str(ctx), "--batch", str(batch))
        blocks = -(-ctx // KV_BLOCK) * batch
        tensors = sum(2 * blocks * KV_BLOCK * heads * dim * 4 for heads, dim in shapes)
        tables = 4 * (blocks + batch + blocks)  # per-slot block tables, token counts, free list
        # int8 (--kv-quant int8): head_dim bytes plus one float32 scale per position, head,
        # K and V instead of head_dim floats; the block metadata is the same
        q8 = run_fit(hearth_bin, model, "--ctx", str(ctx), "--batch", str(batch), "--kv-quant", "int8")
        assert q8["kv_quant"] == "int8" and fit["kv_quant"] == "none"
        q8_tensors = sum(2 * blocks * KV_BLOCK * heads * (dim + 4) for heads, dim in shapes)
        assert fit["kv_pool_bytes"] - q8["kv_pool_bytes"] == tensors - q8_tensors
        # prefix-cache metadata (src/kv/kv_prefix.c): per block 64 bytes of hash, partial-match
        # key, namespace (the adapter set), generations, parent, refcount, list links and valid
        # count plus its 16 token ids; two power-of-two bucket arrays of int32 (chain names,
        # partial matches) with at least one bucket per block each; 32 bytes of chain state
        # (with its namespace) per slot; 56 fixed
        buckets = 1 << max(0, (blocks - 1).bit_length())
        prefix = blocks * (64 + 4 * KV_BLOCK) + 2 * 4 * buckets + 32 * batch + 56
        assert fit["kv_pool_bytes"] == tensors + tables + prefix
        assert fit["max_sequences"] == batch
        assert fit["kv_blocks"] == blocks and fit["kv_blocks_cut_from"] == 0


@pytest.mark.parametrize("name", ["llama-f32", "gemma4-f32"])
def test_cuda_kv_pool_matches_config(hearth_bin, name):
    """fit --device cuda (no GPU needed: --sku): the device pool is K and V of every layer
    that keeps a cache at that layer's own shape (Gemma 4: sliding and full layers differ,
    shared-KV layers keep none), block-rounded positions, then the block tables; each
    allocation rounded as the device allocator takes it (2 MiB pages from 2 MiB, else 512
    bytes: cuda_plan.c). int8: one byte per element and a float scale per (position, head)."""
    model = model_path(f"tiny/{name}")
    shapes = kv_layer_shapes(json.loads((model / "config.json").read_text()))

    def alloc(n):
        return -(-n // (2 << 20)) * (2 << 20) if n >= 2 << 20 else -(-n // 512) * 512
    for ctx, batch in ((100, 1), (4096, 8)):
        blocks = -(-ctx // KV_BLOCK) * batch
        rows = sum(blocks * KV_BLOCK * heads for heads, _ in shapes)
        elems = sum(blocks * KV_BLOCK * heads * dim for heads, dim in shapes)
        tables = alloc(4 * blocks)  # one int32 per block of each slot's table
        f32 = run_fit(hearth_bin, model, "--device", "cuda", "--sku", "h200", "--ctx", str(ctx), "--batch", str(batch))
        q8 = run_fit(hearth_bin, model, "--device", "cuda", "--sku", "h200", "--ctx", str(ctx), "--batch", str(batch),
                     "--kv-quant", "int8")
        assert f32["kv_blocks"] == q8["kv_blocks"] == blocks and f32["kv_device_dtype"] == "f32"
        assert f32["kv_pool_bytes"] == 2 * alloc(4 * elems) + tables
        assert q8["kv_pool_bytes"] == 2 * alloc(elems) + 2 * alloc(4 * rows) + tables


def test_fit_is_deterministic_and_flags_checked(hearth_bin):
    model = model_path(f"models/{REAL_GGUFS['smollm2']}")
    a = run_fit(hearth_bin, model, "--ctx", "1024", "--bandwidth", "20")
    b = run_fit(hearth_bin, model, "--ctx", "1024", "--bandwidth", "20")
    for k in ("weights_bytes", "kv_pool_bytes", "scratch_bytes", "buffers_bytes", "engine_bytes",
              "decode_bytes_per_token", "decode_tok_s"):
        assert a[k] == b[k], k
    assert a["bandwidth_source"] == "given"
    assert a["decode_tok_s"] == pytest.approx(20e9 / a["decode_bytes_per_token"])
    # the largest context that fits is one whose need stays within the available memory
    assert a["fits"] and a["max_context_that_fits"] == a["model_max_context"]
    p = subprocess.run([str(hearth_bin), "fit", str(model), "--ctx", "-5"], capture_output=True, text=True)
    assert p.returncode == 2 and "usage" in p.stderr


def test_load_holds_one_tensor_not_the_whole_file(hearth_bin):
    """The loader drops each tensor's file pages once it is copied (src/model/load.c), so the
    load's peak is the weight arena plus one tensor's pages, not the file beside the weights.
    Measured: before that change SmolLM2 Q4_1 at ctx 256 peaked at 201 MiB (the 92 MiB of
    weights held twice); the kernel's VmHWM must now stay below base + weights + half the file,
    and fit's own load figure must say the same."""
    model = model_path(f"models/{REAL_GGUFS['smollm2']}")
    fit = run_fit(hearth_bin, model, "--ctx", "256", "--threads", "2", "--max-sequences", "1")
    measured = measure_peak(hearth_bin, model, 256, 2, fill=False, constrained=False)
    half_file = model.stat().st_size // 2
    base = fit["runtime_overhead"]["process_resident_bytes"]
    assert fit["weights_bytes"] <= fit["weights_load_peak_bytes"] < fit["weights_bytes"] + half_file
    assert measured["peak_rss_bytes"] < base + fit["weights_bytes"] + half_file, (measured, fit)


def test_hybrid_kv_pool_and_state_match_config(hearth_bin):
    """Qwen3.5 (src/kv/kv_state.h): keys and values for the full-attention layers only, and per
    sequence a float32 record per Gated DeltaNet layer (the conv's last width - 1 inputs of
    2 k_heads k_dim + v_heads v_dim channels, then v_heads [v_dim, k_dim] matrices), plus
    2 x sequences + 2 snapshot records of all of them plus min(sequences, 4) backups for
    speculative decoding (24 bytes of metadata each) and the pool's 56-byte header; all from
    config.json."""
    model = model_path("tiny/qwen3_5-f32")
    cfg = json.loads((model / "config.json").read_text())
    n, every = cfg["num_hidden_layers"], cfg["full_attention_interval"]
    full = sum(1 for i in range(n) if (i + 1) % every == 0)
    kh, vh, kd, vd, width = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads",
                                              "linear_key_head_dim", "linear_value_head_dim",
                                              "linear_conv_kernel_dim"))
    per_seq = (n - full) * ((width - 1) * (2 * kh * kd + vh * vd) + vh * vd * kd) * 4
    for ctx, batch in ((100, 1), (512, 3)):
        fit = run_fit(hearth_bin, model, "--ctx", str(ctx), "--batch", str(batch))
        blocks = -(-ctx // KV_BLOCK) * batch
        tensors = 2 * full * blocks * KV_BLOCK * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
        tables = 4 * (blocks + batch + blocks)
        buckets = 1 << max(0, (blocks - 1).bit_length())
        prefix = blocks * (64 + 4 * KV_BLOCK) + 2 * 4 * buckets + 32 * batch + 56  # as test_kv_pool_matches_config
        snaps = 2 * batch + 2 + min(batch, 4)
        state = 56 + batch * per_seq + snaps * (per_seq + 24)
        assert fit["kv_pool_bytes"] == tensors + tables + prefix + state


def test_draft_model_counted_on_a_gpu(hearth_bin):
    """--device cuda (a named GPU, no device needed): the draft's engine on the same GPU is its
    own device plan (weights, KV pool, scratch, sampler), made from the memory the target's
    engine left, with the target's context, sequences and step; the CUDA context is counted
    once, the draft's own cuBLAS handle (runtime_bytes: data/cuda_runtime.json's extra_engine_bytes,
    measured on an H100 by tools/gpu_run.d/train-serve.sh) beside it. SmolLM2 drafting for itself:
    the draft's device engine equals the model's own without speculation (a draft verifies
    nothing), the peak grows by exactly it and the handle, and a pool that fits the target alone
    on an L4 stops fitting with the draft."""
    model = model_path(f"models/{REAL_GGUFS['smollm2']}")
    args = ("--sku", "L4", "--ctx", "2048", "--max-sequences", "8", "--max-step-tokens", "256")
    alone = run_fit(hearth_bin, model, *args)
    fit = run_fit(hearth_bin, model, *args, "--draft-model", str(model))
    as_draft = run_fit(hearth_bin, model, *args, "--speculate", "none")  # a draft verifies nothing itself
    assert alone["device"] == "cuda" and "draft" not in alone
    assert fit["draft"]["engine_bytes"] == as_draft["engine_bytes"] < alone["engine_bytes"]
    assert fit["draft"]["runtime_bytes"] == 60 << 20  # the measured second handle (compute capability 8.9: the default row)
    assert fit["draft_bytes"] == fit["draft"]["engine_bytes"] + fit["draft"]["runtime_bytes"]
    assert fit["draft"]["weights_bytes"] == alone["weights_bytes"]
    assert fit["draft"]["kv_pool_bytes"] == alone["kv_pool_bytes"]
    assert fit["predicted_peak_bytes"] == alone["predicted_peak_bytes"] + fit["draft_bytes"]
    assert fit["host"]["predicted_peak_bytes"] > alone["host"]["predicted_peak_bytes"]
    # a pool of 60% of the card: the target fits, target and draft do not
    blocks = int(0.6 * alone["available_bytes"] / (alone["kv_pool_bytes"] / alone["kv_blocks"]))
    big = ("--sku", "L4", "--ctx", "2048", "--max-sequences", "8", "--kv-blocks", str(blocks))
    assert run_fit(hearth_bin, model, *big)["fits"] is True
    assert run_fit(hearth_bin, model, *big, "--draft-model", str(model))["fits"] is False


def test_draft_model_counted(hearth_bin):
    """--draft-model: the draft's engine (weights, KV pool, scratch, buffers, its threads) is
    created beside the target's; fit adds it (draft_bytes, parts still summing to the peak)
    and the prediction stays within 2% of `generate --draft-model`'s measured peak, where
    leaving the draft out would be far off (SmolLM2 drafting for itself: the draft is as big)."""
    model = model_path(f"models/{REAL_GGUFS['smollm2']}")
    args = ("--ctx", "512", "--threads", "2", "--max-sequences", "1")
    fit = run_fit(hearth_bin, model, *args, "--draft-model", str(model))
    alone = run_fit(hearth_bin, model, *args)
    # the draft's pool and scratch are written once it proposes: a prompt of 488 tokens and 16
    # generated ones (both pools all but full), the draft proposing from the first
    prompt = filling_prompt(hearth_bin, model, 488)
    p = subprocess.run([str(hearth_bin), "generate", str(model), prompt, "--no-chat-template", "--max-tokens", "16",
                        "--ctx", "512", "--threads", "2", "--report-memory", "--json", "--draft-model",
                        str(model)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "tokens proposed" in p.stderr and " 0 tokens proposed" not in p.stderr, p.stderr[-400:]
    peak = json.loads([x for x in p.stderr.splitlines() if x.startswith('{"peak_rss_bytes"')][-1])["peak_rss_bytes"]
    assert fit["draft"]["weights_bytes"] == alone["weights_bytes"] and fit["draft_bytes"] > alone["weights_bytes"]
    err = (fit["predicted_peak_bytes"] - peak) / peak
    ROWS.append(("smollm2 + itself as draft", 512, 2, fit["predicted_peak_bytes"], peak, 100 * err))
    assert abs(err) <= TOLERANCE, f"predicted {fit['predicted_peak_bytes']} vs measured {peak} ({100 * err:+.2f}%)"
    assert abs((alone["predicted_peak_bytes"] - peak) / peak) > 4 * TOLERANCE  # the draft is what closes it
    parts = ("weights_bytes", "kv_pool_bytes", "scratch_bytes", "buffers_bytes", "grammar_bytes",
             "runtime_overhead_bytes", "draft_bytes")
    assert sum(fit[k] for k in parts) == fit["predicted_peak_bytes"]
