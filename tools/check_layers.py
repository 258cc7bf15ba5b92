#!/usr/bin/env python3
"""check_layers.py: fails when an #include in src/ points up the layer order of
docs/design.md (a folder may include its own folder and the layers below it, never one
above; consumers in layer 10 include only their own folder, base/ and hearth.h, plus the
one server entry point the CLI opens). Run by `make test`; prints every violation."""
import os
import re
import sys

LAYERS = {
    "base": 1, "io": 2, "tok": 3, "grammar": 3, "kv": 4, "ops": 5,
    "backend/cpu": 6, "backend/cuda": 6, "model": 7, "engine": 8,
    # hub/ implements hearth.h's library section (downloads, the model library, the
    # catalogue) beside api/: part of libhearth, above the engine it sizes models with
    "api": 9, "hub": 9,
    # memory/ implements hearth.h's personal memory section (the wiki vault, its index,
    # the read-only tools) on top of the embedding API
    "memory": 9,
    # train/ implements hearth.h's training section (hearth train: LoRA SFT with a float32
    # backward per op) over the loaded model's weights and the tokenizer
    "train": 9,
    "server": 10, "cli": 10,
}
# Backends implement the same op table side by side: neither includes the other.
SIBLINGS_APART = {"backend/cpu", "backend/cuda"}
# Consumers (layer 10) see the library only through hearth.h and base/.
CONSUMER_ALLOWED = {"base"}
# The CLI starts the server through its one public entry point.
EXTRA_ALLOWED = {("cli", "server/server.h")}
# A forward pass is op-table calls only: model/ includes no backend. The BERT encoder is
# the one exception: its ops (LayerNorm, erf GELU, bidirectional attention) exist on the
# CPU alone and are not in the op table yet.
MODEL_BACKEND_EXCEPTIONS = {"model/bert.c", "model/bert.h"}

INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    parts = path.split("/")
    if parts[0] == "backend" and len(parts) > 2:
        return "backend/" + parts[1]
    return parts[0] if len(parts) > 1 else None


def main(root):
    src = os.path.join(root, "src")
    bad = []
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".c", ".h", ".cu", ".cuh", ".inc")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            me = folder_of(rel)
            if me not in LAYERS:
                bad.append(f"{rel}: folder '{me}' has no layer in tools/check_layers.py")
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
            for inc in INC.findall(text):
                if inc == "hearth.h":
                    continue
                them = folder_of(inc)
                if them is None or them == me:
                    continue
                if them not in LAYERS:
                    continue  # not a src/ header (e.g. a system or generated one)
                if (me, inc) in EXTRA_ALLOWED:
                    continue
                if LAYERS[me] == 10 and them not in CONSUMER_ALLOWED:
                    bad.append(f"{rel}: includes {inc} (a consumer sees only hearth.h, base/ and its own folder)")
                elif me in SIBLINGS_APART and them in SIBLINGS_APART:
                    bad.append(f"{rel}: includes {inc} (the backends do not include each other)")
                elif me == "model" and them.startswith("backend/") and rel not in MODEL_BACKEND_EXCEPTIONS:
                    bad.append(f"{rel}: includes {inc} (a forward pass calls the op table, never a backend)")
                elif LAYERS[them] > LAYERS[me]:
                    bad.append(f"{rel}: includes {inc} (layer {LAYERS[them]} '{them}' is above layer {LAYERS[me]} '{me}')")
    # a backend implements ops, never a model family: no file under src/backend/ names one
    # (not even in a comment: a feature is named by its op or op_dims field)
    family = re.compile(r"\b(gemma\d*|qwen\d*(?:[._]\d+)?|minicpm\d*|llama(?![.-]cpp|\.cpp))\b", re.I)
    for dirpath, _, files in os.walk(os.path.join(src, "backend")):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                m = family.search(line)
                if m:
                    bad.append(f"{rel}:{n}: names the model family '{m.group(0)}' (backends know ops, not families)")
    for b in bad:
        print("layers:", b)
    if bad:
        print(f"layers: {len(bad)} finding(s); see docs/design.md (Layers)")
        return 1
    print("layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")))
