"""The Python API.

    from pydflash import api
    with api.load("target.gguf", "drafter.gguf") as llm:
        out = llm.generate("def fib(n):", max_tokens=64)
        print(out.text, out.stats.mean_accept_len)

``load(target)`` without a drafter gives plain greedy decoding through the same engine (the losslessness oracle).

Keyword arguments are ``Request``'s: ``temperature`` (0 = greedy), ``top_k``, ``top_p``, ``seed`` and
``sampling_mode`` ("rejection", the default, or "match"; see ``Request`` for what each keeps and what a seed
promises), e.g. ``llm.generate(prompt, temperature=0.7, top_p=0.9, seed=1)``. The sampling controls are
``Request``'s too, with speculation on: ``logit_bias``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
``repeat_penalty`` / ``repeat_last_n``, and constrained output with ``grammar`` (GBNF) or ``json_schema``, e.g.
``llm.generate(prompt, json_schema={"type": "object", ...})`` (docs/sampling.md).

An ``LLM`` is thread-safe: one lock serialises every call into the engine, and whichever caller steps the engine
files each event under its request, so several threads may generate or stream on one ``LLM`` at once (their
requests share the engine's slots). After ``close()`` (or the ``with`` block) every call raises ``EngineClosed``.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Iterable, Iterator, Optional

from .cache.config import CacheConfig
from .config import EngineConfig
from .engine.engine import Engine
from .engine.request import Event, Request, Result
from .errors import EngineClosed, RequestCancelled
from .pair import PathLike, load_pair


class LLM:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.RLock()
        self._inbox: dict[int, deque[Event]] = {}  # request id -> events not yet taken by its caller
        self._closed = False

    # --- generation -----------------------------------------------------------------------------------
    def generate(self, prompt, **kw) -> Result:
        return self.generate_many([Request(prompt, **kw)])[0]

    def generate_many(self, requests: Iterable[Request]) -> list[Result]:
        """Results in request order. Every request is validated before any is queued."""
        reqs = list(requests)
        self._submit(reqs)
        results: dict[int, Result] = {}
        try:
            while len(results) < len(reqs):
                for ev in self._next_events([r.id for r in reqs if r.id not in results]):
                    if ev.finished:
                        results[ev.request_id] = ev.result
        finally:
            self._forget(reqs, results)
        return [results[r.id] for r in reqs]

    def stream(self, prompt, **kw) -> Iterator[Event]:
        """Events for one request as the engine steps. Closing the generator early (``break``, an exception in the
        consumer, garbage collection) cancels the request and frees its slot; a request cancelled through
        ``engine.cancel`` ends the stream without a finished event."""
        req = Request(prompt, **kw)
        self._submit([req])
        done: dict[int, Result] = {}
        try:
            while not done:
                try:
                    events = self._next_events([req.id])
                except RequestCancelled:  # cancelled through the engine: the stream just ends
                    return
                for ev in events:
                    if ev.finished:
                        done[req.id] = ev.result
                    yield ev
        finally:
            self._forget([req], done)

    # --- tokens ---------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """The tokens a string prompt becomes (the defaults: as ``generate`` tokenizes it)."""
        with self._lock:
            self._check_open()
            return self.engine.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens) -> str:
        with self._lock:
            self._check_open()
            return self.engine.model.detokenize(tokens).decode("utf-8", "replace")

    # --- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.engine.close()
            self.engine.pair.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- the event inbox ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("this LLM is closed (its `with` block ended or close() was called)")

    def _submit(self, reqs: list[Request]) -> None:
        with self._lock:
            self._check_open()
            self.engine.submit_all(reqs)
            for r in reqs:
                self._inbox[r.id] = deque()

    def _next_events(self, ids: list[int]) -> list[Event]:
        """Events waiting for any of these requests, stepping the engine (for everyone) until there are some."""
        with self._lock:
            while True:
                self._check_open()
                out = [ev for i in ids for ev in _drain(self._inbox[i])]
                if out:
                    return out
                if not any(self.engine.is_live(i) for i in ids):
                    raise RequestCancelled(f"request(s) {ids} were cancelled before they finished")
                for ev in self.engine.step():
                    box = self._inbox.get(ev.request_id)
                    if box is not None:
                        box.append(ev)

    def _forget(self, reqs: list[Request], finished: dict) -> None:
        """Stop collecting events for these requests; cancel those that have not finished."""
        with self._lock:
            for r in reqs:
                self._inbox.pop(r.id, None)
                if r.id not in finished and not self._closed:
                    self.engine.cancel(r.id)


def _drain(box: deque) -> list:
    out = list(box)
    box.clear()
    return out


def load(target: PathLike, drafter: Optional[PathLike] = None, config: Optional[EngineConfig] = None,
         allow_scale_mismatch: bool = False, target_kv_overrides: Optional[dict] = None,
         cache: Optional[CacheConfig] = None) -> LLM:
    """target_kv_overrides: GGUF metadata overrides for the target (llama.cpp's --override-kv).
    cache: prompt-cache options (default CacheConfig(): slot reuse and the device tier; docs/cache.md).
    config.rpc: llama.cpp RPC servers for the target's offloaded layers (EngineConfig, pydflash/rpc_endpoints.py)."""
    config = config or EngineConfig()
    pair = load_pair(target, drafter, n_gpu_layers=config.n_gpu_layers, allow_scale_mismatch=allow_scale_mismatch,
                     target_kv_overrides=target_kv_overrides, rpc=config.rpc, rpc_allow_public=config.rpc_allow_public)
    try:
        return LLM(Engine(pair, config, cache=cache))
    except BaseException:
        pair.close()
        raise
