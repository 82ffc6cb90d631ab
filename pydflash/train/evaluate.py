"""Greedy DFlash decoding, simulated exactly with the torch target and drafter.

Under greedy verification the committed text is the target's own greedy continuation, whatever the
drafter proposes. So one full forward of the target over ``prompt + greedy continuation`` gives the
target features of every committed prefix, and the drafter can be run at *every* possible anchor
in one batched, masked forward. The decode is then a walk over that table:

    n = P                       # anchor: first token after prefill (from the prefill's argmax)
    while n < L - 1:
        m = accepted[n]         # longest prefix of the drafts that equals y[n+1 ..]
        n += m + 1              # m accepted drafts + 1 bonus token (the target's argmax)

tau = committed tokens / steps (counting the bonus); acceptance rate = m / (block - 1).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .drafter import DFlashDrafter, block_mask


@torch.no_grad()
def accept_table(model: DFlashDrafter, embd: torch.Tensor, feats: torch.Tensor, tokens: torch.Tensor,
                 start: int, valid_len: int, head_chunk: int = 4096) -> np.ndarray:
    """accepted[n] for every anchor n in [start, valid_len - 2] of one sequence.

    feats: [1, L, K*D]; tokens: [1, L]. Returns int array of length valid_len (zeros outside).
    """
    c = model.config
    blk = c.block_size
    L = tokens.shape[1]
    anchors = torch.arange(start, valid_len - 1, device=tokens.device)[None]      # [1, M]
    M = anchors.shape[1]
    ctx = model.fuse(feats)
    mask, q_pos = block_mask(anchors, L, blk)
    k_pos = torch.cat([torch.arange(L, device=tokens.device)[None], q_pos], dim=1)
    ids = torch.full((1, M, blk), c.mask_token_id, device=tokens.device, dtype=torch.long)
    ids[:, :, 0] = tokens[:, anchors[0]]
    noise = (F.embedding(ids.view(1, -1), embd) * c.input_embedding_scale).to(ctx.dtype)
    h = model(noise, ctx, q_pos, k_pos, mask)[0].view(M, blk, -1)[:, 1:]         # [M, blk-1, D]
    h = h.reshape(-1, h.shape[-1])
    drafts = torch.cat([(h[s:s + head_chunk] @ embd.T).argmax(-1) for s in range(0, h.shape[0], head_chunk)])
    drafts = drafts.view(M, blk - 1)
    tgt_pos = (anchors[0][:, None] + torch.arange(1, blk, device=tokens.device)[None])   # [M, blk-1]
    in_range = tgt_pos < valid_len
    truth = tokens[0, tgt_pos.clamp(max=L - 1)]
    ok = ((drafts == truth) & in_range).int().cumprod(dim=1).sum(dim=1)
    out = np.zeros(valid_len, dtype=np.int64)
    out[start:valid_len - 1] = ok.cpu().numpy()
    return out


def walk(accepted: np.ndarray, start: int, valid_len: int) -> tuple[int, int, int]:
    """Return (steps, committed tokens, accepted drafts) of a greedy DFlash decode."""
    n, steps, acc_total = start, 0, 0
    while n < valid_len - 1:
        m = int(min(accepted[n], valid_len - 2 - n))
        n += m + 1
        steps += 1
        acc_total += m
    return steps, n - start, acc_total


def evaluate(model, embd, feats, tokens, starts, valid_lens, block: int) -> dict:
    """feats/tokens: per-sequence tensors [N, L, ...]; returns tau and acceptance rate."""
    steps = committed = accepted = 0
    per_seq = []
    for i in range(tokens.shape[0]):
        tab = accept_table(model, embd, feats[i:i + 1], tokens[i:i + 1], int(starts[i]), int(valid_lens[i]))
        s, c, a = walk(tab, int(starts[i]), int(valid_lens[i]))
        steps, committed, accepted = steps + s, committed + c, accepted + a
        per_seq.append(c / max(s, 1))
    return {
        "tau": committed / max(steps, 1),
        "acceptance_rate": accepted / max(steps * (block - 1), 1),
        "steps": steps, "committed": committed, "sequences": int(tokens.shape[0]),
        "tau_per_seq_median": float(np.median(per_seq)) if per_seq else 0.0,
    }
