"""How long each HTTP hop keeps an idle connection open.

A client's pool reuses an idle connection until its own expiry; a server closes one after its idle timeout. Where
the two are equal the timers race: a request sent on a connection as the server closes it is lost (httpx raises
ReadError or RemoteProtocolError, and does not resend a POST). httpx, and so the openai client, expire idle
connections after 5 s, and uvicorn closes them after 5 s by default. A benchmark's 16-client level, whose clients
sat ~5 s idle while three other servers played their rounds, lost a request twice in one run (an H100,
2026-12-06). So every server here keeps an idle connection open longer than its clients keep it in their pools.
"""

from __future__ import annotations

# The public server: longer than the pools of common clients (httpx and openai 5 s, aiohttp 15 s), as nginx's
# default keepalive_timeout is. An idle connection costs a socket and nothing else.
PUBLIC_S = 75
# A worker: its only client is the router, over a private Unix socket.
WORKER_S = 600
# The router's pool to a worker expires idle connections well before the worker would close them.
ROUTER_POOL_S = 60.0
