"""The `hearth` package on the GPU: `Engine(model, device="cuda")` from a package built with
the CUDA backend (`HEARTH_CUDA=1 pip install ./python`, docs/python.md "On the GPU"). Oracle:
the `hearth generate --device cuda` CLI of the same build for the same prompt, seed and
sampling (the same tokens, so the same text), with and without --cuda-exact; and a session
saved on the GPU resumes with the text of a fresh prefill. Skips, saying why, where the
package was built without CUDA or no GPU exists (a skip is never a pass)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "parity"))
from conftest import BIN, CACHE  # noqa: E402

hearth = pytest.importorskip("hearth", reason="the hearth package is not importable (make python-test installs it)")

MODELS = ["llama-f32", "qwen3-q4g64", "qwen3_5-f32"]
PROMPT = "Tell me about the sea."


def tiny(name):
    path = CACHE / "tiny" / name
    if not (path / "config.json").exists():
        pytest.fail(f"{path} missing: run tools/make_tiny_models.py", pytrace=False)
    return hearth.Model.open(str(path))


def gpu_engine(model, **kw):
    try:
        return hearth.Engine(model, device="cuda", ctx=512, threads=2, **kw)
    except hearth.Error as e:  # a CPU-only build, or no device: the GPU path did NOT run
        if "without the CUDA backend" in str(e) or "no CUDA device" in str(e):
            pytest.skip(f"the GPU path did NOT run ({e}); it needs a GPU and the package built with "
                        "HEARTH_CUDA=1 (docs/python.md)")
        raise


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("sampling,flags", [({"temperature": 0.0}, ["--temp", "0"]),
                                            ({"temperature": 0.8, "top_p": 0.9, "seed": 7},
                                             ["--temp", "0.8", "--top-p", "0.9", "--seed", "7"])])
@pytest.mark.parametrize("name", MODELS)
def test_cuda_generate_equals_the_cli(name, sampling, flags, exact):
    model = tiny(name)
    engine = gpu_engine(model, cuda_exact=exact)
    got = engine.generate(PROMPT, max_tokens=16, **sampling)
    cli = subprocess.run([str(BIN), "generate", model.path, PROMPT, "--max-tokens", "16", "--ctx",
                          "512", "--threads", "2", "--device", "cuda", *(["--cuda-exact"] if exact else []), *flags],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert got == cli.stdout and got.info["completion_tokens"] > 0
    engine.close()


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-q4g64"])
def test_cuda_session_resumes(name, tmp_path):
    model = tiny(name)
    engine = gpu_engine(model, cuda_exact=True)
    system = "You are a helpful assistant who answers in one sentence. " * 6
    path = str(tmp_path / "s.hkv")
    n = engine.save_session(path, PROMPT, system=system)
    fresh = engine.generate(PROMPT, system=system, max_tokens=16)
    engine.close()
    resumed_engine = gpu_engine(model, cuda_exact=True)
    assert resumed_engine.load_session(path) == n
    resumed = resumed_engine.generate(PROMPT, system=system, max_tokens=16)
    assert resumed.info["cached_tokens"] > 0 and resumed == fresh
    resumed_engine.close()
