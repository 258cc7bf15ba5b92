#!/usr/bin/env python3
"""bench/tokenize/run.py: tokenizer encoding throughput, HF `tokenizers` (Python, one thread)
vs hearth (bench/tokenize/tok_bench.c linked against lib/libhearth.a), on the tokenizer corpus
concatenated and repeated to ~5 MB; whole text as one string and line by line. Loading is not
timed. Writes bench/results/tokenize.md (bench/results_file.py). A benchmark, not a test: it asserts
nothing except that both sides produce the same number of tokens (else the row is flagged).
usage: .venv/bin/python bench/tokenize/run.py [--mb 5] [--repeats 3] [--lib lib/libhearth.a]
"""
import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # must be set before tokenizers is imported

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def corpus_text(megabytes):
    files = sorted(glob.glob(str(REPO / "tests" / "parity" / "corpus" / "tokenizer" / "*.txt")))
    if not files:
        sys.exit("bench: tests/parity/corpus/tokenizer/*.txt missing")
    one = "".join(open(f, encoding="utf-8", newline="").read() for f in files)
    copies = max(1, round(megabytes * 1e6 / len(one.encode("utf-8"))))
    return one * copies


def tokenizers_under_test():
    """(name, path given to hearth, HF tokenizers.Tokenizer) for each tokenizer benchmarked."""
    from tokenizers import Tokenizer
    out = []
    for fam in ("llama", "qwen3", "gemma3"):
        d = CACHE / "tiny" / f"{fam}-f32"
        if (d / "tokenizer.json").exists():
            out.append((f"tiny-{fam} (tokenizer.json)", str(d), Tokenizer.from_file(str(d / "tokenizer.json"))))
    d = CACHE / "models" / "all-MiniLM-L6-v2"
    if (d / "tokenizer.json").exists():
        t = Tokenizer.from_file(str(d / "tokenizer.json"))
        t.no_truncation()  # its tokenizer.json truncates at 128 tokens; hearth encodes everything
        t.no_padding()
        out.append(("all-MiniLM-L6-v2 (WordPiece)", str(d), t))
    gguf = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if gguf.exists():
        # The reference is transformers' own GGUF converter (the tokenizer the parity
        # tests hold hearth to), through the parity suite's loader.
        sys.path.insert(0, str(REPO / "tests" / "parity"))
        from conftest import hf_tokenizer
        out.append(("SmolLM2-135M (GGUF gpt2 BPE, 49k)", str(gguf), hf_tokenizer(str(gguf)).backend_tokenizer))
    if not out:
        sys.exit("bench: no tokenizers in the cache; run tools/get_models.sh")
    return out


def hf_mb_per_s(tok, text, by_line, repeats):
    # Lines end at "\n" only, like tok_bench.c (str.splitlines would also split on \r, \x0b, \u2028...).
    pieces = [line + "\n" for line in text.split("\n")] if by_line else [text]
    if by_line:
        pieces[-1] = pieces[-1][:-1]
    nbytes = len(text.encode("utf-8"))
    best, n_tokens = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = 0
        for p in pieces:
            n += len(tok.encode(p, add_special_tokens=False).ids)
        best = min(best, time.perf_counter() - t0)
        n_tokens = n
    return nbytes / 1e6 / best, n_tokens


def build_helper(lib, out_dir):
    """Compiles tok_bench.c against the static library; returns (path or None, error text)."""
    exe = out_dir / "tok_bench"
    pkgs = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson", "libpcre2-8", "libutf8proc"],
                          capture_output=True, text=True).stdout.split()
    cmd = [os.environ.get("CC", "cc"), "-O2", "-std=gnu11", f"-I{REPO / 'include'}", f"-I{REPO / 'src'}",
           str(REPO / "bench" / "tokenize" / "tok_bench.c"), str(lib), *pkgs, "-lm", "-pthread", "-o", str(exe)]
    if not Path(lib).exists():
        return None, f"{lib} missing (run make)"
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        return None, f"tok_bench did not build: {last}"
    return exe, ""


def hearth_mb_per_s(exe, model, text_file, by_line, repeats):
    p = subprocess.run([str(exe), model, str(text_file), "lines" if by_line else "whole", str(repeats)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return None, None, p.stderr.strip()[-300:]
    r = json.loads(p.stdout)
    return r["mb_per_s"], r["tokens"], ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=5.0, help="corpus size in MB (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="passes per measurement; the best counts")
    ap.add_argument("--lib", default=str(REPO / "lib" / "libhearth.a"))
    args = ap.parse_args()
    import tokenizers

    text = corpus_text(args.mb)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "corpus.txt"
        text_file.write_bytes(text.encode("utf-8"))
        exe, build_error = build_helper(args.lib, Path(tmp))
        if build_error:
            print(f"bench: hearth side unavailable: {build_error}", file=sys.stderr)
        for name, model, tok in tokenizers_under_test():
            for by_line in (False, True):
                hf, hf_tokens = hf_mb_per_s(tok, text, by_line, args.repeats)
                hr, hr_tokens, error = (None, None, build_error)
                if exe:
                    hr, hr_tokens, error = hearth_mb_per_s(exe, model, text_file, by_line, args.repeats)
                rows.append({"tokenizer": name, "mode": "lines" if by_line else "whole",
                             "hf_mb_per_s": round(hf, 3), "hearth_mb_per_s": None if hr is None else round(hr, 3),
                             "ratio": None if hr is None else round(hr / hf, 3),
                             "hf_tokens": hf_tokens, "hearth_tokens": hr_tokens,
                             "same_token_count": None if hr_tokens is None else hr_tokens == hf_tokens,
                             "hearth_error": error or None})
                print(f"{name:38s} {rows[-1]['mode']:5s} HF {hf:8.2f} MB/s  hearth "
                      f"{'n/a' if hr is None else f'{hr:8.2f}'} MB/s", file=sys.stderr)

    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               "tokenizers": tokenizers.__version__}
    result = {"benchmark": "tokenizer encode throughput", "corpus_bytes": len(text.encode("utf-8")),
              "repeats": args.repeats, "timing": "best of repeats, encode only (load excluded), one thread",
              "command": " ".join([".venv/bin/python", "bench/tokenize/run.py"] + sys.argv[1:]),
              "machine": machine, "rows": rows}
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["# Tokenizer encode throughput (MB/s, higher is better)", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores; HF tokenizers {machine['tokenizers']} "
             f"(Python, TOKENIZERS_PARALLELISM=false); corpus {result['corpus_bytes'] / 1e6:.1f} MB "
             f"(tests/parity/corpus/tokenizer repeated); best of {args.repeats}.", "",
             "| tokenizer | mode | HF MB/s | hearth MB/s | hearth/HF | same token count |",
             "|---|---|---:|---:|---:|:---:|"]
    for r in rows:
        same = "-" if r["same_token_count"] is None else ("yes" if r["same_token_count"] else "**NO**")
        lines.append(f"| {r['tokenizer']} | {r['mode']} | {fmt(r['hf_mb_per_s'])} | {fmt(r['hearth_mb_per_s'])} "
                     f"| {fmt(r['ratio'])} | {same} |")
    errors = sorted({r["hearth_error"] for r in rows if r["hearth_error"]})
    if errors:
        lines += ["", "hearth errors: " + "; ".join(errors)]
    md = "\n".join(lines) + "\n"
    results_file.write("tokenize", md, result)
    print(md)


if __name__ == "__main__":
    main()
