"""examples/ against the INSTALLED library: `make examples` installs hearth into
build/install-test (HEARTH_PREFIX) and runs this file. It checks the install (soname link
chain, the shared library exporting exactly the functions the installed hearth.h declares,
hearth.pc read by pkg-config, a DESTDIR staging install), builds every example with
`pkg-config --cflags --libs hearth` (and the generate example statically, with
`pkg-config --static`), and runs them on the tiny models. Oracles: the installed
`hearth generate` for the generation examples (same prompt, seed and greedy settings: the
CLI's own parity with mlx-lm is tests/parity/test_generate.py), sentence-transformers'
vectors in tests/parity/goldens/embed_minilm.json for the embeddings example."""
import base64
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = Path(os.environ.get("HEARTH_PREFIX", ROOT / "build" / "install-test"))
CACHE = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
TINY = CACHE / "tiny"
MINILM = CACHE / "models" / "all-MiniLM-L6-v2"
GOLDEN = ROOT / "tests" / "parity" / "goldens" / "embed_minilm.json"
HEADER = (ROOT / "include" / "hearth.h").read_text()
VERSION = re.search(r'#define HEARTH_VERSION "([^"]+)"', HEADER).group(1)
API_VERSION = int(re.search(r"#define HEARTH_API_VERSION (\d+)", HEADER).group(1))


def need(path, what):
    if not path.exists():  # fail, not skip: a missing model must not pass as green
        pytest.fail(f"{what} missing at {path}: run `make examples` / tools/get_models.sh", pytrace=False)
    return path


def pkg_config(*args):
    env = dict(os.environ, PKG_CONFIG_PATH=str(PREFIX / "lib" / "pkgconfig"))
    r = subprocess.run(["pkg-config", *args, "hearth"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=120, **kw)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    need(PREFIX / "lib" / "pkgconfig" / "hearth.pc", "the test install")
    out = tmp_path_factory.mktemp("examples")
    flags = pkg_config("--cflags", "--libs")
    exes = {}
    for name in ("generate", "chat_stream", "batch", "embeddings"):
        exe = out / name
        run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", ROOT / "examples" / f"{name}.c", *flags,
             f"-Wl,-rpath,{PREFIX / 'lib'}", "-lm", "-o", exe])
        exes[name] = exe
    # The static archive with only what hearth.pc says it needs: Libs.private, and the
    # Requires.private packages as the shared libraries they are here (`pkg-config --static`
    # would also ask for their own private static dependencies, which Debian does not ship).
    pc = (PREFIX / "lib" / "pkgconfig" / "hearth.pc").read_text()
    libs_private = re.search(r"^Libs.private:(.*)$", pc, re.M).group(1).split()
    requires = [line.split()[0] for line in subprocess.run(
        ["pkg-config", "--print-requires-private", "hearth"], capture_output=True, text=True, check=True,
        env=dict(os.environ, PKG_CONFIG_PATH=str(PREFIX / "lib" / "pkgconfig"))).stdout.splitlines()]
    assert requires, "hearth.pc has no Requires.private"
    deps = subprocess.run(["pkg-config", "--libs", *requires], capture_output=True, text=True, check=True).stdout.split()
    static = [str(PREFIX / "lib" / "libhearth.a"), *libs_private, *deps]
    exes["generate_static"] = out / "generate_static"
    run(["cc", "-std=c11", "-O2", ROOT / "examples" / "generate.c", *pkg_config("--cflags"), *static, "-o",
         exes["generate_static"]])
    return exes


def cli(*args):
    return run([PREFIX / "bin" / "hearth", "generate", *args]).stdout


def test_install_layout():
    lib = PREFIX / "lib"
    soname = f"libhearth.so.{API_VERSION - 1}"
    assert os.readlink(lib / "libhearth.so") == soname
    assert os.readlink(lib / soname) == f"libhearth.so.{VERSION}"
    real = lib / f"libhearth.so.{VERSION}"
    assert real.is_file() and not real.is_symlink()
    dyn = run(["readelf", "-d", real]).stdout.decode()
    assert f"Library soname: [{soname}]" in dyn
    assert (PREFIX / "include" / "hearth.h").read_text() == HEADER
    assert (lib / "libhearth.a").is_file() and os.access(PREFIX / "bin" / "hearth", os.X_OK)
    assert pkg_config("--modversion") == [VERSION]
    assert pkg_config("--variable=prefix") == [str(PREFIX)]
    assert "-lhearth" in pkg_config("--libs")
    # Requires.private carries the library's own dependencies for static links.
    assert "-ljansson" in pkg_config("--static", "--libs") and "-ljansson" not in pkg_config("--libs")


@pytest.mark.parametrize("lang", [["cc", "-std=c99", "-x", "c"], ["c++", "-std=c++11", "-x", "c++"]])
def test_installed_header_stands_alone(tmp_path, lang):
    # strict C99 and C++ (extern "C") consumers, with nothing but the installed header
    src = tmp_path / "use.c"
    src.write_text("#include <hearth.h>\nint main(void) { return HEARTH_API_VERSION - 1; }\n")
    run([*lang[:2], "-pedantic", "-Wall", "-Wextra", "-Werror", *pkg_config("--cflags"), lang[2], lang[3], src,
         "-fsyntax-only"])


