"""Gemma-3 target in PyTorch, loaded from a llama.cpp GGUF.

The forward mirrors llama.cpp's ``src/models/gemma3.cpp`` (not transformers), so that the
features and greedy tokens the drafter is trained on are the ones llama.cpp will produce:

- input embeddings scaled by sqrt(n_embd) in f32;
- RMSNorm weights are stored with Gemma's ``1 + w`` already folded in by the converter
  (``norm_shift`` in conversion/gemma.py), so the norm is plain ``x * rsqrt(ms + eps) * w``;
- q/k RMSNorm per head, NeoX RoPE with base 10000 on sliding layers and ``rope.freq_base``
  (1e6) on global ones; layer ``il`` slides when ``il % 6 < 5`` (``set_swa_pattern(6)``);
- a key at position p0 is visible to a query at p1 when ``0 <= p1 - p0 < n_swa`` (sliding)
  or ``p0 <= p1`` (global);
- query scaled by 1/sqrt(head_dim) before attention; post-attention and post-FFN norms;
- GELU (tanh approximation) gated FFN; tied output head.

Feature convention: ``layer_out[j]`` is the output of layer j, i.e. HF ``hidden_states[j + 1]``
and llama.cpp's layer-input ``j + 1``.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GemmaConfig:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float          # global layers
    rope_base_swa: float      # sliding layers
    n_swa: int
    swa_pattern: int = 6

    def is_swa(self, il: int) -> bool:
        return il % self.swa_pattern < self.swa_pattern - 1


def _field(reader, key):
    return reader.fields[key].contents()


def load_gguf_weights(path: str, threads: int = 8) -> tuple[GemmaConfig, dict[str, np.ndarray]]:
    """Dequantize every tensor of a gemma3 GGUF to float32 numpy arrays (gguf-py)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"expected a gemma3 GGUF, got {arch!r}")

    def key(name, default=None):
        full = f"gemma3.{name}"
        return _field(reader, full) if full in reader.fields else default

    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = GemmaConfig(
        n_vocab=n_vocab,
        n_embd=int(key("embedding_length")),
        n_layer=int(key("block_count")),
        n_ff=int(key("feed_forward_length")),
        n_head=int(key("attention.head_count")),
        n_head_kv=int(key("attention.head_count_kv")),
        head_dim=int(key("attention.key_length")),
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_base=float(key("rope.freq_base", 1e6)),
        rope_base_swa=float(key("rope.freq_base_swa", 10000.0)),
        n_swa=int(key("attention.sliding_window", 0)),
    )

    def deq(t):
        # ggml shapes are (ne0, ne1); numpy rows are ne1 -> (out, in) like torch Linear
        return t.name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    with ThreadPoolExecutor(threads) as pool:
        weights = dict(pool.map(deq, reader.tensors))
    return cfg, weights


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_neox(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """NeoX RoPE (rotate halves). x: [B, H, T, D], pos: [T] or [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv                      # [.., T, D/2]
    if ang.dim() == 3:                                      # [B, T, D/2] -> [B, 1, T, D/2]
        ang = ang[:, None]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class GemmaTarget(torch.nn.Module):
    """Gemma-3 decoder with a preallocated KV cache shared by a batch of equal-length rows."""

    def __init__(self, cfg: GemmaConfig, weights: dict[str, np.ndarray], dtype=torch.float32,
                 device="cpu"):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.w = {k: torch.from_numpy(v).to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embd = self.w["token_embd.weight"]            # [n_vocab, n_embd], also the output head
        self.device = torch.device(device)
        self.cache_k: list[torch.Tensor] = []
        self.cache_v: list[torch.Tensor] = []

    # -- cache ---------------------------------------------------------------------------
    def reset_cache(self, batch: int, max_len: int) -> None:
        c = self.cfg
        shape = (batch, c.n_head_kv, max_len, c.head_dim)
        self.cache_k = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(c.n_layer)]
        self.cache_v = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in range(c.n_layer)]

    def _mask(self, start: int, T: int, il: int) -> torch.Tensor:
        q = torch.arange(start, start + T, device=self.device)[:, None]
        k = torch.arange(0, start + T, device=self.device)[None, :]
        ok = k <= q
        if self.cfg.n_swa > 0 and self.cfg.is_swa(il):
            ok &= (q - k) < self.cfg.n_swa
        return ok

    # -- forward -------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, start: int = 0, use_cache: bool = False,
                layers_out: tuple[int, ...] = (), logits: str = "all"):
        """tokens: [B, T] at positions start..start+T-1.

        Returns (logits or None, {j: output of layer j [B, T, n_embd]}).
        logits: "all" | "last" | "none".
        """
        c = self.cfg
        B, T = tokens.shape
        x = F.embedding(tokens, self.embd) * math.sqrt(c.n_embd)
        pos = torch.arange(start, start + T, device=self.device)
        feats = {}
        for il in range(c.n_layer):
            p = f"blk.{il}."
            w = self.w
            h = rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)
            q = (h @ w[p + "attn_q.weight"].T).view(B, T, c.n_head, c.head_dim).transpose(1, 2)
            k = (h @ w[p + "attn_k.weight"].T).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
            v = (h @ w[p + "attn_v.weight"].T).view(B, T, c.n_head_kv, c.head_dim).transpose(1, 2)
            q = rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
            base = c.rope_base_swa if c.is_swa(il) else c.rope_base
            q = rope_neox(q, pos, base)
            k = rope_neox(k, pos, base)
            if use_cache:
                self.cache_k[il][:, :, start:start + T] = k
                self.cache_v[il][:, :, start:start + T] = v
                k = self.cache_k[il][:, :, : start + T]
                v = self.cache_v[il][:, :, : start + T]
                mask = self._mask(start, T, il)
            else:
                mask = self._mask(0, T, il)
            if c.n_head_kv != c.n_head:
                k = k.repeat_interleave(c.n_head // c.n_head_kv, dim=1)
                v = v.repeat_interleave(c.n_head // c.n_head_kv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
            a = a.transpose(1, 2).reshape(B, T, c.n_head * c.head_dim) @ w[p + "attn_output.weight"].T
            x = x + rms_norm(a, w[p + "post_attention_norm.weight"], c.rms_eps)
            h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)
            f = F.gelu(h @ w[p + "ffn_gate.weight"].T, approximate="tanh") * (h @ w[p + "ffn_up.weight"].T)
            f = f @ w[p + "ffn_down.weight"].T
            x = x + rms_norm(f, w[p + "post_ffw_norm.weight"], c.rms_eps)
            if il in layers_out:
                feats[il] = x
                if logits == "none" and il == max(layers_out):  # the layers above feed nothing asked for
                    break
        if logits == "none":
            return None, feats
        if logits == "last":
            x = x[:, -1:]
        x = rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        return x @ self.embd.T, feats

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embd.T


@torch.no_grad()
def greedy_generate(target: GemmaTarget, prompts: torch.Tensor, n_new: int,
                    stop_ids: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched greedy continuation of equal-length prompts [B, P].

    Returns (tokens [B, P + n_new], length [B]): length counts tokens up to and including
    the first stop token (rows continue after it, but those tokens are not used).
    """
    B, P = prompts.shape
    target.reset_cache(B, P + n_new)
    out = torch.empty((B, P + n_new), dtype=torch.long, device=prompts.device)
    out[:, :P] = prompts
    logits, _ = target(prompts, 0, use_cache=True, logits="last")
    length = torch.full((B,), P + n_new, dtype=torch.long, device=prompts.device)
    stop = torch.tensor(list(stop_ids) or [-1], device=prompts.device)
    for i in range(n_new):
        nxt = logits[:, -1].argmax(-1)
        out[:, P + i] = nxt
        hit = torch.isin(nxt, stop) & (length == P + n_new)
        length = torch.where(hit, torch.full_like(length, P + i + 1), length)
        if i + 1 < n_new:
            logits, _ = target(nxt[:, None], P + i, use_cache=True, logits="all")
    return out, length
