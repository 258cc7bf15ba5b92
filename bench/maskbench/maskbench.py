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
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def order_object(obj, schema, root):
    order, subs = prop_order(schema, root, obj)
    keys = [k for k in order if k in obj] + [k for k in obj if k not in subs]
    extra = extra_schema(schema, root)
    return {k: reorder(obj[k], subs.get(k, extra), root) for k in keys}


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
    b = os.environ.get("MASKBENCH_BUILD", "build-maskbench")
    env = dict(os.environ, CCACHE_NOHASHDIR="true")
    subprocess.run(["make", "--no-print-directory", "-j2", "NVCC=", f"BUILD={b}", f"BINDIR={b}/bin", f"LIBDIR={b}/lib",
                    f"{b}/bench/maskbench"], cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)
    return os.path.join(ROOT, b, "bench", "maskbench")


def run_hearth(driver, model, cases, tmp):
    path = os.path.join(tmp, "cases.jsonl")
    with open(path, "w") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    res = os.path.join(tmp, "results.jsonl")
    with open(res, "w") as out:
        p = subprocess.run([driver, model, path], stdout=out, stderr=subprocess.PIPE, text=True)
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

def run_llguidance(model, cases):
    import llguidance
    from gguf import GGUFReader  # vocabulary strings and token types

    r = GGUFReader(model)
    f = r.fields
    toks = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8", "replace")
            for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    eos = int(f["tokenizer.ggml.eos_token_id"].parts[-1][0])
    kind = bytes(f["tokenizer.ggml.model"].parts[-1]).decode()
    byte_dec = {}
    if kind == "gpt2":  # byte-level BPE alphabet back to bytes
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        byte_dec = {chr(c): b for b, c in zip(bs, cs)}

    def tok_bytes(s, ty):
        if ty in (3, 4):  # control / user-defined: special (control) or literal text
            return s.encode() if ty == 4 else b"\xff" + s.encode()
        if kind == "gpt2":
            return bytes(byte_dec.get(ch, 0) for ch in s)
        if ty == 6 and s.startswith("<0x") and len(s) == 6:
            return bytes([int(s[3:5], 16)])
        return s.replace("\u2581", " ").encode()

    vocab = [tok_bytes(s, ty) for s, ty in zip(toks, types)]
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrap(vocab, eos)))
    import numpy as np
    out = []
    for c in cases:
        res = {"name": c["name"], "error": None, "tests": [], "mask_us": []}
        t0 = time.perf_counter()
        grm = llguidance.LLMatcher.grammar_from_json_schema(c["schema"])
        err = llguidance.LLMatcher.validate_grammar(grm, tok)
        res["compile_us"] = (time.perf_counter() - t0) * 1e6
        if err:
            res["error"] = err
            out.append(res)
            continue
        for t in c["tests"]:
            ids = c["ids"][len(res["tests"])]
            m = llguidance.LLMatcher(tok, grm)
            bm = llguidance.torch_bits = None
            mask = np.zeros(((tok.vocab_size + 31) // 32,), dtype=np.int32)
            rej = -1
            for k, id in enumerate(ids + [eos]):
                t1 = time.perf_counter()
                m.fill_next_token_bitmask_np(mask) if hasattr(m, "fill_next_token_bitmask_np") else None
                dt = (time.perf_counter() - t1) * 1e6
                if t["valid"]:
                    res["mask_us"].append(dt)
                if m.is_error() or not (int(mask[id >> 5]) >> (id & 31) & 1) or not m.consume_token(id):
                    rej = k
                    break
            res["tests"].append({"valid": t["valid"], "accepted": rej < 0 and not m.is_error()})
        out.append(res)
    return out


class _Wrap:
    def __init__(self, vocab, eos):
        self.tokens = vocab
        self.eos_token_id = eos
        self.bos_token_id = None

    def __call__(self, s):
        raise NotImplementedError


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/hearth/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--no-llguidance", action="store_true")
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--tmp", help="work folder (default: a fresh temporary one)")
    ap.add_argument("--json", help="write per-schema hearth results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        cases = load_cases(tmp, args.limit)
        if cases is None:
            raise SystemExit("maskbench-dev.tar.xz not found (set HEARTH_SHARED_DATA)")
        driver = build_driver()
        t0 = time.time()
        hr = run_hearth(driver, args.model, cases, tmp)
        print(f"hearth: {time.time() - t0:.1f}s", file=sys.stderr)
    hs = summary(hr)
    print(json.dumps({"hearth": hs}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            for r in hr:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
