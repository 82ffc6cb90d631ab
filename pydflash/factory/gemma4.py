"""A tiny Gemma-4 target (llama.cpp arch ``gemma4``), shaped like Gemma-4-31B at toy widths.

What the pinned loader reads (src/models/gemma4.cpp load_arch_hparams / load_arch_tensors, the generic keys in
src/llama-model.cpp llama_model_base::load_hparams) and what conversion/gemma.py Gemma4Model writes:

    gemma4.attention.sliding_window_pattern   bool per layer (an ARRAY here, gemma3 takes a uint period)
    gemma4.attention.sliding_window, .rope.freq_base_swa
    gemma4.attention.key_length / value_length           full-attention head size (31B: 512)
    gemma4.attention.key_length_swa / value_length_swa   sliding head size (31B: 256), required
    gemma4.attention.head_count_kv            per layer (31B: 16 sliding, 4 full)
    gemma4.rope.dimension_count / _swa        full layers rotate all dims, with rope_freqs = 1e30 past the
                                              rotated quarter ("proportional" rope, partial_rotary_factor 0.25)
    gemma4.embedding_length_per_layer_input   required; 0 = no per-layer embeddings (31B has none)
    gemma4.attention.shared_kv_layers         0 (31B shares none)
    gemma4.final_logit_softcapping            30, applied in-graph after the head

    per layer: attn_norm, attn_q, attn_k, attn_v (sliding layers only: full layers use K as V, 31B's
    attention_k_eq_v), attn_output, attn_q_norm, attn_k_norm, post_attention_norm, ffn_norm, ffn_gate,
    ffn_up, ffn_down, post_ffw_norm, layer_output_scale ([1], 31B's layer_scalar)
    global: rope_freqs (read by the first full layer, shared by the others), token_embd, output_norm, output

The graph itself supplies the rest: the sqrt(n_embd) input scale, attention scale 1.0 after the q/k RMS norms, an
unweighted RMS norm on V, GELU, and ``t_layer_inp[il] = inpL`` (so the layer inputs DFlash reads need no
patch). Norm weights are stored as used (conversion/gemma.py's Gemma4 norm_shift is 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from . import weights as W
from .targets import TargetSpec, head_plan, tie_output
from .tokenizer import TinyVocab, add_vocab

GEMMA4 = "gemma4"


@dataclass(frozen=True)
class Gemma4Spec(TargetSpec):
    # sliding layers use TargetSpec's head_dim / n_head_kv; full layers these two
    head_dim_full: int = 32
    n_head_kv_full: int = 1
    swa_layers: tuple[bool, ...] = ()  # True = sliding; 31B: five sliding then one full, ten times
    rotary_full: float = 0.25  # the share of a full layer's head that rotates
    softcap: float = 30.0
    post_norm_gain: float = 1.0  # post_attention_norm / post_ffw_norm: the size of each layer's contribution
    layer_scalar: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.swa_layers) != self.n_layer or not any(self.swa_layers) or all(self.swa_layers):
            raise ValueError("swa_layers must name every layer, with sliding and full layers both present")
        if int(self.head_dim_full * self.rotary_full) % 2:
            raise ValueError("the rotated part of a full head must be even")

    @property
    def logit_softcap(self) -> float | None:
        return self.softcap or None

    def head(self, il: int) -> tuple[int, int]:
        """(head size, KV heads) of layer il."""
        swa = self.swa_layers[il]
        return (self.head_dim, self.n_head_kv) if swa else (self.head_dim_full, self.n_head_kv_full)


def default_spec(tied_output: bool = False) -> Gemma4Spec:
    spec = Gemma4Spec(
        GEMMA4, n_layer=6, rope_base=1_000_000.0, rope_base_swa=10000.0, sliding_window=64,
        swa_layers=(True, True, False, True, True, False),
        embd_std=0.125,  # x sqrt(64) in-graph = unit-RMS residual input, like the other tiny targets
        layer_scalar=0.8,
    )
    return tie_output(spec) if tied_output else spec


def rope_freqs(spec: Gemma4Spec) -> np.ndarray:
    """Frequency factors of the full layers: 1 for the rotated pairs, 1e30 (no rotation) for the rest."""
    n_rot = int(spec.head_dim_full * spec.rotary_full / 2)
    return np.array([1.0] * n_rot + [1e30] * (spec.head_dim_full // 2 - n_rot), dtype=np.float32)


def target_plan(spec: Gemma4Spec, n_vocab: int) -> list[W.Planned]:
    """Every tensor of the target in generation order (determinism)."""
    e, nh = spec.n_embd, spec.n_head
    plan = head_plan(spec, n_vocab)
    freqs = rope_freqs(spec)
    plan.append(W.Planned("rope_freqs.weight", freqs.shape, "fixed", values=tuple(freqs.tolist())))

    def add(name: str, shape: tuple[int, ...], kind: str = "matrix", scale: float = 1.0) -> None:
        plan.append(W.Planned(name, shape, kind, scale))

    for il, swa in enumerate(spec.swa_layers):
        hd, n_kv = spec.head(il)
        b = f"blk.{il}."
        add(b + "attn_norm.weight", (e,), "norm")
        add(b + "attn_q.weight", (nh * hd, e))
        add(b + "attn_k.weight", (n_kv * hd, e))
        if swa:
            add(b + "attn_v.weight", (n_kv * hd, e))
        add(b + "attn_output.weight", (e, nh * hd))
        add(b + "attn_q_norm.weight", (hd,), "norm")
        add(b + "attn_k_norm.weight", (hd,), "norm")
        add(b + "post_attention_norm.weight", (e,), "norm", spec.post_norm_gain)
        add(b + "ffn_norm.weight", (e,), "norm")
        add(b + "ffn_gate.weight", (spec.n_ff, e))
        add(b + "ffn_up.weight", (spec.n_ff, e))
        add(b + "ffn_down.weight", (e, spec.n_ff))
        add(b + "post_ffw_norm.weight", (e,), "norm", spec.post_norm_gain)
        plan.append(W.Planned(b + "layer_output_scale.weight", (1,), "fixed", values=(spec.layer_scalar,)))
    return plan


def target_weights(spec: Gemma4Spec, rng: np.random.Generator, n_vocab: int, dtype: str) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array, generated in a fixed order (determinism)."""
    return W.materialize(target_plan(spec, n_vocab), rng, dtype)


