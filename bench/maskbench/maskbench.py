#!/usr/bin/env python3
"""MaskBench: hearth's grammar engine against llguidance on the same schemas, tokenizer
and instances.

For every schema: compile it; feed each instance token by token (the model's tokenizer,
read from its GGUF); a valid instance must have every token in the mask and end where
the grammar may end; an invalid one must be refused somewhere. A schema passes when it
compiles and every decision is right. llguidance gets the same token ids (its tokenizer
is built from the same GGUF vocabulary through hearth's byte strings).

Instances are written as compact JSON with object keys in the order of the schema's
`properties` (both engines emit properties in schema order; JSON Schema does not care).

  bench/maskbench/maskbench.py [--model GGUF] [--limit N] [--no-llguidance] [--out FILE]

The data set is found like the tests find it: $HEARTH_SHARED_DATA or shared/data beside
the checkout's parent; it is unpacked into a temporary folder.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results_file  # noqa: E402


def shared_data():
    d = os.environ.get("HEARTH_SHARED_DATA")
    if d:
        return d
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return os.path.join(os.path.dirname(top or ROOT), "shared", "data")


def load_cases(tmp, limit=None, stride=1):
    tar = os.path.join(shared_data(), "maskbench-dev.tar.xz")
    if not os.path.exists(tar):
        return None
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else t.extractall(tmp)
    d = os.path.join(tmp, "maskbench-dev")
    names = sorted(f for f in os.listdir(d) if f.endswith(".json"))[::stride]
    if limit:
        names = names[:limit]
    cases = []
    for n in names:
        with open(os.path.join(d, n)) as f:
            c = json.load(f)
        schema = c["schema"]
        tests = [{"valid": bool(x["valid"]), "text": serialize(x["data"], schema)} for x in c["tests"]]
        cases.append({"name": n[:-5], "schema": json.dumps(schema), "tests": tests})
    return cases


# ---- instance serialization: keys in schema order ------------------------------------

def resolve(root, ref):
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def prop_order(schema, root, obj, depth=0):
    """Property names in the order hearth's grammar writes them: a $ref's target, then
    allOf items, then the schema's own properties; of anyOf/oneOf, the branch sharing the
    most keys with the instance, after the schema's own."""
    if not isinstance(schema, dict) or depth > 12:
        return [], {}
    order, subs = [], {}

    def add(o, s):
        for k in o:
            if k not in subs:
                order.append(k)
                subs[k] = s.get(k)
    if "$ref" in schema:
        add(*prop_order(resolve(root, schema["$ref"]), root, obj, depth + 1))
    for s in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        add(*prop_order(s, root, obj, depth + 1))
    props = schema.get("properties")
    if isinstance(props, dict):
        add(list(props), props)
    for key in ("anyOf", "oneOf"):
        best, best_hit = None, -1
        for s in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            o, sb = prop_order(s, root, obj, depth + 1)
            hit = len(set(o) & set(obj))
            if hit > best_hit:
                best, best_hit = (o, sb), hit
        if best:
            add(*best)
    return order, subs


def extra_schema(schema, root, depth=0):
    if not isinstance(schema, dict) or depth > 12:
        return None
    ap = schema.get("additionalProperties")
    if isinstance(ap, dict):
        return ap
    if "$ref" in schema:
        return extra_schema(resolve(root, schema["$ref"]), root, depth + 1)
    return None


def pattern_schema(schema, root, key, depth=0):
    """The patternProperties schema a key not in properties falls under (first match)."""
    if not isinstance(schema, dict) or depth > 12:
        return None
    pp = schema.get("patternProperties")
    if isinstance(pp, dict):
        for pat, s in pp.items():
            try:
                if re.search(pat, key):
                    return s
            except re.error:
                pass
    if "$ref" in schema:
        return pattern_schema(resolve(root, schema["$ref"]), root, key, depth + 1)
    return None


def order_object(obj, schema, root):
    order, subs = prop_order(schema, root, obj)
    keys = [k for k in order if k in obj] + [k for k in obj if k not in subs]
    extra = extra_schema(schema, root)
    return {k: reorder(obj[k], subs[k] if k in subs else pattern_schema(schema, root, k) or extra, root) for k in keys}


