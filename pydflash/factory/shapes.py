"""Real model shapes for random-weight speed runs: a target and its z-lab DFlash drafter, at full size or scaled down.

Qwen3-4B (Qwen/Qwen3-4B config.json): hidden_size 2560, num_hidden_layers 36, num_attention_heads 32,
num_key_value_heads 8, head_dim 128 (so q is 4096 wide over a 2560-wide residual), intermediate_size 9728,
vocab_size 151936, tie_word_embeddings true, rope_theta 1000000, rms_norm_eps 1e-6, max_position_embeddings 40960,
q/k RMS norms (llama.cpp arch qwen3). The 2507 releases differ only in rope_theta (5e6) and context (262,144).

z-lab/Qwen3-4B-DFlash-b16 (its config.json): a Qwen3-style stack of 5 layers at the target's widths (hidden 2560,
FFN 9728, 32 heads of 128, 8 KV heads), block_size 16, num_target_layers 36, dflash_config.target_layer_ids
[1, 9, 17, 25, 33], mask_token_id 151669 (a slot past Qwen's 151,669 named tokens, inside the padded 151,936).
The ids follow dflash's build_target_layer_ids (zlab_target_layer_ids below): as many taps as drafter layers, spread
over 1 .. num_target_layers - 3. docs/byo-pair.md gives the same figures (537.4 M parameters, 58 tensors).

Gemma-4-31B (llama.cpp arch gemma4; factory/gemma4.py names its particulars): 60 layers, five sliding (window
1024, 16 KV heads of 256) then one full (4 KV heads of 512, K used as V, a quarter of each head rotated), hidden
5376, 32 query heads, FFN 21504, 262,144 tokens, tied embeddings, final logit softcap 30: 30.7 B parameters, the
published count, and the 880 KiB of F16 KV per token that docs/byo-pair.md sizes. z-lab/gemma-4-31B-it-DFlash (as
docs/byo-pair.md reads its config): 5 layers of 64 query heads of 128 and 8 KV heads, FFN 10752, six taps [1, 12,
23, 35, 46, 57], mask 4 (Gemma's <mask>), block 16: 1,536 M parameters. Its first four layers are sliding
(window 2048) in z-lab's config; llama.cpp's dflash graph runs every layer over the whole block and context, which
at a benchmark's contexts (under 2048) is the same work, so the shape leaves the window out.

Scaled shapes (``scaled``) keep what matters to the code path: the query-to-KV head ratio, a q wider than the
residual, the tied head, the full vocabulary and mask id, the drafter's depth and its taps, row widths that K-quants
take whole; the widths and the target's depth shrink, so a CPU test runs the same writers, quantizer and loaders in
seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import gguf

from . import gemma4, targets
from . import weights as W
from .drafter import DrafterSpec
from .gemma4 import Gemma4Spec
from .targets import TargetSpec, tie_output
from .tokenizer import TinyVocab


@dataclass(frozen=True)
class DrafterDims:
    """A drafter's own attention and FFN widths, where they are not the target's (z-lab's Gemma-4-31B drafter)."""
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int


@dataclass(frozen=True)
class ScaleShape:
    name: str
    target: TargetSpec
    n_vocab: int
    mask_id: int
    drafter_layers: int
    block_size: int = 16
    drafter_dims: DrafterDims | None = None  # None: the target's widths (z-lab's Qwen3 drafters)
    n_taps: int = 0  # target layers the drafter reads; 0: as many as it has layers

    def drafter(self) -> DrafterSpec:
        """z-lab's drafter for this target: the target's residual width, its own attention and FFN widths where
        drafter_dims gives them, its taps spread as dflash spreads them."""
        t = self.target
        d = self.drafter_dims or DrafterDims(t.n_head, t.n_head_kv, t.head_dim, t.n_ff)
        return DrafterSpec(
            n_layer=self.drafter_layers, n_embd=t.n_embd, n_head=d.n_head, n_head_kv=d.n_head_kv,
            head_dim=d.head_dim, n_ff=d.n_ff, n_ctx=t.n_ctx, rms_eps=t.rms_eps, rope_base=t.rope_base,
            target_layer_ids=zlab_target_layer_ids(t.n_layer, self.n_taps or self.drafter_layers),
            n_target_layers=t.n_layer, mask_token_id=self.mask_id, n_vocab=self.n_vocab,
            input_embedding_scale=t.embedding_scale, block_size=self.block_size, logit_softcap=t.logit_softcap,
        )

    def target_plan(self) -> list[W.Planned]:
        """The target's tensors in generation order (gemma4 has its own layout)."""
        if isinstance(self.target, Gemma4Spec):
            return gemma4.target_plan(self.target, self.n_vocab)
        return targets.target_plan(self.target, self.n_vocab)

    def add_target_keys(self, w: gguf.GGUFWriter, vocab: TinyVocab, dtype: str) -> None:
        if isinstance(self.target, Gemma4Spec):
            gemma4.add_target_keys(w, self.target, vocab, dtype)
        else:
            targets.add_target_keys(w, self.target, vocab, dtype)

    @property
    def target_params(self) -> int:
        return sum(math.prod(p.shape) for p in self.target_plan())


def zlab_target_layer_ids(n_target_layers: int, n_draft_layers: int) -> tuple[int, ...]:
    """dflash's build_target_layer_ids: evenly spaced over 1 .. n - 3 (HF ids: the output of layer i)."""
    if n_draft_layers == 1:
        return (n_target_layers // 2,)
    start, end = 1, n_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (n_draft_layers - 1))) for i in range(n_draft_layers))


