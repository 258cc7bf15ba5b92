#!/usr/bin/env python3
"""bench/cpu_quality/run.py: how far the CPU fast tier's logits are from the reference tier's,
measured the way llama.cpp's users measure a quantization (llama-perplexity --kl-divergence):
teacher-forced over a fixed corpus (bench/cpu_quality/corpus: prose, code, a chat rendered with
each model's template), the full next-token distribution at every position, KL(reference ||
candidate) averaged and at its 99th percentile, and how often the top token agrees.

Reference: hearth with HEARTH_CPU=scalar (float32 activations, double accumulation). Candidates:
hearth's fast tier at each ISA level this CPU has (HEARTH_CPU=avx2, avx512), fed either 8 tokens
per call (the multi-token tile kernels of prefill and batched decode) or 1 (the decode kernels),
and llama.cpp (llama-cpp-python with bench/cpu_vs_llamacpp's native build, all logits of one
batch per document), on the same token ids of the same GGUF file, 2 threads each.
Writes bench/results/cpu_quality.md (bench/results_file.py: the tables, bench/cpu_quality/notes.md's
hand-measured sections, then the full result as json). A benchmark, not a test: it asserts nothing.
usage: .venv/bin/python bench/cpu_quality/run.py [--hearth-lib lib/libhearth.so] [--threads 2]
       [--models smollm2,gemma3] [--out bench/results/cpu_quality] [--keep DIR] [--engines hearth,llamacpp] [--append]
"""
import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402
sys.path.insert(0, str(REPO / "bench" / "cpu_vs_llamacpp"))
import run_bench  # noqa: E402  (machine description helpers)

CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
MODELS = {"smollm2": ("SmolLM2-135M-Instruct Q4_1", CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
          "gemma3": ("Gemma 3 270M Q4_K_M", CACHE / "models" / "gemma-3-270m-q4_k_m.gguf")}
DOCS = ("prose", "explain", "code", "chat")


# ---- hearth through its public C API (include/hearth.h) ---------------------------------------

class Err(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("message", ctypes.c_char * 1024)]


class EngineOptions(ctypes.Structure):
    """hearth_engine_options of include/hearth.h, every field in order (the library reads all of
    them: a shorter struct here would hand it whatever memory follows)."""
    _fields_ = [("n_threads", ctypes.c_int), ("context_length", ctypes.c_int), ("max_step_tokens", ctypes.c_int),
                ("max_sequences", ctypes.c_int), ("use_mmap", ctypes.c_int), ("kv_blocks", ctypes.c_int),
                ("kv_budget_bytes", ctypes.c_double), ("kv_quant", ctypes.c_int), ("deterministic", ctypes.c_int),
                ("device", ctypes.c_int), ("cuda_exact", ctypes.c_int), ("max_logits_rows", ctypes.c_int),
                ("host_sampler", ctypes.c_int), ("speculate", ctypes.c_int), ("draft_model", ctypes.c_void_p)]


def hearth_lib(path):
    lib = ctypes.CDLL(str(path))
    lib.hearth_model_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Err)]
    lib.hearth_engine_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(EngineOptions),
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Err)]
    lib.hearth_seq_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(Err)]
    lib.hearth_seq_append.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                      ctypes.c_size_t, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(Err)]
    lib.hearth_seq_close.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.hearth_model_vocab_rows.argtypes = [ctypes.c_void_p]
    lib.hearth_model_vocab_rows.restype = ctypes.c_int32
    lib.hearth_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                    ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)), ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(Err)]
    lib.hearth_chat_render.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(Err)]
    lib.hearth_free.argtypes = [ctypes.c_void_p]
    return lib


def check(st, err, what):
    if st:
        sys.exit(f"cpu_quality: {what}: {err.message.decode(errors='replace')}")


