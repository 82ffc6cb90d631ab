"""``pydflash_requests_total`` counts every generation request exactly once with its outcome: 4xx rejections (the
router's and the workers'), a stream lost to an engine kill (an error, not also a cancellation), and streams lost
to a worker kill (which the dead worker cannot count)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.helpers.server_util import Server, write_models_toml

N_CTX = 512
OUTCOMES = ("ok", "error", "cancelled", "rejected")
LONG = {"model": "tiny", "prompt": "hello", "max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    p = tiny("gemma3")
    cfg = write_models_toml(tmp_path_factory.mktemp("counts") / "models.toml", {
        "tiny": {"target": str(p.target), "drafter": str(p.drafter), "n_slots": 2, "n_ctx_slot": N_CTX},
        "other": {"target": str(p.target), "drafter": "", "n_slots": 1, "n_ctx_slot": N_CTX},
    }, default="tiny")
    srv = Server(["--config", str(cfg), "--max-body-mb", "1"])
    yield srv
    srv.stop()


def outcomes(server) -> dict[str, float]:
    return {o: server.metric("pydflash_requests_total", outcome=o) for o in OUTCOMES}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if after[k] != before[k]}


def wait_serving(server, timeout=60.0) -> None:
    """Until a request is served again (after a kill, /health can read 200 before the dying worker is noticed)."""
    deadline = time.monotonic() + timeout
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    while server.http().post("/v1/completions", json=body).status_code != 200:
        assert time.monotonic() < deadline, "the model did not come back"
        time.sleep(0.2)


def wait_counts(server, before: dict, want: dict, timeout=10.0) -> dict:
    """The counters' change once it reaches want (counts land a moment after the client saw the end)."""
    deadline = time.monotonic() + timeout
    while True:
        got = delta(before, outcomes(server))
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def stream_until_killed(server, pid: int) -> list[str]:
    """A long stream; after its first text frame the process pid is killed. The frames that followed."""
    frames = []
    with server.http().stream("POST", "/v1/completions", json=LONG) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if not frames:
                os.kill(pid, signal.SIGKILL)
            frames.append(line[6:])
    return frames


def test_ok_is_counted_once(server):
    before = outcomes(server)
    assert server.http().post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}
                              ).status_code == 200
    assert wait_counts(server, before, {"ok": 1}) == {"ok": 1}


def test_rejections_are_counted_by_status(server):
    before = outcomes(server)
    status = {s: server.metric("pydflash_requests_rejected_total", status=str(s)) for s in (400, 404, 413)}
    h = server.http()
    assert h.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 0}).status_code == 400
    assert h.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
                  ).status_code == 404
    too_long = {"model": "tiny", "prompt": [1] * N_CTX, "max_tokens": 4}  # refused by the worker's engine
    assert h.post("/v1/completions", json=too_long).status_code == 400
    assert h.post("/v1/completions", json={"model": "tiny", "prompt": "x" * (2 << 20)}).status_code == 413
    assert wait_counts(server, before, {"rejected": 4}) == {"rejected": 4}
    after = {s: server.metric("pydflash_requests_rejected_total", status=str(s)) for s in (400, 404, 413)}
    assert {s: after[s] - status[s] for s in status} == {400: 2, 404: 1, 413: 1}
    assert server.metric("pydflash_requests_rejected_total", model="tiny", status="400") >= 1  # the worker's


def test_engine_kill_mid_stream_is_one_error(server):
    wait_serving(server)
    before = outcomes(server)
    [engine] = server.engine_pids()
    frames = stream_until_killed(server, engine)
    assert frames[-1] == "[DONE]" and "error" in json.loads(frames[-2])
    assert wait_counts(server, before, {"error": 1}) == {"error": 1}  # not also "cancelled"
    wait_serving(server)


def test_worker_kill_mid_stream_is_one_error(server):
    wait_serving(server)
    before = outcomes(server)
    [worker] = server.worker_pids()
    frames = stream_until_killed(server, worker)
    assert frames[-1] == "[DONE]" and "error" in json.loads(frames[-2])
    assert wait_counts(server, before, {"error": 1}) == {"error": 1}
    wait_serving(server)
