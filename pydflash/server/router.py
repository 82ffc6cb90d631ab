"""The router's model registry: presets, resident worker processes, LRU eviction and respawn.

Each resident preset runs in its own worker process (``pydflash.server.worker``) that serves on a Unix socket.
The router process never loads a model. Selection rules:
- a name is only looked up among the presets (never joined into a path); an unknown one is ``ModelNotFound``
  (its message lists the served names), except with a single preset, which is served under any name;
- ``None`` or ``"any"`` is the most recently used resident model, else the default preset;
- at most ``max_resident`` workers run; a new one evicts the least recently used idle worker;
- a worker that dies unexpectedly is respawned; while it comes back, its model answers 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import httpx

from . import keepalive
from .errors import InvalidRequestError, NotFoundError, Unavailable, log_safe
from .metrics import RESIDENT, RESTARTS, process_dead, remove_owned_dir
from .preset import Preset, ServerModels

log = logging.getLogger(__name__)


def quiet_unix_read_race(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The loop's exception handler in the router. httpx reaches the workers over Unix sockets through anyio, whose
    raw-socket streams wake a pending read from a reader callback (``Future.set_result``). When that read was just
    cancelled (a client went away, a stream ended), the callback finds the future done and the loop logs "Exception
    in callback Future.set_result ... InvalidStateError" at ERROR level, several times a minute under load
    (agronholm/anyio#1267). Nothing is lost and no request is affected: drop exactly that report, pass on the rest."""
    if isinstance(context.get("exception"), asyncio.InvalidStateError) and "Future.set_result" in repr(
            context.get("handle")):
        return
    loop.default_exception_handler(context)


LOAD_TIMEOUT_S = 300.0
RETRY_AFTER_S = 2


# what a dying worker says of the cause (Python, ggml, CUDA), as against stack frames
_CAUSE = re.compile(r"Error|GGML_ASSERT|error:|Fatal Python error|Aborted|Segmentation fault")


class ModelNotFound(NotFoundError):
    """No preset has this name."""


class ModelNotLoaded(InvalidRequestError):
    """POST /models/unload for a model that no worker holds."""


class ModelUnavailable(Unavailable):
    """The model cannot serve now: loading failed, respawning, or every resident worker is busy."""

    def __init__(self, message: str, retry_after: int = RETRY_AFTER_S):
        super().__init__(message, retry_after=retry_after)


def select(models: ServerModels, name: Optional[str], recent: Optional[str]) -> str:
    """The preset a request names. ``None``, ``""`` or ``"any"`` is ``recent`` (the most recently used model that
    still serves, as the caller tracks it) or else the default; an unknown name is the one preset when there is only
    one (as llama-server), else ``ModelNotFound``. Shared with the Ray Serve ingress (``pydflash.server.ray``), whose
    replicas hold the models."""
    if name is None or name == "any" or name == "":
        return recent if recent is not None else models.default
    if name in models.presets:
        return name
    if len(models.presets) == 1:  # one model served: any name is it, as llama-server does (clients hard-code one)
        return models.default
    log.info("request for unknown model %s", log_safe(name))
    served = ", ".join(repr(k) for k in models.presets)
    raise ModelNotFound(f"model {name!r} not found; the served models are {served} (GET /v1/models)")


class StderrPump:
    """One worker process's stderr, read on a thread of its own. Each line goes on to the router's stderr as it comes,
    since the worker's logs (engine INFO lines, warnings, tracebacks) belong in the server's output, and the last
    ``KEEP`` lines stay here for the exit report. The thread ends at the pipe's EOF, once the process is gone."""

    KEEP = 2000  # ample for a faulthandler dump of every thread after the cause line; bounded for a long-lived worker

    def __init__(self, pipe):
        self._lines: collections.deque[str] = collections.deque(maxlen=self.KEEP)
        self._lock = threading.Lock()  # the event loop reads while this thread appends
        self._thread = threading.Thread(target=self._pump, args=(pipe,), name="worker-stderr", daemon=True)
        self._thread.start()

    def _pump(self, pipe) -> None:
        # a thread, not the event loop: a blocking read costs nothing here, and it keeps draining whatever the
        # loop does, so a chatty worker never fills the pipe and stalls on a write
        with pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with self._lock:
                    self._lines.append(line)
                # a closed or broken router stderr must not stop the draining
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(line + "\n")
                    sys.stderr.flush()

    @property
    def done(self) -> bool:
        """Every line the process wrote is here (EOF)."""
        return not self._thread.is_alive()

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


