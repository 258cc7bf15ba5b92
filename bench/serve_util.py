"""serve_util.py: a `hearth serve` for a benchmark script: started on a free loopback port,
waited for until /health answers, stopped when the block ends. A server that exits or never
answers stops the benchmark with the end of its own log, not a hang or a silent bad run.

    with hearth_serve(binary, ["--model", m, "--max-sequences", "8"]) as (proc, port):
        ...  # requests to http://127.0.0.1:{port}
"""
import contextlib
import socket
import subprocess
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hearth_serve(binary, args, ready_s=600):
    """Yields (the server's Popen, its port) once it answers; args: every serve flag but --port."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "serve", *args, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    why = f"exited with {proc.returncode}" if proc.poll() is not None else f"no answer in {ready_s} s"
                    raise SystemExit(f"hearth serve {why}:\n{tail}")
                time.sleep(0.1)
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
