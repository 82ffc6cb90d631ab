"""The OpenAI error envelope, and the one place that maps exception classes to HTTP statuses.

    {"error": {"message": str, "type": str, "param": str | null, "code": int}}

| class              | status | type                       | when                                               |
|--------------------|--------|----------------------------|----------------------------------------------------|
| InvalidRequestError| 400    | invalid_request_error      | bad field, bad JSON, body not an object            |
| ContextSizeError   | 400    | exceed_context_size_error  | prompt + max_tokens + draft block > slot context   |
| AuthenticationError| 401    | authentication_error       | missing or wrong Bearer token                      |
| NotFoundError      | 404    | not_found_error            | unknown model or route                             |
| PayloadTooLarge    | 413    | invalid_request_error      | body over the size limit                           |
| Overloaded         | 429    | rate_limit_error           | the wait queue is full (with Retry-After)          |
| ServerError        | 500    | server_error               | our bug or misconfiguration; never client input    |
| Unavailable        | 503    | unavailable_error          | loading, worker restarting, engine dead (Retry-After)|

Overload is 429, not llama-server's 503: it is the client's load that is refused, and the openai client and load
tools back off on 429 with Retry-After. The type name follows the ``*_error`` pattern of the others; clients branch
on the status, not the type.

Mapping is by class (``to_api_error``), never by reading messages. Validation failures are 400 (FastAPI's default is
422), with ``param`` naming the field (``messages[0].content``) and the message saying why.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

from pydflash import errors as core

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error the client sees. Raise a subclass; ``status`` and ``type`` come from the class."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: Optional[str] = None, headers: Optional[dict] = None,
                 status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        if status is not None:  # e.g. 405 from routing, still an invalid_request_error
            self.status = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, param={self.param!r})"


class InvalidRequestError(APIError):
    status, type = 400, "invalid_request_error"


class ContextSizeError(APIError):
    status, type = 400, "exceed_context_size_error"


class AuthenticationError(APIError):
    status, type = 401, "authentication_error"

    def __init__(self, message: str = "missing or invalid API key (Authorization: Bearer ...)", **kw):
        kw.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kw)


class NotFoundError(APIError):
    status, type = 404, "not_found_error"


class PayloadTooLarge(APIError):
    status, type = 413, "invalid_request_error"

    def __init__(self, limit_bytes: int, **kw):
        super().__init__(f"request body is larger than the limit of {limit_bytes} bytes", **kw)


def _retry_after(seconds: float) -> dict:
    return {"Retry-After": str(max(1, int(round(seconds))))}


class Overloaded(APIError):
    status, type = 429, "rate_limit_error"

    def __init__(self, message: str = "server busy: the request queue is full", retry_after: float = 1, **kw):
        super().__init__(message, headers=_retry_after(retry_after), **kw)


class ServerError(APIError):
    status, type = 500, "server_error"

    def __init__(self, message: str = "internal server error (see the server log)", **kw):
        super().__init__(message, **kw)


class Unavailable(APIError):
    status, type = 503, "unavailable_error"

    def __init__(self, message: str = "model unavailable, retry shortly", retry_after: float = 1, **kw):
        super().__init__(message, headers=_retry_after(retry_after), **kw)


def envelope(err: APIError) -> dict:
    """The JSON body: for a response, or for ``data: {"error": ...}`` in a stream."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.status}}


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception to what the client sees. Unknown exceptions are logged with their traceback and become a
    generic 500: the client never sees internals."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, core.ContextOverflow):  # before InvalidRequest: it is a subclass
        return ContextSizeError(str(exc))
    if isinstance(exc, core.InvalidRequest):
        return InvalidRequestError(str(exc))
    if _is_request_validation_error(exc):
        return validation_error(exc.errors())
    if isinstance(exc, core.KVSlotFull):  # transient: the KV cache is full right now
        return Unavailable("no KV cache room for this request now, retry shortly")
    if isinstance(exc, (core.ModelLoadError, core.IncompatibleDrafter, core.NativeLibraryError)):
        # A preset that cannot load is the operator's misconfiguration: a 500, with details only in the log.
        log.error("model could not be loaded: %s", log_safe(str(exc)))
        return ServerError(f"the model could not be loaded ({type(exc).__name__}; see the server log)")
    log.error("unhandled %s", type(exc).__name__, exc_info=exc)
    return ServerError()


def _is_request_validation_error(exc: BaseException) -> bool:
    """A pydantic error about a *request* body (the client's fault). One about a response model is our bug: 500."""
    from pydantic import ValidationError

    from .schemas import request_models

    return isinstance(exc, ValidationError) and exc.title in {m.__name__ for m in request_models()}


# --- validation errors -> one readable 400 -------------------------------------------------------------------------

_BODY_NOT_OBJECT = ("model_attributes_type", "model_type", "dict_type", "missing")


