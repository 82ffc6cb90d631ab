"""The engine loop: one thread owns the engine (and so every llama.cpp context) of a worker process.

HTTP handlers never touch the engine. They send commands through a thread-safe queue and get replies on a
``Sink``, an asyncio queue fed from this thread with ``call_soon_threadsafe``:

    handler --submit/cancel/call--> [command queue] --> loop thread: engine.submit / cancel / step
    handler <--accepted/event/error-- Sink <-------------- loop thread

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
from typing import Any, Callable, Optional

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


@dataclass
class _Submit:
    req: Request
    sink: Sink


@dataclass
class _Cancel:
    request_id: int


@dataclass
class _Call:
    fn: Callable[[Engine], Any]
    sink: Sink


class EngineLoop:
    def __init__(self, engine: Engine, max_queue: int = 64, on_step: Optional[Callable[[Engine, list], None]] = None,
                 on_death: Optional[Callable[[BaseException], None]] = None):
        self.engine = engine
        self.max_queue = max_queue
        self.on_step = on_step  # metrics hook, runs on the loop thread after every step
        self.on_death = on_death
        self.dead: Optional[BaseException] = None
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[int, Sink] = {}
        self._stop = False
        # a step's replies, sent when the next step's target forward starts (or at once when no step follows): the
        # event loop then writes the streams while this thread waits on the GPU, not while it runs Python between
        # native calls (on the H200 at 16 streams the host part of a step was ~2.8x its in-process cost; this alone
        # did not change that measurably: docs/gpu_2026-12-02-b)
        self._undelivered: list[tuple[Sink, tuple]] = []
        engine.before_verify = self._deliver
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

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run fn(engine) on the loop thread between steps (tokenize, scoring...); its exception is re-raised."""
        if self.dead is not None:
            raise EngineDead(f"the engine failed: {self.dead}")
        sink = Sink()
        self._cmds.put(_Call(fn, sink))
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
                if not self.engine.has_work or self._stop:  # no forward follows to send them in
                    self._deliver()
                if self.on_step is not None:  # also when idle: gauges follow cancellations
                    self.on_step(self.engine, events)
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
            Sink.put_all(items)

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
                cmd.sink.put((True, cmd.fn(self.engine)))
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
