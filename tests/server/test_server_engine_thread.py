"""The worker's engine thread: a step's events reach their streams when the next step's target forward starts (the
event loop then writes them while the engine thread waits on the device), in order and all of them."""

from __future__ import annotations

import asyncio

from pydflash.config import EngineConfig
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.pair import load_pair
from pydflash.server.engine_client import ACCEPTED, EngineClient, Sink
from pydflash.server.engine_thread import EngineThread


def test_events_go_out_before_the_next_forward_and_all_of_them(tiny, monkeypatch):
    p = tiny("gemma3")
    engine = Engine(load_pair(p.target, p.drafter), EngineConfig(n_slots=2, n_ctx_slot=512))
    reqs = [Request([1, 5, 9, 13, 17], max_tokens=40, ignore_eos=True),
            Request([1, 6, 10, 14], max_tokens=25, ignore_eos=True)]
    expected = {r.id: engine.generate(r.prompt, max_tokens=r.max_tokens, ignore_eos=True).tokens for r in reqs}

    in_step, ends = [], []  # ends: target forwards counted at the end of each step
    step = engine.step

    def traced_step():
        in_step.append(True)
        try:
            return step()
        finally:
            in_step.pop()
            ends.append(engine.target_ctx.n_decodes)

    monkeypatch.setattr(engine, "step", traced_step)
    deliveries = []  # (inside a step?, target forwards so far, events) per delivery
    put_all = Sink.put_all

    def traced_put_all(items):
        deliveries.append((bool(in_step), engine.target_ctx.n_decodes, [item[1] for _, item in items]))
        put_all(items)

    monkeypatch.setattr(Sink, "put_all", staticmethod(traced_put_all))

    async def main():
        eloop = EngineThread(engine)
        assert isinstance(eloop, EngineClient)  # what the worker's routes are written against
        sinks = {r.id: Sink() for r in reqs}
        eloop.start()
        try:
            for r in reqs:
                eloop.submit(r, sinks[r.id])
            got = {}
            for r in reqs:
                assert (await sinks[r.id].get())[1] == ACCEPTED
                toks = []
                while True:
                    ev = (await asyncio.wait_for(sinks[r.id].get(), 30))[1]
                    toks += ev.tokens
                    if ev.finished:
                        break
                got[r.id] = toks
            return got
        finally:
            eloop.stop()

    assert asyncio.run(main()) == expected
    # every delivery but the last came from inside a step, before its target forward: the forwards counted then are
    # those of the steps that made the events (the one about to run has not counted yet)
    assert len(deliveries) > 2
    assert all(inside for inside, _, _ in deliveries[:-1]) and not deliveries[-1][0]
    inside = [n for _, n, _ in deliveries[:-1]]
    assert all(a < b for a, b in zip(inside, inside[1:])) and set(inside) <= set(ends)
    assert deliveries[-1][2][-1].finished  # the last step's events go out at once when no step follows
    engine.close()


def test_an_exception_in_a_step_fails_every_request_once_and_reports_the_death(tiny, monkeypatch):
    """A Python exception out of ``Engine.step`` mid-generation (not a process kill): each running request gets the
    events its earlier steps made, then one ``EngineDead`` naming the cause; ``dead`` holds it and ``on_death`` runs
    once, which is what makes a worker report 503 and exit for the router to respawn it."""
    from pydflash.server.engine_client import EngineDead

    p = tiny("qwen3")
    engine = Engine(load_pair(p.target, p.drafter), EngineConfig(n_slots=2, n_ctx_slot=512))
    step, steps = engine.step, []

    def failing_step():
        steps.append(None)
        if len(steps) == 4:
            raise RuntimeError("a bug in the step")
        return step()

    monkeypatch.setattr(engine, "step", failing_step)
    deaths = []
    reqs = [Request([1, 5, 9, 13], max_tokens=200, ignore_eos=True), Request([1, 6, 10], max_tokens=200,
                                                                                ignore_eos=True)]

    async def main():
        eloop = EngineThread(engine, on_death=deaths.append)
        sinks = {r.id: Sink() for r in reqs}
        eloop.start()
        try:
            for r in reqs:
                eloop.submit(r, sinks[r.id])
            ends = {}
            for r in reqs:
                assert (await sinks[r.id].get())[1] == ACCEPTED
                tokens = 0
                while True:
                    item = (await asyncio.wait_for(sinks[r.id].get(), 30))[1]
                    if isinstance(item, BaseException):
                        ends[r.id] = (tokens, item)
                        break
                    assert not item.finished  # 200 tokens cannot be done in three steps
                    tokens += len(item.tokens)
            return eloop, ends
        finally:
            eloop.stop()

    eloop, ends = asyncio.run(main())
    assert all(isinstance(err, EngineDead) and "a bug in the step" in str(err) for _, err in ends.values())
    assert all(tokens > 0 for tokens, _ in ends.values())  # what the steps before the failure made arrived first
    assert isinstance(eloop.dead, RuntimeError) and len(deaths) == 1 and deaths[0] is eloop.dead
    engine.close()
    engine.pair.close()
