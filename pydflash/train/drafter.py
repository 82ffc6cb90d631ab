"""DFlash drafter in plain PyTorch, parameter-for-parameter z-lab's ``DFlashDraftModel``.

Glossary (shared with pydflash.engine):
- draft block: ``[anchor, MASK x (B-1)]`` at positions a..a+B-1; drafts are the argmax at 1..B-1.
- anchor: the last committed token; it has not been through the target yet.
- target features: the outputs of ``target_layer_ids`` (raw HF ids) at committed positions < a,
  concatenated, projected by ``fc`` and normalised by ``hidden_norm``.

Each layer attends non-causally over ``[context features; noise block]``. The context keys and
values come from the same k/v projections applied to the fused features (no input norm), as in
z-lab's model.py and llama.cpp's src/models/dflash.cpp (``inp_g`` -> wk/wv -> k_norm -> rope).
The token embedding and the output head are the target's (frozen, passed in, never stored).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .distill import topk_kl
from .target import rope_neox


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int = 640
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    intermediate_size: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    vocab_size: int = 262144
    num_target_layers: int = 18
    target_layer_ids: tuple[int, ...] = (1, 4, 8, 12, 15)
    block_size: int = 16
    mask_token_id: int = 4
    input_embedding_scale: float = math.sqrt(640)
    max_position_embeddings: int = 32768

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 1 < self.block_size <= 64:
            raise ValueError("block_size must be in 2..64")
        if any(not 0 <= i < self.num_target_layers for i in self.target_layer_ids):
            raise ValueError("target_layer_ids must index target layers")

    def to_hf_config(self) -> dict:
        """config.json in z-lab's layout (Qwen3 backbone + dflash_config)."""
        d = asdict(self)
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": d["hidden_size"],
            "num_hidden_layers": d["num_hidden_layers"],
            "num_attention_heads": d["num_attention_heads"],
            "num_key_value_heads": d["num_key_value_heads"],
            "head_dim": d["head_dim"],
            "intermediate_size": d["intermediate_size"],
            "hidden_act": "silu",
            "rms_norm_eps": d["rms_norm_eps"],
            "rope_theta": d["rope_theta"],
            "rope_parameters": {"rope_type": "default", "rope_theta": d["rope_theta"]},
            "vocab_size": d["vocab_size"],
            "max_position_embeddings": d["max_position_embeddings"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "num_target_layers": d["num_target_layers"],
            "block_size": d["block_size"],
            "torch_dtype": "bfloat16",
            "dflash_config": {
                "target_layer_ids": list(d["target_layer_ids"]),
                "block_size": d["block_size"],
                "mask_token_id": d["mask_token_id"],
                "input_embedding_scale": d["input_embedding_scale"],
            },
        }

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "DrafterConfig":
        dc = cfg.get("dflash_config", {})
        return cls(
            hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
            head_dim=cfg["head_dim"], intermediate_size=cfg["intermediate_size"],
            rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg.get("rope_theta", 10000.0),
            vocab_size=cfg["vocab_size"], num_target_layers=cfg["num_target_layers"],
            target_layer_ids=tuple(dc["target_layer_ids"]), block_size=dc["block_size"],
            mask_token_id=dc["mask_token_id"], input_embedding_scale=dc["input_embedding_scale"],
        )


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, h, ctx, q_pos, k_pos, mask):
        """h: [B, Q, D] normed noise; ctx: [B, C, D] fused features; mask: [B, 1, Q, C+Q] bool."""
        c = self.c
        B, Q, _ = h.shape
        kv_in = torch.cat([ctx, h], dim=1)
        q = self.q_norm(self.q_proj(h).view(B, Q, -1, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(B, kv_in.shape[1], -1, c.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(B, kv_in.shape[1], -1, c.head_dim).transpose(1, 2)
        q = rope_neox(q, q_pos, c.rope_theta)
        k = rope_neox(k, k_pos, c.rope_theta)
        rep = c.num_attention_heads // c.num_key_value_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
        return self.o_proj(a.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, ctx, q_pos, k_pos, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, q_pos, k_pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """feats: [B, C, n_target_layers * D] -> [B, C, D]."""
        return self.hidden_norm(self.fc(feats))

    def forward(self, noise_emb, ctx, q_pos, k_pos, mask):
        """noise_emb: [B, Q, D] (already scaled); ctx: fused features [B, C, D].

        q_pos: [B, Q] positions of the noise tokens; k_pos: [B, C+Q]; mask: [B, 1, Q, C+Q].
        Returns the final-normed hidden states [B, Q, D] (apply the target head for logits).
        """
        x = noise_emb
        for layer in self.layers:
            x = layer(x, ctx, q_pos, k_pos, mask)
        return self.norm(x)


def block_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention mask and noise positions for many draft blocks per row.

    anchors: [B, M] anchor positions. Noise token (m, j) sits at position anchors[m] + j and sees
    context positions < anchors[m] plus every token of its own block.
    Returns mask [B, 1, M*block, ctx_len + M*block] and q_pos [B, M*block].
    """
    B, M = anchors.shape
    dev = anchors.device
    j = torch.arange(block, device=dev)
    q_pos = (anchors[:, :, None] + j).reshape(B, M * block)
    blk = torch.arange(M, device=dev).repeat_interleave(block)                     # [M*block]
    ctx_ok = torch.arange(ctx_len, device=dev)[None, None, :] < anchors.repeat_interleave(block, 1)[:, :, None]
    self_ok = (blk[:, None] == blk[None, :]).expand(B, -1, -1)
    mask = torch.cat([ctx_ok, self_ok], dim=2)[:, None]
    return mask, q_pos


def position_weights(block: int, gamma: float = 7.0, device=None) -> torch.Tensor:
    """Loss weight of block position k (k = 1..block-1): exp(-(k-1)/gamma); position 0 gets 0."""
    k = torch.arange(block, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def draft_logits_loss(model: DFlashDrafter, embd: torch.Tensor, feats: torch.Tensor, tokens: torch.Tensor,
                      valid_len: torch.Tensor, anchors: torch.Tensor, head_chunk: int = 8192,
                      teacher: torch.Tensor | None = None, topk: int = 0, alpha: float = 0.0,
                      soft: tuple[torch.Tensor, torch.Tensor] | None = None, soft_weight: float = 0.0):
    """Weighted cross-entropy of one batch of draft blocks.

    embd: target embedding / head [V, D]; feats: [B, L, K*D]; tokens: [B, L]; valid_len: [B]
    (labels at positions >= valid_len are ignored); anchors: [B, M].
    teacher: the target's final hidden state after its output norm [B, L, D] (its logits are teacher @ embd.T).
    With it, each position's loss is (1 - alpha) x the cross-entropy on the hard label + alpha x the cross-entropy
    on the target's distribution over its topk tokens (renormalized): top-k logit distillation, which also
    tells the drafter which other tokens the target found likely, not only its argmax.
    soft: the target's stored top-k at each token position ([B, L, k] ids, [B, L, k] log-probabilities:
    distill.dense_soft); with it, each position's loss is (1 - soft_weight) x the hard-label cross-entropy +
    soft_weight x distill.topk_kl (stored distillation: the GGUF target's own probabilities).
    Returns (loss, stats dict with per-position top-1 accuracy [block]).
    """
    c = model.config
    B, L = tokens.shape
    M, blk = anchors.shape[1], c.block_size
    ctx = model.fuse(feats)
    mask, q_pos = block_mask(anchors, L, blk)
    k_pos = torch.cat([torch.arange(L, device=tokens.device).expand(B, L), q_pos], dim=1)
    ids = torch.full((B, M, blk), c.mask_token_id, device=tokens.device, dtype=torch.long)
    ids[:, :, 0] = tokens.gather(1, anchors)
    noise = F.embedding(ids.view(B, M * blk), embd) * c.input_embedding_scale
    h = model(noise.to(ctx.dtype), ctx, q_pos, k_pos, mask)                        # [B, M*blk, D]

    lab_pos = q_pos.clamp(max=L - 1)
    labels = tokens.gather(1, lab_pos)
    w = position_weights(blk, device=tokens.device).repeat(M)[None].expand(B, -1)
    w = w * (q_pos < valid_len[:, None]).float()
    h, labels, w = h.reshape(-1, h.shape[-1]), labels.reshape(-1), w.reshape(-1)
    keep = w > 0
    h, labels, w = h[keep], labels[keep], w[keep]
    distill = teacher is not None and topk > 0 and alpha > 0
    if distill:  # the target's state where each label was predicted: position q_pos - 1, whose token is q_pos's label
        t_pos = (lab_pos - 1).clamp(min=0)
        th = teacher.gather(1, t_pos[..., None].expand(-1, -1, teacher.shape[-1])).reshape(-1, teacher.shape[-1])[keep]
    stored = soft is not None and soft_weight > 0
    if stored:  # the stored top-k that predicted each label: entry q_pos of its row
        k = soft[0].shape[-1]
        s_ids, s_logp = (x.gather(1, lab_pos[..., None].expand(-1, -1, k)).reshape(-1, k)[keep] for x in soft)
    pos_in_blk = torch.arange(blk, device=tokens.device).repeat(M)[None].expand(B, -1).reshape(-1)[keep]
    total = h.new_zeros((), dtype=torch.float32)
    hits = torch.zeros(blk, device=tokens.device)
    counts = torch.zeros(blk, device=tokens.device)
    for s in range(0, h.shape[0], head_chunk):
        lg = (h[s:s + head_chunk] @ embd.T).float()
        ce = F.cross_entropy(lg, labels[s:s + head_chunk], reduction="none")
        if distill:
            with torch.no_grad():
                t_val, t_ids = (th[s:s + head_chunk] @ embd.T).float().topk(topk, dim=-1)
                t_p = torch.softmax(t_val, dim=-1)
            port_ce = -(t_p * torch.log_softmax(lg, dim=-1).gather(1, t_ids)).sum(-1)
            ce = (1.0 - alpha) * ce + alpha * port_ce
        if stored:
            kl = topk_kl(lg, s_ids[s:s + head_chunk], s_logp[s:s + head_chunk])
            ce = (1.0 - soft_weight) * ce + soft_weight * kl
        total = total + (ce * w[s:s + head_chunk]).sum()
        with torch.no_grad():
            hit = (lg.argmax(-1) == labels[s:s + head_chunk]).float()
            p = pos_in_blk[s:s + head_chunk]
            hits.index_add_(0, p, hit)
            counts.index_add_(0, p, torch.ones_like(hit))
    loss = total / w.sum().clamp(min=1e-6)
    return loss, {"acc": hits / counts.clamp(min=1)}
