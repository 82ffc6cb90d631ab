"""How many drafts a slot gets this step.

Drafting pays when the tokens it adds per step outweigh what it costs per step:
    (1 + E[accepted]) / t_spec_step  >  1 / t_plain_step
The engine measures both step times (EMA); each slot tracks its own E[accepted] (EMA). A slot whose drafts do not
pay stops drafting and probes again after a pause that doubles each time it fails (capped), so a useless drafter
costs one probe step every `max_backoff` steps. While paused, the slot's target features still accumulate in its
pending buffer (no drafter work), and are injected in one batch when it probes.
"""

from __future__ import annotations

from dataclasses import dataclass

from .slot import Slot

EMA = 0.3
MAX_BACKOFF = 64


@dataclass
class StepCosts:
    t_spec: float = 0.0  # EMA seconds of a step with drafts
    t_plain: float = 0.0  # EMA seconds of a step without drafts

    def observe(self, drafted: bool, seconds: float) -> None:
        name = "t_spec" if drafted else "t_plain"
        old = getattr(self, name)
        setattr(self, name, seconds if old == 0.0 else (1 - EMA) * old + EMA * seconds)

    @property
    def ratio(self) -> float:
        """t_spec / t_plain; before both are measured assume drafting costs twice a plain step."""
        if self.t_spec == 0.0 or self.t_plain == 0.0:
            return 2.0
        return self.t_spec / self.t_plain


def plan_drafts(slot: Slot, costs: StepCosts) -> int:
    """Drafts for this step under the adaptive policy (slot.draft_max is the ceiling)."""
    if slot.draft_max == 0:
        return 0
    if slot.pause > 0:
        slot.pause -= 1
        return 0
    return slot.draft_max


def observe_acceptance(slot: Slot, n_drafts: int, n_accepted: int, costs: StepCosts) -> None:
    if n_drafts == 0:
        return
    slot.ema_accepted = n_accepted if slot.ema_accepted < 0 else (1 - EMA) * slot.ema_accepted + EMA * n_accepted
    if 1.0 + slot.ema_accepted < costs.ratio:
        slot.pause = slot.backoff
        slot.backoff = min(slot.backoff * 2, MAX_BACKOFF)
    else:
        slot.backoff = 4
