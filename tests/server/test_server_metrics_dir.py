"""The Prometheus multiprocess directory (/tmp/pydflash-metrics-*) that the router makes for itself and its workers
is gone once the server stops, restarts included: a stop leaves nothing behind."""

from __future__ import annotations

import os
import pathlib
import signal

from tests.helpers.server_util import Server, write_models_toml
from tests.server.test_server_sockdir import wait_new_worker

ENV = b"PROMETHEUS_MULTIPROC_DIR="


def metrics_dir_of(pid: int) -> pathlib.Path:
    """The metrics directory a worker writes into, from its environment (inherited from the router)."""
    env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return pathlib.Path(next(e[len(ENV):] for e in env if e.startswith(ENV)).decode())


def test_metrics_dir_is_removed_on_stop(tiny, tmp_path):
    p = tiny("gemma3")
    cfg = write_models_toml(tmp_path / "models.toml", {
        "tiny": {"target": str(p.target), "drafter": "", "n_slots": 1, "n_ctx_slot": 256}})
    srv = Server(["--config", str(cfg)])
    try:
        [worker] = srv.worker_pids()
        metrics_dir = metrics_dir_of(worker)
        assert metrics_dir.name.startswith("pydflash-metrics-") and metrics_dir.is_dir()
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        assert srv.http().post("/v1/completions", json=body).status_code == 200
        assert any(metrics_dir.glob("*.db"))  # in use: the workers' samples are there
        os.kill(worker, signal.SIGKILL)  # a respawned worker writes into the same directory
        worker = wait_new_worker(srv, worker)
        assert metrics_dir_of(worker) == metrics_dir
    finally:
        srv.stop()
    assert not metrics_dir.exists(), list(metrics_dir.iterdir())
