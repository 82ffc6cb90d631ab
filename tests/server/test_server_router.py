"""The router over several presets: "any" follows the most recent model, LRU eviction, 404 for unknown names, and
a worker killed mid-stream takes down only its own requests."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import time

import pytest

from tests.helpers.server_util import Server, write_models_toml


def two_model_server(tiny, folder, n_ctx_slot: int, max_resident: int, args=(), log=None) -> Server:
    """Presets alpha (tiny gemma3 pair, the default) and beta (tiny llama pair)."""
    a, b = tiny("gemma3"), tiny("llama")
    cfg = write_models_toml(folder / "models.toml", {
        "alpha": {"target": str(a.target), "drafter": str(a.drafter), "n_slots": 2, "n_ctx_slot": n_ctx_slot},
        "beta": {"target": str(b.target), "drafter": str(b.drafter), "n_slots": 2, "n_ctx_slot": n_ctx_slot},
    }, default="alpha")
    return Server(["--config", str(cfg), "--max-resident", str(max_resident), *args], log=log)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("router")
    with open(folder / "server.log", "wb") as log:  # the server's stdout and stderr, as the benchmarks capture them
        srv = two_model_server(tiny, folder, n_ctx_slot=512, max_resident=1, args=["-v"], log=log)
        yield srv
        srv.stop()


def test_worker_logs_reach_the_server_output(server):
    """A worker's stderr (its INFO lines under -v, warnings, tracebacks) shows in the server's own output; before,
    the router kept it in a file read only for exit reports."""
    pid = worker_pid(server, "alpha")  # the preloaded default, the only worker yet
    log_path = pathlib.Path(server.log.name)
    deadline = time.monotonic() + 10
    while True:
        text = log_path.read_text(errors="replace")
        # lines only a worker writes: uvicorn's startup with the worker's process id and its Unix socket, and the
        # worker's own logging at INFO (its "worker" format), which -v passes down as --log-level info
        if (f"Started server process [{pid}]" in text and "Uvicorn running on unix socket" in text
                and "worker pydflash.server.chat INFO chat template:" in text):
            break
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.1)


def resident(server) -> set[str]:
    return {m["id"] for m in server.http().get("/v1/models").json()["data"] if m["meta"]["resident"]}


def ask(server, model, **kw):
    body = {"prompt": "hello", "max_tokens": 4, "temperature": 0, **kw}
    if model is not None:
        body["model"] = model
    r = server.http().post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["model"]


def test_any_follows_the_most_recent_and_lru_evicts(server):
    assert resident(server) == {"alpha"}  # the default preset loads at start
    assert ask(server, "any") == "alpha" and ask(server, None) == "alpha"
    assert ask(server, "beta") == "beta"
    assert resident(server) == {"beta"}  # max_resident 1: alpha was evicted
    assert ask(server, "any") == "beta"
    assert ask(server, "alpha") == "alpha" and resident(server) == {"alpha"}
    assert server.metric("pydflash_models_resident") == 1


def test_unknown_model_is_404(server):
    r = server.http().post("/v1/completions", json={"model": "gamma", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


@pytest.fixture(scope="module")
def pair_server(tiny, tmp_path_factory):
    srv = two_model_server(tiny, tmp_path_factory.mktemp("kill"), n_ctx_slot=2048, max_resident=2)
    yield srv
    srv.stop()


def worker_pid(server, model) -> int:
    """The worker serving `model`: the one whose command line carries the preset's name."""
    for pid in server.worker_pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f'"name": "{model}"'.encode() in f.read():
                return pid
    raise AssertionError(f"no worker for {model}")


