"""cuda_check_parity.py: compares two `hearth trace` JSON outputs (CPU backend vs CUDA
backend, same model and ids): greedy tokens must be identical; reports the largest
difference among the top logits of every prompt position and step. Prints one JSON line;
exit status 1 when the greedy tokens differ. Usage: cuda_check_parity.py CPU.json CUDA.json"""
import json
import sys

a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta, tb = [s["token"] for s in a["steps"]], [s["token"] for s in b["steps"]]
agree = next((k for k in range(min(len(ta), len(tb))) if ta[k] != tb[k]), min(len(ta), len(tb)))
diff = 0.0
for xa, xb in zip(a["prompt"] + a["steps"], b["prompt"] + b["steps"]):
    gb = dict((i, v) for i, v in xb["top"])
    for i, v in xa["top"]:
        if i in gb:
            diff = max(diff, abs(v - gb[i]))
same = ta == tb and len(ta) > 0
print(json.dumps({"greedy_identical": same, "agree_prefix": agree, "steps": len(ta), "max_top_logit_diff": diff}))
sys.exit(0 if same else 1)
