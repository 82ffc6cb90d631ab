"""Distillation on the target's stored top-k probabilities (``topk.py``): soft labels next to the hard label.

The hard label says only which token the target picked. The stored top-k also says how sure it was and what came
second, which a drafter of 11 M parameters can use: where the target hesitates, the drafter need not be sure either.

Loss per label position (``topk_kl``): KL(p || q) over k + 1 outcomes, the teacher's k tokens and one bucket for
the rest of the vocabulary,

    KL = sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest),   p_rest = 1 - sum_i p_i

with p the target's probabilities (from its full softmax, stored as log-probabilities) and q the drafter's. It is
zero exactly when the drafter gives those k tokens the target's probabilities (and so the rest its mass too), and
the rest bucket keeps the drafter from parking mass on tokens the target rules out. The trainer mixes it with the
hard-label cross-entropy: (1 - w) CE + w KL (``--distill-stored w``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

_FLOOR = 1e-6  # probability mass a bucket keeps at least, so that log(0) never appears


def topk_kl(logits: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
    """logits: the drafter's [n, V]; t_ids [n, k] (long); t_logp [n, k]: the target's log-probabilities of those
    ids. Returns the KL of each row [n] (float32)."""
    logq = F.log_softmax(logits.float(), dim=-1)
    lq = logq.gather(1, t_ids)                                           # [n, k]
    lp = t_logp.float()
    p = lp.exp()
    kl = (p * (lp - lq)).sum(-1)
    p_rest = (1.0 - p.sum(-1)).clamp(min=0.0)
    q_rest = (1.0 - lq.exp().sum(-1)).clamp(min=_FLOOR)
    # xlogy: a teacher whose k tokens hold all its mass contributes nothing for the rest
    return kl + torch.xlogy(p_rest, p_rest) - p_rest * q_rest.log()


def dense_soft(data: dict, rows: list[tuple[int, int, int]], L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's soft labels laid out like its tokens: ([B, L, k] ids, [B, L, k] log-probabilities), entry t of a
    row being the target's top-k for token t. rows: (row index, prompt length, row length as trained) per batch
    row; prompt positions (never labels: anchors sit in the response) stay 0."""
    k = data["topk_ids"].shape[1]
    ids = np.zeros((len(rows), L, k), dtype=np.int64)
    logp = np.zeros((len(rows), L, k), dtype=np.float32)
    for b, (i, p, n) in enumerate(rows):
        s = int(data["resp_starts"][i])
        ids[b, p:n] = data["topk_ids"][s:s + n - p]
        logp[b, p:n] = data["topk_logp"][s:s + n - p]
    return torch.from_numpy(ids).to(device), torch.from_numpy(logp).to(device)
