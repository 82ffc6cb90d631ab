"""Request body size limit (HTTP 413), as an ASGI middleware in front of everything else.

A declared ``Content-Length`` over the limit is refused before a byte of the body is read. A body without one
(chunked) is read up to the limit and refused as soon as it passes it; otherwise it is replayed to the app.
uvicorn has no such limit of its own.
"""

from __future__ import annotations

import json


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                return await self._refuse(send, 400, "invalid Content-Length header")
            if too_big:
                return await self._refuse(send, 413, f"request body over the {self.max_bytes} byte limit")
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away while sending
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(send, 413, f"request body over the {self.max_bytes} byte limit")
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later reads wait for the disconnect, as usual

        return await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send, status: int, message: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": status}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
