"""The worker's end of its engine process (``engine_process.py``): an ``EngineClient`` over a pipe.

    engine = EngineProcessClient(preset_json)   # starts the engine process and waits until it has loaded
    engine.submit(req, sink) / engine.cancel(id) / await engine.call(ops.score, tokens, top_n)
    engine.info, engine.n_busy, engine.n_waiting, engine.dead

Replies come back on a reader thread, which hands each step's to the event loop in one wake-up (``Sink.put_all``)
and feeds the metrics (``on_step``). If the engine process ends unasked (its engine failed, a native abort, a kill),
every waiting request and call gets ``EngineDead`` and ``on_death`` runs: the worker then exits and the router
respawns it, engine process and all.
"""

from __future__ import annotations

import itertools
import logging
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from ..engine.request import Event, Request
from ..errors import ModelLoadError, PydflashError
from .engine_client import EngineDead, EngineInfo, LoopState, Sink

log = logging.getLogger(__name__)
STOP_WAIT_S = 10.0


class EngineExited(PydflashError):
    """The engine process ended before it was ready, without a load error of its own (its stderr says why)."""


def describe_status(code: int) -> str:
    if code < 0:
        try:
            return f"status {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"status {code}"


class EngineProcessClient:
    def __init__(self, preset_json: str, log_level: str = "warning",
                 on_step: Optional[Callable[[LoopState, list], None]] = None,
                 on_death: Optional[Callable[[BaseException], None]] = None):
        self.on_step = on_step
        self.on_death = on_death
        self.dead: Optional[BaseException] = None
        self.n_waiting = self.n_busy = 0
        self._sinks: dict[int, Sink] = {}  # request id -> its call's sink
        self._calls: dict[int, Sink] = {}  # call id -> its sink
        self._call_ids = itertools.count()
        self._lock = threading.Lock()  # sends, and registering a waiter against the engine's death
        self._stopping = False
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pydflash.server.engine_process", "--preset", preset_json,
             "--fd", str(theirs.fileno()), "--log-level", log_level],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self.info: EngineInfo = self._wait_ready()
        self._reader = threading.Thread(target=self._read, name="engine-link", daemon=True)

    def _wait_ready(self) -> EngineInfo:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            raise EngineExited(f"the engine process ended while loading ({describe_status(self.proc.wait())})")
        if kind == "load-error":
            self.proc.wait()
            raise ModelLoadError(payload)
        return payload

    def start(self) -> None:
        self._reader.start()

    def stop(self) -> None:
        """Ask the engine process to finish (it frees its contexts), and make sure it has."""
        self._stopping = True
        self._send(("stop",))
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._reader.is_alive():
            self._reader.join(timeout=STOP_WAIT_S)  # it reads the pipe's end and leaves
        self._conn.close()

    # --- called from the event loop -------------------------------------------------------------------------------
    def submit(self, req: Request, sink: Sink) -> None:
        # registered, or refused, against the same reading of `dead`: _die then answers a registered sink once
        with self._lock:
            dead = self.dead
            if dead is None:
                self._sinks[req.id] = sink
        if dead is not None:
            sink.put((req.id, EngineDead(str(dead))))
            return
        self._send(("submit", req))

    def cancel(self, request_id: int) -> None:
        self._sinks.pop(request_id, None)
        self._send(("cancel", request_id))

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        """fn(engine, *args) on the engine's loop thread (fn: a module-level function, ``ops.py``); its exception
        is re-raised."""
        sink = Sink()
        with self._lock:
            dead = self.dead
            if dead is None:
                call_id = next(self._call_ids)
                self._calls[call_id] = sink
        if dead is not None:
            raise EngineDead(str(dead))
        self._send(("call", call_id, fn, args))
        ok, value = await sink.get()
        if not ok:
            raise value
        return value

    def _send(self, msg: tuple) -> None:
        with self._lock:
            try:
                self._conn.send(msg)
            except OSError:  # the engine process is gone: the reader sees the pipe close and fails the waiters
                pass

    # --- the reader thread ----------------------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                if not self._stopping:
                    self._die(f"the engine process ended ({describe_status(self.proc.wait())})")
                return
            kind = msg[0]
            if kind == "replies":
                self._route(msg[1], msg[2])
            elif kind == "call":
                sink = self._calls.pop(msg[1], None)
                if sink is not None:
                    sink.put((msg[2], msg[3]))
            elif kind == "dead":
                self._die(f"the engine failed: {msg[1]}")

    def _route(self, replies: list[tuple[int, Any]], state: Optional[LoopState]) -> None:
        items, events = [], []
        for rid, item in replies:
            sink = self._sinks.get(rid)
            if isinstance(item, Event):
                events.append(item)
                if item.finished:
                    self._sinks.pop(rid, None)
            elif isinstance(item, BaseException):
                self._sinks.pop(rid, None)
            if sink is not None:
                items.append((sink, (rid, item)))
        if items:
            Sink.put_all(items)
        if state is not None:
            self.n_waiting, self.n_busy = state.n_waiting, state.n_busy
        if self.on_step is not None and (events or state is not None):
            self.on_step(state or LoopState(self.n_waiting, self.n_busy), events)

    def _die(self, why: str) -> None:
        with self._lock:
            if self.dead is not None:
                return
            self.dead = EngineDead(why)
            sinks, self._sinks = self._sinks, {}
            calls, self._calls = self._calls, {}
        log.error("%s", why)
        for rid, sink in sinks.items():
            sink.put((rid, self.dead))
        for sink in calls.values():
            sink.put((False, self.dead))
        if self.on_death is not None:
            self.on_death(self.dead)
