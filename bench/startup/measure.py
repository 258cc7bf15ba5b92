"""Start-up of `hearth --no-open` (the appliance, default model): seconds from exec until
/health answers, the CPU seconds the process spent until then, and its VmRSS / VmHWM and
/stats at that moment; with --request, the same again after one short chat request
(a 7-token answer: the KV blocks one request writes). Usage: measure.py BIN [RUNS]
[--request] [-- extra hearth flags]. Each run gets a free port; the first run of a fresh
HEARTH_CACHE also probes the bandwidth (recorded)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_kb(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def memory(pid, port):
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())
    return {"vm_rss_bytes": proc_kb(pid, "VmRSS"), "vm_hwm_bytes": proc_kb(pid, "VmHWM"),
            "stats_peak_bytes": stats.get("peak_bytes"), "kv_blocks_used": stats["kv_blocks"]["used"]
            + stats["kv_blocks"]["cached"]}


def short_request(port):
    body = json.dumps({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 7,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())["usage"]


def main():
    binary = sys.argv[1]
    mine = sys.argv[:sys.argv.index("--")] if "--" in sys.argv else sys.argv
    request = "--request" in mine
    mine = [x for x in mine if x != "--request"]
    runs = int(mine[2]) if len(mine) > 2 else 3
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    for run in range(runs):
        port = free_port()
        t0 = time.monotonic()
        proc = subprocess.Popen([binary, "--no-open", "--port", str(port), *extra], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None:
                    sys.exit(f"hearth exited with {proc.returncode}")
                time.sleep(0.01)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(proc.pid)
        rss, hwm = proc_kb(proc.pid, "VmRSS"), proc_kb(proc.pid, "VmHWM")
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())
        after = None
        if request:
            usage = short_request(port)
            after = dict(memory(proc.pid, port), usage=usage)
        proc.terminate()
        proc.wait()
        out = {"run": run, "health_seconds": round(wall, 3), "cpu_seconds": cpu, "vm_rss_bytes": rss,
               "vm_hwm_bytes": hwm, "stats_peak_bytes": stats.get("peak_bytes"),
               "predicted_peak_bytes": stats.get("predicted_peak_bytes"),
               "context_length": stats.get("context_length"), "load_average": os.getloadavg()[0]}
        if after:
            out["after_request"] = after
        print(json.dumps(out))


if __name__ == "__main__":
    main()
