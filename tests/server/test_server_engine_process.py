"""A worker's engine process (server/engine_process.py) through its client (server/engine_process_client.py),
without HTTP: outputs equal the same engine's in this process, errors cross the pipe typed, the state reaches the
client with the last events, and an engine process that dies fails every waiter with EngineDead instead of leaving it
hanging."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time

import pytest

from pydflash.config import EngineConfig
from pydflash.engine.engine import Engine
from pydflash.engine.request import Event, Request
from pydflash.errors import DecodeError, InvalidRequest, ModelLoadError, PydflashError
from pydflash.pair import load_pair
from pydflash.server import ops
from pydflash.server.engine_client import ACCEPTED, EngineClient, EngineDead, Sink
from pydflash.server.engine_process import portable
from pydflash.server.engine_process_client import EngineProcessClient
from pydflash.server.preset import Preset


def _preset(p, **kw) -> Preset:
    return Preset(name="tiny", target=str(p.target), drafter=str(p.drafter), n_slots=2, n_ctx_slot=512, **kw)


async def _run(link: EngineProcessClient, reqs: list[Request]) -> dict[int, list[int]]:
    sinks = {r.id: Sink() for r in reqs}
    for r in reqs:
        link.submit(r, sinks[r.id])
    out = {}
    for r in reqs:
        assert (await asyncio.wait_for(sinks[r.id].get(), 30))[1] == ACCEPTED
        toks = []
        while True:
            _, ev = await asyncio.wait_for(sinks[r.id].get(), 30)
            assert isinstance(ev, Event), ev
            toks += ev.tokens
            if ev.finished:
                break
        out[r.id] = toks
    return out


def test_the_engine_process_serves_as_the_engine_does(tiny):
    p = tiny("gemma3")
    reqs = [Request([1, 5, 9, 13, 17], max_tokens=40, ignore_eos=True),
            Request([1, 6, 10, 14], max_tokens=25, ignore_eos=True)]
    engine = Engine(load_pair(p.target, p.drafter), EngineConfig(n_slots=2, n_ctx_slot=512))
    try:
        expected = {r.id: engine.generate(r.prompt, max_tokens=r.max_tokens, ignore_eos=True).tokens for r in reqs}
    finally:
        engine.close()
        engine.pair.close()
    steps = []
    link = EngineProcessClient(_preset(p).to_json(), on_step=lambda state, events: steps.append((state, events)))
    try:
        assert isinstance(link, EngineClient)  # what the worker's routes are written against
        assert link.info.n_ctx_slot == 512 and link.info.drafter and link.info.n_slots == 2
        link.start()

        async def main():
            got = await _run(link, reqs)
            erased = await link.call(ops.erase_slot, 0)  # a finished request's prompt was kept in its slot
            assert erased["id_slot"] == 0 and erased["n_erased"] > 0, erased
            with pytest.raises(InvalidRequest, match="no slot 7"):  # typed, across the pipe
                await link.call(ops.erase_slot, 7)
            return got

        assert asyncio.run(main()) == expected
        assert (link.n_busy, link.n_waiting) == (0, 0)  # the state came with the last events
        tokens = [t for _, events in steps for ev in events for t in ev.tokens]
        assert sorted(tokens) == sorted(t for r in reqs for t in expected[r.id])  # every event reached the metrics
    finally:
        link.stop()
    assert link.proc.returncode == 0


def test_an_engine_process_that_dies_fails_every_waiter(tiny):
    p = tiny("gemma3")
    deaths = []
    link = EngineProcessClient(_preset(p).to_json(), on_death=deaths.append)
    link.start()

    async def main():
        sink = Sink()
        req = Request([1, 5, 9], max_tokens=100_000 // 256, ignore_eos=True)
        link.submit(req, sink)
        assert (await asyncio.wait_for(sink.get(), 30))[1] == ACCEPTED
        await asyncio.wait_for(sink.get(), 30)  # it is decoding
        os.kill(link.proc.pid, signal.SIGKILL)
        while True:
            _, item = await asyncio.wait_for(sink.get(), 30)
            if not isinstance(item, Event):
                break
        assert isinstance(item, EngineDead) and "SIGKILL" in str(item), item
        with pytest.raises(EngineDead):
            await link.call(ops.erase_slot, 0)
        late = Sink()
        link.submit(Request([1, 2], max_tokens=2), late)
        assert isinstance((await asyncio.wait_for(late.get(), 5))[1], EngineDead)

    try:
        asyncio.run(main())
        deadline = time.monotonic() + 5  # the reader thread calls on_death after it has failed the waiters
        while not deaths and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(deaths) == 1 and isinstance(deaths[0], EngineDead)
    finally:
        link.stop()


def test_a_preset_that_cannot_load_is_a_load_error(tmp_path):
    bad = Preset(name="bad", target=str(tmp_path / "missing.gguf"), drafter="")
    with pytest.raises(ModelLoadError):
        EngineProcessClient(bad.to_json())


def test_an_error_that_does_not_pickle_crosses_as_its_kind_and_message():
    exc = DecodeError(1, "llama_decode")  # its __init__ takes (code, what): pickle cannot rebuild it
    with pytest.raises(TypeError):
        pickle.loads(pickle.dumps(exc))
    sent = pickle.loads(pickle.dumps(portable(exc)))
    assert type(sent) is PydflashError and "llama_decode failed with code 1" in str(sent)
    bad_id = InvalidRequest("token id 9 outside the vocabulary")
    assert portable(bad_id) is bad_id
