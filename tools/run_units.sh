#!/bin/sh
# run_units.sh JOBS LOGDIR BINARY...: the unit test binaries, JOBS at a time (each is
# independent: temporary files carry the process id), the slowest first so that the long
# ones overlap the rest; each one's output is kept in LOGDIR/<name>.log and printed whole,
# in the order given, once all have finished; exits 1 when any failed (each named).
jobs=${1:?usage: run_units.sh JOBS LOGDIR BINARY...}
logs=${2:?usage: run_units.sh JOBS LOGDIR BINARY...}
shift 2
mkdir -p "$logs" && rm -f "$logs"/*.log "$logs"/*.rc
# the slowest binaries (a measured list; any others follow in the order given)
slow="test_spec test_cpu_ops_kernels test_cpu_matmul test_scheduler test_hybrid"
{
    for s in $slow; do for b in "$@"; do [ "${b##*/}" = "$s" ] && echo "$b"; done; done
    for b in "$@"; do case " $slow " in *" ${b##*/} "*) ;; *) echo "$b" ;; esac; done
} | xargs -P "$jobs" -I{} sh -c 'n=$(basename "$1"); HEARTH_TEST_DATA=tests/data "$1" >"$2/$n.log" 2>&1; echo $? >"$2/$n.rc"' _ {} "$logs"
fail=
for b in "$@"; do
    n=${b##*/}
    cat "$logs/$n.log"
    rc=$(cat "$logs/$n.rc" 2>/dev/null || echo missing)
    [ "$rc" = 0 ] || fail="$fail $n(rc $rc)"
done
[ -z "$fail" ] || { echo "unit: FAILED:$fail"; exit 1; }
echo "unit: all $# binaries passed"