def render_chat(lib, m, msgs):
    """The chat through the model's template; a model without one (Gemma 3 270M's GGUF) gets
    plain "Role: text" turns."""
    err, text_p = Err(), ctypes.c_char_p()
    if lib.hearth_chat_render(m, msgs.encode(), None, 0, None, ctypes.byref(text_p), ctypes.byref(err)) == 0:
        text = text_p.value
        lib.hearth_free(text_p)
        return text, 0  # the template writes the special tokens itself
    turns = [f"{t['role'].capitalize()}: {t['content']}" for t in json.loads(msgs)]
    return "\n\n".join(turns).encode(), 1


def corpus_ids(lib, model_path):
    """The corpus as token ids of this model: the text files as they are (with the tokenizer's
    special prefix), the chat through the model's own template."""
    err, m = Err(), ctypes.c_void_p()
    check(lib.hearth_model_open(str(model_path).encode(), ctypes.byref(m), ctypes.byref(err)), err, "open")
    out = {}
    for name in DOCS:
        if name == "chat":
            text, special = render_chat(lib, m, (HERE / "corpus" / "chat.json").read_text(encoding="utf-8"))
        else:
            text, special = (HERE / "corpus" / f"{name}.txt").read_bytes(), 1
        ids_p, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        check(lib.hearth_tokenize(m, text, len(text), special, ctypes.byref(ids_p), ctypes.byref(n),
                                  ctypes.byref(err)), err, "tokenize")
        out[name] = [ids_p[i] for i in range(n.value)]
        lib.hearth_free(ids_p)
    return out


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def hearth_logits(args, docs):
    """Yields (doc, logits[rows, vocab]) with hearth (the level HEARTH_CPU selects), args.chunk
    tokens per hearth_seq_append, logits for each of them."""
    lib = hearth_lib(args.hearth_lib)
    err, m, e, seq = Err(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    check(lib.hearth_model_open(str(args.model).encode(), ctypes.byref(m), ctypes.byref(err)), err, "open")
    longest = max(len(v) for v in docs.values())
    opts = EngineOptions(n_threads=args.threads, context_length=longest + 16, max_sequences=1)
    check(lib.hearth_engine_create(m, ctypes.byref(opts), ctypes.byref(e), ctypes.byref(err)), err, "engine")
    vocab = lib.hearth_model_vocab_rows(e)
    buf = np.empty((8, vocab), dtype=np.float32)
    for name in DOCS:
        ids = docs[name]
        check(lib.hearth_seq_open(e, ctypes.byref(seq), ctypes.byref(err)), err, "seq")
        rows = []
        for i in range(0, len(ids) - 1, args.chunk):  # the last token predicts nothing we can score
            part = ids[i:min(i + args.chunk, len(ids) - 1)]
            arr = (ctypes.c_int32 * len(part))(*part)
            check(lib.hearth_seq_append(e, seq, arr, len(part), len(part),
                                        buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.byref(err)),
                  err, "append")
            rows.append(buf[:len(part)].copy())
        lib.hearth_seq_close(e, seq)
        yield name, np.concatenate(rows)


def llamacpp_logits(args, docs):
    import prepare_models
    llama_cpp = prepare_models.import_llama_cpp()
    longest = max(len(v) for v in docs.values())
    llm = llama_cpp.Llama(model_path=str(args.model), n_threads=args.threads, n_threads_batch=args.threads,
                          n_ctx=longest + 16, n_batch=longest + 16, n_ubatch=512, logits_all=True, use_mmap=False,
                          n_gpu_layers=0, verbose=False)
    for name in DOCS:
        ids = docs[name][:-1]
        llm.reset()
        llm.eval(ids)
        yield name, np.array(llm.scores[:len(ids)], dtype=np.float32)


def worker(args):
    """Child process: one engine over the corpus. With --ref-dir it writes the reference's log
    probabilities there; otherwise it reads them and prints per-position KL and top-1 agreement."""
    docs = json.loads(Path(args.ids).read_text())
    gen = llamacpp_logits(args, docs) if args.engine == "llamacpp" else hearth_logits(args, docs)
    result, t0 = {}, time.time()
    for name, logits in gen:
        ref_path = Path(args.ref_dir) / f"{name}.npy"
        if args.write_ref:
            np.save(ref_path, log_softmax(logits).astype(np.float32))
            continue
        ref = np.load(ref_path, mmap_mode="r")
        n = min(ref.shape[1], logits.shape[1])  # rows past the tokenizer's vocabulary (padding), if any
        kl, top1, margin, merr = [], [], [], []
        for i in range(0, ref.shape[0], 64):
            lp_ref = np.asarray(ref[i:i + 64, :n], dtype=np.float64)
            lp = log_softmax(logits[i:i + 64, :n])
            kl.extend((np.exp(lp_ref) * (lp_ref - lp)).sum(axis=1).tolist())
            top1.extend((lp_ref.argmax(axis=1) == lp.argmax(axis=1)).tolist())
            # the reference's top two tokens: its margin between them and the candidate's error in
            # that margin (a top-1 flip is an error below minus the margin)
            two = np.argsort(-lp_ref, axis=1)[:, :2]
            rows = np.arange(len(two))[:, None]
            m_ref = np.diff(lp_ref[rows, two], axis=1)[:, 0] * -1
            m_cand = np.diff(lp[rows, two], axis=1)[:, 0] * -1
            margin.extend(m_ref.tolist())
            merr.extend((m_cand - m_ref).tolist())
        result[name] = {"kl": kl, "top1": top1, "margin": margin, "margin_err": merr}
    print(json.dumps({"docs": result, "seconds": time.time() - t0}))


def run_worker(engine, model, ids_path, ref_dir, args, env_cpu=None, chunk=8, write_ref=False):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", engine, "--model", str(model), "--ids", ids_path,
           "--ref-dir", ref_dir, "--threads", str(args.threads), "--chunk", str(chunk),
           "--hearth-lib", str(args.hearth_lib)] + (["--write-ref"] if write_ref else [])
    env = dict(os.environ)
    env.pop("HEARTH_CPU", None)
    if env_cpu:
        env["HEARTH_CPU"] = env_cpu
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"cpu_quality: {engine} {env_cpu or ''} failed:\n{out.stderr[-2000:]}")
    print(f"  {engine} {env_cpu or ''} chunk {chunk}: {time.time() - t0:.0f} s", file=sys.stderr)
    return None if write_ref else json.loads(out.stdout.strip().splitlines()[-1])


