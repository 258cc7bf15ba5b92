"""--device cpu|cuda|auto: where no GPU exists (CI), auto falls back to the CPU with a note and
cuda fails cleanly; where one exists, the CUDA backend with exact f32 GEMMs gives the same
greedy tokens as the CPU backend's reference tier (HEARTH_CPU=scalar: exact dequantization,
double accumulation) on every tiny model family. Heavier GPU checks: tools/cuda_check."""
import json
import os
import subprocess

import pytest

from conftest import TINY_MODELS

IDS = "[262,368,543,30,477,256,54,161,116,381,481,253,390,557,105,588,256,14,222,418]"


def trace(hearth_bin, model, device, env=None, args=()):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([str(hearth_bin), "trace", str(model), "--ids", IDS, "--last", "2", "--top", "5",
                           "--steps", "12", "--step-top", "5", "--device", device, *args],
                          capture_output=True, text=True, env=e, timeout=120)


def has_gpu(hearth_bin, model):
    r = trace(hearth_bin, model, "auto")
    assert r.returncode == 0, r.stderr
    return "device auto: cpu" not in r.stderr


def test_version_names_backends(hearth_bin):
    out = subprocess.run([str(hearth_bin), "--version"], capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("backends:"))
    assert line.split()[1] == "cpu" and set(line.split()[1:]) <= {"cpu", "cuda"}, out


def test_unknown_device_is_refused(hearth_bin, tiny_models):
    r = trace(hearth_bin, tiny_models["llama-f32"], "tpu")
    assert r.returncode != 0 and "cpu, cuda or auto" in r.stderr, r.stderr


def test_without_gpu_auto_is_cpu_and_cuda_fails(hearth_bin, tiny_models):
    m = tiny_models["llama-f32"]
    if has_gpu(hearth_bin, m):
        pytest.skip("a CUDA device is present: the no-GPU fallback is not what runs here")
    cpu, auto, cuda = trace(hearth_bin, m, "cpu"), trace(hearth_bin, m, "auto"), trace(hearth_bin, m, "cuda")
    assert auto.returncode == 0 and json.loads(auto.stdout) == json.loads(cpu.stdout)
    assert cuda.returncode == 1 and ("no CUDA device" in cuda.stderr or "without the CUDA backend" in cuda.stderr)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_cuda_greedy_matches_cpu_reference(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        refused = trace(hearth_bin, m, "cuda")
        # hybrid Gated DeltaNet models (qwen3_5, qwen3_5_moe) and Gemma 4 (dense and MoE) run on
        # the GPU: never refused by name
        assert not (name.startswith(("qwen3_5", "gemma4")) and "CPU backend only" in refused.stderr), refused.stderr
        if "CPU backend only" in refused.stderr:  # a family the CUDA backend refuses by name
            pytest.skip(f"the CUDA backend refuses {name} for now: {refused.stderr.strip()}")
        pytest.skip("no CUDA device here (or hearth built without nvcc): the CUDA forward pass did NOT run")
    ref = trace(hearth_bin, m, "cpu", {"HEARTH_CPU": "scalar"})
    gpu = trace(hearth_bin, m, "cuda", args=["--cuda-exact"])
    # every family runs, Gemma 4 dense and MoE included (per-layer head sizes, shared KV,
    # per-layer inputs, softcap): a refusal here is a failure, not a skip
    assert ref.returncode == 0 and gpu.returncode == 0, ref.stderr + gpu.stderr
    a, b = json.loads(ref.stdout), json.loads(gpu.stdout)
    assert [s["token"] for s in a["steps"]] == [s["token"] for s in b["steps"]]
    # f32 everywhere on both sides, only summation orders differ: 1e-3 is ~10x the largest
    # difference seen on the H200 (1e-4 on these models) and far below any indexing error.
    for x, y in zip(a["prompt"] + a["steps"], b["prompt"] + b["steps"]):
        assert x["top"][0][0] == y["top"][0][0] and abs(x["top"][0][1] - y["top"][0][1]) < 1e-3


# ---- device greedy in the real paths (serve's scheduler, generate) ----
# A step whose rows are all plain greedy (temperature 0, no logprobs / penalties / bias) on
# the GPU takes its ids from the device (engine_forward_rows_greedy / hearth_seq_append_
# greedy); the oracle is again the CPU reference tier, which samples on the host.
# The engine says once on stderr that the device chose ids, so a test cannot pass by the
# host path alone.
import sys  # noqa: E402
import threading  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import free_port, running  # noqa: E402

# gemma4: the device sampler reads the softcapped logits; its steps run eagerly (per-layer inputs)
GREEDY_MODELS = ["llama-f32", "qwen3-q4g64", "gemma3-bf16", "qwen3_5-f32", "gemma4-q4g64"]
PROMPTS = ["Tell me about the sea.", "Count from one to ten.", "What is a prime number?"]
DEVICE_NOTE = "greedy ids chosen on the device"


def post(base, body):
    r = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())