def item_schema(schema, root, i, depth=0):
    if not isinstance(schema, dict) or depth > 12:
        return None
    pre = schema.get("prefixItems", schema.get("items") if isinstance(schema.get("items"), list) else None)
    if isinstance(pre, list) and i < len(pre):
        return pre[i]
    if isinstance(schema.get("items"), dict):
        return schema["items"]
    if "$ref" in schema:
        return item_schema(resolve(root, schema["$ref"]), root, i, depth + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        for s in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            r = item_schema(s, root, i, depth + 1)
            if r is not None:
                return r
    return None


def reorder(x, schema, root):
    if isinstance(x, dict):
        return order_object(x, schema, root)
    if isinstance(x, list):
        return [reorder(v, item_schema(schema, root, i), root) for i, v in enumerate(x)]
    return x


def serialize(data, schema):
    return json.dumps(reorder(data, schema, schema), ensure_ascii=False, separators=(",", ":"))


# ---- the hearth run ---------------------------------------------------------------------

def build_driver():
    b = os.environ.get("MASKBENCH_BUILD", "build")
    env = dict(os.environ, CCACHE_NOHASHDIR="true")
    subprocess.run(["make", "--no-print-directory", "-j2", "NVCC=", f"BUILD={b}", f"BINDIR={b}/bin", f"LIBDIR={b}/lib",
                    f"{b}/bench/maskbench"], cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)
    return os.path.join(ROOT, b, "bench", "maskbench")


def run_hearth(driver, model, cases, tmp, vocab=None):
    path = os.path.join(tmp, "cases.jsonl")
    with open(path, "w") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    res = os.path.join(tmp, "results.jsonl")
    with open(res, "w") as out:
        p = subprocess.run([driver, model, path] + ([vocab] if vocab else []), stdout=out, stderr=subprocess.PIPE,
                           text=True)
    if p.returncode:
        raise SystemExit(f"maskbench driver failed: {p.stderr}")
    with open(res) as f:
        return [json.loads(l) for l in f if l.strip()]


def verdicts(results):
    """passing schemas, compile errors, wrong accepts, wrong rejects"""
    passing = errors = wrong_accept = wrong_reject = 0
    for r in results:
        if r["error"]:
            errors += 1
            continue
        ok = True
        for t in r["tests"]:
            if t["valid"] and not t["accepted"]:
                wrong_reject += 1
                ok = False
            elif not t["valid"] and t["accepted"]:
                wrong_accept += 1
                ok = False
        passing += ok
    return passing, errors, wrong_accept, wrong_reject


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def summary(results):
    times = [t for r in results for t in r.get("mask_us", [])]
    comp = [r["compile_us"] for r in results if not r["error"]]
    p, e, wa, wr = verdicts(results)
    return {"schemas": len(results), "passing": p, "errors": e, "wrong_accept": wa, "wrong_reject": wr,
            "tokens": len(times), "mask_avg_us": statistics.mean(times) if times else float("nan"),
            "mask_p50_us": pct(times, 50), "mask_p99_us": pct(times, 99), "compile_p50_us": pct(comp, 50)}


# ---- llguidance on the same ids ----------------------------------------------------------

class _Vocab:
    """llguidance's tokenizer interface over hearth's byte strings (special tokens get
    llguidance's 0xFF marker so they never match text)."""

    def __init__(self, path, eos):
        self.tokens, self.special_token_ids = [], []
        for i, line in enumerate(open(path)):
            flag, _, hexs = line.rstrip("\n").partition(" ")
            b = bytes.fromhex(hexs)
            if flag == "1":
                self.special_token_ids.append(i)
                b = b"\xff" + (b or b"special")
            self.tokens.append(b)
        self.eos_token_id = eos
        self.bos_token_id = None
        self.by_bytes = {}
        for i, b in enumerate(self.tokens):
            if b and i not in self.special_token_ids:
                self.by_bytes.setdefault(b, i)
        self.longest = max(len(b) for b in self.by_bytes)

    def __call__(self, s):
        """Greedy longest match: llguidance tokenizes the text a grammar forces (any
        tokenization of the right bytes serves; instances themselves arrive as ids)."""
        if isinstance(s, str):
            s = s.encode()
        out, i = [], 0
        while i < len(s):
            for n in range(min(self.longest, len(s) - i), 0, -1):
                id = self.by_bytes.get(s[i:i + n])
                if id is not None:
                    out.append(id)
                    i += n
                    break
            else:
                raise ValueError(f"no token for byte {s[i]:#x}")
        return out


def run_llguidance(vocab_path, eos, cases, hearth_results):
    import llguidance
    import llguidance.numpy as lnp
    vocab = _Vocab(vocab_path, eos)
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab))
    mask = lnp.allocate_token_bitmask(1, tok.vocab_size)
    out = []
    for c, hr in zip(cases, hearth_results):
        res = {"name": c["name"], "error": None, "tests": [], "mask_us": []}
        t0 = time.perf_counter()
        grm = llguidance.LLMatcher.grammar_from_json_schema(c["schema"], overrides={"whitespace_flexible": True})
        m0 = llguidance.LLMatcher(tok, grm, log_level=0)
        res["compile_us"] = (time.perf_counter() - t0) * 1e6
        if m0.is_error():
            res["error"] = m0.get_error()
            out.append(res)
            continue
        for t in c["tests"]:
            # llguidance forces the tokens of text the grammar fixes by its tokenizer's
            # encoding and refuses other splits of it, so its instances are encoded the same
            # way (greedy longest match over the shared byte strings)
            ids = vocab(t["text"])
            m = llguidance.LLMatcher(tok, grm, log_level=0)
            ok = True
            for id in ids + [eos]:
                t1 = time.thread_time_ns()
                lnp.fill_next_token_bitmask(m, mask, 0)
                dt = (time.thread_time_ns() - t1) / 1e3
                if t["valid"]:
                    res["mask_us"].append(dt)
                allowed = (int(mask[0, id >> 5]) >> (id & 31)) & 1
                if m.is_error() or not allowed or not m.consume_token(id):
                    ok = False
                    break
            res["tests"].append({"valid": t["valid"], "accepted": ok and not m.is_error()})
        out.append(res)
    return out


