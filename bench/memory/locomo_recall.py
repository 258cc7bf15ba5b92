#!/usr/bin/env python3
"""locomo_recall.py: retrieval recall@5 of `hearth memory search` on LoCoMo against two
baselines measured in the same run: Okapi BM25 over the raw dialogue turns, and BM25 +
all-MiniLM-L6-v2 cosine (vectors from `hearth embed`) fused by reciprocal rank.

Each LoCoMo conversation goes into its own fresh vault as a ChatGPT-format export (one
conversation per session, message ids = LoCoMo dia_ids, author names = speakers) through
`hearth memory import`; questions are asked through `hearth memory mcp` (memory_search,
limit 5, kind conversation). recall@5 = the share of a question's evidence dialogue ids
found in the top 5, averaged per category. Writes bench/results/memory_locomo.md (bench/results_file.py).

--synthesize MODEL (with --limit-convs N for a subset): after the import, `hearth memory
synthesize --model MODEL` writes articles from each conversation, and a second hearth row,
"hearth+articles", searches everything (no kind filter: articles, Talk pages and raw
chunks compete for the 5 places; Reference/ is there too). An article or Talk passage
counts the dialogue ids it cites: its footnote markers resolved through the article's
footnote definitions ([[Conversations/<hash>#<dia_id> speaker]]), and any citation in the
passage itself; so one article place can hold several ids (the mean is reported). That run
goes into the results under "with_synthesis", beside the raw run, which it leaves alone.

The data set is found as tests find it: $HEARTH_SHARED_DATA, else shared/data beside the
checkout's parent; usage: locomo_recall.py [--bin build/bin/hearth] [--limit-convs N]
[--synthesize MODEL [--threads N]]
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import results_file  # noqa: E402
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
RRF_K = 60  # the same fusion constant hearth uses (src/memory/memory_index.c)


def shared_data():
    env = os.environ.get("HEARTH_SHARED_DATA")
    if env:
        return Path(env)
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True, text=True).stdout
    return Path(top.strip() or REPO).parent / "shared" / "data"


def load_locomo(tmp):
    tar = shared_data() / "locomo-dev.tar.xz"
    if not tar.exists():
        sys.exit(f"locomo_recall: {tar} not found (set HEARTH_SHARED_DATA)")
    with tarfile.open(tar) as t:
        t.extractall(tmp, filter="data")
    return sorted(Path(tmp).rglob("*.json"))


def sessions(conv):
    n = 1
    while f"session_{n}" in conv or f"session_{n}_date_time" in conv:
        if isinstance(conv.get(f"session_{n}"), list):
            yield n, conv.get(f"session_{n}_date_time", ""), conv[f"session_{n}"]
        n += 1


def turn_text(turn):
    text = turn.get("text", "")
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def session_time(s):
    try:
        return datetime.strptime(s, "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return 0


def chatgpt_export(conv):
    """One ChatGPT-format conversation per LoCoMo session."""
    out = []
    for n, when, turns in sessions(conv):
        mapping, parent, t0 = {}, None, session_time(when)
        for i, turn in enumerate(turns):
            mapping[turn["dia_id"]] = {
                "id": turn["dia_id"], "parent": parent, "children": [],
                "message": {"author": {"role": "user", "name": turn["speaker"]},
                            "content": {"content_type": "text", "parts": [turn_text(turn)]},
                            "create_time": t0 + i},
            }
            if parent:
                mapping[parent]["children"].append(turn["dia_id"])
            parent = turn["dia_id"]
        out.append({"title": f"{conv['speaker_a']} and {conv['speaker_b']}, session {n}, {when}",
                    "create_time": t0, "mapping": mapping, "current_node": parent})
    return out


WORD = re.compile(r"\w+")


class BM25:
    """Okapi BM25 with rank_bm25's defaults (k1 1.5, b 0.75, idf ln((N-n+.5)/(n+.5)+1))."""

    def __init__(self, docs, k1=1.5, b=0.75):
        self.docs = [Counter(WORD.findall(d.lower())) for d in docs]
        self.len = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.len) / max(1, len(self.len))
        df = Counter(w for d in self.docs for w in d)
        n = len(docs)
        self.idf = {w: math.log((n - c + 0.5) / (c + 0.5) + 1) for w, c in df.items()}
        self.k1, self.b = k1, b

    def scores(self, q):
        words = WORD.findall(q.lower())
        out = []
        for d, ln in zip(self.docs, self.len):
            s = 0.0
            for w in words:
                f = d.get(w, 0)
                if f:
                    s += self.idf[w] * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * ln / self.avg))
            out.append(s)
        return out