def chat(prompt, **extra):
    return dict({"model": "default_model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                 "temperature": 0}, **extra)


def serve_answers(hearth_bin, model, device, env, concurrent, extra=None, prompts=None, args=()):
    prompts = prompts or PROMPTS
    port = free_port()
    cmd = [str(hearth_bin), "serve", "--model", str(model), "--port", str(port), "--device", device, *args]
    with open(f"/tmp/hearth-serve-{port}.log", "w+b") as log:
        with running(cmd, port, log, dict(os.environ, **env), 120) as base:
            out = [None] * len(prompts)

            def ask(i):
                out[i] = post(base, chat(prompts[i], **(extra or {})))["choices"][0]["message"]["content"]
            if concurrent:  # several rows in one step: the scheduler's multi-row greedy path
                ts = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
                [t.start() for t in ts]
                [t.join() for t in ts]
            else:
                for i in range(len(prompts)):
                    ask(i)
        log.seek(0)
        return out, log.read().decode(errors="replace")


@pytest.mark.parametrize("name", GREEDY_MODELS)
def test_cuda_serve_device_greedy_matches_cpu(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the CUDA serve path did NOT run")
    ref, _ = serve_answers(hearth_bin, m, "cpu", {"HEARTH_CPU": "scalar"}, concurrent=False)
    gpu, log = serve_answers(hearth_bin, m, "cuda", {}, concurrent=True, args=["--cuda-exact"])
    assert DEVICE_NOTE in log, log[-2000:]
    assert gpu == ref
    # logprobs asked: the host sampler path on the same GPU, same greedy text, no device ids
    host, log2 = serve_answers(hearth_bin, m, "cuda", {}, concurrent=False, extra={"logprobs": True},
                               args=["--cuda-exact"])
    assert DEVICE_NOTE not in log2, log2[-2000:]
    assert host == ref


@pytest.mark.parametrize("name", GREEDY_MODELS[:2])
def test_cuda_generate_device_greedy_matches_cpu(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the CUDA generate path did NOT run")

    def gen(device, env, *args):
        return subprocess.run([str(hearth_bin), "generate", str(m), PROMPTS[0], "--max-tokens", "16", "--temp", "0",
                               "--device", device, *args], capture_output=True, text=True,
                              env=dict(os.environ, **env), timeout=120)
    ref = gen("cpu", {"HEARTH_CPU": "scalar"})
    gpu = gen("cuda", {}, "--cuda-exact")
    assert ref.returncode == 0 and gpu.returncode == 0, ref.stderr + gpu.stderr
    assert DEVICE_NOTE in gpu.stderr, gpu.stderr
    assert gpu.stdout == ref.stdout and ref.stdout.strip()
    # --host-sampler (engine option host_sampler): the same tokens, picked on the host
    host = gen("cuda", {}, "--cuda-exact", "--host-sampler")
    assert host.returncode == 0 and DEVICE_NOTE not in host.stderr, host.stderr
    assert host.stdout == ref.stdout


# ---- constrained rows: the token mask applied by the device sampler (cuda_sample.cu), made
# on the host while the step's forward pass runs; the CPU scalar tier's masked sampling is
# the oracle (exact tier: the same greedy tokens) ----
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                               "maximum": 99}}}
DEVICE_SAMPLE_NOTE = "tokens sampled on the device"


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-q4g64"])
def test_cuda_constrained_masks_on_device(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the CUDA constrained path did NOT run")
    extra = {"max_tokens": 40,
             "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}}
    ref, _ = serve_answers(hearth_bin, m, "cpu", {"HEARTH_CPU": "scalar"}, concurrent=False, extra=extra)
    gpu, log = serve_answers(hearth_bin, m, "cuda", {}, concurrent=True, extra=extra, args=["--cuda-exact"])
    assert DEVICE_SAMPLE_NOTE in log, log[-2000:]  # the masked rows went through the device sampler
    assert gpu == ref
    assert all(a.startswith("{") for a in gpu), gpu


# ---- ragged steps: 12 concurrent requests (decode rows of many sequences beside prefill
# chunks, T > 8: the split attention dispatch, cuBLAS matmuls, lm_head through the GEMM) ----
PROMPTS12 = PROMPTS + ["Name three rivers.", "Why is the sky blue?", "Write a haiku about rain.",
                       "What is two plus two?", "Describe a cat.", "List some colours.",
                       "Say hello in French.", "What do bees make?", "Spell the word house."]


# qwen3_5-f32: Gated DeltaNet layers with many sequences' tokens in one step (cuda_gdn_runs);
# gemma4-bf16: layers of their own shapes, shared KV, per-layer inputs in ragged steps
@pytest.mark.parametrize("name", ["llama-f32", "qwen3-q4g64", "qwen3_5-f32", "gemma4-bf16"])
def test_cuda_serve_12_concurrent_equal_alone(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the CUDA serve path did NOT run")
    env = {}
    # exact operands (--cuda-exact): only summation order may differ; all 12 in one step, prompts chunked
    args = ["--cuda-exact", "--max-sequences", "12", "--max-step-tokens", "64"]
    alone, _ = serve_answers(hearth_bin, m, "cuda", env, concurrent=False, prompts=PROMPTS12, args=args)
    together, _ = serve_answers(hearth_bin, m, "cuda", env, concurrent=True, prompts=PROMPTS12, args=args)
    assert together == alone


def test_cuda_exact_flag(hearth_bin, tiny_models, real_ggufs):
    """--cuda-exact (engine option cuda_exact) reaches the device plan: f32 GEMM staging
    (4 bytes an element, not bf16's 2) and no bf16 prefill-attention stage, so fit's device
    scratch differs by exactly what cuda_plan.c sizes; on the CPU it changes nothing."""
    m = tiny_models["llama-f32"]
    plain = trace(hearth_bin, m, "cpu")
    exact = trace(hearth_bin, m, "cpu", args=["--cuda-exact"])
    gen = [subprocess.run([str(hearth_bin), "generate", str(m), "Hello there", "--max-tokens", "8", "--temp", "0",
                           "--device", "cpu", *a], capture_output=True, text=True, timeout=120)
           for a in ((), ("--host-sampler",))]
    # --host-sampler is accepted by the engine verbs and changes nothing on the CPU
    assert gen[0].returncode == 0 and gen[1].returncode == 0, gen[0].stderr + gen[1].stderr
    assert gen[0].stdout == gen[1].stdout and gen[0].stdout.strip()
    assert plain.returncode == 0 and exact.returncode == 0, plain.stderr + exact.stderr
    assert plain.stdout == exact.stdout

    def scratch(*extra):
        p = subprocess.run([str(hearth_bin), "fit", str(real_ggufs["smollm2"]), "--device", "cuda", "--sku", "h200",
                            "--ctx", "4096", "--max-step-tokens", "2048", "--json", *extra],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["scratch_bytes"]
    assert scratch("--cuda-exact") > scratch()


# ---- --expert-offload N: expert weights in pinned host memory, a device pool of N slots ----
# Bit-identical to the resident run (same kernels, same bytes; only where they live
# changes): trace's logits compared exactly, serve's greedy answers with 3 concurrent
# requests (ragged steps) equal. 3 slots: misses and slot reuse inside every step; 64: the
# experts stay across steps.
OFFLOAD_MODELS = ["qwen3_moe-q4g64", "gemma4_moe-q4g64", "qwen3_5_moe-q4g64", "qwen3_moe-f32"]


@pytest.mark.parametrize("name", OFFLOAD_MODELS)
def test_cuda_expert_offload_trace_identical(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): --expert-offload on the GPU did NOT run")
    resident = trace(hearth_bin, m, "cuda", args=["--cuda-exact"])
    assert resident.returncode == 0, resident.stderr
    for slots in ("3", "64"):
        off = trace(hearth_bin, m, "cuda", args=["--cuda-exact", "--expert-offload", slots])
        assert off.returncode == 0, off.stderr
        assert f"{slots} device slots" in off.stderr, off.stderr
        assert json.loads(off.stdout) == json.loads(resident.stdout), slots


@pytest.mark.parametrize("name", OFFLOAD_MODELS[:2])
def test_cuda_expert_offload_serve_matches_resident(hearth_bin, tiny_models, name):
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): --expert-offload on the GPU did NOT run")
    resident, _ = serve_answers(hearth_bin, m, "cuda", {}, concurrent=True, args=["--cuda-exact"])
    off, log = serve_answers(hearth_bin, m, "cuda", {}, concurrent=True,
                             args=["--cuda-exact", "--expert-offload", "3"])
    assert "experts offloaded" in log, log[-2000:]
    assert off == resident


# ---- saved KV files on the GPU (engine/seq_file.c through the device pools) ----
@pytest.mark.parametrize("name", ["llama-f32", "qwen3_5-f32", "gemma4-q4g64"])
def test_cuda_prompt_cache_file(hearth_bin, tiny_models, name, tmp_path):
    """generate --prompt-cache-file --device cuda: the first run writes the file, the second
    loads the prompt's prefix from it (a hybrid's state cannot be cut to a prefix: none), both
    with the text of a run without the file; the CPU (scalar tier) loads the GPU's file and
    gives its own reference text."""
    m = tiny_models[name]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): saved KV files on the GPU did NOT run")
    cache = tmp_path / "p.hkv"

    def gen(device, env, *args):
        r = subprocess.run([str(hearth_bin), "generate", str(m), PROMPTS[0], "--max-tokens", "16", "--temp", "0",
                            "--device", device, *args], capture_output=True, text=True,
                           env=dict(os.environ, **env), timeout=120)
        assert r.returncode == 0, r.stderr
        return r
    plain = gen("cuda", {}, "--cuda-exact")
    first = gen("cuda", {}, "--cuda-exact", "--prompt-cache-file", str(cache))
    assert cache.exists() and first.stdout == plain.stdout
    second = gen("cuda", {}, "--cuda-exact", "--prompt-cache-file", str(cache))
    assert second.stdout == plain.stdout
    loaded = int(second.stderr.split("prompt cache: ")[1].split()[0])
    assert loaded == 0 if name.startswith("qwen3_5") else loaded > 0, second.stderr
    ref = gen("cpu", {"HEARTH_CPU": "scalar"})
    cpu = gen("cpu", {"HEARTH_CPU": "scalar"}, "--prompt-cache-file", str(cache))
    assert "prompt cache: " in cpu.stderr and cpu.stdout == ref.stdout


def test_cuda_serve_prompt_cache_dir(hearth_bin, tiny_models, tmp_path):
    """serve --prompt-cache-dir --device cuda: the first server saves its requests' KV when it
    stops, a second one loads the files at start and answers the same."""
    m = tiny_models["llama-f32"]
    if not has_gpu(hearth_bin, m):
        pytest.skip("no CUDA device here (or hearth built without nvcc): --prompt-cache-dir on the GPU did NOT run")
    args = ["--cuda-exact", "--prompt-cache-dir", str(tmp_path / "pc")]
    first, _ = serve_answers(hearth_bin, m, "cuda", {}, concurrent=False, args=args)
    assert any(f.endswith(".hkv") for f in os.listdir(tmp_path / "pc"))
    again, log = serve_answers(hearth_bin, m, "cuda", {}, concurrent=False, args=args)
    assert again == first
    loaded = log.split("prompt cache ")[1]
    assert "files" in loaded and not loaded.split(":")[1].strip().startswith("0 files"), log[-2000:]
