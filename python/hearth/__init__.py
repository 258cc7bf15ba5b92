"""hearth: a local LLM runtime in C, from Python.

    import hearth
    model = hearth.Model.open("smollm2")
    engine = hearth.Engine(model, ctx=4096)
    print(engine.generate([{"role": "user", "content": "Hi!"}], max_tokens=32))
    for piece in engine.stream("Once upon a time", max_tokens=64, chat_template=False):
        print(piece, end="", flush=True)

The types wrap libhearth (include/hearth.h) through a C extension; every computing call
releases the GIL. docs/python.md describes the whole API.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Union

from . import _hearth

__version__ = _hearth.VERSION
API_VERSION = _hearth.API_VERSION
Error = _hearth.Error



def _error(message: str, status: str) -> Error:
    e = Error(message)
    e.status = status
    return e


Message = Dict[str, Any]
Prompt = Union[str, Sequence[int], Sequence[Message]]

_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "seed", "stop", "ignore_eos")


class Model:
    """An open model: tokenizer, chat template and weights index (no weights loaded for
    compute until an Engine is made from it)."""

    def __init__(self, name: str):
        self._m = _hearth.Model(name)

    @classmethod
    def open(cls, name: str) -> "Model":
        """A model folder, a .gguf file, an HF-cache repo id or an unambiguous part of a
        known model's name (as `hearth ls` shows them)."""
        return cls(name)

    @property
    def path(self) -> str:
        return self._m.path

    @property
    def vocab_size(self) -> int:
        return self._m.vocab_size

    @property
    def is_embedding(self) -> bool:
        return self._m.is_embedding

    def info(self) -> Dict[str, Any]:
        return json.loads(self._m.info_json())

    def tokenize(self, text: str, add_special: bool = False) -> List[int]:
        return self._m.tokenize(text, add_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._m.detokenize(list(ids), skip_special)

    def chat_template(self, messages: Sequence[Message], tools: Optional[Sequence[Dict[str, Any]]] = None,
                      add_generation_prompt: bool = True, **template_args: Any) -> str:
        """The model's chat template rendered over OpenAI-style messages (and tools);
        template_args are extra template variables, e.g. enable_thinking=False."""
        return self._m.render(json.dumps(list(messages)), json.dumps(list(tools)) if tools is not None else None,
                              add_generation_prompt, json.dumps(template_args) if template_args else None)

    def prompt_ids(self, prompt: Prompt, chat_template: bool = True, system: Optional[str] = None) -> List[int]:
        """Token ids the way `hearth generate` makes them: a string goes through the chat
        template as one user turn (after `system`), unless chat_template is False (then it
        is tokenized with the tokenizer's special tokens); a list of messages through the
        template; a list of ints is taken as it is."""
        if isinstance(prompt, str):
            if not chat_template:
                return self.tokenize(prompt, add_special=True)
            msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
                [{"role": "user", "content": prompt}]
            return self.tokenize(self.chat_template(msgs))
        items = list(prompt)
        if all(isinstance(x, int) for x in items):
            return items
        return self.tokenize(self.chat_template(items))

    def close(self) -> None:
        self._m.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Result(str):
    """Generated text (a str) with .info: finish_reason, prompt_tokens, completion_tokens,
    cached_tokens and timings."""
    info: Dict[str, Any]

    def __new__(cls, text: str, info: Dict[str, Any]) -> "Result":
        r = super().__new__(cls, text)
        r.info = info
        return r


class Stream:
    """The pieces of text of one generation as they are produced: iterate it (`for` or
    `async for`). Generation runs on a worker thread; leaving the loop early (break,
    an exception, close()) cancels it at the next token."""

    def __init__(self, run):
        self._run = run
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._cancel = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._aq: Optional[asyncio.Queue] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.info: Optional[Dict[str, Any]] = None

    def _put(self, item: Any) -> None:
        if self._aq is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._aq.put_nowait, item)
        else:
            self._q.put(item)

    def _start(self) -> None:
        def on_token(piece: str) -> bool:
            self._put(("piece", piece))
            return self._cancel.is_set()

        def work() -> None:
            try:
                self._put(("end", self._run(on_token)))
            except BaseException as e:  # handed to the consumer
                self._put(("error", e))

        self._thread = threading.Thread(target=work, name="hearth-stream", daemon=True)
        self._thread.start()

    def _take(self, item: Any) -> str:
        kind, value = item
        if kind == "piece":
            return value
        self._thread.join()
        if kind == "error":
            raise value
        self.info = value.info
        raise StopIteration

    def __iter__(self) -> Iterator[str]:
        if self._thread is None:
            self._start()
        try:
            while True:
                try:
                    yield self._take(self._q.get())
                except StopIteration:
                    return
        finally:
            self.close()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._agen()

    async def _agen(self) -> AsyncIterator[str]:
        self._loop = asyncio.get_running_loop()
        self._aq = asyncio.Queue()
        if self._thread is None:
            self._start()
        try:
            while True:
                item = await self._aq.get()
                try:
                    piece = self._take(item)
                except StopIteration:
                    return
                yield piece
        finally:
            self._cancel.set()
            if self._thread is not None and self._thread.is_alive():
                await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def close(self) -> None:
        """Cancels the generation (if still running) and waits for the worker to stop."""
        self._cancel.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


