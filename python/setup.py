"""Builds the `hearth` Python package: compiles libhearth from the checkout this folder
sits in (`make lib`, CPU build) and links it statically into the C extension
hearth._hearth, so the installed package needs no shared library at run time.
`pip install ./python` from the repository root; the C dependencies are tools/deps.sh's
(`bash tools/deps.sh --run`)."""
import os
import shlex
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PKGS = "jansson libpcre2-8 libutf8proc libcurl sqlite3 libcrypto"  # the Makefile's PKGS


class BuildWithLibhearth(build_ext):
    def run(self):
        if not (REPO / "Makefile").exists() or not (REPO / "include" / "hearth.h").exists():
            raise SystemExit(f"hearth: {REPO} is not a hearth checkout; install with `pip install ./python` "
                             "from the repository root")
        # the checkout's build/ (ignored by git): a second install recompiles only what changed
        build = REPO / "build" / "python"
        jobs = str(max(1, min(os.cpu_count() or 1, 8)))
        # NVCC= : a CPU build (the CUDA backend needs the toolkit's libraries at link time)
        subprocess.check_call(["make", "-C", str(REPO), "-j", jobs, "lib", "NVCC=", f"BUILD={build}/obj",
                               f"LIBDIR={build}/lib", f"BINDIR={build}/bin"])
        try:
            libs = shlex.split(subprocess.check_output(["pkg-config", "--libs", *PKGS.split()], text=True))
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"hearth: pkg-config could not find the C libraries ({e}); run tools/deps.sh --run")
        for ext in self.extensions:
            ext.extra_objects = [str(build / "lib" / "libhearth.a")]
            ext.extra_link_args = libs + ["-lm", "-pthread"]
        super().run()


setup(
    name="hearth",
    version="0.1.0",
    description="Python bindings for hearth, a local LLM runtime in C",
    packages=["hearth"],
    package_data={"hearth": ["py.typed", "*.pyi"]},
    ext_modules=[Extension("hearth._hearth", ["hearth/_hearth.c"], include_dirs=[str(REPO / "include"), str(REPO / "src")],
                           extra_compile_args=["-std=gnu11", "-Wall", "-Wno-unused-parameter",
                                               "-Wno-missing-field-initializers"])],
    cmdclass={"build_ext": BuildWithLibhearth},
    python_requires=">=3.9",
)
