"""The engine loop: one thread owns the engine (and so every llama.cpp context).

HTTP handlers never touch the engine. They send commands through a thread-safe queue and get replies on a
``Sink``, an asyncio queue fed from this thread with ``call_soon_threadsafe``:

    handler --submit/cancel/call--> [command queue] --> loop thread: engine.submit / cancel / step
    handler <--accepted/event/error-- Sink <-------------- loop thread

In ``pydflash-server`` the loop runs in an engine process of its own (``core.py``), whose sinks write to the
worker through a pipe (``core_link.py``); in-process (``serve/resident.py``) its sinks are the handlers' own.

Replies are ``(request id, item)``. A submit is answered first with ``ACCEPTED`` or an error (validation, context overflow, a full queue), so a
handler can still answer 4xx before it sends any stream byte. While the engine has work the thread steps it and
only polls the command queue between steps; while idle it blocks on the queue. An exception out of ``step()`` is
an engine failure: every waiting request gets the error, the loop marks itself dead (``/health`` turns 503) and
the worker exits so that the router respawns it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..engine.engine import Engine
from ..engine.request import Event, Request
from ..errors import PydflashError
from .errors import Overloaded, Unavailable

log = logging.getLogger(__name__)

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


CACHE_READ_EVERY_S = 0.25  # prompt-cache metrics are read this often while steps run, and when a request ends


@dataclass
class _Submit:
    req: Request
    sink: Sink


@dataclass
class _Cancel:
    request_id: int


@dataclass
class _Call:
    fn: Callable[..., Any]  # fn(engine, *args)
    args: Sequence[Any]
    sink: Sink


class EngineLoop:
    """``deliver(items)`` sends a step's replies, ``[(sink, (request id, event))]`` (default: ``Sink.put_all``).
    ``defer``: hold them until the next step's target forward starts (or no step follows), so that an event loop
    sharing this process's GIL writes the streams while this thread waits on the device, not while it runs Python
    between native calls. On the H200 at 16 streams that alone did not change the step's host part measurably
    (docs/benchmarks.md); an engine process (core.py) has no such neighbour and sends at once."""

    def __init__(self, engine: Engine, max_queue: int = 64,
                 on_step: Optional[Callable[[LoopState, list], None]] = None,
                 on_death: Optional[Callable[[BaseException], None]] = None,
                 deliver: Optional[Callable[[list], None]] = None, defer: bool = True):
        self.engine = engine
        self.info = EngineInfo.of(engine)
        self.max_queue = max_queue
        self.on_step = on_step  # metrics hook, runs on the loop thread after every step (and when idle)
        self.on_death = on_death
        self.deliver = deliver or Sink.put_all
        self.dead: Optional[BaseException] = None
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[int, Sink] = {}
        self._stop = False
        self._undelivered: list[tuple[Sink, tuple]] = []
        self._cache_at = 0.0  # when the prompt cache's metrics were last read
        if defer:
            engine.before_verify = self._deliver
        self._defer = defer
        self.last_step = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._cmds.put(None)
        self._thread.join(timeout=10)

    # --- called from the event loop -------------------------------------------------------------------------------
    def submit(self, req: Request, sink: Sink) -> None:
        self._cmds.put(_Submit(req, sink))

    def cancel(self, request_id: int) -> None:
        self._cmds.put(_Cancel(request_id))

    def call_to(self, sink: Sink, fn: Callable[..., Any], *args) -> None:
        """Run fn(engine, *args) on the loop thread between steps; ``(True, value)`` or ``(False, exception)`` goes
        to the sink."""
        self._cmds.put(_Call(fn, args, sink))

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        """Run fn(engine, *args) on the loop thread between steps (``ops.py``: tokenize, scoring...); its exception
        is re-raised."""
        if self.dead is not None:
            raise EngineDead(f"the engine failed: {self.dead}")
        sink = Sink()
        self.call_to(sink, fn, *args)
        ok, value = await sink.get()
        if not ok:
            raise value
        return value

    @property
    def n_waiting(self) -> int:
        return len(self.engine.queue)

    @property
    def n_busy(self) -> int:
        return sum(s is not None for s in self.engine.slots)

    # --- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                self._drain(block=not self.engine.has_work)
                events = []
                if self.engine.has_work and not self._stop:
                    events = self.engine.step()
                    self.last_step = time.monotonic()
                    self._undelivered += [d for d in map(self._delivery, events) if d is not None]
                if not self._defer or not self.engine.has_work or self._stop:  # no forward follows to send them in
                    self._deliver()
                if self.on_step is not None:  # also when idle: gauges follow cancellations
                    self.on_step(self._state(events), events)
        except BaseException as exc:  # an engine failure: fail everyone, then let the worker die
            log.exception("engine loop failed")
            self._deliver()  # what the steps before produced, then the error
            self.dead = exc
            self._fail_all(exc)
            if self.on_death is not None:
                self.on_death(exc)

    def _deliver(self) -> None:
        if self._undelivered:
            items, self._undelivered = self._undelivered, []
            self.deliver(items)

    def _state(self, events: list) -> LoopState:
        """The prompt cache's metrics are read when idle, when a request ends, and every CACHE_READ_EVERY_S."""
        e = self.engine
        now = time.monotonic()
        cache = None
        if not events or any(ev.finished for ev in events) or now - self._cache_at >= CACHE_READ_EVERY_S:
            cache, self._cache_at = e.prompt_cache.metrics(), now
        return LoopState(len(e.queue), sum(s is not None for s in e.slots), cache)

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._cmds.get(timeout=0.5) if block else self._cmds.get_nowait()
        except queue.Empty:
            return
        while cmd is not None:
            self._handle(cmd)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _handle(self, cmd) -> None:
        if isinstance(cmd, _Submit):
            if len(self.engine.queue) >= self.max_queue:
                full = QueueFull(f"{len(self.engine.queue)} requests are queued (limit {self.max_queue})")
                cmd.sink.put((cmd.req.id, full))
                return
            try:
                self.engine.submit(cmd.req)
            except PydflashError as exc:
                cmd.sink.put((cmd.req.id, exc))
                return
            self._sinks[cmd.req.id] = cmd.sink
            cmd.sink.put((cmd.req.id, ACCEPTED))
        elif isinstance(cmd, _Cancel):
            self._sinks.pop(cmd.request_id, None)
            self.engine.cancel(cmd.request_id)
        elif isinstance(cmd, _Call):
            try:
                cmd.sink.put((True, cmd.fn(self.engine, *cmd.args)))
            except Exception as exc:  # the caller maps it (InvalidRequest -> 400, others -> 500)
                cmd.sink.put((False, exc))

    def _delivery(self, ev: Event) -> Optional[tuple[Sink, tuple]]:
        """(sink, reply) for an event, or None when nobody listens any more."""
        sink = self._sinks.get(ev.request_id)
        if sink is None:
            return None
        if ev.finished:
            del self._sinks[ev.request_id]
        return sink, (ev.request_id, ev)

    def _fail_all(self, exc: BaseException) -> None:
        err = EngineDead(f"the engine failed: {type(exc).__name__}: {exc}")
        for rid, sink in self._sinks.items():
            sink.put((rid, err))
        self._sinks.clear()
        while True:  # commands that arrived meanwhile get the same answer
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Submit):
                cmd.sink.put((cmd.req.id, err))
            elif isinstance(cmd, _Call):
                cmd.sink.put((False, err))
