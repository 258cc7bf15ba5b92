"""Builds the `hearth` Python package: compiles libhearth from the checkout this folder
sits in (`make lib`) and links it statically into the C extension hearth._hearth, so the
installed package needs no shared library at run time. `pip install ./python` from the
repository root; the C dependencies are tools/deps.sh's (`bash tools/deps.sh --run`).

By default the library is a CPU build in build/python/. Two environment variables change
that (docs/python.md, "On the GPU"):
  HEARTH_CUDA=1      build libhearth with the CUDA backend (nvcc on PATH, as `make` finds it)
                     and link the CUDA runtime and cuBLAS into the extension
  HEARTH_BUILD=DIR   the make build folder to use (BUILD=DIR, LIBDIR=DIR/lib): an existing
                     build with the same flags (e.g. `make BUILD=DIR BINDIR=DIR/bin
                     LIBDIR=DIR/lib`) is reused as it is, nothing is recompiled"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


class BuildWithLibhearth(build_ext):
    def run(self):
        if not (REPO / "Makefile").exists() or not (REPO / "include" / "hearth.h").exists():
            raise SystemExit(f"hearth: {REPO} is not a hearth checkout; install with `pip install ./python` "
                             "from the repository root")
        cuda = os.environ.get("HEARTH_CUDA", "") not in ("", "0")
        nvcc = shutil.which("nvcc") if cuda else ""
        if cuda and not nvcc:
            raise SystemExit("hearth: HEARTH_CUDA=1 needs nvcc on PATH (the CUDA toolkit) to build the GPU backend")
        # the checkout's build/ (ignored by git): a second install recompiles only what changed
        build = Path(os.environ.get("HEARTH_BUILD") or REPO / "build" / ("python-cuda" if cuda else "python"))
        build = build if build.is_absolute() else REPO / build
        jobs = str(max(1, min(os.cpu_count() or 1, 8)))
        # NVCC= : a CPU build; NVCC=<nvcc>: the CUDA backend built in (named, so an NVCC= that
        # a calling make passes down cannot turn it off)
        make = ["make", "-C", str(REPO), f"NVCC={nvcc}", f"BUILD={build}", f"LIBDIR={build}/lib", f"BINDIR={build}/bin"]
        subprocess.check_call([*make, "-j", jobs, "lib"])
        # the link flags libhearth needs (the C libraries, and CUDA's where it is built in)
        libs = shlex.split(subprocess.check_output([*make, "-s", "--no-print-directory", "link-flags"], text=True))
        if not any(f.startswith("-ljansson") for f in libs):
            raise SystemExit("hearth: pkg-config could not find the C libraries; run tools/deps.sh --run")
        for ext in self.extensions:
            ext.extra_objects = [str(build / "lib" / "libhearth.a")]
            ext.extra_link_args = libs
        # setuptools relinks only when _hearth.c changed: a CPU module left in python/build
        # would be reused for a CUDA build (and the other way round); one file, always redone
        self.force = True
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
