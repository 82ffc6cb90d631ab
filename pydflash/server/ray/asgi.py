"""One HTTP request through an ASGI app in this process, streamed: the head, then each body chunk as it is sent.

A Serve replica hosts the same worker app that ``pydflash-server`` runs behind a Unix socket, and calls it here
instead of over a socket. (``httpx.ASGITransport`` would do, but it collects the whole body before returning, so
an SSE stream would arrive in one piece at the end.)

    async for part in call(app, "/v1/completions", body):   # Head first, then bytes
        ...

Closing the generator early (the caller went away, or was cancelled) tells the app its client disconnected, as
uvicorn would, so the worker cancels the engine requests and frees their slots.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator, Union

SEND_QUEUE = 64  # body messages buffered before the app's send() waits: a reader that stalls stalls the app,
# whose own send timeout (sse-starlette's) then frees the slot, as it would behind a socket


@dataclass
class Head:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


async def call(app, path: str, body: bytes, method: str = "POST") -> AsyncIterator[Union[Head, bytes]]:
    path, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
        "root_path": "", "client": ("127.0.0.1", 0), "server": ("replica", 0), "state": {},
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    out: asyncio.Queue = asyncio.Queue(SEND_QUEUE)
    task = asyncio.ensure_future(app(scope, receive, out.put))
    try:
        while True:
            msg = await _next(out, task)
            if msg is None:  # the app returned (or raised) without ending its body
                task.result()
                return
            if msg["type"] == "http.response.start":
                yield Head(msg["status"], {k.decode("latin-1"): v.decode("latin-1") for k, v in msg["headers"]})
            elif msg["type"] == "http.response.body":
                chunk = msg.get("body", b"")
                more = msg.get("more_body", False)
                # what else is already queued goes along: one hop per step of the engine, not per SSE line
                while more and not out.empty():
                    nxt = out.get_nowait()
                    chunk += nxt.get("body", b"")
                    more = nxt.get("more_body", False)
                if chunk:
                    yield chunk
                if not more:
                    return
    finally:
        gone.set()  # the app sees http.disconnect if it still listens
        if not task.done():
            task.cancel()
        # an exception after the app answered (Starlette re-raises what its error middleware turned into a 500)
        # is the app's to log, not ours to raise
        with contextlib.suppress(BaseException):
            await task


async def _next(out: asyncio.Queue, task: asyncio.Future):
    """The app's next message, or None once the app is done and sent nothing more."""
    if not out.empty():
        return out.get_nowait()
    get = asyncio.ensure_future(out.get())
    try:
        await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():
            get.cancel()
    if get.done() and not get.cancelled():
        return get.result()
    return out.get_nowait() if not out.empty() else None
