"""The engine thread: one thread owns the engine (and so every llama.cpp context); an ``EngineClient``.

HTTP handlers never touch the engine. They send commands through a thread-safe queue and get replies on a
``Sink``, an asyncio queue fed from this thread with ``call_soon_threadsafe``:

    handler --submit/cancel/call--> [command queue] --> engine thread: engine.submit / cancel / step
    handler <--accepted/event/error-- Sink <-------------- engine thread

In ``pydflash-server`` this thread runs inside an engine process of its own (``engine_process.py``), whose sinks
write to the worker through a pipe (``engine_process_client.py``); in a Ray replica, or with
``PYDFLASH_ENGINE_PROCESS=0``, it runs in the worker's own process and its sinks are the handlers' own.

While the engine has work the thread steps it and only polls the command queue between steps; while idle it
blocks on the queue. An exception out of ``step()`` is an engine failure: every waiting request gets the error, the
thread marks the engine dead (``/health`` turns 503) and the worker exits so that the router respawns it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..engine.engine import Engine
from ..engine.request import Event, Request
from ..errors import PydflashError
from .engine_client import ACCEPTED, EngineDead, EngineInfo, LoopState, QueueFull, Sink

log = logging.getLogger(__name__)

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


class EngineThread:
    """``deliver(items)`` sends a step's replies, ``[(sink, (request id, event))]`` (default: ``Sink.put_all``).
    ``defer``: hold them until the next step's target forward starts (or no step follows), so that an event loop
    sharing this process's GIL writes the streams while this thread waits on the device, not while it runs Python
    between native calls. On the H200 at 16 streams that alone did not change the step's host part measurably
    (docs/benchmarks.md); an engine process (engine_process.py) has no such neighbour and sends at once."""

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

    def close(self) -> None:
        """Stop the thread, then free the engine and its pair; nothing touches them afterwards."""
        self.stop()  # joins the thread first: a step never runs on freed contexts
        self.engine.close()
        self.engine.pair.close()

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
