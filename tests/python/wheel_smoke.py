"""The hearth wheel in a fresh virtual environment (make python-test runs this with that
environment's python, which has nothing installed but the wheel): the package imports from
site-packages, not from the checkout, needs no other Python package, and a greedy
generation on the tiny llama model gives the text of `hearth generate` (HEARTH_BIN).
Standard library only; exits non-zero with the reason on any failure."""
import os
import subprocess
import sys
from pathlib import Path

import hearth

cache = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
model_dir = cache / "tiny" / "llama-f32"
if not (model_dir / "config.json").exists():
    sys.exit(f"wheel_smoke: {model_dir} missing: run tools/make_tiny_models.py")
where = Path(hearth.__file__).resolve()
if "site-packages" not in where.parts:
    sys.exit(f"wheel_smoke: hearth was imported from {where}, not from the environment's site-packages")
prompt, args = "The capital of France is", ["--max-tokens", "12", "--temp", "0", "--ctx", "512", "--threads", "2"]
got = hearth.Engine(hearth.Model.open(str(model_dir)), ctx=512, threads=2).generate(
    prompt, chat_template=False, max_tokens=12, temperature=0.0)
cli = subprocess.run([os.environ.get("HEARTH_BIN", "bin/hearth"), "generate", str(model_dir), prompt,
                      "--no-chat-template", *args], capture_output=True, text=True, timeout=120)
if cli.returncode != 0:
    sys.exit(f"wheel_smoke: hearth generate failed: {cli.stderr}")
if got != cli.stdout or not got:
    sys.exit(f"wheel_smoke: the wheel generated {str(got)!r}, the CLI {cli.stdout!r}")
print(f"wheel_smoke: OK ({where.parent}, {got.info['completion_tokens']} tokens as the CLI)")
