"""A worker's engine process: loads the preset's pair and runs its ``EngineThread``, talking to the worker over one
pipe (``engine_process_client.py`` is the worker's end).

    python -m pydflash.server.engine_process --preset '{"name": ...}' --fd N    (started by EngineProcessClient)

Why a process of its own: a step's Python between native calls (batch building, commits, rollbacks) and the
worker's event loop (HTTP, the SSE frames of every stream) would otherwise share one GIL, and each wait for it
lengthens the step. On the H200 at 16 streams the host part of a step through HTTP was 2.7-2.9x its in-process
cost, and a shorter switch interval or sending events during the forward did not close that
(docs/benchmarks.md). Here the engine thread has the interpreter to itself: the main thread only sleeps in
``recv`` until a command arrives. (vLLM splits its engine core from its API server for the same reason.)

Messages, each a pickled tuple:

    worker -> engine   ("submit", Request) | ("cancel", request id) | ("call", call id, fn, args) | ("stop",)
    engine -> worker   ("ready", EngineInfo) or ("load-error", message): first, once
                       ("replies", [(request id, ACCEPTED | Event | exception)], LoopState | None)
                       ("call", call id, ok, value | exception)
                       ("dead", message): the engine failed; the process exits next

A step's events go out in one message with the engine thread's state. The process ends when the worker says stop,
or when its end of the pipe closes (the worker died: nothing is left to answer to).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import pickle
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any, Optional

from ..errors import InvalidRequest, PydflashError
from .engine_client import LoopState
from .engine_thread import EngineThread
from .preset import Preset

log = logging.getLogger(__name__)
EXIT_LOAD_FAILED = 3
EXIT_ENGINE_DEAD = 70


def load_engine(preset: Preset):
    """The engine of a preset (its pair loaded as the preset says)."""
    from ..engine.engine import Engine
    from ..pair import load_pair

    target, drafter = preset.pair_files()
    pair = load_pair(target, drafter, n_gpu_layers=preset.n_gpu_layers, rpc=preset.rpc,
                     rpc_allow_public=preset.rpc_allow_public)
    try:
        return Engine(pair, preset.engine_config(), cache=preset.cache_config())
    except BaseException:
        pair.close()
        raise


def portable(exc: BaseException) -> BaseException:
    """exc if it survives pickling (arguments and attributes), else a plain error of the same kind with its message:
    a reply the worker cannot read would cost the whole pipe."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        kind = InvalidRequest if isinstance(exc, InvalidRequest) else PydflashError
        return kind(f"{type(exc).__name__}: {exc}")


class Outbox:
    """The engine side of the pipe, and the engine thread's one sink: every reply names its request, and the worker
    routes it. Written from the engine thread only (the lock guards the rare message from elsewhere)."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._lock = threading.Lock()
        self._pending: list[tuple] = []  # a step's replies, sent with the thread's state after it
        self._shown: Optional[tuple[int, int]] = None

    def send(self, msg: tuple, fallback: Optional[tuple] = None) -> None:
        """msg, or fallback if msg does not pickle (a call's result of an unexpected type)."""
        try:
            data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        except Exception:
            if fallback is None:
                raise
            data = pickle.dumps(fallback, pickle.HIGHEST_PROTOCOL)
        with self._lock:
            try:
                self._conn.send_bytes(data)
            except OSError:  # the worker is gone: nobody is left to serve
                os._exit(0)

    # --- EngineThread's sink and hooks ----------------------------------------------------------------------------
    def put(self, reply: tuple) -> None:
        """A reply outside a step (accepted, refused, the engine failed): at once, after any the step left."""
        rid, item = reply
        self._flush(None, [(rid, portable(item) if isinstance(item, BaseException) else item)])

    def deliver(self, items: list[tuple[Any, tuple]]) -> None:
        self._pending += [reply for _, reply in items]

    def on_step(self, state: LoopState, events: list) -> None:
        shown = (state.n_waiting, state.n_busy)
        if self._pending or state.cache is not None or shown != self._shown:
            self._shown = shown
            self._flush(state, [])

    def on_death(self, exc: BaseException) -> None:
        self._flush(None, [])
        self.send(("dead", f"{type(exc).__name__}: {exc}"))
        os._exit(EXIT_ENGINE_DEAD)

    def _flush(self, state: Optional[LoopState], more: list[tuple]) -> None:
        replies, self._pending = self._pending + more, []
        if replies or state is not None:
            self.send(("replies", replies, state))


class _CallReply:
    """Where one call's (ok, value) goes; a value that cannot cross the pipe becomes an error."""

    def __init__(self, out: Outbox, call_id: int):
        self.out, self.call_id = out, call_id

    def put(self, reply: tuple) -> None:
        ok, value = reply
        if not ok:
            value = portable(value)
        unsent = PydflashError(f"the engine's answer ({type(value).__name__}) cannot cross to the worker")
        self.out.send(("call", self.call_id, ok, value), fallback=("call", self.call_id, False, unsent))


def serve(conn: Connection, thread: EngineThread, out: Outbox) -> None:
    """Commands until the worker says stop or goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the worker died: nothing is left to answer to
            os._exit(0)
        kind = msg[0]
        if kind == "submit":
            thread.submit(msg[1], out)
        elif kind == "cancel":
            thread.cancel(msg[1])
        elif kind == "call":
            thread.call_to(_CallReply(out, msg[1]), msg[2], *msg[3])
        elif kind == "stop":
            return
        else:
            log.error("unknown command %r", kind)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="pydflash-engine")
    p.add_argument("--preset", required=True, help="the preset as JSON")
    p.add_argument("--fd", type=int, required=True, help="this process's end of the worker's pipe")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    # a native abort or fault mid-step (GGML_ASSERT, CUDA) kills the process without a Python traceback: dump every
    # thread's Python stack to stderr (the worker's, which the router reads for the last words)
    faulthandler.enable()
    # Ctrl-C reaches the whole process group, and so does a service manager's stop (systemd's default KillMode sends
    # SIGTERM to every process of the unit): this process ends when its worker stops it or goes away. Ended by the
    # signal instead, it died under a worker still shutting down, which then logged the ordinary stop as an engine
    # death (ERROR, "the engine process ended (status -15)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s engine %(name)s %(levelname)s %(message)s")
    conn = Connection(args.fd)
    preset = Preset.from_json(args.preset)
    try:
        engine = load_engine(preset)
    except PydflashError as exc:  # a preset that cannot load: the worker shows the line to the router
        conn.send(("load-error", str(exc)))
        raise SystemExit(EXIT_LOAD_FAILED)
    out = Outbox(conn)
    thread = EngineThread(engine, preset.max_queue, on_step=out.on_step, on_death=out.on_death,
                          deliver=out.deliver, defer=False)
    out.send(("ready", thread.info))
    thread.start()
    serve(conn, thread, out)
    thread.close()


if __name__ == "__main__":
    main()
