"""The regression bar for the shipped drafter on text that repeats itself (CPU, in make test).

A DFlash drafter sees the target's hidden states, so text that literally repeats is the easiest case it gets. A
regression in feature alignment (which layers, which positions), in the Gemma embedding scale, or in training shows
up here first as tau falling towards 1-2. The full suite (14 cases, 256 tokens, bar 8) runs on the GPU through
``scripts/bench/drafter_eval.py --suite``; this is four of its cases at a lower bar. The drafter shipped before
version 2 reached 4.45 on them; version 2 7.76, version 3 8.98 (an AMD EPYC CPU, 2026-12-01), version 5 10.24
(2026-12-02), version 6 9.85 (2026-12-06), version 7 10.24 (2026-12-06, later); on an AVX-512 Intel Xeon
(2026-12-07) version 7 10.45, version 8 10.24.
The drafter alone: the engine's copied chains (engine/lookup.py) are off, or they would hide a regression here."""

from __future__ import annotations

import pytest

from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER
from pydflash.engine.engine import Engine
from pydflash.engine.request import Request
from pydflash.engine.stats import Stats
from pydflash.pair import load_pair
from pydflash.train.eval_suite import REPETITION

CASES = ("a b c repeated", "csv rows", "markdown table", "log lines")
BAR = 5.0
TOKENS = 128


def repetition_tau(target: str, drafter: str) -> tuple[float, dict]:
    """Committed tokens per target forward over the cases together (greedy, 15 drafts per step)."""
    pair = load_pair(target, drafter)
    engine = Engine(pair, EngineConfig(n_slots=len(CASES), n_ctx_slot=1024, n_threads=0, lookup=False))
    try:
        reqs = [Request(REPETITION[name], max_tokens=TOKENS, add_special=True) for name in CASES]
        results = engine.run(reqs)
    finally:
        engine.close()
    per_case = {name: results[r.id].stats for name, r in zip(CASES, reqs)}
    total = Stats()  # the cases together, as scripts/bench/drafter_eval.py totals a bucket
    for st in per_case.values():
        total.merge_tokens(st)
    return total.mean_accept_len, {n: round(st.mean_accept_len, 2) for n, st in per_case.items()}


@pytest.mark.real_model
@pytest.mark.slow
def test_shipped_drafter_copies_repetitive_text(gemma_path):
    tau, per_case = repetition_tau(gemma_path, str(SHIPPED_DRAFTER))
    assert tau >= BAR, per_case


def test_model_card_states_the_shipped_files():
    """Every shipped drafter file is in MODEL_CARD.md's table with its exact size and sha256 (the card is what a
    user checks a download against; a retrained drafter must update it)."""
    import hashlib
    import re

    from pydflash.defaults import MODELS_DIR

    card = (MODELS_DIR / "MODEL_CARD.md").read_text()
    table = re.findall(r"^\| `([^`]+)` \|[^|]*\| (\d+) \| `([0-9a-f]{64})` \|$", card, re.M)
    rows = {name: (int(size), sha) for name, size, sha in table}
    shipped = sorted(p.name for p in MODELS_DIR.iterdir() if p.name != "MODEL_CARD.md")
    assert sorted(rows) == shipped
    for name, (size, sha) in rows.items():
        data = (MODELS_DIR / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, sha), name
