"""The public OpenAI-compatible app: authentication, size limits, model selection, and a proxy to the workers.

Bodies are validated here against the same pydantic schemas the workers use, so bad input is answered 4xx
without touching a worker and ``/openapi.json`` documents every body. The validated request then goes, byte for
byte, to the worker of its model over a Unix socket; answers and SSE streams come back unchanged. A worker that
dies mid-request gives its client a 503 (or, mid-stream, an error event then ``[DONE]``).

Where the models run is the app's ``Backend``: by default ``WorkerProxy`` (worker processes on this machine, chosen
by the ``Router``); ``pydflash.server.ray`` plugs in Ray Serve replicas behind the same routes.

Public routes (no API key needed): ``PUBLIC_ROUTES``. Everything else needs ``Authorization: Bearer KEY`` when
the server has an API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from typing import Optional, Protocol

import httpx
from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import metrics
from . import schemas as S
from .errors import AuthenticationError, InvalidRequestError, envelope, install, log_safe, responses
from .limits import BodyLimit
from .preset import ServerModels
from .router import ModelUnavailable, Router

log = logging.getLogger(__name__)
PUBLIC_ROUTES = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
DISCONNECT_POLL_S = 0.25
MAX_BODY_BYTES = 16 * 1024 * 1024


RELAYED_HEADERS = frozenset({"content-type", "retry-after"})  # what a worker's answer keeps on its way out


class Backend(Protocol):
    """Where the app's validated requests go; the HTTP routes, schemas and auth stay the same whatever it is."""

    async def startup(self, preload: bool) -> None: ...

    async def shutdown(self) -> None: ...

    def status(self) -> dict[str, str]:
        """Each preset's state: "ready", "loading", "restarting" or "unloaded" (``/health``, ``/v1/models``)."""

    async def forward(self, path: str, model: Optional[str], stream: bool, http: HTTPRequest) -> Response:
        """Answer one request (its raw body is ``await http.body()``) from the model it names."""


class WorkerProxy:
    """The default backend: one worker process per resident preset, chosen and respawned by the ``Router``."""

    def __init__(self, router: Router):
        self.router = router

    async def startup(self, preload: bool) -> None:
        await self.router.startup(preload=preload)

    async def shutdown(self) -> None:
        await self.router.shutdown()

    def status(self) -> dict[str, str]:
        return self.router.status()

    async def forward(self, path: str, model: Optional[str], stream: bool, http: HTTPRequest) -> Response:
        return await _forward(self.router, path, model, stream, http)

    async def load(self, name: str) -> None:
        await self.router.load(name)

    async def unload(self, name: str) -> None:
        await self.router.unload(name)


