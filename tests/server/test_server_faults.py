"""Faults and load: cancelled and abandoned requests free their slots, a full queue answers 429 with Retry-After,
and the server keeps serving."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time

import httpx
import pytest

from tests.helpers.server_util import Server, write_models_toml


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    p = tiny("gemma3")
    cfg = write_models_toml(tmp_path_factory.mktemp("faults") / "models.toml", {
        "tiny": {"target": str(p.target), "drafter": str(p.drafter), "n_slots": 4, "n_ctx_slot": 2048,
                 "max_queue": 256},
        "narrow": {"target": str(p.target), "drafter": "", "n_slots": 1, "n_ctx_slot": 2048, "max_queue": 2},
    }, default="tiny")
    srv = Server(["--config", str(cfg), "--max-resident", "2"])
    yield srv
    srv.stop()


LONG = {"model": "tiny", "prompt": "hello", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def wait_idle(server, model="tiny", timeout=3.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        busy = server.metric("pydflash_slots_busy", model=model)
        queued = server.metric("pydflash_queue_depth", model=model)
        if busy == 0 and queued == 0:
            return
        assert time.monotonic() < deadline, f"slots busy {busy}, queued {queued} after {timeout} s"
        time.sleep(0.1)


def quick_request_time(server) -> float:
    t = time.monotonic()
    r = server.http().post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8})
    assert r.status_code == 200, r.text
    return time.monotonic() - t


def test_cancel_fifty_streams_mid_flight(server):
    async def one(client):
        async with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return  # closes the stream: the client goes away mid-generation (or while queued)

    async def main():
        async with httpx.AsyncClient(base_url=server.base, timeout=httpx.Timeout(30.0)) as client:
            tasks = [asyncio.ensure_future(one(client)) for _ in range(50)]
            await asyncio.sleep(1.0)
            for t in tasks:
                t.cancel()  # the queued ones never got a frame: abandon them too
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    assert quick_request_time(server) < 5.0
    wait_idle(server)


def test_two_hundred_abandoned_after_half_a_second(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.base, timeout=0.5) as client:
            res = await asyncio.gather(*[client.post("/v1/completions", json=LONG) for _ in range(200)],
                                       return_exceptions=True)
        return res

    res = asyncio.run(main())
    assert all(isinstance(r, httpx.TimeoutException) or r.status_code in (200, 429) for r in res)
    assert quick_request_time(server) < 5.0
    wait_idle(server)


def test_disconnect_frees_the_slot_within_a_second(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/v1/completions", json=LONG, timeout=0.5)
    t = time.monotonic()
    wait_idle(server, timeout=2.0)
    assert time.monotonic() - t < 1.5


def test_full_queue_is_429_with_retry_after(server):
    body = {**LONG, "model": "narrow", "max_tokens": 300}
    with cf.ThreadPoolExecutor(10) as pool:
        rs = list(pool.map(lambda _: server.http().post("/v1/completions", json=body), range(10)))
    codes = sorted(r.status_code for r in rs)
    assert set(codes) <= {200, 429}, codes
    assert codes.count(200) >= 2  # one running + at least one queued (arrival order races the step loop)
    refused = [r for r in rs if r.status_code == 429]
    assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in refused)


def test_more_requests_than_slots_first_in_first_out(server):
    done = []

    def run(i):
        r = server.http().post("/v1/completions", json={**LONG, "model": "narrow", "max_tokens": 40})
        assert r.status_code == 200
        done.append(i)

    with cf.ThreadPoolExecutor(3) as pool:
        futs = []
        for i in range(3):
            futs.append(pool.submit(run, i))
            time.sleep(0.15)
        for f in futs:
            f.result()
    assert done == [0, 1, 2]
