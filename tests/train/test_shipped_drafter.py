"""The shipped Gemma-3-270M drafter with the real target (CPU): it accepts, and feature alignment matters."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER
from pydflash.engine.slot import Slot

pytestmark = pytest.mark.real_model

PROMPTS = [
    'def is_prime(n):\n    """Return True if n is a prime number."""\n',
    'def read_lines(path):\n    """Return the lines of a text file."""\n',
    "import os\nimport sys\n\n\ndef main():\n",
]


def run(gemma_path, draft_max):
    with api.load(gemma_path, SHIPPED_DRAFTER, EngineConfig(n_ctx_slot=512, draft_max=draft_max, lookup=False)) as llm:
        stats = [llm.generate(p, max_tokens=64).stats for p in PROMPTS]
    drafted = sum(s.n_drafted for s in stats)
    return sum(s.n_accepted for s in stats) / drafted, sum(s.n_generated for s in stats) / sum(s.n_steps for s in stats)


def test_shipped_pair_accepts(gemma_path):
    """Acceptance over the first 4 draft positions > 0.3 on three fixed code prompts; tau > 2 with the full block."""
    rate4, _ = run(gemma_path, 4)
    _, tau = run(gemma_path, None)
    assert rate4 > 0.3, rate4
    assert tau > 2.0, tau


def test_shifting_the_features_by_one_row_collapses_acceptance(gemma_path, monkeypatch):
    """The same drafter fed each committed position's features one row late (the classic off-by-one) accepts far
    less: the alignment the engine asserts is what makes drafts good."""
    aligned, _ = run(gemma_path, 4)
    real = Slot.add_features

    def late(self, rows, positions):
        rows = rows.array()  # a copy of the rows the verify left in the target's buffers (LayerRows)
        # every position gets the features of the position before it (labels unchanged, so only quality drops)
        prev = getattr(self, "_prev_row", rows[:1])
        self._prev_row = rows[-1:]
        return real(self, np.concatenate([prev, rows[:-1]]), positions)

    monkeypatch.setattr(Slot, "add_features", late)
    shifted, _ = run(gemma_path, 4)
    assert shifted < 0.5 * aligned, (aligned, shifted)