def summarize(docs):
    kl = np.concatenate([np.array(d["kl"]) for d in docs.values()])
    top1 = np.concatenate([np.array(d["top1"]) for d in docs.values()])
    per_doc = {k: {"mean_kl": float(np.mean(v["kl"])), "top1": float(np.mean(v["top1"])), "n": len(v["kl"])}
               for k, v in docs.items()}
    out = {"n": int(kl.size), "mean_kl": float(kl.mean()), "p99_kl": float(np.percentile(kl, 99)),
           "max_kl": float(kl.max()), "top1": float(top1.mean()), "top1_agree": int(top1.sum()), "per_doc": per_doc}
    if all("margin_err" in d for d in docs.values()):
        out.update(top1_noise(np.concatenate([np.array(d["margin"]) for d in docs.values()]),
                              np.concatenate([np.array(d["margin_err"]) for d in docs.values()])))
    return out


def top1_noise(margin, merr):
    """How many top-1 agreements this error size predicts, and their spread: position i flips when
    the error in the reference's top-two margin falls below -margin_i. Taking the errors as drawn
    independently of the margin from their own distribution over the corpus, position i flips with
    probability p_i = the fraction of errors below -margin_i; the agreements then number
    sum(1 - p_i) with standard deviation sqrt(sum p_i (1 - p_i)). Two engines whose error
    distributions are alike predict the same count, and their observed counts differ by chance
    within about 2 * sqrt(sd_a^2 + sd_b^2) (more if their flips are independent of each other)."""
    srt = np.sort(merr)
    p = np.searchsorted(srt, -margin, side="left") / len(srt)
    near = margin < NEAR_TIE
    return {"rms_margin_err": float(np.sqrt(np.mean(merr ** 2))), "top1_expected": float(np.sum(1 - p)),
            "top1_sd": float(np.sqrt(np.sum(p * (1 - p)))), "near_ties": int(near.sum()),
            "rms_margin_err_near": float(np.sqrt(np.mean(merr[near] ** 2))) if near.any() else None}


