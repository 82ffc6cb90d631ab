"""Tiny random target models in llama.cpp's own GGUF layout: llama, qwen3, gemma3.

Keys and tensor names follow what the vendored loaders read
(src/llama-model.cpp llama_model_base::load_hparams, src/models/{llama,qwen3,gemma3}.cpp):

    {arch}.context_length, .embedding_length, .block_count, .feed_forward_length,
    .attention.head_count, .attention.head_count_kv, .attention.key_length/.value_length,
    .attention.layer_norm_rms_epsilon (required by all three), .rope.freq_base, .vocab_size

    token_embd, output_norm, output (absent when tied: llama.cpp then duplicates token_embd),
    blk.N.attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down
    qwen3, gemma3:  blk.N.attn_q_norm, attn_k_norm            (per-head RMSNorm, [head_dim])
    gemma3:         blk.N.post_attention_norm, post_ffw_norm  (sandwich norms)

Gemma3 specifics handled by llama.cpp itself: the sqrt(n_embd) input-embedding scale
(applied in-graph for token inputs) and sliding-window layers. gemma3's loader calls
load_swa_pattern(ml, 6): a uint `sliding_window_pattern` n marks layer il as SWA when
il % n < n - 1, so pattern 3 over 6 layers gives SWA layers 0,1,3,4 and full layers 2,5.

No HF twin is written for targets, so there is no q/k rope permutation to mirror: the
arrays are generated directly in the GGUF orientation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

from . import weights as W
from .tokenizer import TinyVocab, add_vocab

ARCHS = ("llama", "qwen3", "gemma3")  # the archs written by this module, in one shared layout
# every arch the factory writes; gemma4 has its own layout (factory/gemma4.py). Appended, so that the seed streams
# of the first three (rng_for(seed, ALL_ARCHS.index(arch), ...)) stay what they were.
ALL_ARCHS = ARCHS + ("gemma4",)
GEMMA_ARCHS = ("gemma3", "gemma4")  # scale token embeddings by sqrt(n_embd) inside their own graph


@dataclass(frozen=True)
class TargetSpec:
    arch: str
    n_layer: int
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx: int = 4096
    rms_eps: float = 1e-6
    rope_base: float = 10000.0
    rope_base_swa: float = 10000.0
    sliding_window: int = 0  # 0: no SWA layers
    swa_pattern: int = 0  # gemma3 uint pattern (see module docstring)
    embd_std: float = 1.0  # token embedding std (before any in-graph scale)
    out_gain: float = 4.0  # output head std * sqrt(n_embd): sets logit spread
    out_norm_gain: float = 1.0  # final norm weight; sets logit spread for a tied head
    tied_output: bool = False  # no output.weight: llama.cpp reuses token_embd as the head

    def __post_init__(self) -> None:
        if self.arch not in ALL_ARCHS:
            raise ValueError(f"arch must be one of {ALL_ARCHS}, got {self.arch!r}")
        if self.arch == "llama" and self.n_head * self.head_dim != self.n_embd:
            # llama's loader requires n_rot == n_embd / n_head; qwen3 and gemma read key_length on its own
            # (Qwen3-4B: 32 heads of 128 over a 2560-wide residual)
            raise ValueError("llama needs n_head * head_dim == n_embd")
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")

    @property
    def has_qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3")

    @property
    def embedding_scale(self) -> float:
        """What a drafter sharing this target's embeddings must multiply them by."""
        return float(np.sqrt(self.n_embd)) if self.arch in GEMMA_ARCHS else 1.0

    @property
    def logit_softcap(self) -> float | None:
        """The target's final logit softcap (Gemma-2/4); None where it has none."""
        return None


def default_spec(arch: str, tied_output: bool = False) -> TargetSpec:
    if arch == "llama":
        spec = TargetSpec("llama", n_layer=5)
    elif arch == "qwen3":
        spec = TargetSpec("qwen3", n_layer=5, rope_base=1_000_000.0)
    elif arch == "gemma3":
        spec = TargetSpec(
            "gemma3", n_layer=6, rope_base=1_000_000.0, rope_base_swa=10000.0,
            sliding_window=64, swa_pattern=3,
            embd_std=0.125,  # x sqrt(64) in-graph = unit-RMS residual input, like the others
        )
    else:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    return tie_output(spec) if tied_output else spec


