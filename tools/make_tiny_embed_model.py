#!/usr/bin/env python3
"""make_tiny_embed_model.py: builds a tiny random-weight decoder embedding model in the
layout of the real Qwen3-Embedding repos into $HEARTH_CACHE/tiny-embed/qwen3-embed-f32/:

- config.json of a Qwen3 decoder (architectures Qwen3ForCausalLM, tied embeddings);
- model.safetensors holding the bare base model (embed_tokens.weight, layers.N...., norm.weight:
  no "model." prefix, no lm_head), as Qwen3-Embedding checkpoints are saved;
- sentence-transformers files: modules.json (Transformer, Pooling, Normalize),
  1_Pooling/config.json with pooling_mode_lasttoken, sentence_bert_config.json;
- a tokenizer whose post-processor appends <|endoftext|>, the token whose final hidden
  state Qwen3-Embedding pools.

Not under tiny/: the suites that run every tiny/* model through mlx_lm.load (which expects
"model."-prefixed weights) would trip on this layout. Weights come from make_tiny_models.py's
qwen3 builder (same shapes and rescaling, its own seed)."""
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_models as tiny  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from tokenizers import processors  # noqa: E402


def main():
    cache = Path(os.environ.get("HEARTH_CACHE", Path.home() / ".cache" / "hearth"))
    out = cache / "tiny-embed" / "qwen3-embed-f32"
    spec = tiny.family_specs()["qwen3"]
    config = json.loads(json.dumps(spec["config"]))
    config.update({"tie_word_embeddings": True, "torch_dtype": "float32"})
    model = tiny.build_model("qwen3-embed", config, tiny.INIT["qwen3"])
    weights = dict(tree_flatten(model.model.parameters()))  # the bare Qwen3Model
    tok = spec["tokenizer"]
    eot = "<|endoftext|>"
    tok.post_processor = processors.TemplateProcessing(single=f"$A:0 {eot}:0", pair=f"$A:0 {eot}:0 $B:1 {eot}:1",
                                                       special_tokens=[(eot, tok.token_to_id(eot))])
    if out.exists():
        shutil.rmtree(out)
    (out / "1_Pooling").mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {k: v for k, v in spec["tokenizer_config"].items() if k != "chat_template"}
    tok_cfg.update({"eos_token": eot, "padding_side": "left"})
    files = {
        "config.json": config,
        "tokenizer_config.json": tok_cfg,
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
        "1_Pooling/config.json": {"word_embedding_dimension": config["hidden_size"],
                                  "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
                                  "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
                                  "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True,
                                  "include_prompt": True},
        "sentence_bert_config.json": {"max_seq_length": 1024, "do_lower_case": False},
        "config_sentence_transformers.json": {"prompts": {"query": "Instruct: Given a query, retrieve passages\nQuery:",
                                                          "document": ""}, "default_prompt_name": None},
    }
    for name, obj in files.items():
        (out / name).write_text(json.dumps(obj, indent=2))
    print(f"{out}: {sum(v.size for v in weights.values())} parameters")


if __name__ == "__main__":
    main()