NEAR_TIE = 0.5  # nats: reference top-two margins below this are where top-1 flips happen


BLOCK = 32  # positions per bootstrap block: neighbouring positions' errors are not independent
DRAWS = 2000


def paired_interval(cand, peer, seed=0):
    """hearth minus llama.cpp on the same positions: mean KL, p99 KL and top-1 agreement, each
    as [2.5%, 97.5%] of a paired block bootstrap (blocks of BLOCK consecutive positions drawn
    with replacement, DRAWS times); an interval that holds 0 is a difference the corpus cannot
    tell from rounding noise."""
    ka, kb = (np.concatenate([np.array(d[k]["kl"]) for k in DOCS]) for d in (cand, peer))
    ta, tb = (np.concatenate([np.array(d[k]["top1"], dtype=float) for k in DOCS]) for d in (cand, peer))
    n = (len(ka) // BLOCK) * BLOCK
    blocks = np.arange(n).reshape(-1, BLOCK)
    pick = blocks[np.random.default_rng(seed).integers(0, len(blocks), size=(DRAWS, len(blocks)))].reshape(DRAWS, -1)
    diffs = {"mean_kl": ka[pick].mean(1) - kb[pick].mean(1),
             "p99_kl": np.percentile(ka[pick], 99, axis=1) - np.percentile(kb[pick], 99, axis=1),
             "top1": ta[pick].mean(1) - tb[pick].mean(1)}
    if all("margin_err" in d[k] for d in (cand, peer) for k in DOCS):  # mean squared error in the top-two margin
        ea, eb = (np.concatenate([np.array(d[k]["margin_err"]) for k in DOCS]) ** 2 for d in (cand, peer))
        diffs["margin_mse"] = ea[pick].mean(1) - eb[pick].mean(1)
    return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in diffs.items()}


def add_intervals(rows):
    for peer in [r for r in rows if r["engine"].startswith("llama.cpp") and "_docs" in r]:
        for r in rows:
            if r["model"] == peer["model"] and r["engine"].startswith("hearth") and "_docs" in r:
                r["vs_llamacpp_95"] = paired_interval(r["_docs"], peer["_docs"])
    for r in rows:
        r.pop("_docs", None)


def hearth_levels():
    flags = run_bench.cpu_info()["isa"]
    levels = ["avx2"] if {"avx2", "fma", "f16c"} <= set(flags) else []
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(flags):
        levels.append("avx512")
    return levels