def create_app(models: ServerModels, api_key: Optional[str] = None, max_resident: int = 2,
               max_body_bytes: int = MAX_BODY_BYTES, preload: bool = True, log_level: str = "warning",
               backend: Optional[Backend] = None) -> FastAPI:
    if backend is None:
        backend = WorkerProxy(Router(models, max_resident=max_resident, log_level=log_level))

    async def authenticate(http: HTTPRequest) -> None:
        if api_key is None or http.url.path in PUBLIC_ROUTES:
            return
        header = http.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise AuthenticationError("invalid or missing API key (send Authorization: Bearer KEY)")

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await backend.startup(preload=preload)
        yield
        await backend.shutdown()

    app = FastAPI(title="pydflash", version="0.1.0", dependencies=[Depends(authenticate)], lifespan=lifespan,
                  description="OpenAI-compatible server with DFlash speculative decoding over llama.cpp")
    install(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(CountRejections)  # outermost: it sees the 413s and 401s too
    app.state.backend = backend

    # --- generation -----------------------------------------------------------------------------------------------
    @app.post("/v1/completions", response_model=S.CompletionResponse, responses=_responses(S.CompletionChunk))
    async def completions(body: S.CompletionRequest, http: HTTPRequest):
        return await backend.forward("/v1/completions", body.model, body.stream, http)

    @app.post("/v1/chat/completions", response_model=S.ChatCompletionResponse, responses=_responses(S.ChatChunk))
    async def chat_completions(body: S.ChatCompletionRequest, http: HTTPRequest):
        return await backend.forward("/v1/chat/completions", body.model, body.stream, http)

    @app.post("/tokenize", response_model=S.TokenizeResponse, responses=_responses())
    async def tokenize(body: S.TokenizeRequest, http: HTTPRequest):
        return await backend.forward("/tokenize", body.model, False, http)

    @app.post("/detokenize", response_model=S.DetokenizeResponse, responses=_responses())
    async def detokenize(body: S.DetokenizeRequest, http: HTTPRequest):
        return await backend.forward("/detokenize", body.model, False, http)

    # --- slot files (llama-server's /slots/{id}?action=...; the worker checks names, files and slots) --------------
    @app.post("/slots/{id_slot}", response_model=S.SlotActionResponse, responses=responses(400, 401, 404, 413, 503))
    async def slot_action(id_slot: int, action: S.SlotAction, http: HTTPRequest,
                          body: Optional[S.SlotActionRequest] = None):
        return await backend.forward(f"/slots/{id_slot}?action={action}", body.model if body else None, False, http)

    # --- llama-server's native endpoints (the worker answers: native_api.py) ----------------------------------------
    # GET routes name their model in the query (?model=), as llama-server's router mode does
    @app.post("/completion", responses=_responses(S.NativeCompletionEvent))
    async def native_completion(body: S.NativeCompletionRequest, http: HTTPRequest):
        return await backend.forward("/completion", body.model, body.stream, http)

    @app.post("/apply-template", response_model=S.ApplyTemplateResponse, responses=_responses())
    async def apply_template(body: S.ChatCompletionRequest, http: HTTPRequest):
        return await backend.forward("/apply-template", body.model, False, http)

    @app.get("/props", responses=responses(401, 404, 503))
    async def props(http: HTTPRequest, model: Optional[str] = None):
        return await backend.forward("/props", model, False, http)

    @app.get("/slots", responses=responses(401, 404, 503))
    async def slot_states(http: HTTPRequest, model: Optional[str] = None):
        return await backend.forward("/slots", model, False, http)

    # --- model control (llama-server's router mode) ---------------------------------------------------------------
    def meta(name: str, status: str) -> S.ModelMeta:
        preset = models.presets[name]
        return S.ModelMeta(resident=status == "ready", default=name == models.default, status=_STATUS[status],
                           n_ctx=preset.n_ctx_slot, n_slots=preset.n_slots, drafter=preset.pair_files()[1])

    @app.get("/models", response_model=S.RouterModelList)
    async def router_models():
        status = backend.status()
        return S.RouterModelList(data=[
            S.RouterModel(id=name, path=models.presets[name].pair_files()[0],
                          status=S.RouterModelStatus(value=_STATUS[status[name]]), meta=meta(name, status[name]))
            for name in models.presets])

    @app.post("/models/load", response_model=S.ModelControlResponse, responses=responses(400, 401, 404, 503))
    async def load_model(body: S.ModelControlRequest):
        await _control(backend, "load")(body.model)
        return S.ModelControlResponse()

    @app.post("/models/unload", response_model=S.ModelControlResponse, responses=responses(400, 401, 404, 503))
    async def unload_model(body: S.ModelControlRequest):
        await _control(backend, "unload")(body.model)
        return S.ModelControlResponse()

    # --- status ---------------------------------------------------------------------------------------------------
    @app.get("/v1/models", response_model=S.ModelList)
    async def list_models():
        status = backend.status()
        created = int(time.time())
        return S.ModelList(data=[S.ModelCard(id=name, created=created, meta=meta(name, status[name]))
                                 for name in models.presets])

    @app.get("/health", response_model=S.HealthResponse,
             responses={503: {"model": S.HealthResponse, "description": "a model is loading or restarting"}})
    async def health():
        status = backend.status()
        bad = {k: v for k, v in status.items() if v in ("loading", "restarting")}
        if not bad:
            return S.HealthResponse(status="ok")
        why = ", ".join(f"{log_safe(k)} {v}" for k, v in bad.items())
        body = S.HealthResponse(status="loading" if "loading" in bad.values() else "error", message=why)
        return JSONResponse(body.model_dump(), status_code=503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics():
        data, content_type = metrics.exposition()
        return Response(data, media_type=content_type)

    return app


# a backend's model states under llama-server's router names (a worker respawning after a failure is loading)
_STATUS = {"ready": "loaded", "loading": "loading", "restarting": "loading", "unloaded": "unloaded"}


def _control(backend, action: str):
    """The backend's load or unload; a backend without model control (Ray Serve places the models itself)
    answers 400."""
    fn = getattr(backend, action, None)
    if fn is None:
        raise InvalidRequestError(f"/models/{action} is not available with this backend: it places the models itself")
    return fn


class CountRejections:
    """Counts each 4xx answer of a generation route in ``pydflash_requests_total`` (outcome "rejected") and
    ``pydflash_requests_rejected_total`` (by status), whoever gave it: this app (bad fields, a wrong key, an
    unknown model, a body too large) or the worker (a prompt over the context, a full queue), which counts only the
    requests it admitted. 499 is not one: the client went away, and the worker counts that as cancelled."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        endpoint = metrics.ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            return await self.app(scope, receive, send)

        async def send_counting(message):
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500 \
                    and message["status"] != 499:
                model = scope.get("state", {}).get("model", "")  # set once a preset is resolved (_forward)
                metrics.count_rejected(model, endpoint, message["status"])
            await send(message)

        await self.app(scope, receive, send_counting)


def _responses(chunk=None) -> dict:
    """OpenAPI for what a generation route can answer: the error envelope, and with stream=true an SSE stream of
    ``chunk`` JSON objects (then ``data: [DONE]``)."""
    out = responses(400, 401, 404, 413, 429, 503)
    if chunk is not None:
        event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
        out[200] = {"content": {"text/event-stream": {"schema": event}},
                    "description": f"JSON, or with stream=true server-sent events, each `data:` a {chunk.__name__}"}
    return out


async def _forward(router: Router, path: str, model: Optional[str], stream: bool, http: HTTPRequest):
    raw = await http.body()
    w = await router.acquire(model)
    http.state.model = w.preset.name  # for the metrics' label of a refusal (CountRejections)
    released = False
    try:
        headers = {"content-type": "application/json"}
        if stream:
            req = w.client.build_request("POST", path, content=raw, headers=headers)
            try:
                resp = await w.client.send(req, stream=True)
            except httpx.TransportError as exc:
                raise await _worker_gone(w, exc, path)
            if resp.status_code != 200:  # refused before any SSE byte: relay the error as it is
                body = await resp.aread()
                await resp.aclose()
                return Response(body, status_code=resp.status_code, headers=_relayed(resp))
            released = True  # the relay releases the worker when the stream ends
            return StreamingResponse(_relay(router, w, resp, path), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        resp = await _send_watching(w.client, path, raw, headers, http)
        return Response(resp.content, status_code=resp.status_code, headers=_relayed(resp))
    except httpx.TransportError as exc:
        raise await _worker_gone(w, exc, path)
    finally:
        if not released:
            router.release(w)


async def _send_watching(client: httpx.AsyncClient, path: str, raw: bytes, headers: dict,
                         http: HTTPRequest) -> httpx.Response:
    """POST to the worker; if our client disconnects first, cancel it (which closes the worker's connection and so
    cancels the generation there)."""
    task = asyncio.ensure_future(client.post(path, content=raw, headers=headers))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await http.is_disconnected():
                task.cancel()
                return httpx.Response(499)  # nobody reads it: the client is gone (nginx's "client closed")
    finally:
        if not task.done():
            task.cancel()


async def _relay(router: Router, w, resp: httpx.Response, path: str):
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.TransportError as exc:  # the worker died mid-stream: tell the client, then end the stream
        err = await _worker_gone(w, exc, path)
        yield f"data: {json.dumps(envelope(err))}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        await resp.aclose()
        router.release(w)


def _relayed(resp: httpx.Response) -> dict:
    return {k: v for k, v in resp.headers.items() if k.lower() in RELAYED_HEADERS}


async def _worker_gone(w, exc: Exception, path: str) -> ModelUnavailable:
    """The error for a request lost with its worker, which is counted here: the worker cannot count it any more."""
    if path in metrics.ENDPOINTS:
        metrics.REQUESTS.labels(w.preset.name, metrics.ENDPOINTS[path], "error").inc()
    # the worker's own last words (a native assert, an engine failure) reach the server's stderr among its other
    # lines: name them here next to the failed request, since a client or benchmark may stop the server before the
    # respawn logs them
    report = await w.settled_exit_report()
    log.error("lost the worker of model %s: %s (worker %s)", log_safe(w.preset.name), exc, log_safe(report))
    return ModelUnavailable(f"the worker serving {w.preset.name!r} failed; retry shortly")
