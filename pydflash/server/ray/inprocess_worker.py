"""One preset loaded in this process: the worker app of ``pydflash-server`` (``create_worker_app``), called in-process.

A Serve replica keeps a few of these (``serve.multiplexed``). Each owns its engine through an ``EngineThread``, as
a worker process does with ``PYDFLASH_ENGINE_PROCESS=0``, so the HTTP code here never calls llama.cpp: requests go
through the worker's routes (``asgi.call``), and only the engine's thread touches the engine.

Serve evicts the least recently used model by calling its ``__del__`` (from a thread), even while requests still
stream from it. Those requests finish: eviction only *retires* the model (no new requests take it) and the engine
is freed when the last one ends. For that moment a replica holds one model more than its limit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import AsyncIterator, Union

from ..preset import Preset
from ..worker import create_worker_app
from . import asgi

log = logging.getLogger(__name__)


class Retired(Exception):
    """The model was evicted between its lookup and its use; look it up again."""


class InProcessWorker:
    """The worker app of one preset, and the ``EngineThread`` under it, in this process."""

    def __init__(self, preset: Preset, app):
        self.preset = preset
        self.app = app
        self.engine = app.state.engine  # the worker's EngineThread: started here, as the worker's lifespan does
        self._lock = threading.Lock()  # Serve calls __del__ from an executor thread
        self._inflight = 0
        self._retired = False
        self._closed = False

    @classmethod
    async def load(cls, preset: Preset) -> "InProcessWorker":
        app = await asyncio.to_thread(create_worker_app, preset)  # loading blocks for seconds: not on the event loop
        model = cls(preset, app)
        model.engine.start()
        log.info("model %s loaded", preset.name)
        return model

    async def call(self, path: str, body: bytes) -> AsyncIterator[Union[asgi.Head, bytes]]:
        """The worker's answer to one request, streamed (``asgi.call``). Raises ``Retired`` before any output."""
        with self._lock:
            if self._retired:
                raise Retired(self.preset.name)
            self._inflight += 1
        try:
            async for part in asgi.call(self.app, path, body):
                yield part
        finally:
            with self._lock:
                self._inflight -= 1
                close = self._retired and self._inflight == 0
            if close:  # not awaited: this may run while the caller is being cancelled
                asyncio.get_running_loop().run_in_executor(None, self.close)

    def __del__(self) -> None:
        """Serve's unload hook (LRU eviction, replica shutdown): free the engine now, or when its last request ends."""
        with self._lock:
            self._retired = True
            idle = self._inflight == 0
        if idle:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.engine.close()
        self.app.state.tokenizer.close()
        log.info("model %s unloaded", self.preset.name)