def markdown(res):
    m = res["machine"]
    lines = ["# CPU fast tier vs reference tier: KL divergence and top-1 agreement", "",
             f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs ({', '.join(m['isa'])}), shared with other "
             f"tenants (each row gives its date and 1-minute load average before -> after; load does not change "
             f"the numbers, only how long they take) and hearth's commit; {res['threads']} threads each.", "",
             "Teacher-forced over `bench/cpu_quality/corpus` (a story, an explanation, code, a chat through the model's template), "
             "every position's full next-token distribution against hearth's reference tier (`HEARTH_CPU=scalar`: "
             "float32 activations, double accumulation) on the same token ids: KL(reference || candidate) in nats "
             "(mean, 99th percentile, max) and how often the top token agrees. hearth `chunk 8`: 8 tokens per "
             "`hearth_seq_append` (the multi-token tile kernels of prefill and batched decode), `chunk 1`: one "
             "(the decode kernels); llama.cpp: each document as one batch, all logits. "
             "Produced by `bench/cpu_quality/run.sh`.", "",
             "| model | engine | positions | mean KL | p99 KL | max KL | top-1 agree | story / explain / code / chat mean KL "
             "| date, hearth, load |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for row in res["rows"]:
        s = row["summary"]
        pd = " / ".join(f"{s['per_doc'][d]['mean_kl']:.4f}" for d in DOCS)
        lines.append(f"| {row['model']} | {row['engine']} | {s['n']} | {s['mean_kl']:.4f} | {s['p99_kl']:.4f} | "
                     f"{s['max_kl']:.3f} | {s['top1']:.2%} ({s['top1_agree']}/{s['n']}) | {pd} | "
                     f"{row['date']}, {row['commit']}, {row['load_before'][0]} -> {row['load_after'][0]} |")
    paired = [r for r in res["rows"] if "vs_llamacpp_95" in r]
    if paired:
        lines += ["", f"hearth minus llama.cpp on the same positions, 95% interval of a paired block bootstrap "
                  f"({BLOCK}-position blocks, {DRAWS} draws): below 0 for KL (above 0 for top-1) hearth is closer to "
                  f"the reference; an interval holding 0 is a difference this corpus cannot tell from noise.", "",
                  "| model | engine | mean KL | p99 KL | top-1 agree (points) |", "| --- | --- | --- | --- | --- |"]
        for r in paired:
            v = r["vs_llamacpp_95"]
            lines.append(f"| {r['model']} | {r['engine']} | {v['mean_kl'][0]:+.5f} .. {v['mean_kl'][1]:+.5f} | "
                         f"{v['p99_kl'][0]:+.4f} .. {v['p99_kl'][1]:+.4f} | "
                         f"{100 * v['top1'][0]:+.2f} .. {100 * v['top1'][1]:+.2f} |")
    noise = [r for r in res["rows"] if "top1_expected" in r["summary"]]
    if noise:
        lines += ["", "Top-1 agreement against what each engine's error size predicts. A top-1 flip needs the error in the "
                  "reference's top-two margin (candidate's log-probability gap between the reference's two best tokens "
                  "minus the reference's) to fall below minus that margin; with the errors drawn from the engine's own "
                  "distribution over the corpus, independently of the margin, position i flips with probability p_i "
                  "(the share of errors below -margin_i): expected agreements sum(1 - p_i), sd sqrt(sum p_i (1 - p_i)). "
                  "RMS margin error: the error's size; its paired interval (hearth minus llama.cpp, mean squared error, "
                  "same bootstrap) holding 0 says the two engines' errors are alike in size, so that a top-1 "
                  "difference between them is which near-ties the rounding happened to tip (-: a row from a run "
                  "before the near-tie column).", "",
                  f"| model | engine | top-1 agree observed | expected from error size (sd) | RMS margin error (nats) "
                  f"| the same at near-ties (margin < {NEAR_TIE} nats) | margin MSE minus llama.cpp, 95% |",
                  "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in noise:
            s_, v = r["summary"], r.get("vs_llamacpp_95", {}).get("margin_mse")
            lines.append(f"| {r['model']} | {r['engine']} | {s_['top1_agree']} | {s_['top1_expected']:.1f} "
                         f"({s_['top1_sd']:.1f}) | {s_['rms_margin_err']:.4f} | "
                         + (f"{s_['rms_margin_err_near']:.4f} ({s_['near_ties']} positions) | "
                            if s_.get("rms_margin_err_near") is not None else "- | ") +
                         f"{'%+.5f .. %+.5f' % tuple(v) if v else '-'} |")
    notes = HERE / "notes.md"  # hand-measured sections (error sources, other peer settings), kept across runs
    if notes.exists():
        lines += [""] + notes.read_text(encoding="utf-8").rstrip("\n").splitlines()
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hearth-lib", default=str(REPO / "lib" / "libhearth.so"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_quality"))
    ap.add_argument("--worker", choices=["hearth", "llamacpp"])
    ap.add_argument("--model"), ap.add_argument("--ids"), ap.add_argument("--ref-dir")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--write-ref", action="store_true")
    ap.add_argument("--keep", help="keep the reference's log probabilities here and reuse them while the corpus "
                    "and model are unchanged (the scalar tier takes minutes per model; clear DIR when the "
                    "reference kernels change), and llama.cpp's per-position results, which a later run with "
                    "--engines hearth compares against")
    ap.add_argument("--engines", default="hearth,llamacpp", help="which candidates to measure")
    ap.add_argument("--append", action="store_true", help="keep the rows of <out>.md for the engines and models "
                    "not measured now (one table from runs taken at different times: each row keeps its date)")
    args = ap.parse_args()
    args.hearth_lib = Path(args.hearth_lib).resolve()
    if args.worker:
        args.engine = args.worker
        return worker(args)
    import prepare_models
    engines = args.engines.split(",")
    llama_version = prepare_models.import_llama_cpp().__version__ if "llamacpp" in engines else None
    started, load_before = time.strftime("%Y-%m-%d %H:%M"), run_bench.loadavg()
    rows, lib = [], hearth_lib(args.hearth_lib)
    for key in args.models.split(","):
        label, path = MODELS[key]
        with tempfile.TemporaryDirectory(prefix="hearth-quality-") as tmp:
            work = Path(args.keep) / key if args.keep else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            docs = corpus_ids(lib, path)
            ids_path, stamp = str(work / "ids.json"), json.dumps({"ids": docs, "model": str(path)})
            print(f"{label}: {sum(len(v) - 1 for v in docs.values())} positions", file=sys.stderr)
            if not (work / "stamp.json").exists() or (work / "stamp.json").read_text() != stamp:
                Path(ids_path).write_text(json.dumps(docs))
                run_worker("hearth", path, ids_path, str(work), args, env_cpu="scalar", write_ref=True)
                (work / "stamp.json").write_text(stamp)
            for level in hearth_levels() if "hearth" in engines else []:
                for chunk in (8, 1):
                    r = run_worker("hearth", path, ids_path, str(work), args, env_cpu=level, chunk=chunk)
                    if args.keep:
                        (work / f"hearth_{level}_chunk{chunk}_positions.json").write_text(
                            json.dumps({"stamp": stamp, "docs": r["docs"]}))
                    rows.append({"model": label, "engine": f"hearth {level}, chunk {chunk}",
                                 "summary": summarize(r["docs"]), "_docs": r["docs"]})
            peer = work / "llamacpp_positions.json"  # with --keep: llama.cpp's per-position results
            if "llamacpp" in engines:
                r = run_worker("llamacpp", path, ids_path, str(work), args)
                rows.append({"model": label, "engine": f"llama.cpp {llama_version}", "summary": summarize(r["docs"]),
                             "_docs": r["docs"]})
                if args.keep:
                    peer.write_text(json.dumps({"stamp": stamp, "docs": r["docs"]}))
            elif args.keep and peer.exists() and json.loads(peer.read_text())["stamp"] == stamp:
                # hearth alone (--engines hearth): intervals against the kept llama.cpp run of this corpus
                rows.append({"model": label, "engine": "llama.cpp (kept)", "_docs": json.loads(peer.read_text())["docs"],
                             "_kept": True})
    add_intervals(rows)
    rows = [r for r in rows if not r.get("_kept")]
    for r in rows:
        r.update(date=started, commit=run_bench.git_describe(), load_before=load_before, load_after=run_bench.loadavg())
    prev = results_file.read_if_exists(args.out, {}) if args.append else {}
    measured = {(r["model"], r["engine"].split(" ")[0]) for r in rows}
    kept = [r for r in prev.get("rows", []) if (r["model"], r["engine"].split(" ")[0]) not in measured]
    order = list(MODELS.values())
    rows = sorted(kept + rows, key=lambda r: ([m[0] for m in order].index(r["model"]), r["engine"].startswith("llama")))
    res = {"machine": run_bench.cpu_info(), "threads": args.threads,
           "python": platform.python_version(), "rows": rows}
    results_file.write(args.out, markdown(res), res)
    print(markdown(res))


if __name__ == "__main__":
    main()
