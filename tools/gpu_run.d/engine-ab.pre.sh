#!/usr/bin/env bash
# engine-ab.pre.sh LOGDIR: started by tools/gpu_run at the very start of the device call: builds
# the "before" hearth of the A/B (AB_OLD_TGZ, default build-gpupack/ab_old.tar.xz: a
# `git archive` of the old commit) into /tmp/ab_old with the same CUDA flags, against
# AB_OLD_DEPS (default build-gpupack/ab_old_deps.tar.xz: the old tree's own
# tools/cuda_check_deps output, packed; its PKGS may differ) or else the carried build-gpudeps; touches /tmp/ab_old/.built (or .failed) when done.
set -u
LOG=${1:?usage: engine-ab.pre.sh LOGDIR}
cd "$(dirname "$0")/../.." || exit 1
T=${AB_OLD_TGZ:-build-gpupack/ab_old.tar.xz}
D=/tmp/ab_old
rm -rf $D && mkdir -p $D
[ -f "$T" ] || { echo "no $T"; touch $D/.failed; exit 1; }
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$T" $D || { touch $D/.failed; exit 1; }
OD=${AB_OLD_DEPS:-build-gpupack/ab_old_deps.tar.xz}
if [ -f "$OD" ]; then
    mkdir -p $D/build-gpudeps && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$OD" $D/build-gpudeps
else
    ln -s "$PWD/build-gpudeps" $D/build-gpudeps
fi
J=$(nproc 2>/dev/null || echo 8)
if (cd $D && make -j"$J" BUILD=build BINDIR=build/bin LIBDIR=build/lib NVCCFLAGS="$NVCCFLAGS" all) >"$LOG/old_build.log" 2>&1; then
    touch $D/.built; echo "old build OK: $($D/build/bin/hearth --version | head -1)"
else
    touch $D/.failed; echo "old build FAILED"; grep -E 'error' "$LOG/old_build.log" | head
fi