def top(scores, k):
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:k]


def rrf(*rankings, k=5):
    fused = defaultdict(float)
    for r in rankings:
        for rank, i in enumerate(r, 1):
            fused[i] += 1.0 / (RRF_K + rank)
    return sorted(fused, key=lambda i: -fused[i])[:k]


class MiniLM:
    """all-MiniLM-L6-v2 vectors through `hearth embed` (checked against sentence-transformers
    by tests/parity/goldens/embed_minilm.json); torch is not in the project's venv."""

    def __init__(self, binary, path):
        self.binary, self.path = binary, path

    def embed(self, texts):
        import numpy as np
        lines = "".join(t.replace("\n", " ").strip() + "\n" for t in texts)
        r = subprocess.run([self.binary, "embed", self.path, "--file", "-", "--json", "--truncate"], input=lines,
                           capture_output=True, text=True, check=True)
        return np.array([d["embedding"] for d in json.loads(r.stdout)["data"]], dtype=np.float32)


CITE = re.compile(r"\[\[Conversations/[^#\]|]+#([^\s\]|]+)")
MARKER = re.compile(r"\[\^(\w+)\](?!:)")
FOOTNOTE = re.compile(r"^\[\^(\w+)\]: (.*)$", re.M)


class Citations:
    """The dialogue ids a passage of an article (or Talk page) cites."""

    def __init__(self, vault):
        self.vault, self.defs = Path(vault), {}

    def __call__(self, hit):
        if hit["path"] not in self.defs:
            f = self.vault / hit["path"]
            text = f.read_text() if f.exists() else ""
            self.defs[hit["path"]] = {m: CITE.findall(d) for m, d in FOOTNOTE.findall(text)}
        defs = self.defs[hit["path"]]
        ids = CITE.findall(hit["text"])
        for m in MARKER.findall(hit["text"]):
            ids += defs.get(m, [])
        return list(dict.fromkeys(ids))