class Worker:
    """One worker process and the HTTP client that reaches it over its Unix socket."""

    def __init__(self, preset: Preset, sock_dir: pathlib.Path, log_level: str):
        self.preset = preset
        self.sock = sock_dir / f"w{id(self):x}.sock"  # not the preset name: names never become paths
        self.log_level = log_level
        self.proc: Optional[subprocess.Popen] = None
        self.client: Optional[httpx.AsyncClient] = None
        self.ready = asyncio.Event()
        self.error: Optional[str] = None  # why loading failed
        self.stopping = False
        self.inflight = 0
        self.starting: Optional[asyncio.Future] = None  # the load in progress (or done); waiters await it
        self.last_used = time.monotonic()
        self._stderr: Optional[StderrPump] = None  # the current process's
        # the previous process and its stderr, since a respawn can come before a stream's handler reports on the
        # dead one (see settled_exit_report)
        self._last_exit: Optional[tuple[subprocess.Popen, StderrPump]] = None

    def _spawn(self, cmd: list[str]) -> None:
        if self.proc is not None:
            self._last_exit = (self.proc, self._stderr)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=os.environ.copy())
        self._stderr = StderrPump(self.proc.stderr)

    async def start(self) -> None:
        self.ready.clear()
        self.error = None
        self.stopping = False
        with contextlib.suppress(FileNotFoundError):
            self.sock.unlink()
        self._spawn([sys.executable, "-m", "pydflash.server.worker", "--preset", self.preset.to_json(),
                     "--uds", str(self.sock), "--log-level", self.log_level])
        # idle connections leave the pool before the worker would close them (keepalive.py); httpx's counts
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20,
                              keepalive_expiry=keepalive.ROUTER_POOL_S)
        transport = httpx.AsyncHTTPTransport(uds=str(self.sock), limits=limits)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://worker",
                                        timeout=httpx.Timeout(None, connect=5.0))
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                await self._settle(self.proc, 2.0)  # its LOAD-ERROR line may still be in the pipe
                self.error = self.last_error() or f"worker exited with status {self.proc.returncode}"
                raise ModelUnavailable(f"model {self.preset.name!r} failed to load: {self.error}", retry_after=10)
            if self.sock.exists():
                with contextlib.suppress(httpx.TransportError):
                    r = await self.client.get("/health")
                    if r.status_code == 200:
                        self.ready.set()
                        log.info("model %s ready (pid %d)", log_safe(self.preset.name), self.proc.pid)
                        return
            await asyncio.sleep(0.05)
        await self.stop()
        raise ModelUnavailable(f"model {self.preset.name!r} did not load within {LOAD_TIMEOUT_S:.0f} s")

    def _stderr_of(self, proc: Optional[subprocess.Popen]) -> Optional[StderrPump]:
        if self._last_exit is not None and self._last_exit[0] is proc:
            return self._last_exit[1]
        return self._stderr if proc is self.proc else None

    def last_error(self, proc: Optional[subprocess.Popen] = None) -> str:
        pump = self._stderr_of(proc or self.proc)
        lines = [ln for ln in (pump.lines() if pump is not None else []) if ln.strip()]
        marked = [ln.split("LOAD-ERROR: ", 1)[1] for ln in lines if "LOAD-ERROR: " in ln]
        # after a native abort the last line is a stack frame (faulthandler's, or ggml's backtrace): the cause is
        # the last line that names one
        causes = [ln for ln in lines if _CAUSE.search(ln)]
        return (marked or causes or lines or [""])[-1][:500]

    def exit_report(self, proc: Optional[subprocess.Popen] = None) -> str:
        """For logs: a process's (default: the current one's) exit status and its last stderr line, or that it
        still runs."""
        proc = proc or self.proc
        status = proc.poll() if proc is not None else None
        if status is None:
            return "still running"
        return f"status {status}; last words: {self.last_error(proc)}"

    async def _settle(self, proc: subprocess.Popen, wait_s: float) -> None:
        """Until the process has exited and its stderr pump has read the last of it, or wait_s."""
        pump = self._stderr_of(proc)
        deadline = time.monotonic() + wait_s
        while (proc.poll() is None or (pump is not None and not pump.done)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def settled_exit_report(self, wait_s: float = 10.0) -> str:
        """exit_report once a dying worker has exited and its last words have come through the pipe: its
        connections close a moment before the process is reaped. An abort's faulthandler dump and core took over
        2 s on a loaded 2-core runner (the report then said 'still running'); the wait ends as soon as the process
        is gone, so only a worker that closed its stream without dying costs the whole bound."""
        # the process whose stream broke: the watcher may respawn the worker meanwhile (a new process with a stderr
        # of its own), and a report on the new one would say "still running"
        proc = self.proc
        if proc is not None:
            await self._settle(proc, wait_s)
        return self.exit_report(proc)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self) -> None:
        self.stopping = True
        self.ready.clear()
        if self.client is not None:
            await self.client.aclose()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            for _ in range(50):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            process_dead(self.proc.pid)
        with contextlib.suppress(FileNotFoundError):
            self.sock.unlink()


