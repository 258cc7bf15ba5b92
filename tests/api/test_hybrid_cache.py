"""Prefix caching on a hybrid model through the chat API: the second turn of a conversation on
the tiny Qwen3.5 (Gated DeltaNet layers, whose recurrent state sums up the whole prefix)
reuses the first turn's prompt and answer (src/kv/kv_state.h: the state kept at block
boundaries) and answers exactly as a server with nothing cached.

Oracles: the shared prefix comes from HF transformers' chat template + tokenizer (the first
turn's prompt tokens followed by its answer tokens, against the second turn's prompt tokens);
the answers from fresh servers (nothing cached). HEARTH_CPU=scalar: bit-identical logprobs.
The answer is held to one word token by logit_bias, so that which of its tokens the
re-rendered history repeats is known.

On the GPU (--device cuda, skipped with the reason where there is none) the same, with the
snapshots kept and loaded on the device (op_table.state_copy) and --deterministic, so the
cached and the fresh server's steps give the same bits whatever their batch shapes.
"""
import pytest

from conftest import TINY, expected_cached, hf_tokenizer, need, prompt_ids, server
from test_cuda_deterministic import gpu_present
from test_prefix_cache import SCALAR, answer, cached, chat, wait_idle

MODEL = TINY / "qwen3_5-f32"
SYSTEM = " ".join(f"note {i}: the hybrid model keeps a state per sequence." for i in range(20))


@pytest.fixture(scope="module")
def tok():
    need(MODEL, "tiny qwen3_5 model", "run tools/make_tiny_models.py")
    return hf_tokenizer(MODEL)


DEVICES = {"cpu": ((), SCALAR), "cuda": (("--device", "cuda", "--deterministic"), {})}


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_second_chat_turn_reuses_prompt_and_answer(tok, device):
    args, env = DEVICES[device]
    if device == "cuda" and not gpu_present(MODEL):
        pytest.skip("no CUDA device here (or hearth built without nvcc): the GPU hybrid prefix cache did NOT run")
    word = tok.convert_tokens_to_ids("Ġthe")
    assert isinstance(word, int) and tok.decode([word] * 3) == " the the the"
    bias = {str(word): 100}
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say something."}]
    n_answer = 48
    with server(MODEL, "--ctx", "2048", *args, env=env) as base:
        first = chat(base, turn1, n_answer, logit_bias=bias)
        text = first["choices"][0]["message"]["content"]
        assert cached(first) == 0 and first["usage"]["completion_tokens"] == n_answer
        turn2 = turn1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "And more?"}]
        ids1, ids2 = prompt_ids(tok, turn1), prompt_ids(tok, turn2)
        generated = [word] * n_answer  # what logit_bias forced (its text: the content, less its leading space)
        assert tok.decode(generated).strip() == text.strip()
        # the first turn computed its prompt and fed back all but its last answer token
        shared = expected_cached(ids1 + generated[:-1], ids2)
        # kept states: the first prompt's last block boundary and the last one its decode passed
        kept = [n for n in (len(ids1) // 16 * 16, (len(ids1) + n_answer - 1) // 16 * 16) if n <= shared]
        second = chat(base, turn2, 24, logit_bias=bias | {str(word): 0})
        got = cached(second)
        print(f"second turn: {got} of {shared} shared tokens from the cache ({100 * got / shared:.0f}%)")
        assert got == max(kept)
        assert got >= 0.9 * shared
        wait_idle(base)
    with server(MODEL, "--ctx", "2048", *args, env=env) as fresh:
        alone = chat(fresh, turn2, 24, logit_bias=bias | {str(word): 0})
        assert cached(alone) == 0
    assert answer(second) == answer(alone)
