"""The router's socket directory (/tmp/pydflash-sock-*) holds one socket per live worker, and is gone once the
server stops: restarts and stops leave nothing behind."""

from __future__ import annotations

import os
import pathlib
import signal
import time

from tests.helpers.server_util import Server, write_models_toml


def uds_of(pid: int) -> pathlib.Path:
    """The Unix socket a worker serves on, from its command line (--uds PATH)."""
    args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return pathlib.Path(args[args.index(b"--uds") + 1].decode())


def wait_new_worker(server, old: int, timeout=60.0) -> int:
    deadline = time.monotonic() + timeout
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    while True:
        pids = [p for p in server.worker_pids() if p != old]
        if pids and server.http().post("/v1/completions", json=body).status_code == 200:
            return pids[0]
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.2)


def test_socket_dir_is_removed_on_stop_and_not_grown_by_restarts(tiny, tmp_path):
    p = tiny("gemma3")
    cfg = write_models_toml(tmp_path / "models.toml", {
        "tiny": {"target": str(p.target), "drafter": "", "n_slots": 1, "n_ctx_slot": 256}})
    srv = Server(["--config", str(cfg)])
    try:
        [worker] = srv.worker_pids()
        sock_dir = uds_of(worker).parent
        assert sock_dir.name.startswith("pydflash-sock-") and sock_dir.is_dir()
        for _ in range(2):  # restarts: still one socket, in the same directory
            os.kill(worker, signal.SIGKILL)
            worker = wait_new_worker(srv, worker)
            assert uds_of(worker).parent == sock_dir
            assert len(list(sock_dir.iterdir())) == 1, list(sock_dir.iterdir())
    finally:
        srv.stop()
    assert not sock_dir.exists(), list(sock_dir.iterdir())
