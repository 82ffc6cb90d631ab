"""A tiny Gemma-4 pair whose drafter drafts right exactly when its noise embeddings are scaled once by sqrt(n_embd).

Why: a random tiny drafter accepts next to nothing, so it cannot show that a wrong transform costs acceptance. This
pair is built so that acceptance measures the scale alone:

- target: every token embedding carries one shared direction m (the mask token's does not), the layers add little
  (post-attention / post-FFN norm weights 0.05), and output row T is beta * m_hat: after any context the greedy
  pick is T.
- drafter (one layer): the attention adds nothing (attn_output = 0). At a mask position the FFN reads
  ffn_norm(s * e_mask), one unit vector u whatever the scale s, and adds c = gamma * m_hat - s0 * e_mask with
  s0 = sqrt(n_embd). The residual is s * e_mask + c = gamma * m_hat + (s - s0) * e_mask: along m (it drafts T,
  every draft accepted) when s = s0; unscaled (s = 1) or scaled twice (s = s0^2) the e_mask term dominates by a
  factor of 14 or more and it drafts other tokens (nothing accepted).

The target is a gemma4 (factory/gemma4.py) with these weights; the drafter is the factory's upstream-layout writer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import gemma4
from . import weights as W
from .drafter import drafter_spec, drafter_weights, write_drafter_gguf
from .tokenizer import build_vocab

TOKEN = 300  # the target's answer: a normal token of the tiny vocabulary
BETA = 6.0  # head gain along m: T's logit ~ 8 * BETA before the softcap, others stay below ~13
GAMMA = 0.5  # the drafter's residual along m; against (s - s0) * |e_mask| >= 7 when the scale is wrong
GATE = 8.0  # silu(8) ~ 8: the FFN unit is in its linear range


@dataclass(frozen=True)
class ScaleProbePair:
    target: Path
    drafter: Path
    token: int  # what the target always picks
    mask_token_id: int
    embedding_scale: float  # the one scale that makes the drafter right


def write_scale_probe_pair(out_dir: str | Path, seed: int = 0, embedding_scale_key: float | None = None,
                           beta: float = BETA) -> ScaleProbePair:
    """Write target.gguf and drafter.gguf under out_dir (drafter.gguf states embedding_scale_key when given).

    beta: the head's gain along m. A smaller one (2-3) lets the context win at times: the target then picks T
    only at some positions, and the drafter's blocks are accepted in part (rollbacks inside a block)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab()
    spec = replace(gemma4.default_spec(), post_norm_gain=0.05)
    rng = W.rng_for(seed, 99)
    t = gemma4.target_weights(spec, rng, vocab.n_vocab, "f32")
    m_hat = _shared_direction(t["token_embd.weight"], vocab.mask_id, rng)
    t["output.weight"][TOKEN] = beta * m_hat
    gemma4.write_target(out_dir / "target.gguf", spec, vocab, t, "f32")

    dspec = drafter_spec(spec, 1, vocab)
    d = drafter_weights(dspec, rng, "f32")
    _steer_drafter(d, t["token_embd.weight"][vocab.mask_id], m_hat, spec.embedding_scale)
    write_drafter_gguf(out_dir / "drafter.gguf", dspec, vocab, d, "f32", embedding_scale_key)
    return ScaleProbePair(out_dir / "target.gguf", out_dir / "drafter.gguf", TOKEN, vocab.mask_id,
                          spec.embedding_scale)


def _shared_direction(embd: np.ndarray, mask_id: int, rng: np.random.Generator) -> np.ndarray:
    """Add one direction m to every embedding row but the mask's (which loses its m component); return m_hat."""
    m = rng.standard_normal(embd.shape[1]).astype(np.float32)
    m_hat = m / np.linalg.norm(m)
    size = np.linalg.norm(embd, axis=1).mean()  # m as long as a typical row
    mask = embd[mask_id] - (embd[mask_id] @ m_hat) * m_hat
    embd += size * m_hat
    embd[mask_id] = mask
    return m_hat


def _steer_drafter(d: dict[str, np.ndarray], e_mask: np.ndarray, m_hat: np.ndarray, s0: float) -> None:
    """Zero the attention output; make the FFN add gamma * m_hat - s0 * e_mask at mask positions."""
    p = "layers.0."
    d[p + "self_attn.o_proj.weight"][:] = 0.0
    x = e_mask / np.sqrt(np.mean(e_mask**2))  # RMS-normed mask embedding: the same for every scale
    u = d[p + "post_attention_layernorm.weight"] * x  # what the FFN reads (HF's post-attention norm = pre-FFN)
    for name in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        d[f"{p}{name}.weight"][:] = 0.0
    d[p + "mlp.gate_proj.weight"][0] = GATE * u / (u @ u)
    d[p + "mlp.up_proj.weight"][0] = u / (u @ u)
    silu = GATE / (1.0 + np.exp(-GATE))
    d[p + "mlp.down_proj.weight"][:, 0] = (GAMMA * m_hat - s0 * e_mask) / silu