class Engine:
    """Weights loaded for compute, the KV pool and scratch memory, allocated once.
    Options are `hearth.h`'s hearth_engine_options: threads (0: all cores), ctx (0: the
    model's own limit, cut to fit memory), max_sequences (sequences at once: batch() runs
    that many together), kv_quant ("none", "int8"; "fp8"/"f16" on the GPU), device ("cpu",
    "cuda", "auto"), deterministic (batch-invariant numerics), cuda_exact (on the GPU: f32
    prefill GEMMs and attention, `--cuda-exact`), kv_budget (bytes of KV pool),
    max_step_tokens. An embedding model gets an embedder instead: only embed()
    works. One call at a time per engine (a lock serialises them)."""

    def __init__(self, model: Model, *, device: str = "cpu", ctx: int = 0, kv_quant: str = "none", threads: int = 0,
                 max_sequences: int = 1, deterministic: bool = False, kv_budget: Optional[float] = None,
                 max_step_tokens: int = 0, cuda_exact: bool = False):
        self.model = model
        self._lock = threading.Lock()
        self._session: Optional[str] = None
        if model.is_embedding:
            self._e = None
            self._emb = _hearth.Embedder(model._m, threads)
        else:
            self._emb = None
            self._e = _hearth.Engine(model._m, device=device, ctx=ctx, kv_quant=kv_quant, threads=threads,
                                     max_sequences=max_sequences, deterministic=int(deterministic),
                                     kv_budget=kv_budget, max_step_tokens=max_step_tokens,
                                     cuda_exact=int(cuda_exact))

    @property
    def context_length(self) -> int:
        return self._gen().context_length

    def _gen(self):
        if self._e is None:
            raise _error("this is an embedding model: it cannot generate text; use embed()", "unsupported")
        return self._e

    @staticmethod
    def _split(kw: Dict[str, Any]) -> Dict[str, Any]:
        bad = [k for k in kw if k not in _SAMPLING]
        if bad:
            raise TypeError(f"unknown sampling argument(s): {', '.join(bad)}")
        return kw

    def _ids(self, prompt: Prompt, chat_template: bool, system: Optional[str]) -> List[int]:
        return self.model.prompt_ids(prompt, chat_template, system)

    def generate(self, prompt: Prompt, *, chat_template: bool = True, system: Optional[str] = None,
                 prompt_cache_file: Optional[str] = None, **sampling: Any) -> Result:
        """The whole answer. sampling: max_tokens (256), temperature, top_p, top_k, min_p,
        repetition_penalty, presence_penalty, frequency_penalty, seed, stop (strings),
        ignore_eos; unset ones take the model's defaults (mlx-lm's, overridden by its
        generation_config.json), as `hearth generate` does. prompt_cache_file: as
        `hearth generate --prompt-cache-file` (defaults to the loaded session)."""
        gen = self._gen()
        ids = self._ids(prompt, chat_template, system)
        params = self._split(sampling)
        with self._lock:
            text, info = gen.generate(ids, params, None, prompt_cache_file or self._session)
        return Result(text, info)

    def stream(self, prompt: Prompt, *, chat_template: bool = True, system: Optional[str] = None,
               prompt_cache_file: Optional[str] = None, **sampling: Any) -> Stream:
        """generate()'s text piece by piece: `for piece in engine.stream(...)` or
        `async for piece in engine.stream(...)`; stream.info after the end."""
        gen = self._gen()
        ids = self._ids(prompt, chat_template, system)
        params = self._split(sampling)
        cache = prompt_cache_file or self._session

        def run(on_token):
            with self._lock:
                text, info = gen.generate(ids, params, on_token, cache)
            return Result(text, info)

        return Stream(run)

    def batch(self, prompts: Sequence[Prompt], *, chat_template: bool = True, system: Optional[str] = None,
              **sampling: Any) -> List[Result]:
        """Every prompt's answer, generated together by continuous batching (up to the
        engine's max_sequences at once, the rest waiting their turn)."""
        gen = self._gen()
        ids = [self._ids(p, chat_template, system) for p in prompts]
        params = self._split(sampling)
        with self._lock:
            out = gen.batch(ids, params)
        return [Result(t, i) for t, i in out]

    def embed(self, texts: Union[str, Sequence[str]], truncate: bool = False) -> List[List[float]]:
        """One vector per text (an embedding model's pooling and normalization)."""
        if self._emb is None:
            raise _error("embed() needs an embedding model (e.g. all-MiniLM-L6-v2)", "unsupported")
        one = isinstance(texts, str)
        with self._lock:
            vecs = self._emb.embed([texts] if one else list(texts), truncate)
        return vecs

    def save_session(self, path: str, prompt: Prompt, *, chat_template: bool = True,
                     system: Optional[str] = None) -> int:
        """Prefills prompt and saves its KV to path (a saved KV file, docs/cli.md); returns
        the tokens saved. Later generate()/stream() calls given this file (or after
        load_session) prefill only what follows the saved prefix."""
        ids = self._ids(prompt, chat_template, system)
        with self._lock:
            self._gen().save_session(path, ids)
        return len(ids)

    def load_session(self, path: Optional[str]) -> int:
        """Checks path whole (version, checksums, this model, this KV format) and makes it
        the prompt cache file of later generate()/stream() calls (which also write their
        conversation back to it); None forgets it. Returns the tokens the file holds."""
        if path is None:
            self._session = None
            return 0
        with self._lock:
            n = self._gen().check_session(path)
        self._session = path
        return n

    def close(self) -> None:
        if self._e is not None:
            self._e.close()
        if self._emb is not None:
            self._emb.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def fit(model: Union[Model, str], *, ctx: int = 0, max_sequences: int = 1, kv_quant: str = "none",
        device: str = "cpu", threads: int = 0, kv_budget: Optional[float] = None) -> Dict[str, Any]:
    """hearth fit: the memory an Engine with these options would take, whether it fits this
    machine, the largest context that would, and the predicted decode speed (a dict; see
    docs/cli.md, `hearth fit`)."""
    m = Model.open(model) if isinstance(model, str) else model
    return json.loads(_hearth.fit(m._m, ctx=ctx, max_sequences=max_sequences, kv_quant=kv_quant, device=device,
                                  threads=threads, kv_budget=kv_budget))


__all__ = ["Model", "Engine", "Stream", "Result", "Error", "fit", "API_VERSION", "__version__"]
