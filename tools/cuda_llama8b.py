"""cuda_llama8b.py: on the GPU machine (PyTorch + transformers there), makes a random-weight
model with the exact shapes of Llama-3.1-8B in bf16 (safetensors via save_pretrained), and
checks hearth's logits and greedy tokens on it against HF transformers run in float32 on
the same bf16 weights (an exact upcast, so the reference carries no bf16 activation
rounding; TF32 off).

  make  OUT_DIR TOKENIZER_DIR      writes the model (tokenizer files copied from a tiny model:
                                   ids are given directly, the text side is never used)
  make1b OUT_DIR TOKENIZER_DIR     the same with Llama-3.2-1B's shapes (tied embeddings): the
                                   8B model's draft for speculative decoding (same tokenizer)
  ref   OUT_DIR IDS_JSON STEPS     prints {"last": [[id, logit]...top 64], "steps": [ids]} as JSON
  compare REF_JSON HEARTH_TRACE_JSON   prints the max |logit| difference and greedy agreement
"""
import json
import os
import shutil
import sys


SHAPE_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128, rope_factor=8.0,
                tie_word_embeddings=False)
SHAPE_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64, rope_factor=32.0,
                tie_word_embeddings=True)


def make(out, tok_dir, shape=SHAPE_8B):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sh = dict(shape)
    factor = sh.pop("rope_factor")
    cfg = LlamaConfig(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                      rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16", **sh)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)  # HF init: normal(0, 0.02) matrices, unit norms
    model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
    # transformers 5 writes RoPE settings as "rope_parameters", which hearth's config reader
    # does not know yet; both read the classic keys, so the check compares the same model.
    path = os.path.join(out, "config.json")
    c = json.load(open(path))
    if "rope_parameters" in c:
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = rp
        json.dump(c, open(path, "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(tok_dir, f)):  # the chat template, where it is its own file
            shutil.copy(os.path.join(tok_dir, f), out)


def ref(out, ids_json, steps):
    import torch
    from transformers import LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32, device_map="cuda").eval()
    ids = torch.tensor([json.loads(ids_json)], device="cuda")
    res = {}
    with torch.no_grad():
        o = model(input_ids=ids, use_cache=True)
        last = o.logits[0, -1]
        v, i = torch.topk(last, 64)
        res["last"] = [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]
        res["last_full"] = last.tolist()
        past, toks = o.past_key_values, []
        nxt = int(last.argmax())
        for _ in range(steps):
            toks.append(nxt)
            o = model(input_ids=torch.tensor([[nxt]], device="cuda"), past_key_values=past, use_cache=True)
            past = o.past_key_values
            nxt = int(o.logits[0, -1].argmax())
    res["steps"] = toks
    print(json.dumps(res))


def compare(ref_path, trace_path):
    r = json.load(open(ref_path))
    t = json.load(open(trace_path))
    full = r["last_full"]
    top = t["prompt"][-1]["top"]  # hearth's top-k of the last prompt position: [id, logit]
    diff = max(abs(full[i] - v) for i, v in top)
    std = (sum(x * x for x in full) / len(full)) ** 0.5
    hs = [s["token"] for s in t["steps"]]
    n = min(len(hs), len(r["steps"]))
    agree = next((k for k in range(n) if hs[k] != r["steps"][k]), n)
    print(json.dumps({"max_abs_logit_diff_top": diff, "logit_rms": std, "greedy_agree_prefix": agree,
                      "greedy_steps": n, "identical": agree == n and n > 0,
                      "top1_equal": top[0][0] == r["last"][0][0]}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    elif cmd == "make1b":
        make(sys.argv[2], sys.argv[3], SHAPE_1B)
    elif cmd == "ref":
        ref(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        compare(sys.argv[2], sys.argv[3])