def validation_error(errs: Iterable[dict], body: Any = None) -> InvalidRequestError:
    """One 400 from pydantic/FastAPI errors: the most specific error, its field path as ``param``.

    ``body`` (the parsed request, when known) lets the path skip pydantic's union-member tags
    (``messages.0.user.content`` -> ``messages[0].content``)."""
    errs = list(errs)
    if not errs:
        return InvalidRequestError("invalid request")
    # A union tries every member; a "wrong type" error from a member that was never meant is the least useful.
    err = next((e for e in errs if not str(e.get("type", "")).endswith("_type")), errs[0])
    loc = list(err.get("loc", ()))
    in_body = bool(loc) and loc[0] == "body"
    if in_body:
        loc = loc[1:]
    kind = err.get("type")
    if kind == "json_invalid":
        reason = (err.get("ctx") or {}).get("error", "JSON decode error")
        where = f" at character {loc[0]}" if loc and isinstance(loc[0], int) else ""
        return InvalidRequestError(f"request body is not valid JSON: {reason}{where}")
    if in_body and not loc and kind in _BODY_NOT_OBJECT:
        return InvalidRequestError("request body must be a JSON object (Content-Type: application/json)")
    param = _field_path(loc, body) or None
    msg = str(err.get("msg", "invalid value"))
    ctx = err.get("ctx") or {}
    if kind in ("union_tag_invalid", "union_tag_not_found"):  # a message without a valid "role"
        field = str(ctx.get("discriminator", "")).strip("'\"") or "role"
        param = f"{param}.{field}" if param else field
        msg = f"must be one of {ctx.get('expected_tags', '')}" if kind == "union_tag_invalid" else "is required"
        if kind == "union_tag_invalid":
            msg += f" (got {ctx.get('tag')!r})"
    others = {_root(e) for e in errs} - {_root(err)}  # other fields that are wrong too (not union members)
    more = f" (and {len(others)} more invalid field{'s' * (len(others) > 1)})" if others else ""
    if param and not msg.startswith(param.split(".")[0].split("[")[0]):
        msg = f"{param}: {msg}"
    return InvalidRequestError(msg + more, param=param)


def _root(err: dict):
    loc = [seg for seg in err.get("loc", ()) if seg != "body"]
    return loc[0] if loc else None


def _field_path(loc: list, body: Any) -> str:
    """``["messages", 0, "content"]`` -> ``messages[0].content``, dropping pydantic's union tags."""
    parts: list[str] = []
    node = body
    for i, seg in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
            node = node[seg] if isinstance(node, list) and -len(node) <= seg < len(node) else None
            continue
        seg = str(seg)
        if isinstance(node, dict) and (seg in node or last):
            keep = True
        elif node is None and body is None:
            keep = "[" not in seg and "(" not in seg  # no body to walk: drop what looks like a type tag
        else:
            keep = False  # a union member's tag, not a key of the input
        if keep:
            parts.append(("." if parts else "") + seg)
            node = node.get(seg) if isinstance(node, dict) else None
    return "".join(parts)


# --- logs ----------------------------------------------------------------------------------------------------------


def log_safe(value: Any, limit: int = 200) -> str:
    """A client-chosen value (model name, id) made safe for one log line: control characters, CR/LF, line
    separators and lone surrogates are escaped, and long values are cut."""
    s = value if isinstance(value, str) else str(value)
    out = []
    for ch in s[:limit]:
        o = ord(ch)
        if o < 0x20 or 0x7F <= o < 0xA0 or ch in "\u2028\u2029" or 0xD800 <= o < 0xE000:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    if len(s) > limit:
        out.append(f"...(+{len(s) - limit} chars)")
    return "".join(out)


# --- FastAPI wiring ------------------------------------------------------------------------------------------------


def _response(err: APIError):
    from fastapi.responses import JSONResponse

    return JSONResponse(envelope(err), status_code=err.status, headers=err.headers or None)


def _from_http_status(status: int, detail: Any, method: str, path: str, headers: Optional[dict]) -> APIError:
    text = detail if isinstance(detail, str) and detail else "error"
    if status == 404:  # Starlette's "Not Found" is an unknown route; other details are the raiser's own words
        return NotFoundError(f"not found: {method} {log_safe(path)}" if text in ("Not Found", "error") else text)
    if status == 405 and text == "Method Not Allowed":
        text = f"method {method} is not allowed for {log_safe(path)}"
    if status == 401:
        return AuthenticationError(text, headers=headers)
    if status == 413:
        return APIError(text, status=413, headers=headers)
    if status == 503:
        return Unavailable(text)
    if status >= 500:
        return ServerError()
    return APIError(text, status=status, headers=headers)  # 400, 405, 415 ...: invalid_request_error


def install(app) -> None:
    """Route every error of ``app`` through the envelope."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def on_api_error(request, exc: APIError):
        return _response(exc)

    async def on_validation(request, exc: RequestValidationError):
        return _response(validation_error(exc.errors(), getattr(exc, "body", None)))

    async def on_http(request, exc: HTTPException):
        err = _from_http_status(exc.status_code, exc.detail, request.method, request.url.path, exc.headers)
        return _response(err)

    async def on_other(request, exc: Exception):
        return _response(to_api_error(exc))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(core.PydflashError, on_other)
    app.add_exception_handler(Exception, on_other)


def _error_doc(description: str) -> dict:
    from .schemas import ErrorResponse

    return {"model": ErrorResponse, "description": description}


def responses(*statuses: int) -> dict:
    """OpenAPI ``responses=`` for a route, so schemathesis knows our error statuses and their body."""
    docs = {400: "invalid request or context overflow", 401: "missing or wrong API key", 404: "unknown model",
            413: "body too large", 429: "queue full (Retry-After)", 500: "server error",
            503: "model loading or restarting (Retry-After)"}
    return {s: _error_doc(docs[s]) for s in (statuses or docs)}