def tie_output(spec: TargetSpec) -> TargetSpec:
    """The spec without output.weight (the head is token_embd), with weights that keep greedy output varied."""
    # Measured on these tiny models: with a tied head, large embeddings make every token
    # predict itself, and unit-RMS ones leave the input too weak, so greedy output falls
    # into a 1-3 token loop. A small embedding (input RMS ~0.24 after any in-graph scale)
    # plus a large final-norm weight (logit std ~2) gives gemma3 6-25 distinct tokens in 64
    # over seeds 0-7; tied llama/qwen3 still loop sooner (1-19), hence untied by default.
    embd_std = 0.24 / spec.embedding_scale
    return replace(spec, tied_output=True, embd_std=embd_std,
                   out_norm_gain=2.0 / (embd_std * np.sqrt(spec.n_embd)))


def head_plan(spec, n_vocab: int) -> list[W.Planned]:
    """The embedding, final norm and (untied) output of any factory target spec, first in its fixed order."""
    e = spec.n_embd
    plan = [W.Planned("token_embd.weight", (n_vocab, e), "embedding", spec.embd_std),
            W.Planned("output_norm.weight", (e,), "norm", spec.out_norm_gain)]
    if not spec.tied_output:
        plan.append(W.Planned("output.weight", (n_vocab, e), "matrix", spec.out_gain))
    return plan


def target_plan(spec: TargetSpec, n_vocab: int) -> list[W.Planned]:
    """Every tensor of the target in generation order (determinism)."""
    e, hd = spec.n_embd, spec.head_dim
    plan = head_plan(spec, n_vocab)

    def add(name: str, shape: tuple[int, ...], kind: str = "matrix") -> None:
        plan.append(W.Planned(name, shape, kind))

    for i in range(spec.n_layer):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (e,), "norm")
        add(b + "attn_q.weight", (spec.n_head * hd, e))
        add(b + "attn_k.weight", (spec.n_head_kv * hd, e))
        add(b + "attn_v.weight", (spec.n_head_kv * hd, e))
        add(b + "attn_output.weight", (e, spec.n_head * hd))
        if spec.has_qk_norm:
            add(b + "attn_q_norm.weight", (hd,), "norm")
            add(b + "attn_k_norm.weight", (hd,), "norm")
        if spec.arch == "gemma3":
            add(b + "post_attention_norm.weight", (e,), "norm")
            add(b + "post_ffw_norm.weight", (e,), "norm")
        add(b + "ffn_norm.weight", (e,), "norm")
        add(b + "ffn_gate.weight", (spec.n_ff, e))
        add(b + "ffn_up.weight", (spec.n_ff, e))
        add(b + "ffn_down.weight", (e, spec.n_ff))
    return plan


def target_weights(spec: TargetSpec, rng: np.random.Generator, n_vocab: int, dtype: str) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array, generated in a fixed order (determinism)."""
    return W.materialize(target_plan(spec, n_vocab), rng, dtype)


def add_target_keys(w: gguf.GGUFWriter, spec: TargetSpec, vocab: TinyVocab, dtype: str) -> None:
    a = spec.arch
    w.add_name(f"pydflash-tiny-{a}")
    w.add_file_type(W.file_type(dtype))
    w.add_uint32(f"{a}.context_length", spec.n_ctx)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    w.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)  # llama: must equal head_dim
    w.add_uint32(f"{a}.vocab_size", vocab.n_vocab)
    if spec.sliding_window:
        w.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_pattern)
        w.add_float32(f"{a}.rope.freq_base_swa", spec.rope_base_swa)
    add_vocab(w, vocab)


def write_target(
    path: Path, spec: TargetSpec, vocab: TinyVocab, tensors: dict[str, np.ndarray], dtype: str
) -> None:
    w = gguf.GGUFWriter(str(path), spec.arch)
    add_target_keys(w, spec, vocab, dtype)
    for name, arr in tensors.items():
        w.add_tensor(name, W.storage(arr, dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
