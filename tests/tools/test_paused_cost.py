"""scripts/bench/paused_cost.py: a paused step of the speculative engine against a plain one, in one process."""

import json
import os

import pytest

from pydflash.factory import write_tiny_pair
from tests.helpers.bench import load_bench

paused_cost = load_bench("paused_cost")


@pytest.fixture(scope="module")
def pair_args(tmp_path_factory):
    pair = write_tiny_pair(str(tmp_path_factory.mktemp("pair")), arch="gemma3", seed=0)
    return ["--ngl", "0", "--threads", "2", "--slots", "1", "--capacity", "2", "--cache",
            "--target", str(pair.target), "--drafter", str(pair.drafter)]


def test_paused_variants_never_draft_and_are_paired_with_plain(pair_args, tmp_path):
    out = paused_cost.main(pair_args + ["--steps", "20", "--warmup", "5", "--repeats", "2",
                                        "--variants", "plain,paused,paused-notaps", "--out", str(tmp_path / "p.json")])
    level = out["levels"]["1"]
    assert out["capacity"] == 2 and out["cache"] is True and (tmp_path / "p.json").exists()
    for v in ("plain", "paused", "paused-notaps"):
        m = level[v]["median"]
        assert len(level[v]["rounds"]) == 2
        # a held pause commits one token a step and never runs the drafter: what is measured is the plain path
        assert m["tokens_per_step"] == 1.0 and m["drafter_ms"] == 0.0, (v, m)
        assert 0 < m["host_ms"] < m["step_ms"] and 0 < m["target_ms"] < m["step_ms"]
    assert "step_vs_plain" not in level["plain"]
    assert level["paused"]["step_vs_plain"] > 0 and level["paused-notaps"]["step_vs_plain"] > 0


def test_short_requests_are_replaced_in_the_same_order_for_every_variant(pair_args, tmp_path):
    """--request-tokens: requests end every few steps and the next prompt of the frozen fresh set takes the slot,
    the same sequence in each variant (request boundaries are part of what is compared). --step-trace: each
    variant's engine its own trace, prefill steps included (two engines in one file could not be told apart)."""
    before = os.environ.get("PYDFLASH_STEP_TRACE")
    out = paused_cost.main(pair_args + ["--request-tokens", "4", "--steps", "24", "--warmup", "6", "--repeats", "1",
                                        "--variants", "plain,paused", "--step-trace", str(tmp_path / "tr")])
    level = out["levels"]["1"]
    assert out["request_tokens"] == 4
    replaced = [level[v]["rounds"][0]["replaced"] for v in ("plain", "paused")]
    assert replaced[0] >= 3 and replaced[0] == replaced[1], replaced
    traces = {f.name.split(".")[0]: f.read_text().splitlines() for f in (tmp_path / "tr").iterdir()}
    assert sorted(traces) == ["paused", "plain"]
    for lines in traces.values():
        rows = [json.loads(x) for x in lines]
        assert len(rows) >= 24 + 6 and any(r["prefilling"] for r in rows)
    assert os.environ.get("PYDFLASH_STEP_TRACE") == before  # the process's own setting is left as it was
