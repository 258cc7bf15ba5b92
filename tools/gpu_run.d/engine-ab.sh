#!/usr/bin/env bash
# engine-ab LOGDIR: an A/B of two hearth binaries on the 8B rows of bench/results/cuda_engine.md:
# the "before" built by engine-ab.pre.sh (/tmp/ab_old) and this tree's ($H), `hearth bench
# --device cuda` on each model of AB_ROWS (default "l8 q8_0 q4_k_m m4": bf16 folder, Q8_0 and
# Q4_K_M GGUFs, MLX 4-bit; nf:MODEL-FORMAT a new-family model of tools/gpu_models.py, written here), decode (128 after 512) and prefill 4096, binaries alternating for
# AB_ROUNDS (2) rounds (AB_KINDS: "decode p4096" or either alone); prints each row's best of rounds and the ratio after/before last. Env
# from tools/gpu_run (H, L8, G8, M4). Usage: engine-ab.sh LOGDIR
set -u
L=${1:?usage: engine-ab.sh LOGDIR}; mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s); BUDGET=${PHASE_BUDGET:-300}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
OLD=/tmp/ab_old/build/bin/hearth
while [ ! -f /tmp/ab_old/.built ] && [ ! -f /tmp/ab_old/.failed ] && [ "$(left)" -gt 30 ]; do sleep 2; done
[ -x $OLD ] || { echo "engine-ab: no old binary"; exit 1; }
case " ${AB_ROWS:-l8} " in *" l8 "* | *" q"* | *" m4 "*) for _ in $(seq 1 200); do [ -f "$G8"/.done ] && [ -f "$L8"/.done ] && break; sleep 1; done ;; esac
# nf:MODEL-FORMAT: a new-family model of tools/gpu_models.py (gguf | mlx), written here first
for m in ${AB_ROWS:-}; do
    case $m in nf:*) it=${m#nf:} f=/tmp/ab_$it
        [ "${it##*-}" = gguf ] && f=$f.gguf
        [ -e "$f.ready" ] || { timeout 200 python3 tools/gpu_models.py "${it%-*}" "${it##*-}" "$f" >"$L/write_$it.log" 2>&1 && touch "$f.ready"; } ;;
    esac
done
path() {
    case $1 in
        l8) echo "$L8" ;; m4) echo "$M4" ;;
        nf:*) f=/tmp/ab_${1#nf:}; [ "${1##*-}" = gguf ] && f=$f.gguf; echo "$f" ;;
        *) echo "$G8/llama8b-$1.gguf" ;;
    esac
}
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for m in ${AB_ROWS:-l8 q8_0 q4_k_m m4}; do
        p=$(path "$m")
        [ -e "$p" ] || { echo "$m: no model"; continue; }
        n=${m#nf:}
        for kind in ${AB_KINDS:-decode p4096}; do
            [ "$kind" = decode ] && a="-p 512 -n 128 -r 3" || a="-p 4096 -n 1 -r 3"
            for side in old new; do
                [ "$(left)" -lt 25 ] && break 4
                [ $side = old ] && b=$OLD || b=$H
                # shellcheck disable=SC2086 # a is a word list
                timeout $(($(left) - 5)) "$b" bench "$p" --device cuda $a --json >"$L/${n}_${kind}_${side}_$r.json" 2>"$L/${n}_${kind}_${side}_$r.log"
                echo "round $r $n $kind $side: $(tail -c 300 "$L/${n}_${kind}_${side}_$r.json" | tr -d '\n' | cut -c1-200)"
            done
        done
    done
done
python3 - "$L" <<'PY'
import glob, json, os, re, sys
L = sys.argv[1]; best = {}
for f in glob.glob(L + "/*_*_*_*.json"):
    m, kind, side, r = re.match(r"(.+)_(decode|p4096)_(old|new)_(\d+)\.json", os.path.basename(f)).groups()
    try: j = json.loads(open(f).read().strip().splitlines()[-1])
    except Exception: continue
    v = j["decode_tps"] if kind == "decode" else j["prefill_tps"]
    best.setdefault((m, kind), {}).setdefault(side, []).append(v)
print("row | before tok/s (runs) | after tok/s (runs) | after/before (best of each)")
for (m, kind), d in sorted(best.items()):
    o, n = d.get("old", []), d.get("new", [])
    if o and n:
        print("%s %s | %.1f (%s) | %.1f (%s) | %.3f" % (m, kind, max(o), ",".join("%.1f" % x for x in o),
              max(n), ",".join("%.1f" % x for x in n), max(n) / max(o)))
PY
