"""The engine deployment: Serve replicas that each hold up to N presets and answer the ingress's requests.

The model of a request is its Serve multiplexed model id (the ingress sets it with
``handle.options(multiplexed_model_id=name)``). Serve routes a request to a replica that already holds its model
when there is one that is not saturated, else to the replica with the fewest models, which loads it
(``serve.multiplexed``: at most N per replica, least recently used evicted). A replica answers with a head
``{"status", "headers", "replica"}`` and then the body bytes of the worker app's answer, as they come (streams
included).

A replica that dies (native abort, OOM, an engine failure: the worker app exits its process as a worker process
would) is replaced by Serve; the ingress turns the loss into a clean error for the requests it had in flight.
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator, Union

from ray import serve

from ...errors import PydflashError
from ..errors import envelope, to_api_error
from ..preset import ServerModels
from ..router import ModelNotFound, ModelUnavailable
from . import asgi
from .inprocess_worker import InProcessWorker, Retired

log = logging.getLogger(__name__)
LOAD_FAILED_RETRY_S = 10  # as the router's Retry-After for a preset that failed to load


class Replica:
    """One engine replica: its presets (``InProcessWorker``s, loaded on demand) behind ``forward``."""

    async def __init__(self, models: ServerModels, max_models: int, preload: bool = True):
        self.models = models
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()  # its actor's name (namespace "serve")

        async def load(name: str) -> InProcessWorker:
            return await InProcessWorker.load(models.presets[name])

        # wrapped here, not as a decorator on the class, since N comes from the application's arguments
        self.model = serve.multiplexed(max_num_models_per_replica=max_models)(load)
        if preload:  # as pydflash-server: the default model loads at start
            try:
                await self.model(models.default)
            except Exception as exc:  # the replica still serves the other presets; the error shows per request
                log.error("default model %s failed to load: %s", models.default, exc)

    async def forward(self, path: str, body: bytes) -> AsyncIterator[Union[dict, bytes]]:
        """The worker app's answer to ``body`` at ``path``, from the request's model: the head, then the body's
        bytes as they come; an answer that is not a stream comes whole, as the head's ``body`` (one hop less)."""
        head = None
        try:
            async for part in self._answer(serve.get_multiplexed_model_id(), path, body):
                if isinstance(part, asgi.Head):
                    head = self._head(part)
                    if not part.headers.get("content-type", "").startswith("text/event-stream"):
                        head["body"] = b""
                        continue
                    yield head
                elif "body" in head:
                    head["body"] += part
                else:
                    yield part
            if head is not None and "body" in head:
                yield head
        except Exception as exc:  # no model, or the app failed before it answered: an envelope, not a Ray error
            if head is not None:
                raise
            for part in self._error(exc):
                yield part

    async def _answer(self, name: str, path: str, body: bytes) -> AsyncIterator[Union[asgi.Head, bytes]]:
        for attempt in (1, 2):  # a model evicted between its lookup and its use is looked up (loaded) again, once
            model = await self._model(name)
            try:
                async for part in model.call(path, body):
                    yield part
                return
            except Retired:
                if attempt == 2:
                    raise ModelUnavailable(f"model {name!r} was evicted twice before it started; retry")

    async def _model(self, name: str) -> InProcessWorker:
        if name not in self.models.presets:  # the ingress resolves names first; this is defence, not routing
            raise ModelNotFound(f"model {name!r} not found; GET /v1/models lists the served models")
        try:
            return await self.model(name)
        except PydflashError as exc:  # a preset that cannot load: the router's answer for it
            raise ModelUnavailable(f"model {name!r} failed to load: {exc}", retry_after=LOAD_FAILED_RETRY_S) from exc

    def _head(self, head: asgi.Head) -> dict:
        return {"status": head.status, "headers": head.headers, "replica": self.replica}

    def _error(self, exc: BaseException):
        err = to_api_error(exc)
        headers = {"content-type": "application/json", **{k.lower(): v for k, v in err.headers.items()}}
        yield {"status": err.status, "headers": headers, "replica": self.replica,
               "body": json.dumps(envelope(err)).encode()}
