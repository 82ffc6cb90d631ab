"""The Serve ingress: ``pydflash-server``'s FastAPI app (``create_app``) with Serve engine replicas as its backend.

Routes, schemas, authentication, size limits and error envelopes are the app's own; only ``forward`` differs from
the worker-process backend. It resolves the model name as the router does (``"any"``: the model this ingress used
last, else the default), sends the raw body to the engine deployment with that name as the multiplexed model id,
and relays the replica's answer. The replica that answered is named in the ``X-Pydflash-Replica`` header.

A replica that dies before it answered is retried once (Serve routes the retry to a live replica); one that dies
mid-stream ends the stream with ``data: {"error": ...}`` (503) and ``data: [DONE]``, as a lost worker does.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from ..app import RELAYED_HEADERS, create_app
from ..errors import Overloaded, ServerError, Unavailable, envelope, log_safe, to_api_error
from ..preset import ServerModels
from ..router import ModelUnavailable, select

log = logging.getLogger(__name__)
REPLICA_HEADER = "X-Pydflash-Replica"
ATTEMPTS = 2  # a replica lost before it answered: once more, on another
LOST = (RayActorError, ReplicaUnavailableError)  # the replica's actor died or is going away


class ServeProxy:
    """``app.Backend`` over the engine deployment's handle."""

    def __init__(self, models: ServerModels, engine: DeploymentHandle):
        self.models = models
        self.engine = engine
        self.mru: Optional[str] = None
        self.served: set[str] = set()  # models a replica answered for, since their last failure

    async def startup(self, preload: bool) -> None:  # the replicas load the default model themselves
        pass

    async def shutdown(self) -> None:
        pass

    def status(self) -> dict[str, str]:
        # Serve's table of which replica holds what is not public: "ready" means a replica answered for the model
        return {name: "ready" if name in self.served else "unloaded" for name in self.models.presets}

    async def forward(self, path: str, model: Optional[str], stream: bool, http: HTTPRequest) -> Response:
        key = select(self.models, model, self.mru)
        raw = await http.body()
        gen, head = await self._open(key, path, raw)
        self.mru = key
        self.served.add(key)
        headers = {k: v for k, v in head["headers"].items() if k.lower() in RELAYED_HEADERS}
        headers[REPLICA_HEADER] = head["replica"]
        if "body" in head:  # a whole answer: JSON, or an error before any stream byte
            return Response(head["body"], status_code=head["status"], headers=headers)
        headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return StreamingResponse(self._relay(key, gen), status_code=head["status"], headers=headers)

    async def _open(self, key: str, path: str, raw: bytes) -> tuple[DeploymentResponseGenerator, dict]:
        """Send the request and wait for the replica's head."""
        for attempt in range(1, ATTEMPTS + 1):
            gen = self.engine.options(multiplexed_model_id=key, stream=True).forward.remote(path, raw)
            try:
                return gen, await gen.__anext__()
            except LOST as exc:
                if attempt == ATTEMPTS:
                    raise self._lost(key, exc)
                log.warning("a replica serving %s was lost before it answered (%s); retrying", log_safe(key),
                            type(exc).__name__)
            except BackPressureError as exc:
                raise Overloaded(f"every replica of model {key!r} is saturated: {exc.message}")
            except DeploymentUnavailableError as exc:
                raise Unavailable(exc.message, retry_after=5)
            except StopAsyncIteration:
                raise ServerError("a replica ended its answer before its head")
            except BaseException:  # our client went away (cancelled) or a bug: the replica stops too
                gen.cancel()
                raise
        raise AssertionError("unreachable")

    async def _relay(self, key: str, gen: DeploymentResponseGenerator):
        ended = False
        try:
            async for chunk in gen:
                yield chunk
            ended = True
        except Exception as exc:  # the replica died mid-stream (or failed): tell the client, then end the stream
            ended = True
            err = self._lost(key, exc) if isinstance(exc, LOST) else to_api_error(exc)
            yield f"data: {json.dumps(envelope(err))}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            if not ended:  # our client went away: the replica cancels its engine requests
                gen.cancel()

    def _lost(self, key: str, exc: BaseException) -> ModelUnavailable:
        self.served.discard(key)
        log.error("lost the replica serving model %s: %s: %s", log_safe(key), type(exc).__name__,
                  log_safe(str(exc).splitlines()[0] if str(exc) else ""))
        return ModelUnavailable(f"the replica serving {key!r} failed; retry shortly")


class Ingress:
    """The ingress deployment's class (wrapped by ``serve.ingress()``): the app is built on the replica."""

    def __init__(self, engine: DeploymentHandle, models: ServerModels, api_key: Optional[str], max_body_bytes: int):
        self.engine = engine
        self.models = models
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    def __serve_build_asgi_app__(self):
        return create_app(self.models, api_key=self.api_key, max_body_bytes=self.max_body_bytes, preload=False,
                          backend=ServeProxy(self.models, self.engine))