def eos_of(model):
    from gguf import GGUFReader
    f = GGUFReader(model).fields["tokenizer.ggml.eos_token_id"]
    return int(f.parts[-1][0])


def table(model, rows, n_schemas):
    out = ["| engine | schemas | passing | compile errors | wrong accepts | wrong rejects | mask avg (us) | "
           "p50 (us) | p99 (us) | compile p50 (us) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in rows:
        out.append(f"| {name} | {s['schemas']} | {s['passing']} | {s['errors']} | {s['wrong_accept']} | "
                   f"{s['wrong_reject']} | {s['mask_avg_us']:.1f} | {s['mask_p50_us']:.1f} | {s['mask_p99_us']:.1f} | "
                   f"{s['compile_p50_us']:.0f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/hearth/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--stride", type=int, default=1, help="every Nth schema (a sample across categories)")
    ap.add_argument("--no-llguidance", action="store_true")
    ap.add_argument("--out", help="write the result file here (bench/results/maskbench.md: the table, then "
                    "the summary as json, bench/results_file.py)")
    ap.add_argument("--tmp", help="work folder (default: a fresh temporary one)")
    ap.add_argument("--json", help="write per-schema hearth results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        cases = load_cases(tmp, args.limit, args.stride)
        if cases is None:
            raise SystemExit("maskbench-dev.tar.xz not found (set HEARTH_SHARED_DATA)")
        driver = build_driver()
        vocab = os.path.join(tmp, "vocab.txt")
        t0 = time.time()
        hr = run_hearth(driver, args.model, cases, tmp, vocab)
        print(f"hearth: {time.time() - t0:.1f}s", file=sys.stderr)
        rows = [("hearth", summary(hr))]
        if not args.no_llguidance:
            t0 = time.time()
            lr = run_llguidance(vocab, eos_of(args.model), cases, hr)
            print(f"llguidance: {time.time() - t0:.1f}s", file=sys.stderr)
            rows.append(("llguidance " + __import__("llguidance").get_version() if hasattr(
                __import__("llguidance"), "get_version") else "llguidance", summary(lr)))
    print(json.dumps(dict(rows), indent=1))
    if args.json:
        with open(args.json, "w") as f:
            for r in hr:
                f.write(json.dumps(r) + "\n")
    if args.out:
        results_file.write(args.out,
                           f"# MaskBench: hearth vs llguidance\n\n"
                           f"`bench/maskbench/maskbench.py --model {os.path.basename(args.model)}"
                           f"{' --limit %d' % args.limit if args.limit else ''}{' --stride %d' % args.stride if args.stride > 1 else ''}` on {platform.node()} "
                           f"({platform.processor() or platform.machine()}, one thread each), {time.strftime('%Y-%m-%d')}.\n\n"
                           f"Data: maskbench-dev (2,192 JSONSchemaBench schemas with valid and invalid instances), instances "
                           f"as compact JSON with keys in schema order, tokenized by hearth; llguidance gets the same ids and "
                           f"byte strings (whitespace_flexible) and, because it refuses other splits of the text a grammar forces, instances encoded by its own tokenizer (greedy longest match over those byte strings; hearth accepts any split, so it gets the model's BPE ids). A schema passes when it compiles and every valid instance is "
                           f"accepted token by token and every invalid one refused. Mask time: thread CPU time per token of "
                           f"valid instances (the machine is shared: wall time would count other processes), each instance on a "
                           f"fresh matcher (hearth's matchers of one compiled grammar share its parse-state and mask cache; "
                           f"llguidance's LLMatcher keeps its own).\n\n" + table(args.model, rows, len(cases)) + "\n",
                           {"model": os.path.basename(args.model), "schemas": len(cases), "limit": args.limit,
                            "stride": args.stride, "summary": dict(rows)})


if __name__ == "__main__":
    main()
