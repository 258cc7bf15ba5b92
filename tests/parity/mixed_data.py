"""Real-model material for the mixed-precision checks (bench/convert_mixed/run.py and
test_convert_mixed_real.py): SmolLM2-135M-Instruct and Gemma 3 270M as float folders and
LoCoMo dialogue as calibration / held-out text.

The float reference is the real GGUF (tools/get_models.sh) dequantized to float32
(bench/train/smollm2_folder.py, cached in $HEARTH_CACHE/bench/smollm2-135m-f32); the input
that gets quantized is the same weights in float16 (exact for these dequantized values, so
the quantizers see what the reference computes, and scales/biases are 16-bit as in
mlx-community models: uniform 4-bit at group 64 is 4.5 bits per weight). Gemma 3 270M's
Q4_K_M GGUF is dequantized by the gguf package (tools/make_goldens.py's reader: HF names,
Gemma's norms back from 1 + w); its float16 copy rounds the Q8_0 / Q5_0 / K-quant values
that float16 cannot hold (a relative error under 2^-11). Calibration text is
LoCoMo conversations 26, 30 and 41, held-out text conversations 42, 43 and 44 (one row per
session, "Speaker: text" lines), found as the other tests find the shared data."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HEARTH_CACHE", os.path.expanduser("~/.cache/hearth")))
SMOL_GGUF = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_GGUF = CACHE / "models" / "gemma-3-270m-q4_k_m.gguf"
CALIBRATION, HELD_OUT = ("26", "30", "41"), ("42", "43", "44")


def shared_data():
    """The public data sets' folder, found as the MaskBench bench and tests find it."""
    sys.path.insert(0, str(REPO / "bench" / "maskbench"))
    import maskbench
    return Path(maskbench.shared_data())


def missing():
    """Why the real-model material cannot be made here, or None."""
    for gguf in (SMOL_GGUF, GEMMA_GGUF):
        if not gguf.exists():
            return f"{gguf} missing: run tools/get_models.sh"
    if not (shared_data() / "locomo-dev.tar.xz").exists():
        return f"{shared_data() / 'locomo-dev.tar.xz'} not found (set HEARTH_SHARED_DATA to the shared data folder)"
    return None


def write_text(dst):
    """dst/calib.jsonl and dst/held.jsonl from LoCoMo; returns their paths."""
    dst = Path(dst)
    with tarfile.open(shared_data() / "locomo-dev.tar.xz") as t:
        t.extractall(dst / "locomo", filter="data")
    out = []
    for name, convs in (("calib.jsonl", CALIBRATION), ("held.jsonl", HELD_OUT)):
        rows = []
        for c in convs:
            conv = json.load(open(next((dst / "locomo").rglob(f"{c}.json"))))
            n = 1
            while f"session_{n}" in conv or f"session_{n}_date_time" in conv:
                turns = conv.get(f"session_{n}")
                if isinstance(turns, list) and turns:
                    rows.append({"text": "\n".join(f"{t['speaker']}: {t['text']}" for t in turns)})
                n += 1
        (dst / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        out.append(dst / name)
    return out


def smol_folders():
    """(float32 reference folder, float16 input folder), made once into $HEARTH_CACHE/bench.
    Under a lock, each folder written whole under another name and then renamed: two pytest-
    xdist workers (test_convert_mixed_real, test_perplexity_llamacpp) may ask at once, and
    the second waits for the first's folders instead of making its own copy beside it, or
    taking a folder whose weights are written but not yet its config and tokenizer."""
    import fcntl

    ref, f16 = CACHE / "bench" / "smollm2-135m-f32", CACHE / "bench" / "smollm2-135m-f16"
    ref.parent.mkdir(parents=True, exist_ok=True)
    with open(ref.parent / "smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (ref / "model.safetensors").exists():
            part = Path(str(ref) + ".part")
            subprocess.run([sys.executable, str(REPO / "bench" / "train" / "smollm2_folder.py"), str(SMOL_GGUF),
                            str(part)], check=True, capture_output=True)
            shutil.rmtree(ref, ignore_errors=True)  # an unfinished folder of an older kind
            os.replace(part, ref)
        f16_copy(ref, f16)
    return ref, f16


def f16_copy(ref, f16):
    """f16: the float32 folder ref with every tensor in float16 (made once)."""
    if not (f16 / "model.safetensors").exists():
        import mlx.core as mx

        tmp = Path(str(f16) + ".part")
        tmp.mkdir(parents=True, exist_ok=True)
        for f in ref.iterdir():
            if f.name == "config.json":
                cfg = json.load(open(f))
                cfg["torch_dtype"] = "float16"
                json.dump(cfg, open(tmp / f.name, "w"), indent=2)
            elif f.name != "model.safetensors":
                (tmp / f.name).write_bytes(f.read_bytes())
        w = mx.load(str(ref / "model.safetensors"))
        mx.save_safetensors(str(tmp / "model.safetensors"), {k: v.astype(mx.float16) for k, v in w.items()},
                            metadata={"format": "mlx"})
        os.replace(tmp, f16)


def gemma_folders():
    """(float32 reference folder, float16 input folder) of Gemma 3 270M, made once into
    $HEARTH_CACHE/bench: weights dequantized by the gguf package, config from the GGUF (what
    it lacks: Gemma 3 270M's config.json values), tokenizer converted from the GGUF by
    transformers."""
    ref, f16 = CACHE / "bench" / "gemma3-270m-f32", CACHE / "bench" / "gemma3-270m-f16"
    if not (ref / "model.safetensors").exists():
        import mlx.core as mx
        from gguf import GGUFReader

        sys.path.insert(0, str(REPO / "tools"))
        import make_goldens

        reader = GGUFReader(str(GEMMA_GGUF))
        cfg = make_goldens.gguf_config(reader, "gemma3")
        g = lambda k: make_goldens.gguf_field(reader, k)  # noqa: E731
        cfg.update(architectures=["Gemma3ForCausalLM"], tie_word_embeddings=True,
                   hidden_activation="gelu_pytorch_tanh", torch_dtype="float32",
                   bos_token_id=int(g("tokenizer.ggml.bos_token_id")), eos_token_id=int(g("tokenizer.ggml.eos_token_id")),
                   pad_token_id=int(g("tokenizer.ggml.padding_token_id")))
        w = make_goldens.gguf_weights(reader, "gemma3", cfg)
        tmp = Path(str(ref) + ".part")
        tmp.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(tmp / "model.safetensors"), w, metadata={"format": "mlx"})
        json.dump(cfg, open(tmp / "config.json", "w"), indent=2)
        gguf_tokenizer(GEMMA_GGUF).save_pretrained(str(tmp))
        os.replace(tmp, ref)
    f16_copy(ref, f16)
    return ref, f16


def gguf_tokenizer(gguf):
    """transformers' tokenizer converted from a GGUF vocabulary; its GGUF reader imports torch
    only for tensor dtypes, which tokenizer conversion never touches, so a placeholder module
    stands in when torch is absent. conftest.py's hf_tokenizer (the tokenizer oracle) converts
    with it too."""
    import importlib.machinery
    import types

    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            stub = types.ModuleType("torch")
            stub.__spec__ = importlib.machinery.ModuleSpec("torch", None)
            stub.__getattr__ = lambda name: object()
            sys.modules["torch"] = stub
    import transformers.modeling_gguf_pytorch_utils as mg
    from transformers import AutoTokenizer

    mg.is_torch_available = lambda: True
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
