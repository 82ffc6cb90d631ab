"""Known, intentional differences between HF and GGUF tensors, undone before comparing.

- Transposed storage: the GGUF logical shape is the HF shape reversed.
- llama q/k permutation: conversion/llama.py `LlamaModel.permute` reorders the
  rows of q_proj/k_proj per head (interleaved rope -> llama.cpp's layout).
- gemma RMSNorm: HF computes x * (1 + w); conversion/gemma.py stores w + 1,
  in the source dtype (torch bf16/f16 arithmetic), so we round the same way.
- gemma3 vocab trim: conversion/gemma.py drops out-of-vocabulary rows of
  embed_tokens, so token_embd may hold only the leading rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .source import to_f32

GEMMA_ARCHS = ("gemma", "gemma2", "gemma3", "gemma3_text")


@dataclass(frozen=True)
class Transform:
    transposed: bool = False
    row_index: np.ndarray | None = None  # gguf row i = source row row_index[i]
    shift: float = 0.0                    # added to the source (gemma norms)
    permute_elements: bool = False        # row_index applies to a 1-D tensor's elements
    kept_rows: int = 0                    # >0: GGUF holds only the first kept_rows source rows

    def describe(self) -> str:
        parts = []
        if self.transposed:
            parts.append("transposed")
        if self.row_index is not None:
            parts.append("llama q/k permute")
        if self.shift:
            parts.append(f"norm w+{self.shift:g}")
        if self.kept_rows:
            parts.append(f"vocab trimmed to {self.kept_rows} rows")
        return ", ".join(parts)


def llama_permute_index(n_rows: int, n_head: int) -> np.ndarray:
    """Row order of conversion/llama.py LlamaModel.permute(w, n_head):
    w.reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2).reshape(w.shape)."""
    return np.arange(n_rows).reshape(n_head, 2, n_rows // n_head // 2).swapaxes(1, 2).reshape(-1)


def pick_transform(arch: str, hf_name: str, src_shape, gguf_shape, heads: tuple[int, int] | None) -> Transform | None:
    """The transform that makes the source look like the GGUF, or None when the shapes disagree."""
    transposed = len(src_shape) == 2 and src_shape != gguf_shape and tuple(reversed(src_shape)) == gguf_shape
    kept = _trimmed_vocab(arch, hf_name, src_shape, gguf_shape)
    if src_shape != gguf_shape and not (transposed or kept):
        return None
    shift = 1.0 if arch in GEMMA_ARCHS and hf_name.endswith("norm.weight") else 0.0
    row_index = None
    if arch == "llama" and heads and not transposed:
        n_head, n_head_kv = heads
        if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            row_index = _maybe_index(src_shape[0], n_head)
        elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            row_index = _maybe_index(src_shape[0], n_head_kv)
    return Transform(transposed, row_index, shift, len(src_shape) == 1, kept)


def _trimmed_vocab(arch: str, hf_name: str, src_shape, gguf_shape) -> int:
    if arch not in GEMMA_ARCHS or not hf_name.endswith("embed_tokens.weight") or len(src_shape) != 2:
        return 0
    same_cols = len(gguf_shape) == 2 and gguf_shape[1] == src_shape[1]
    return gguf_shape[0] if same_cols and gguf_shape[0] < src_shape[0] else 0


def _maybe_index(n_rows: int, n_head: int) -> np.ndarray | None:
    if n_head <= 0 or n_rows % (2 * n_head):
        return None
    return llama_permute_index(n_rows, n_head)


def source_rows(src2d: np.ndarray, dtype: str, tf: Transform, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the source as the GGUF should hold them, float32.

    src2d is the source viewed as 2-D (rows, cols) in its stored dtype.
    """
    if tf.transposed:
        raw = src2d[:, lo:hi].T
    elif tf.row_index is not None and tf.permute_elements:  # 1-D bias: one row
        raw = src2d[:, tf.row_index]
    elif tf.row_index is not None:
        raw = src2d[tf.row_index[lo:hi]]
    else:
        raw = src2d[lo:hi]
    x = to_f32(np.ascontiguousarray(raw), dtype)
    if tf.shift:
        x = _round_like(x + np.float32(tf.shift), dtype)
    return x


def _round_like(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values to the source dtype, as torch arithmetic in that dtype would."""
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        return (rounded.astype(np.uint32) << 16).view(np.float32)
    return x