class Hearth:
    """A `hearth memory mcp` process on one vault."""

    def __init__(self, binary, vault, embed):
        self.p = subprocess.Popen([binary, "memory", "mcp", "--vault", vault, "--embed-model", embed],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.id = 0

    def search(self, q, limit=5, kind="conversation"):
        self.id += 1
        args = {"query": q, "limit": limit, **({"kind": kind} if kind else {})}
        req = {"jsonrpc": "2.0", "id": self.id, "method": "tools/call",
               "params": {"name": "memory_search", "arguments": args}}
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        r = json.loads(self.p.stdout.readline())["result"]
        if r["isError"]:
            raise RuntimeError(r["content"][0]["text"])
        return json.loads(r["content"][0]["text"])

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def run(binary, embed, limit_convs, synth_model=None, threads=0):
    """embed None: BM25 only (hearth with --embed-model none, no hybrid baseline).
    synth_model: also synthesize each conversation with it and score hearth+articles."""
    tmp = tempfile.mkdtemp(prefix="locomo-")
    files = load_locomo(tmp)[:limit_convs]
    minilm = MiniLM(binary, embed) if embed else None
    embed_arg = embed or "none"
    template = os.path.join(tmp, "template")
    # one vault with Reference/ embedded once; each conversation gets a copy (the vectors
    # cache travels in the index, keyed by text)
    subprocess.run([binary, "memory", "init", "--vault", template], check=True, capture_output=True)
    subprocess.run([binary, "memory", "status", "--vault", template, "--embed-model", embed_arg], check=True,
                   capture_output=True)
    names = ["hearth", "bm25", "bm25+minilm"][:3 if embed else 2] + (["hearth+articles", "hearth all kinds"]
                                                                      if synth_model else [])
    hits = {name: defaultdict(list) for name in names}
    timing = defaultdict(float)
    for f in files:
        conv = json.loads(f.read_text())
        vault = os.path.join(tmp, f.stem)
        shutil.copytree(template, vault, symlinks=True)
        export = os.path.join(tmp, f.stem + "-conversations.json")
        Path(export).write_text(json.dumps(chatgpt_export(conv)))
        t = time.perf_counter()
        subprocess.run([binary, "memory", "import", export, "--vault", vault, "--embed-model", embed_arg],
                       check=True, capture_output=True)
        timing["hearth_import_s"] += time.perf_counter() - t
        qas = [qa for qa in conv["qa"] if any(e.strip() for e in qa.get("evidence", []))]
        if synth_model:  # every kind before synthesis: the same search as hearth+articles, without them
            h = Hearth(binary, vault, embed_arg)
            before = [[r["heading"].split(" ")[0] for r in h.search(qa["question"], kind=None)
                       if r["kind"] == "conversation"] for qa in qas]
            h.close()
            t = time.perf_counter()
            r = subprocess.run([binary, "memory", "synthesize", "--model", synth_model, "--vault", vault,
                                "--embed-model", embed_arg, "--threads", str(threads)],
                               check=True, capture_output=True, text=True)
            timing["synthesis_s"] += time.perf_counter() - t
            report = json.loads(r.stdout)
            for k in ("segment", "extract", "route", "synthesize", "rejected"):
                timing["synth_" + k] += report[k]
            cites = Citations(vault)
        turns = [(turn["dia_id"], f"{turn['speaker']}: {turn_text(turn)}") for _, _, ts in sessions(conv) for turn in ts]
        timing["turns"] += len(turns)
        ids = [i for i, _ in turns]
        bm25 = BM25([t for _, t in turns])
        t = time.perf_counter()
        if minilm:
            vecs = minilm.embed([t for _, t in turns])
            qvecs = minilm.embed([qa["question"] for qa in qas])
        timing["baseline_embed_s"] += time.perf_counter() - t
        h = Hearth(binary, vault, embed_arg)
        for qi, qa in enumerate(qas):
            evidence = {e.strip() for e in qa["evidence"] if e.strip()}
            q, cat = qa["question"], qa.get("category", 0)
            t = time.perf_counter()
            res = h.search(q)
            timing["hearth_search_s"] += time.perf_counter() - t
            timing["questions"] += 1
            got = {"hearth": [r["heading"].split(" ")[0] for r in res]}
            if synth_model:
                cited = []
                for r in h.search(q, kind=None):
                    conv_hit = r["kind"] == "conversation"
                    cited += [r["heading"].split(" ")[0]] if conv_hit else cites(r)
                    timing["places_" + ("conversation" if conv_hit else r["kind"])] += 1
                got["hearth+articles"] = cited
                got["hearth all kinds"] = before[qi]
                timing["ids_in_top5"] += len(set(cited))
            s = bm25.scores(q)
            got["bm25"] = [ids[i] for i in top(s, 5)]
            if minilm:
                cos = (vecs @ qvecs[qi]).tolist()
                got["bm25+minilm"] = [ids[i] for i in rrf(top(s, 50), top(cos, 50))]
            for name, g in got.items():
                hits[name][cat].append(len(evidence & set(g)) / len(evidence))  # every list: the top 5's ids
        h.close()
        print(f"locomo_recall: {f.stem} done", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    return hits, timing


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def summarize(hits):
    """recall@5 in % per category and over all questions, and the question counts."""
    cats = sorted({c for h in hits.values() for c in h})
    table = {name: {CATEGORIES.get(c, str(c)): round(100 * sum(h[c]) / len(h[c]), 1) for c in cats}
             for name, h in hits.items()}
    for name, h in hits.items():
        allv = [x for c in cats for x in h[c]]
        table[name]["all"] = round(100 * sum(allv) / len(allv), 1)
    return table, {CATEGORIES.get(c, str(c)): len(hits["hearth"][c]) for c in cats}


def table_lines(table, counts, names):
    cols = list(table["hearth"])
    lines = ["| system | " + " | ".join(f"{c} ({counts.get(c, sum(counts.values()))})" for c in cols) + " |",
             "| --- |" + " ---: |" * len(cols)]
    return lines + [f"| {n} | " + " | ".join(f"{table[n][c]:.1f}" for c in cols) + " |" for n in names if n in table]


def markdown(result):
    lines = ["# LoCoMo retrieval, recall@5 (%)\n", f"`bench/memory/locomo_recall.py`, {result.get('when')}, "
             f"{result.get('machine', machine())}, {result.get('load')}. Evidence dialogue ids found in the top 5, averaged per "
             "question.\n"]
    table = result.get("recall_at_5_percent")
    if table:  # the raw run (absent when only --synthesize has run into a new --out)
        lines += table_lines(table, result["questions"], ("hearth", "bm25", "bm25+minilm"))
        best = max(table["bm25"]["all"], table["bm25+minilm"]["all"])
        lines += ["", f"hearth - better baseline: {table['hearth']['all'] - best:+.1f} points. hearth searched raw "
                  f"conversations only (no synthesis). Mean `memory_search` over MCP: "
                  f"{result['hearth_search_ms_mean']} ms per question (query embedding included); import + "
                  f"embedding of all turns: {result['hearth_import_and_embed_s']} s (baseline embedding through "
                  f"hearth embed: {result['baseline_embed_s']} s)."]
    w = result.get("with_synthesis")
    if w:
        t = w["recall_at_5_percent"]
        lines += ["", "## With synthesis by a real model\n",
                  f"`--synthesize {w['model']} --limit-convs {w['conversations']}`, {w['when']}, {w['load']}: "
                  f"the first {w['conversations']} of 6 conversations ({w['turns']} turns), each synthesized by "
                  f"{w['model']} (greedy, every answer under its stage's JSON Schema) in {w['synthesis_s']} s "
                  f"({w['synthesis_s_per_turn']} s a turn; {w['stages']}). The raw rows are re-measured on the "
                  "same subset in the same run.\n"]
        lines += table_lines(t, w["questions"], ("hearth+articles", "hearth all kinds", "hearth", "bm25",
                                                 "bm25+minilm"))
        p = w["top5_places"]
        lines += ["", "hearth+articles: every kind searched after synthesis (articles, Talk, raw chunks, and "
                  "Reference/, the docs every vault has); hearth all kinds: the same search before synthesis "
                  "(what the articles change); hearth: conversations only (the raw run's row). hearth+articles - "
                  f"hearth all kinds: {t['hearth+articles']['all'] - t['hearth all kinds']['all']:+.1f} points. "
                  "After synthesis the 5 places went to: " + ", ".join(f"{k} {v}" for k, v in p.items()) +
                  f"; distinct dialogue ids per top 5: {w['ids_per_top5']} (the other rows: at most 5)."]
        if w.get("note"):
            lines += ["", w["note"]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "bin" / "hearth"))
    ap.add_argument("--embed", default=str(Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache/hearth"))
                                           / "models" / "all-MiniLM-L6-v2"))
    ap.add_argument("--limit-convs", type=int, default=None)
    ap.add_argument("--synthesize", metavar="MODEL", help="also synthesize with MODEL (recorded beside the raw run)")
    ap.add_argument("--threads", type=int, default=0, help="synthesis and embedding threads (0: all cores)")
    ap.add_argument("--note", default="", help="a sentence recorded under the synthesis table")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "memory_locomo"))
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    hits, timing = run(a.bin, a.embed, a.limit_convs, a.synthesize, a.threads)
    load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    table, counts = summarize(hits)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    old = results_file.read_if_exists(a.out, {})
    if a.synthesize:
        turns = int(timing["turns"])
        places = {k[len("places_"):]: int(v) for k, v in sorted(timing.items()) if k.startswith("places_")}
        result = old
        result["with_synthesis"] = {
            "model": Path(a.synthesize).name, "conversations": a.limit_convs or 6, "turns": turns, "when": when,
            "load": load, "questions": counts, "recall_at_5_percent": table,
            "synthesis_s": round(timing["synthesis_s"], 1),
            "synthesis_s_per_turn": round(timing["synthesis_s"] / max(1, turns), 2),
            "stages": ", ".join(f"{k} {int(timing['synth_' + k])}" for k in
                                ("segment", "extract", "route", "synthesize", "rejected")),
            "top5_places": places, "ids_per_top5": round(timing["ids_in_top5"] / max(1, timing["questions"]), 2),
            "note": a.note}
    else:
        result = {"benchmark": "LoCoMo retrieval recall@5 (locomo-dev, 6 conversations)", "machine": machine(),
                  "when": when, "questions": counts, "recall_at_5_percent": table,
                  "hearth_search_ms_mean": round(1000 * timing["hearth_search_s"] / max(1, timing["questions"]), 2),
                  "hearth_import_and_embed_s": round(timing["hearth_import_s"], 1),
                  "baseline_embed_s": round(timing["baseline_embed_s"], 1),
                  "load": load,
                  "synthesis": "none (raw conversations only; --synthesize MODEL measures it: with_synthesis)"}
        if "with_synthesis" in old:
            result["with_synthesis"] = old["with_synthesis"]
    text = markdown(result)
    results_file.write(a.out, text, result)
    print(text)


if __name__ == "__main__":
    main()