def add_target_keys(w: gguf.GGUFWriter, spec: Gemma4Spec, vocab: TinyVocab, dtype: str) -> None:
    w.add_name(f"pydflash-tiny-{GEMMA4}")
    w.add_file_type(W.file_type(dtype))
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv([spec.head(il)[1] for il in range(spec.n_layer)])
    w.add_key_length(spec.head_dim_full)
    w.add_value_length(spec.head_dim_full)
    w.add_key_length_swa(spec.head_dim)
    w.add_value_length_swa(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_base)
    w.add_rope_freq_base_swa(spec.rope_base_swa)
    w.add_rope_dimension_count(spec.head_dim_full)
    w.add_rope_dimension_count_swa(spec.head_dim)
    w.add_sliding_window(spec.sliding_window)
    w.add_sliding_window_pattern(list(spec.swa_layers))
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(spec.softcap)
    w.add_vocab_size(vocab.n_vocab)
    add_vocab(w, vocab)


def write_target(path: Path, spec: Gemma4Spec, vocab: TinyVocab, tensors: dict[str, np.ndarray], dtype: str) -> None:
    w = gguf.GGUFWriter(str(path), GEMMA4)
    add_target_keys(w, spec, vocab, dtype)
    for name, arr in tensors.items():
        w.add_tensor(name, W.storage(arr, dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
