"""scripts/bench/ramp_replay.py: the engine's step costs replaced by a model, counted and taught as modelled."""

import pytest

from pydflash.config import EngineConfig
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.factory import write_tiny_pair
from pydflash.pair import load_pair
from tests.engine.test_adaptive import interp
from tests.helpers.bench import load_bench

ramp_replay = load_bench("ramp_replay")


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("pair"), arch="qwen3", seed=0)


def engine(pair_files, drafter: bool, **kw) -> Engine:
    pair = load_pair(pair_files.target, pair_files.drafter if drafter else None)
    return Engine(pair, EngineConfig(n_slots=2, n_ctx_slot=256, draft_max=15, **kw))


def test_plain_steps_cost_what_the_model_says_warm_ups_included(pair_files):
    eng = engine(pair_files, drafter=False)
    try:
        costs = ramp_replay.ModelledCosts(eng, seed=0, warm=2.0, sigma=0.0)
        prompt = [2] + list(range(100, 111))  # 12 tokens: 11 go through as a prompt chunk, the last is the anchor
        eng.run([Request(prompt, max_tokens=16, ignore_eos=True, temperature=0)])
        m = ramp_replay
        decode = m.PER_SLOT + m.VERIFY[1] / m.FEATURES
        prefill = m.PER_SLOT + interp(m.VERIFY, 11) / m.FEATURES
        # each shape's first two runs at 2x: the prompt's step (its only run) and the first two decode steps
        want = 2.0 * prefill + 2 * 2.0 * decode + 14 * decode
        assert costs.steps == 17 and costs.drafting == 0
        assert costs.seconds == pytest.approx(want, rel=1e-9)
    finally:
        eng.close()
        eng.pair.close()


def test_the_adaptive_policy_learns_the_modelled_costs(pair_files):
    eng = engine(pair_files, drafter=True, adaptive=True, synth_len=5.0)
    try:
        costs = ramp_replay.ModelledCosts(eng, seed=0, warm=3.0, sigma=0.0)
        eng.run([Request([2] + list(range(100, 131)), max_tokens=64, ignore_eos=True, temperature=0)])
        m = ramp_replay
        curves = eng.drafting.costs
        assert curves.drop_first and costs.drafting > 0
        # a plain step with features on, as modelled (its warm-up runs dropped, so not 3x)
        assert curves.verify(1, 1, True) == pytest.approx(m.PER_SLOT + m.VERIFY[1], rel=1e-6)
        # one slot's whole block: the drafter forward as modelled, with the 1-16 feature rows a drafting step injects
        block = m.DRAFT0 + m.DRAFT_SLOT + 16 * m.DRAFT_TOKEN
        assert block + m.ROW - 1e-9 <= curves.draft(16) <= block + 16 * m.ROW + 1e-9
    finally:
        eng.close()
        eng.pair.close()
