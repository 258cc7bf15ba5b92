#!/usr/bin/env python3
"""burst.py: time to first token of `hearth serve` when N clients send, at the same moment,
chats it has answered before (bench/serve_load's prompt pool, one sequential warm-up request
each): how much of each prompt the prefix cache gives back (usage cached_tokens) and how long
the first token takes. Run it with two binaries to compare prefix-cache policies.
Usage: burst.py BIN MODEL [--n 16] [--rounds 3] [--max-tokens 16] [--threads 2] [serve flags...]
Prints one line per round: the sorted TTFTs (ms), engine steps taken, sorted cached_tokens."""
import argparse, json, os, socket, subprocess, sys, threading, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "serve_load"))
sys.path.insert(0, os.path.join(HERE, "..", "serve_overhead"))
import load_gen  # noqa: E402
from sse_client import stream_completion  # noqa: E402

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin"), ap.add_argument("model")
    ap.add_argument("--n", type=int, default=16), ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16), ap.add_argument("--threads", type=int, default=2)
    a, extra = ap.parse_known_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the random-weight 1B GGUFs carry no chat template: ChatML, as bench/serve_load gives them
    argv = [a.bin, "serve", "--model", a.model, "--port", str(port), "--threads", str(a.threads),
            "--max-sequences", str(a.n), "--ctx", "1024", "--kv-blocks", str(1024 * a.n // 16),
            "--log-level", "WARNING", "--chat-template", CHATML] + extra
    server = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        def stats():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as r:
                return json.load(r)
        for _ in range(600):
            try:
                stats()
                break
            except OSError:
                time.sleep(0.1)
        bodies = [load_gen.request_body(load_gen.PROMPTS[i % len(load_gen.PROMPTS)], a.max_tokens, [128001])
                  for i in range(a.n)]
        for b in bodies:
            stream_completion(port, "/v1/chat/completions", b)
        for _ in range(a.rounds):
            s0, res, gate = stats(), [None] * a.n, threading.Barrier(a.n)

            def client(i):
                gate.wait()
                res[i] = stream_completion(port, "/v1/chat/completions", bodies[i])
            threads = [threading.Thread(target=client, args=(i,)) for i in range(a.n)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            steps = stats()["steps"]["count"] - s0["steps"]["count"]
            ttft = sorted(round(r.ttft * 1000) for r in res)
            cached = sorted(r.usage["prompt_tokens_details"]["cached_tokens"] for r in res)
            print(f"ttft_ms {ttft} p50 {ttft[len(ttft) // 2]} steps {steps} cached {cached}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