def _remove_dir(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class Router:
    def __init__(self, models: ServerModels, max_resident: int = 2, log_level: str = "warning"):
        if max_resident < 1:
            raise ValueError("max_resident must be >= 1")
        self.models = models
        self.max_resident = max_resident
        self.log_level = log_level
        self.workers: dict[str, Worker] = {}
        self.mru: Optional[str] = None
        self._lock = asyncio.Lock()
        self._sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="pydflash-sock-"))
        # removed at shutdown; atexit also covers an exit that skips it (an exception at start, sys.exit)
        atexit.register(_remove_dir, self._sock_dir)
        self._monitor: Optional[asyncio.Task] = None
        self._respawning: set[str] = set()

    # --- selection ------------------------------------------------------------------------------------------------
    def resolve(self, name: Optional[str]) -> str:
        return select(self.models, name, self.mru if self.mru in self.workers else None)

    @contextlib.asynccontextmanager
    async def use(self, name: Optional[str]):
        """A ready worker for the model, held in use (never evicted) until the block ends."""
        w = await self.acquire(name)
        try:
            yield w
        finally:
            self.release(w)

    async def acquire(self, name: Optional[str]) -> Worker:
        key = self.resolve(name)
        if key in self._respawning:
            raise ModelUnavailable(f"model {key!r} is restarting after a worker failure")
        async with self._lock:
            w = self.workers.get(key)
            if w is None:
                await self._make_room()
                w = self.workers[key] = Worker(self.models.presets[key], self._sock_dir, self.log_level)
                w.starting = asyncio.ensure_future(self._start(key, w))
            w.inflight += 1  # held from here: eviction skips it while it loads
        try:
            if not w.ready.is_set():
                # shielded: a client that gives up waiting does not abort a load other requests wait for
                await asyncio.wait_for(asyncio.shield(w.starting), LOAD_TIMEOUT_S)
        except BaseException:
            w.inflight -= 1
            raise
        w.last_used = time.monotonic()
        self.mru = key
        return w

    # --- model control (llama-server's POST /models/load and /models/unload) ---------------------------------------
    def exact(self, name: str) -> str:
        """A preset named exactly (model control acts on a name, never on "any")."""
        if name not in self.models.presets:
            served = ", ".join(repr(k) for k in self.models.presets)
            raise ModelNotFound(f"model {name!r} not found; the served models are {served} (GET /models)")
        return name

    async def load(self, name: str) -> None:
        """Start the preset's worker unless it runs, and wait until it serves (evicting as a request would)."""
        self.release(await self.acquire(self.exact(name)))

    async def unload(self, name: str) -> None:
        """Stop the preset's worker; one that serves requests now is left alone (503, retry)."""
        key = self.exact(name)
        async with self._lock:
            w = self.workers.get(key)
            if w is None or key in self._respawning:
                raise ModelNotLoaded(f"model {key!r} is not loaded")
            if w.inflight:
                raise ModelUnavailable(f"model {key!r} is serving requests; retry once they end")
            log.info("unloading model %s (asked)", log_safe(key))
            await self._unload(key)

    def release(self, w: Worker) -> None:
        w.inflight -= 1
        w.last_used = time.monotonic()

    async def _start(self, key: str, w: Worker) -> None:
        try:
            await w.start()
            RESIDENT.inc()
        except BaseException:
            if self.workers.get(key) is w:
                del self.workers[key]
            raise

    async def _make_room(self) -> None:
        while len(self.workers) >= self.max_resident:
            idle = [(w.last_used, k) for k, w in self.workers.items() if w.inflight == 0 and w.ready.is_set()]
            if not idle:
                raise ModelUnavailable("every resident model is busy; retry shortly")
            _, victim = min(idle)
            log.info("evicting model %s (least recently used)", log_safe(victim))
            await self._unload(victim)

    async def _unload(self, key: str) -> None:
        w = self.workers.pop(key)
        if self.mru == key:
            self.mru = None
        await w.stop()
        RESIDENT.dec()

    # --- lifecycle ------------------------------------------------------------------------------------------------
    async def startup(self, preload: bool = True) -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_unix_read_race)
        self._monitor = asyncio.ensure_future(self._watch())
        if preload:  # the default model loads at start; /health is 503 until it is ready
            asyncio.ensure_future(self._preload())

    async def _preload(self) -> None:
        try:
            w = await self.acquire(self.models.default)
            self.release(w)
        except Exception as exc:
            log.error("default model %s failed to load: %s", log_safe(self.models.default), exc)

    async def shutdown(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        for key in list(self.workers):
            await self._unload(key)
        _remove_dir(self._sock_dir)  # the workers are gone: nothing listens in it any more
        remove_owned_dir()  # nor writes metrics (the directory is this process's if it made it: metrics.py)

    async def _watch(self) -> None:
        """Respawn workers that died without being asked to (native abort, OOM kill, SIGKILL, engine failure)."""
        while True:
            await asyncio.sleep(0.2)
            for key, w in list(self.workers.items()):
                if w.ready.is_set() and not w.stopping and not w.alive and key not in self._respawning:
                    self._respawning.add(key)
                    asyncio.ensure_future(self._respawn(key, w))

    async def _respawn(self, key: str, w: Worker) -> None:
        log.error("worker for model %s died (%s); respawning", log_safe(key), log_safe(await w.settled_exit_report()))
        RESTARTS.labels(key).inc()
        RESIDENT.dec()
        process_dead(w.proc.pid)
        try:
            await w.client.aclose()
            await w.start()
            RESIDENT.inc()
        except Exception as exc:
            log.error("respawning model %s failed: %s", log_safe(key), exc)
            if self.workers.get(key) is w:
                del self.workers[key]
        finally:
            self._respawning.discard(key)

    def status(self) -> dict:
        out = {}
        for key in self.models.presets:
            w = self.workers.get(key)
            if key in self._respawning:
                out[key] = "restarting"
            elif w is None:
                out[key] = "unloaded"
            elif w.ready.is_set():
                out[key] = "ready"
            else:
                out[key] = "loading"
        return out
