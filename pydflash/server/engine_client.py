"""What the worker's HTTP side knows of an engine: the ``EngineClient`` interface and the replies that come through it.

Two clients implement it, and the worker's routes (``completions.py``, ``scoring.py``, ``slots.py``) are written
against the interface only:

- ``engine_thread.EngineThread``: the engine on a thread of this process (a Ray replica's in-process worker, and
  ``PYDFLASH_ENGINE_PROCESS=0``); inside an engine process it is the loop that the process runs;
- ``engine_process_client.EngineProcessClient``: the worker's end of an engine process (``engine_process.py``),
  the default under ``pydflash-server``.

A Ray replica reaches its presets one level up, through the worker app itself (``ray/inprocess_worker.py``), whose
routes hold an ``EngineThread``: the app, not the engine, is what crosses Ray.

Replies are ``(request id, item)`` on the ``Sink`` a submit names: first ``ACCEPTED`` or an error (validation,
context overflow, a full queue), so a handler can still answer 4xx before any stream byte; then the request's
``Event``s, the last one ``finished``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, runtime_checkable

from ..engine.request import Request
from .errors import Overloaded, Unavailable

if TYPE_CHECKING:
    from ..engine.engine import Engine

ACCEPTED = "accepted"


class QueueFull(Overloaded):
    """More requests wait than the worker's queue limit allows."""


class EngineDead(Unavailable):
    """The engine failed; this worker serves nothing more until it is respawned."""


class Sink:
    """Where the loop thread delivers one HTTP call's replies; read with ``await sink.get()`` on the event loop."""

    def __init__(self):
        self._aloop = asyncio.get_running_loop()
        self._q: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:  # called from the loop thread
        self._aloop.call_soon_threadsafe(self._q.put_nowait, item)

    async def get(self) -> Any:
        return await self._q.get()

    @staticmethod
    def put_all(items: list[tuple["Sink", Any]]) -> None:
        """Deliver a step's replies with one wake-up of the event loop, not one per request: each wake-up is a
        write to the loop's self-pipe and a turn for the GIL, which at 16 streams costs the engine thread."""
        by_loop: dict = {}
        for sink, item in items:
            by_loop.setdefault(sink._aloop, []).append((sink._q, item))
        for aloop, puts in by_loop.items():
            aloop.call_soon_threadsafe(_put_nowait_all, puts)


def _put_nowait_all(puts: list) -> None:
    for q, item in puts:
        q.put_nowait(item)


@dataclass(frozen=True)
class EngineInfo:
    """What the HTTP side may know of an engine without asking its loop: sizes fixed at load, and the GGUF's chat
    template source (resolved on the HTTP side, chat.resolve)."""

    n_slots: int
    n_ctx_slot: int
    block_size: int
    n_vocab: int
    drafter: bool
    arch: str
    chat_template: Optional[str]  # the GGUF's tokenizer.chat_template
    bos_text: str
    eos_text: str
    # the most prompt bytes one token can cover (0: no such bound for this tokenizer); see prompt_bytes_limit
    max_token_bytes: int = 0

    @classmethod
    def of(cls, engine: Engine) -> "EngineInfo":
        from ..compat.gguf_meta import read_metadata

        model = engine.model
        meta = read_metadata(model.path)
        piece = lambda t: model.token_to_piece(t, special=True).decode("utf-8", "replace")  # noqa: E731
        return cls(engine.config.n_slots, engine.config.n_ctx_slot, engine.block_size, model.n_vocab,
                   engine.drafter is not None, model.arch, meta.get("tokenizer.chat_template"),
                   piece(model.bos), piece(model.eos), max_token_bytes(model, meta.get("tokenizer.ggml.model")))

    def prompt_bytes_limit(self) -> Optional[int]:
        """The most UTF-8 bytes a prompt may have and still fit the slot, or None when unknown. A prompt with more
        needs over n_ctx_slot tokens whatever it says, so it can be refused without tokenizing it: tokenizing
        runs on the engine's thread (~1 s per MB on a CPU), where it would stall every running stream."""
        return self.n_ctx_slot * self.max_token_bytes if self.max_token_bytes > 0 else None


# Tokenizers whose vocabulary texts are at least as long as the input bytes they match: SentencePiece (a space
# is stored as the 3-byte U+2581, a byte-fallback token as "<0xNN>") and byte-level BPE (each input byte is stored
# as a 1- or 2-byte character). WordPiece and Unigram normalize (drop whitespace, strip accents), so a token can
# stand for more bytes than its text: no bound there.
_BOUNDED_TOKENIZERS = {"llama", "gpt2"}


def max_token_bytes(model, tokenizer: Optional[str]) -> int:
    """The longest vocabulary text in bytes (an upper bound on the input bytes one token covers), or 0 when this
    tokenizer gives no such bound. One pass over the vocabulary at load (0.7 s for Gemma-3's 262k tokens on a loaded
    2-core CPU; the longest is 48 bytes, so a 4096-token slot refuses prompts over 192 KiB untokenized)."""
    if tokenizer not in _BOUNDED_TOKENIZERS:
        return 0
    return max((len(model.token_text(t)) for t in range(model.n_vocab)), default=0)


@dataclass(frozen=True)
class LoopState:
    """What the loop reports after each step (and when idle) for the metrics: the queue and the busy slots, and
    the prompt cache's counts when they were read this time (None otherwise)."""

    n_waiting: int
    n_busy: int
    cache: Optional[dict] = None


@runtime_checkable
class EngineClient(Protocol):
    """An engine as the HTTP side uses it. Every method is called from the worker's event loop."""

    info: EngineInfo  # sizes and template facts fixed at load
    dead: Optional[BaseException]  # set once the engine failed: it serves nothing more
    on_step: Optional[Callable[[LoopState, list], None]]  # metrics hook: after every step, and when idle
    on_death: Optional[Callable[[BaseException], None]]  # runs once when the engine fails

    @property
    def n_busy(self) -> int:
        """Slots generating now."""

    @property
    def n_waiting(self) -> int:
        """Requests queued for a slot."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop the engine and free its contexts; nothing touches it afterwards."""

    def submit(self, req: Request, sink: Sink) -> None:
        """Queue ``req``; its replies go to ``sink``: ``ACCEPTED`` or an error first, then its events."""

    def cancel(self, request_id: int) -> None:
        """Drop a request; its slot is free on the engine's next turn. No more replies come for it."""

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(engine, *args)`` on the engine's thread between steps (``fn``: a module-level function of
        ``ops.py``, so that it can cross to an engine process); its exception is re-raised here."""