def engine_of(server, worker: int) -> int:
    """The engine process a worker started (server/engine_process.py)."""
    for pid in server.engine_pids():
        with open(f"/proc/{pid}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == worker:
                return pid
    raise AssertionError(f"worker {worker} has no engine process")


def gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped by init
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_sigkill_worker_mid_stream(pair_server):
    srv = pair_server
    ask(srv, "alpha")
    ask(srv, "beta")
    victim = worker_pid(srv, "alpha")
    its_engine = engine_of(srv, victim)
    frames = []
    body = {"model": "alpha", "prompt": "hello", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with srv.http().stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            frames.append(line[6:])
            if len(frames) == 3:
                os.kill(victim, signal.SIGKILL)
    assert frames[-1] == "[DONE]"
    err = json.loads(frames[-2])["error"]
    assert err["code"] == 503 and err["type"] == "unavailable_error"
    assert gone(its_engine, 10)  # the worker's engine process (and its device memory) went with it
    assert ask(srv, "beta") == "beta"  # the other model is unaffected
    deadline = time.monotonic() + 60
    while True:  # 503 with Retry-After while alpha respawns, then it serves again
        r = srv.http().post("/v1/completions", json={"model": "alpha", "prompt": "hi", "max_tokens": 2})
        if r.status_code == 200:
            break
        assert r.status_code == 503 and "retry-after" in r.headers, r.text
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert worker_pid(srv, "alpha") != victim
    assert srv.metric("pydflash_worker_restarts_total", model="alpha") == 1


@pytest.mark.parametrize("victim", ["engine", "worker"])
def test_a_native_abort_names_its_cause_in_the_router_log(tiny, tmp_path, victim):
    """A native abort mid-step (GGML_ASSERT, a CUDA error: SIGABRT, no Python traceback) happens in a worker's engine
    process: the client's stream ends with a 503 and the router reports the worker's exit with the cause
    faulthandler wrote. A worker killed the same way is reported with its own status and cause, not a stack frame
    or 'still running', even when the client sees the stream break before the process is reaped."""
    p = tiny("llama")
    log_path = tmp_path / "router.log"
    with open(log_path, "wb") as log:
        srv = Server(["-m", str(p.target), "-md", str(p.drafter), "-np", "1", "-c", "2048"], log=log)
        try:
            body = {"prompt": "hello", "max_tokens": 1500, "ignore_eos": True, "temperature": 0, "stream": True}
            target = srv.engine_pids()[0] if victim == "engine" else srv.worker_pids()[0]
            killed, frames = False, []
            with srv.http().stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        frames.append(line[6:])
                    # once: the count stays 3 over the blank lines between events, and a second kill of the reaped
                    # process raised ProcessLookupError under load
                    if len(frames) == 3 and not killed:
                        os.kill(target, signal.SIGABRT)
                        killed = True
            assert frames[-1] == "[DONE]" and json.loads(frames[-2])["error"]["code"] == 503, frames[-3:]
            # the stream handler's report when the stream broke; the watcher's when the worker exited
            report = b"lost the worker" if victim == "worker" else b"died ("
            deadline = time.monotonic() + 15
            while report not in log_path.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            srv.stop()
    lost = [ln for ln in log_path.read_text().splitlines() if report.decode() in ln]
    assert lost, log_path.read_text()[-2000:]
    status = "status 70" if victim == "engine" else "status -6"  # 70: the worker's exit after its engine died
    assert status in lost[0] and "Fatal Python error: Aborted" in lost[0], lost[0]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_router_drops_only_the_cancelled_read_wakeup_report(loop_kind, caplog):
    """anyio's Unix-socket reads (httpx to the workers) can be woken after they were cancelled; the loop would log that
    as an ERROR under load (seen on every bench run). The router's handler drops exactly that report and still logs
    any other callback failure."""
    import asyncio

    from pydflash.server.router import quiet_unix_read_race

    loop = asyncio.new_event_loop() if loop_kind == "asyncio" else pytest.importorskip("uvloop").new_event_loop()
    try:
        loop.set_exception_handler(quiet_unix_read_race)
        fut = loop.create_future()
        fut.cancel()
        loop.call_soon(fut.set_result, None)  # what anyio's reader callback does after a cancelled receive()

        def broken():
            raise ZeroDivisionError("a real failure")

        loop.call_soon(broken)
        with caplog.at_level("ERROR", logger="asyncio"):
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    messages = [r.getMessage() + str(r.exc_info) for r in caplog.records]
    assert not any("InvalidStateError" in m for m in messages), messages
    assert any("ZeroDivisionError" in m for m in messages), messages


def test_a_dead_workers_report_survives_its_respawn():
    """The stream handler's report on a worker that died names that process's status and last words even when the
    watcher respawns the worker (a new running process with a stderr of its own) before the handler looks again;
    before, it said 'still running' (seen under load in test_a_native_abort_names_its_cause_in_the_router_log)."""
    import asyncio
    import sys

    from pydflash.server.router import Worker

    w = Worker.__new__(Worker)  # only the process bookkeeping: no preset, no socket
    w.proc, w._stderr, w._last_exit = None, None, None
    code = "import sys, time; time.sleep(0.5); sys.stderr.write('Fatal Python error: Aborted\\n'); sys.exit(6)"
    w._spawn([sys.executable, "-c", code])

    async def stream_breaks_then_respawn():
        handler = asyncio.create_task(w.settled_exit_report(wait_s=5.0))
        await asyncio.sleep(0)  # the handler starts waiting on the dying process
        w.proc.wait()  # it dies; the watcher respawns before the handler's next look (the loop is blocked here)
        w._spawn([sys.executable, "-c", "import time; time.sleep(30)"])
        return await handler

    try:
        report = asyncio.run(stream_breaks_then_respawn())
        assert report.startswith("status 6") and "Fatal Python error: Aborted" in report, report
        assert w.exit_report() == "still running"  # the new process
    finally:
        w.proc.kill()
        w.proc.wait()


def test_idle_connections_outlive_the_clients_pools(server):
    """A client's pool reuses an idle connection for up to 5 s (httpx, and so the openai client); a server that
    closes it after the same 5 s (uvicorn's default) races the pool, and a request sent as it closes is lost (a
    benchmark's 16-client level lost two in one run). Both hops keep an idle connection open longer than that:
    the public server, and the worker the router reaches over its Unix socket. Each serves a second request on a
    connection left idle for 6 s."""
    pid = worker_pid(server, "alpha")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    uds = args[args.index(b"--uds") + 1].decode()
    public = socket.create_connection(("127.0.0.1", server.port))
    worker = socket.socket(socket.AF_UNIX)
    worker.connect(uds)
    try:
        for sock in (public, worker):
            assert health(sock).startswith(b"HTTP/1.1 200"), "the first request"
        time.sleep(6)
        for sock in (public, worker):
            assert health(sock).startswith(b"HTTP/1.1 200"), "the connection was closed while idle"
    finally:
        public.close()
        worker.close()


def health(sock: socket.socket) -> bytes:
    """GET /health on an open HTTP/1.1 connection, kept alive; the response's bytes (b"" if the peer closed)."""
    sock.settimeout(10)
    data = b""
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return data
            data += chunk
    except ConnectionError:  # closed by the peer: reset, or a broken pipe
        return data
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return data
