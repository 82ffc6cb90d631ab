"""Acceptance and timing statistics, per request and in aggregate."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens taken from the prompt cache, not prefilled
    n_generated: int = 0
    n_steps: int = 0  # target forwards after prefill (each commits >= 1 token)
    n_draft_steps: int = 0  # steps that carried drafts
    n_drafted: int = 0
    n_accepted: int = 0
    n_feature_steps: int = 0  # steps whose target forward extracted features (adaptive drafting skips them)
    n_lookup_steps: int = 0  # drafting steps that verified a chain copied from the text, not the drafter's (lookup.py)
    n_lookup_accepted: int = 0  # drafts accepted in those steps
    # accept_hist[i]: how often draft position i+1 was accepted; drafted_hist[i]: how often it was proposed.
    accept_hist: list[int] = field(default_factory=list)
    drafted_hist: list[int] = field(default_factory=list)
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_commit: float = 0.0
    t_host: float = 0.0

    def record_step(self, n_drafts: int, n_accepted: int, n_committed: int) -> None:
        self.n_steps += 1
        self.n_generated += n_committed
        if n_drafts:
            self.n_draft_steps += 1
            self.n_drafted += n_drafts
            self.n_accepted += n_accepted
            grow = n_drafts - len(self.drafted_hist)
            if grow > 0:
                self.drafted_hist += [0] * grow
                self.accept_hist += [0] * grow
            for i in range(n_drafts):
                self.drafted_hist[i] += 1
            for i in range(n_accepted):
                self.accept_hist[i] += 1

    def merge_tokens(self, other: "Stats") -> None:
        """Add another request's counts. Times are not merged: the engine's own are per step, shared by slots."""
        for name in ("n_prompt", "n_cached", "n_generated", "n_steps", "n_draft_steps", "n_drafted", "n_accepted",
                     "n_feature_steps", "n_lookup_steps", "n_lookup_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.t_prefill += other.t_prefill
        for mine, theirs in ((self.accept_hist, other.accept_hist), (self.drafted_hist, other.drafted_hist)):
            if len(theirs) > len(mine):
                mine += [0] * (len(theirs) - len(mine))
            for i, v in enumerate(theirs):
                mine[i] += v

    @property
    def accept_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accept_len(self) -> float:
        """tau: committed tokens per target forward, counting the bonus."""
        return self.n_generated / self.n_steps if self.n_steps else 0.0

    @property
    def t_decode(self) -> float:
        return self.t_draft + self.t_verify + self.t_commit + self.t_host

    @property
    def tokens_per_second(self) -> float:
        return self.n_generated / self.t_decode if self.t_decode > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "n_prompt": self.n_prompt,
            "n_cached": self.n_cached,
            "n_generated": self.n_generated,
            "n_steps": self.n_steps,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "n_feature_steps": self.n_feature_steps,
            "n_lookup_steps": self.n_lookup_steps,
            "n_lookup_accepted": self.n_lookup_accepted,
            "accept_rate": round(self.accept_rate, 4),
            "mean_accept_len": round(self.mean_accept_len, 4),
            "accept_by_position": [round(a / d, 4) if d else 0.0 for a, d in zip(self.accept_hist, self.drafted_hist)],
            "tokens_per_second": round(self.tokens_per_second, 2),
            "time_s": {
                "prefill": round(self.t_prefill, 4),
                "draft": round(self.t_draft, 4),
                "verify": round(self.t_verify, 4),
                "commit": round(self.t_commit, 4),
                "host": round(self.t_host, 4),
            },
        }
