# hearth build. `make` builds bin/hearth and lib/libhearth.{a,so}; `make test` installs
# what it needs (tools/deps.sh) and runs unit, sanitizer, fuzz and parity tests.
# Sources are found by wildcard: add a file under src/ and it is built; add
# tests/unit/test_<name>.c and it becomes a test; tests/fuzz/fuzz_<name>.c a fuzz target.
# BUILD/BINDIR may be overridden to build in a separate tree (e.g. BUILD=build-x).

BUILD   ?= build
BINDIR  ?= bin
LIBDIR  ?= lib
CC      ?= gcc
PKGS    := jansson libpcre2-8 libutf8proc libcurl sqlite3 libcrypto libgit2
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# A GPU machine without the -dev packages: tools/cuda_check_deps copies their headers and
# libraries into GPUDEPS (DT_RPATH, so their own dependencies resolve there too); used
# only when pkg-config finds nothing.
GPUDEPS ?= build-gpudeps
ifeq ($(PKG_LIBS),)
ifneq ($(wildcard $(GPUDEPS)/lib),)
GPUDEPS_DIR := $(abspath $(GPUDEPS))
PKG_CFLAGS := -I$(GPUDEPS_DIR)/include
PKG_LIBS   := -L$(GPUDEPS_DIR)/lib -Wl,--disable-new-dtags,-rpath,$(GPUDEPS_DIR)/lib,-rpath-link,$(GPUDEPS_DIR)/lib \
              $(shell cat $(GPUDEPS_DIR)/libs.txt)
endif
endif
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fPIC -pthread -Iinclude -Isrc $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -pthread
PYTHON  := .venv/bin/python
FUZZ_SECONDS ?= 5

