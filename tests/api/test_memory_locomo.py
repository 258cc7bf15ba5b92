"""LoCoMo retrieval through `hearth memory` (one conversation, BM25 only so it runs in
seconds): the conversation is imported as a ChatGPT export, every question is asked over
MCP, and recall@5 of the evidence dialogue ids must beat Okapi BM25 over the raw turns
measured in the same run (bench/memory/locomo_recall.py is the full benchmark, with the
all-MiniLM-L6-v2 hybrid). The data set is found at test time ($HEARTH_SHARED_DATA, else
shared/data beside the checkout's parent); without it the test skips."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hearth_process import isolate_cache, need  # noqa: E402

isolate_cache()
REPO = Path(__file__).resolve().parent.parent.parent
BIN = Path(os.environ.get("HEARTH_BIN", REPO / "bin" / "hearth"))


def bench():
    spec = importlib.util.spec_from_file_location("locomo_recall", REPO / "bench" / "memory" / "locomo_recall.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_locomo_recall_beats_bm25_over_raw_turns():
    need(BIN, "hearth binary", "run make (or set HEARTH_BIN)")
    b = bench()
    if not (b.shared_data() / "locomo-dev.tar.xz").exists():
        pytest.skip(f"no {b.shared_data() / 'locomo-dev.tar.xz'} (set HEARTH_SHARED_DATA)")
    hits, timing = b.run(str(BIN), None, 1)
    recall = {name: 100 * sum(sum(v) for v in h.values()) / sum(len(v) for v in h.values()) for name, h in hits.items()}
    assert timing["questions"] > 150
    print(f"recall@5: hearth {recall['hearth']:.1f}, bm25 {recall['bm25']:.1f}")
    assert recall["hearth"] >= recall["bm25"] + 3, recall
