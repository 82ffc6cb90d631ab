"""Stored top-k distillation (pydflash/train/distill.py, topk.py, drafter.draft_logits_loss's soft labels) on tiny
random data, on the CPU."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from pydflash.train.distill import dense_soft, topk_kl
from pydflash.train.drafter import DFlashDrafter, DrafterConfig, draft_logits_loss
from pydflash.train.topk import reduce_rows


def _teacher(logits, k):
    ids, logp = reduce_rows(logits.numpy(), k)
    return torch.from_numpy(ids).long(), torch.from_numpy(logp)


def test_kl_is_zero_when_the_drafter_is_the_teacher_and_positive_otherwise():
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 3
    ids, logp = _teacher(logits, 5)
    assert torch.allclose(logp, F.log_softmax(logits, -1).gather(1, ids))  # reduce_rows: true log-probabilities
    assert topk_kl(logits, ids, logp).abs().max() < 1e-5
    # shifting every logit by a constant is the same distribution
    assert topk_kl(logits + 7.0, ids, logp).abs().max() < 1e-5
    other = logits + torch.randn_like(logits)
    assert (topk_kl(other, ids, logp) > 1e-3).all()


def test_kl_counts_mass_the_drafter_moves_outside_the_teachers_tokens():
    """Same ratios among the k tokens, but half the mass parked elsewhere: the rest bucket sees it."""
    logits = torch.tensor([[4.0, 3.0, 2.0, -10.0, -10.0, -10.0]])
    ids, logp = _teacher(logits, 3)
    moved = logits.clone()
    moved[0, 3] = math.log(torch.exp(logits[0, :3]).sum().item())  # token 3 now holds half the mass
    assert topk_kl(moved, ids, logp).item() > 0.3


def tiny():
    torch.manual_seed(0)
    c = DrafterConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      intermediate_size=64, vocab_size=50, num_target_layers=8, target_layer_ids=(1, 3, 5),
                      block_size=4, mask_token_id=4, input_embedding_scale=math.sqrt(32))
    return c, DFlashDrafter(c).train()


def _grads(model, soft, weight, embd, feats, tokens, valid, anchors):
    model.zero_grad()
    loss, _ = draft_logits_loss(model, embd, feats, tokens, valid, anchors, soft=soft, soft_weight=weight)
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_the_weight_changes_the_gradient_and_zero_is_the_hard_label_loss():
    c, m = tiny()
    embd = torch.randn(c.vocab_size, c.hidden_size)
    B, L, k = 2, 14, 4
    feats, tokens = torch.randn(B, L, 3 * c.hidden_size), torch.randint(5, c.vocab_size, (B, L))
    valid, anchors = torch.tensor([14, 12]), torch.tensor([[3, 6], [4, 7]])
    # a teacher that is sure of the label but gives other tokens a share
    ids = torch.randint(5, c.vocab_size, (B, L, k))
    ids[..., 0] = tokens
    logp = torch.log(torch.tensor([0.6, 0.2, 0.1, 0.05])).expand(B, L, k).clone()
    base_loss, base = _grads(m, None, 0.0, embd, feats, tokens, valid, anchors)
    off_loss, off = _grads(m, (ids, logp), 0.0, embd, feats, tokens, valid, anchors)
    on_loss, on = _grads(m, (ids, logp), 0.5, embd, feats, tokens, valid, anchors)
    assert off_loss == base_loss and torch.equal(off, base)
    assert on_loss != base_loss and (on - base).abs().max() > 1e-4


def test_soft_labels_line_up_with_the_token_they_predict():
    """Entry j of a row's stored top-k predicts response token j, i.e. token prompt_len + j of the row."""
    data = {"resp_starts": np.array([0, 3]), "topk_ids": np.arange(3 + 5)[:, None].repeat(2, 1).astype(np.int32),
            "topk_logp": np.zeros((8, 2), np.float16)}
    ids, _ = dense_soft(data, [(0, 2, 5), (1, 4, 8)], 9, "cpu")
    assert ids[0, :, 0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 0]
    assert ids[1, :, 0].tolist() == [0, 0, 0, 0, 3, 4, 5, 6, 0]