def test_shared_library_exports_the_header_only():
    declared = set(re.findall(r"\b(hearth_[a-z0-9_]+)\s*\(", HEADER))
    nm = run(["nm", "-D", "--defined-only", PREFIX / "lib" / f"libhearth.so.{VERSION}"]).stdout.decode()
    exported = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    assert exported == declared


def test_destdir_staging(tmp_path):
    stage = tmp_path / "stage"
    run(["make", "--no-print-directory", "-s", "install", f"DESTDIR={stage}", "PREFIX=/opt/hearth"],
        cwd=ROOT)
    files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if not p.is_dir())
    assert files == sorted(f"opt/hearth/{f}" for f in (
        "bin/hearth", "include/hearth.h", "lib/libhearth.a", "lib/libhearth.so", f"lib/libhearth.so.{API_VERSION - 1}",
        f"lib/libhearth.so.{VERSION}", "lib/pkgconfig/hearth.pc"))
    pc = (stage / "opt/hearth/lib/pkgconfig/hearth.pc").read_text()
    assert "prefix=/opt/hearth\n" in pc and str(stage) not in pc


@pytest.mark.parametrize("model", ["llama-f32", "qwen3-q4g32", "gemma3-q8g64"])
def test_generate_greedy_equals_cli(built, model):
    path = need(TINY / model, "tiny model")
    got = run([built["generate"], path, "The capital of France is", 24, 0]).stdout
    assert got == cli(path, "The capital of France is", "--no-chat-template", "--temp", "0", "--max-tokens", "24")
    assert len(got) > 0


def test_generate_seeded_sampling_equals_cli(built):
    path = need(TINY / "qwen3-f32", "tiny model")
    got = run([built["generate"], path, "Once upon a time", 24, 0.9, 7]).stdout
    assert got == cli(path, "Once upon a time", "--no-chat-template", "--temp", "0.9", "--seed", "7",
                      "--max-tokens", "24")
    # another seed samples something else: the seed really reaches the sampler
    assert got != run([built["generate"], path, "Once upon a time", 24, 0.9, 8]).stdout


def test_generate_static_link_equals_shared(built):
    path = need(TINY / "llama-q8g32", "tiny model")
    args = [path, "static or shared", 12, 0]
    assert run([built["generate_static"], *args]).stdout == run([built["generate"], *args]).stdout


@pytest.mark.parametrize("model", ["gemma3-f32", "qwen3-q8g32"])
def test_chat_stream_equals_cli_chat(built, model):
    path = need(TINY / model, "tiny model")
    message = 'Say "hi"\\ and\nstop'  # quotes, a backslash and a newline go through the JSON escaping
    r = run([built["chat_stream"], path, message, 20])
    assert r.stdout == cli(path, message, "--temp", "0", "--max-tokens", "20")
    assert b"finish: length" in r.stderr or b"finish: stop" in r.stderr


def test_chat_stream_cancels_from_the_callback(built):
    path = need(TINY / "gemma3-f32", "tiny model")
    full = run([built["chat_stream"], path, "Hi there", 40]).stdout
    r = run([built["chat_stream"], path, "Hi there", 40, 10])
    assert b"finish: cancelled" in r.stderr
    assert len(r.stdout) >= 10 and full.startswith(r.stdout) and len(r.stdout) < len(full)


def test_batch_equals_each_prompt_alone(built):
    path = need(TINY / "llama-q4g32", "tiny model")
    prompts = ["one two three", "The capital of France is", "x", "a much longer prompt " * 6]
    got = run([built["batch"], path, 16, *prompts]).stdout
    want = b"".join(b"--- %d\n%s\n" % (i, cli(path, p, "--no-chat-template", "--temp", "0", "--deterministic",
                                             "--max-tokens", "16")) for i, p in enumerate(prompts))
    assert got == want


def test_embeddings_match_sentence_transformers(built):
    need(MINILM / "config.json", "all-MiniLM-L6-v2")
    golden = json.loads(need(GOLDEN, "embedding goldens").read_text(encoding="utf-8"))
    items = golden["items"][:6]
    ref = np.array([np.frombuffer(base64.b64decode(i["embedding_f32_b64"]), dtype="<f4") for i in items], np.float64)
    lines = run([built["embeddings"], MINILM, *[i["text"] for i in items]]).stdout.decode().splitlines()
    assert lines[0] == f"dim {ref.shape[1]} pooling mean normalized 1"
    got = np.array([[float(x) for x in line.split()] for line in lines[1:1 + len(items)]])
    assert np.abs(got - ref).max() < 1e-4  # float32 rounding on both sides is ~1e-6
    assert lines[1 + len(items)] == "cosine similarity"
    cos = np.array([[float(x) for x in line.split()] for line in lines[2 + len(items):]])
    unit = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    assert np.abs(cos - unit @ unit.T).max() < 2e-4  # printed with 4 decimals