LIB_SRC := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC := $(shell find src/cli -name '*.c' | sort)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
# CUDA backend: src/**/*.cu go into the library only when nvcc is on PATH; without it
# nothing CUDA is built. cudart is linked statically (the binary runs wherever the driver
# is, whatever toolkit is installed); cuBLAS from the toolkit that built it, opened with dlopen
# when a CUDA engine first needs it (cuda_gemm.cu), not linked: its static constructors cost
# ~90 ms of CPU at every start of the binary, CLI commands that never touch the GPU included.
NVCC := $(shell command -v nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME ?= $(abspath $(dir $(NVCC))..)
CU_SRC   := $(shell find src -name '*.cu' | sort)
# CU_BUILD: where the CUDA objects live. The sanitizer build reuses the main build's (nvcc
# compiles host code without sanitizers anyway, and three architectures take minutes).
CU_BUILD ?= $(BUILD)
CU_OBJ   := $(CU_SRC:%.cu=$(CU_BUILD)/obj/%.o)
LIB_OBJ  += $(CU_OBJ)
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
             -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_89,code=sm_89
CFLAGS   += -DHEARTH_HAVE_CUDA -I$(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all lib link-flags install examples wheel python-test test test-quick test-build unit unit-build asan asan-build fuzz fuzz-build parity soak soak-bin soak-short deps run clean format
all: $(BINDIR)/hearth $(LIBDIR)/libhearth.a $(LIBDIR)/libhearth.so

lib: $(LIBDIR)/libhearth.a $(LIBDIR)/libhearth.so

# V=1 shows every command; by default one short line per file.
ifeq ($(V),1)
Q :=
else
Q := @
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The scalar reference tier (HEARTH_CPU=scalar) is the oracle of many parity and API
# tests; -O3 lets gcc vectorize its dequantizers and its four-row double chains (SmolLM2
# Q4_1 trace: 3.3 -> 2.2 s). Without -ffast-math gcc may not reorder or contract any
# float operation, so the results are the same bits. Not in the sanitizer build: OPT
# given on the command line wins over this.
# ops.o: op_lora_apply's loops (LoRA adapters) are vectorized only at -O3.
$(BUILD)/obj/src/io/ggml_quant.o $(BUILD)/obj/src/backend/cpu/kernels_ref.o $(BUILD)/obj/src/ops/ops.o: OPT := -O3

# The chat page is pulled into web_assets.o by .incbin, which -MMD cannot see.
$(BUILD)/obj/src/server/web_assets.o build/fuzz/obj/src/server/web_assets.o: $(wildcard web/*)
# Likewise data/*.json (the SKU table and the model catalogue) for data_files.o.
$(BUILD)/obj/src/io/data_files.o build/fuzz/obj/src/io/data_files.o: $(wildcard data/*)
# And hearth's docs, copied into a memory vault's Reference/ (memory_reference.o).
$(BUILD)/obj/src/memory/memory_reference.o build/fuzz/obj/src/memory/memory_reference.o: README.md $(wildcard docs/*.md)

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -Iinclude -Isrc -MMD -MP -c $< -o $@

ifneq ($(CU_BUILD),$(BUILD))
$(CU_BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -Iinclude -Isrc -MMD -MP -c $< -o $@
endif

$(BUILD)/libhearth.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	$(Q)ar rcs $@ $^

$(LIBDIR)/libhearth.a: $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	@cp $< $@

# The shared library carries a soname (libhearth.so.<API version - 1>, include/hearth.h) and
# exports only what hearth.h declares (a version script made from the header), so that
# internal symbols (tok_*, kv_*, ...) never clash with a program's own. lib/ holds it as
# install puts it: the real file and the two links.
VERSION    := $(shell sed -n 's/^\#define HEARTH_VERSION "\(.*\)"/\1/p' include/hearth.h)
API_VERSION := $(shell sed -n 's/^\#define HEARTH_API_VERSION \([0-9]*\)/\1/p' include/hearth.h)
SONAME     := libhearth.so.$(shell echo $$(($(API_VERSION) - 1)))
SO_REAL    := libhearth.so.$(VERSION)
$(BUILD)/hearth.map: include/hearth.h
	@mkdir -p $(dir $@)
	@{ echo '{ global:'; grep -oE '\bhearth_[a-z0-9_]+ *\(' $< | sed 's/ *($$/;/' | sort -u; echo 'local: *; };'; } >$@

$(LIBDIR)/$(SO_REAL): $(LIB_OBJ) $(BUILD)/hearth.map
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LINK  $@")
	$(Q)$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script,$(BUILD)/hearth.map -o $@ $(LIB_OBJ) \
	  $(LDLIBS) $(CUDA_LIBS)
$(LIBDIR)/libhearth.so: $(LIBDIR)/$(SO_REAL)
	@ln -sf $(SO_REAL) $(LIBDIR)/$(SONAME)
	@ln -sf $(SONAME) $@

$(BINDIR)/hearth: $(CLI_OBJ) $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LINK  $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS) -lcmocka

# Builds (unit-build) or builds and runs (unit) every unit test binary, JOBS at a time
# (tools/run_units.sh: each one's cmocka output printed whole, in order, after all ran).
unit-build: $(UNIT_BIN)
unit: $(UNIT_BIN)
	@sh tools/run_units.sh $(JOBS) $(BUILD)/unit-logs $(UNIT_BIN)

ASAN_MAKE = $(MAKE) --no-print-directory BUILD=build/asan BINDIR=build/asan/bin LIBDIR=build/asan/lib \
  CU_BUILD=$(CU_BUILD) OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
  LDLIBS="$(LDLIBS) -fsanitize=address,undefined"
# '+': the sub-make is reached through ASAN_MAKE, so make would not see $(MAKE) in the
# recipe and would not hand it the jobserver (the sub-make then warned and ran at -j1)
asan:
	+@$(ASAN_MAKE) unit
# Builds the sanitizer tests without running them. After the CUDA objects: the sub-make
# reuses them (CU_BUILD) and must not compile the same object next to this make.
asan-build: $(CU_OBJ)
	+@$(ASAN_MAKE) unit-build build/asan/bin/hearth

# The soak (tests/soak/soak.py): the sanitizer build of the server under a bounded mixed
# workload with disconnects, bad input and slow senders, checking status codes, /health,
# the RSS trend, /stats back to zero and the sanitizer's output. `make soak` runs it for
# three minutes (before a release); the parity stage runs its 30-second form.
soak-bin: $(CU_OBJ)
	+@$(ASAN_MAKE) build/asan/bin/hearth
soak: soak-bin
	@$(PYTHON) tests/soak/soak.py --bin build/asan/bin/hearth
soak-short: soak-bin
	@$(PYTHON) tests/soak/soak.py --short --bin build/asan/bin/hearth

# libFuzzer targets, built with clang against the library sources, run a few seconds each.
# One make target per fuzzer: each runs single-threaded for FUZZ_SECONDS, so under -jN
# N of them run side by side, each on its own core for its full time.
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
fuzz: $(FUZZ_BIN:build/fuzz/%=fuzz-run-%)
fuzz-build: $(FUZZ_BIN)
fuzz-run-%: build/fuzz/%
	@n=$*; mkdir -p build/fuzz/corpus-$$n; \
	  seeds=tests/fuzz/seeds/$$n; [ -d $$seeds ] || seeds=; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
	  $< -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -print_final_stats=0 \
	      build/fuzz/corpus-$$n $$seeds >build/fuzz/$$n.log 2>&1 \
	    || { echo "fuzz: $$n FAILED"; tail -40 build/fuzz/$$n.log; exit 1; }

# The library is built once with fuzzer coverage (no libFuzzer main), each target links it.
COMMA := ,
FUZZ_FLAGS := -O1 -g -std=gnu11 -fsanitize=address,undefined -Iinclude -Isrc $(PKG_CFLAGS)
FUZZ_OBJ := $(LIB_SRC:%.c=build/fuzz/obj/%.o)
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@clang $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
# The SIMD matmul kernels are linked into the fuzzers (through the engine) but no parser
# input reaches them; under UBSan clang takes ~85 s each to compile them (ASan alone ~12 s),
# so here they keep ASan and coverage but not UBSan. The ASan+UBSan unit-test build
# (make asan) checks them with both, on the inputs that do reach them.
FUZZ_NO_UBSAN := build/fuzz/obj/src/backend/cpu/kernels_avx2.o build/fuzz/obj/src/backend/cpu/kernels_avx512.o
$(FUZZ_NO_UBSAN): build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@clang $(filter-out -fsanitize=address$(COMMA)undefined,$(FUZZ_FLAGS)) -fsanitize=address \
	  -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

build/fuzz/libhearth-fuzz.a: $(FUZZ_OBJ)
	@rm -f $@
	@ar rcs $@ $^

build/fuzz/%: tests/fuzz/%.c build/fuzz/libhearth-fuzz.a
	@mkdir -p $(dir $@)
	$(Q)clang $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $< build/fuzz/libhearth-fuzz.a $(LDLIBS)

deps:
	@bash tools/deps.sh

# `make install PREFIX=/usr/local DESTDIR=`: the binary, both libraries (the shared one as
# real file + soname link + dev link), the header and hearth.pc for pkg-config.
PREFIX ?= /usr/local
DESTDIR ?=
INSTALL_LIB := $(DESTDIR)$(PREFIX)/lib
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(INSTALL_LIB)/pkgconfig
	install -m 755 $(BINDIR)/hearth $(DESTDIR)$(PREFIX)/bin/hearth
	install -m 644 include/hearth.h $(DESTDIR)$(PREFIX)/include/hearth.h
	install -m 644 $(LIBDIR)/libhearth.a $(INSTALL_LIB)/libhearth.a
	install -m 755 $(LIBDIR)/$(SO_REAL) $(INSTALL_LIB)/$(SO_REAL)
	ln -sf $(SO_REAL) $(INSTALL_LIB)/$(SONAME)
	ln -sf $(SONAME) $(INSTALL_LIB)/libhearth.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@REQUIRES_PRIVATE@|$(PKGS)|' \
	    -e 's|@LIBS_PRIVATE@|-lm -pthread $(CUDA_LIBS)|' hearth.pc.in >$(INSTALL_LIB)/pkgconfig/hearth.pc

# examples/ built against the installed library through pkg-config and run on the tiny
# models by tests/examples/test_examples.py (which also checks the install's layout).
EXAMPLES_PREFIX := $(abspath build/install-test)
examples:
	@rm -rf $(EXAMPLES_PREFIX)
	@$(MAKE) --no-print-directory install PREFIX=$(EXAMPLES_PREFIX) >/dev/null
	@HEARTH_PREFIX=$(EXAMPLES_PREFIX) $(PYTHON) -m pytest -q -p no:cacheprovider tests/examples

# The flags a program that links libhearth.a needs after it (python/setup.py reads them):
# the C libraries, and the CUDA runtime and cuBLAS where the CUDA backend is built in.
link-flags:
	@echo $(LDLIBS) $(CUDA_LIBS)

# The Python package (python/) as users get it: `make wheel` builds its wheel with pip (its
# setup.py builds libhearth itself: a CPU build in build/python) into build/python/dist.
# python-test installs that wheel into a fresh virtual environment (no packages, no
# network: tests/python/wheel_smoke.py imports it there and generates as the CLI does) and
# into build/python/site, where tests/python run on it.
PY_DIST := $(abspath build/python/dist)
PY_SITE := $(abspath build/python/site)
PY_VENV := $(abspath build/python/venv)
PIP     := $(PYTHON) -m pip -q --disable-pip-version-check
wheel:
	@rm -rf $(PY_DIST)
	@HEARTH_BUILD=$(WHEEL_BUILD) $(PIP) wheel --no-deps --no-build-isolation -w $(PY_DIST) ./python
	@echo "  WHEEL $$(ls $(PY_DIST)/hearth-*.whl)"
# python-test's wheel reuses the main tree (setup.py's HEARTH_BUILD) where that is a CPU build
# (no nvcc): the same objects setup.py would compile into build/python, so make test does not
# compile libhearth a second time. After `all`, so the tree is complete and current. With the
# CUDA backend in the main tree the wheel keeps its own CPU build.
python-test: all
	+@$(MAKE) --no-print-directory wheel WHEEL_BUILD=$(if $(NVCC),,$(abspath $(BUILD)))
	@rm -rf $(PY_SITE) $(PY_VENV)
	@$(PYTHON) -m venv --without-pip $(PY_VENV)
	@$(PIP) --python $(PY_VENV)/bin/python install --no-index --no-deps $(PY_DIST)/hearth-*.whl
	@HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PY_VENV)/bin/python tests/python/wheel_smoke.py
	@$(PIP) install --no-index --no-deps --target $(PY_SITE) $(PY_DIST)/hearth-*.whl
	@PYTHONPATH=$(PY_SITE) HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTHON) -m pytest -q -p no:cacheprovider tests/python

# Parity tests against the Python oracles (mlx-lm, HF tokenizers, gguf, jinja2) and the
# API tests (the real mlx_lm.server, the openai SDK), the short soak of the sanitizer
# build, and the chat page (headless chromium).
# PYTEST_JOBS pytest-xdist workers per suite: most tests wait on one single-threaded
# subprocess (a trace, a --threads 1 server, an oracle), so one worker per core. Parity
# tests are independent of each other and spread one by one (worksteal: a worker that runs
# out takes half of the other's queue, so both finish together; under load, the two ended
# 27 s apart); API tests keep each file on one worker, in order (a file's tests share a
# module-scoped server and its state).
PYTEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(PYTHON) -m pytest -q -p no:cacheprovider -n $(PYTEST_JOBS)
STAGE := sh tools/stage.sh
parity: all
	@bash tools/get_models.sh
	@# one run per folder: each folder's tests import helpers from its own conftest module
	@$(STAGE) parity env HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTEST) --dist worksteal --durations=20 tests/parity
	@$(STAGE) api env HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTEST) --dist loadfile --durations=20 tests/api
	+@$(STAGE) soak $(MAKE) --no-print-directory soak-short
	@$(STAGE) ui env HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTHON) -m pytest -q -p no:cacheprovider tests/ui

# Everything `make test` runs is built first in one make graph (main tree with its CUDA
# objects, unit tests, sanitizer tree, fuzz library): as four sequential builds each one's
# last long compile left a core idle. Builds use every core (JOBS), and so do the fuzzers
# (one per core) and the pytest suites (PYTEST_JOBS workers); unit tests run in order.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test-build: all unit-build asan-build fuzz-build
# The test build compiles the CUDA objects for sm_90a and sm_80, not sm_89 as well: every
# arch-specific branch of the kernels (>= 800, >= 900) is compiled either way, sm_80 code runs
# on sm_89 GPUs (same major version), and the third architecture cost about a minute of CI.
# Derived from NVCCFLAGS (so a user's own flags hold in `make test` too), less sm_89.
comma := ,
TEST_NVCCFLAGS ?= $(filter-out -gencode=arch=compute_89$(comma)code=sm_89,$(NVCCFLAGS))
test: deps
	@python3 tools/check_layers.py
	+@$(STAGE) build $(MAKE) --no-print-directory -j$(JOBS) test-build $(if $(NVCC),NVCCFLAGS="$(TEST_NVCCFLAGS)")
	@# the unit tests of the scheduler load the tiny models: made before they run
	@$(STAGE) models bash tools/get_models.sh
	+@$(STAGE) unit $(MAKE) --no-print-directory unit
	+@$(STAGE) examples $(MAKE) --no-print-directory examples
	+@$(STAGE) python-test $(MAKE) --no-print-directory python-test
	+@$(STAGE) asan $(MAKE) --no-print-directory asan
	+@$(STAGE) fuzz $(MAKE) --no-print-directory -j$(JOBS) fuzz
	+@$(MAKE) --no-print-directory parity

# The inner loop: the unit tests, then the CLI's error table and the fit / start-up checks
# that need no oracle server (a couple of minutes on 2 cores); `make test` runs everything.
test-quick: all unit-build
	@$(MAKE) --no-print-directory unit
	@HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTHON) -m pytest -q -p no:cacheprovider tests/parity/test_cli_errors.py
	@HEARTH_BIN=$(abspath $(BINDIR)/hearth) $(PYTHON) -m pytest -q -p no:cacheprovider tests/api/test_startup.py

# `make run` builds only what this machine can use: no CUDA objects without a GPU
# (nvidia-smi -L fails or there is no /dev/nvidia0), only the native GPU architecture
# with one. Each in its own build folder, so these objects never mix with the
# every-architecture ones of `make` (three) and `make test` (sm_90a and sm_80), which still
# build and check every kernel branch.
RUN_GPU = $(shell nvidia-smi -L >/dev/null 2>&1 && [ -e /dev/nvidia0 ] && echo 1)
RUN_FLAGS = $(if $(RUN_GPU),BUILD=build/run-native NVCCFLAGS="-O3 -std=c++17 -Xcompiler -fPIC -arch=native",BUILD=build/run-cpu NVCC=)
run:
	@bash tools/deps.sh --run
	@$(MAKE) --no-print-directory -j$$(nproc) $(RUN_FLAGS) all
	@bash tools/get_models.sh --default
	@bash tools/run_default.sh

format:
	clang-format -i $$(find src include tests -name '*.[ch]')

clean:
	rm -rf build bin lib

# The GEMV microbenchmark (CUDA events; needs a GPU to run): tools/cuda_check runs it.
$(BUILD)/bench/gemv_bench: bench/cuda/gemv_bench.c $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS)

# One Gated DeltaNet layer's prefill, token walk against the chunked form (CUDA events;
# tools/gpu_run.d/gdn-bench.sh).
$(BUILD)/bench/gdn_bench: bench/cuda/gdn_bench.c $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS)

# The batched-step microbenchmark (matmul paths, ragged attention; tools/gpu_run.d/cuda-batch.sh).
$(BUILD)/bench/batch_bench: bench/cuda/batch_bench.c $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS)

# The grammar engine on MaskBench cases (bench/maskbench/maskbench.py builds and runs it).
$(BUILD)/bench/maskbench: bench/maskbench/maskbench.c $(BUILD)/libhearth.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libhearth.a $(LDLIBS) $(CUDA_LIBS)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(FUZZ_OBJ:.o=.d)