QWEN3_4B = ScaleShape(
    "qwen3-4b",
    tie_output(TargetSpec("qwen3", n_layer=36, n_embd=2560, n_head=32, n_head_kv=8, head_dim=128, n_ff=9728,
                          n_ctx=40960, rms_eps=1e-6, rope_base=1_000_000.0)),
    n_vocab=151_936, mask_id=151_669, drafter_layers=5,
)


def _round_up(x: float, quantum: int) -> int:
    return int(-(-x // quantum) * quantum)


def scaled(shape: ScaleShape, name: str, width: int, heads: int, depth: int, quantum: int = 256) -> ScaleShape:
    """shape with its widths / width, its head counts / heads, its target layers / depth (a Gemma-4 target keeps
    the head of its sliding pattern: depth must leave whole periods of it).

    Every matrix's input width is rounded up to a multiple of quantum: K-quant blocks span 256 values of a row, and
    llama.cpp quantizes a row of another width to a fallback type, so a Q4_K_M of narrower rows would not run the
    Q4_K / Q6_K kernels the full-size model runs. The ratios then hold up to that rounding (Qwen3-4B / 10: a
    256-wide residual, q 512 wide against 409.6, FFN 1024 against 972.8); at width 1 the shape is unchanged."""
    t = shape.target
    if t.n_embd % width or (t.n_embd // width) % quantum or t.n_head % heads or t.n_head_kv % heads \
            or t.n_layer % depth:
        raise ValueError(f"{shape.name} does not divide by width {width}, heads {heads}, depth {depth}")
    n_head = t.n_head // heads

    def head_dim(n_q_heads: int, size: int) -> int:  # a head size whose q projection is wide as the full one / width
        return _round_up(n_q_heads * size / width, quantum) // (n_q_heads // heads)

    changes = dict(n_embd=t.n_embd // width, n_ff=_round_up(t.n_ff / width, quantum), n_head=n_head,
                   n_head_kv=t.n_head_kv // heads, head_dim=head_dim(t.n_head, t.head_dim), n_layer=t.n_layer // depth)
    if isinstance(t, Gemma4Spec):
        changes.update(head_dim_full=head_dim(t.n_head, t.head_dim_full), n_head_kv_full=t.n_head_kv_full // heads,
                       swa_layers=t.swa_layers[:t.n_layer // depth])
    small = replace(t, **changes)
    dims = shape.drafter_dims
    if dims is not None:
        dims = DrafterDims(dims.n_head // heads, dims.n_head_kv // heads, head_dim(dims.n_head, dims.head_dim),
                           _round_up(dims.n_ff / width, quantum))
    # tie_output's embedding std and final-norm gain depend on the width
    return replace(shape, name=name, target=tie_output(small) if t.tied_output else small, drafter_dims=dims)


# 256 wide, 8 query / 2 KV heads of 64, FFN 1024, 9 layers; the drafter's taps [1, 2, 4, 5, 6]
TINY_QWEN3_4B = scaled(QWEN3_4B, "tiny-qwen3-4b", width=10, heads=4, depth=4)

GEMMA4_31B = ScaleShape(
    "gemma4-31b",
    tie_output(Gemma4Spec(
        gemma4.GEMMA4, n_layer=60, n_embd=5376, n_head=32, n_head_kv=16, head_dim=256, n_ff=21504, n_ctx=262_144,
        rms_eps=1e-6, rope_base=1_000_000.0, rope_base_swa=10_000.0, sliding_window=1024,
        swa_layers=((True,) * 5 + (False,)) * 10, head_dim_full=512, n_head_kv_full=4)),
    n_vocab=262_144, mask_id=4, drafter_layers=5,
    drafter_dims=DrafterDims(n_head=64, n_head_kv=8, head_dim=128, n_ff=10752), n_taps=6,
)

# 256 wide, 8 query heads (sliding: 4 KV heads of 64; full: 1 of 128), FFN 1024, 12 layers (two periods of five
# sliding and one full); the drafter 16 heads of 32, 2 KV heads, FFN 512, taps [1, 3, 4, 6, 7, 9]
TINY_GEMMA4_31B = scaled(GEMMA4_31B, "tiny-gemma4-31b", width=21, heads=4, depth=5)

SHAPES = {s.name: s for s in (QWEN3_4B, TINY_QWEN3_4B, GEMMA4_31B, TINY_GEMMA4_31B)}
