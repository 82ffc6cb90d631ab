"""Seeded random weights shared by the target and drafter writers.

Arrays are numpy in PyTorch/HF orientation ([out, in] for a linear layer); gguf-py's
GGUFWriter.add_tensor reverses the dims into ggml's ne order itself, so the same array
goes into GGUF and safetensors unchanged.
"""

from __future__ import annotations

import gguf
import numpy as np

DTYPES = ("f32", "f16")


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def rng_for(seed: int, *stream: int) -> np.random.Generator:
    """Independent stream per component, so adding a drafter layer never changes the target."""
    return np.random.default_rng(np.random.SeedSequence([seed, *stream]))


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    # In f16 mode every value is made f16-representable up front, so the f32 norm
    # vectors in GGUF and the f16 copies in safetensors hold identical numbers.
    x = x.astype(np.float32)
    return x.astype(np.float16).astype(np.float32) if dtype == "f16" else x


def matrix(rng: np.random.Generator, out_dim: int, in_dim: int, dtype: str, gain: float = 1.0) -> np.ndarray:
    """[out, in] with std gain/sqrt(in): keeps activations O(1) through the layer."""
    w = rng.standard_normal((out_dim, in_dim), dtype=np.float32) * (gain / np.sqrt(in_dim))
    return _round(w, dtype)


def embedding(rng: np.random.Generator, n_vocab: int, n_embd: int, dtype: str, std: float) -> np.ndarray:
    return _round(rng.standard_normal((n_vocab, n_embd), dtype=np.float32) * std, dtype)


def norm(rng: np.random.Generator, n: int, dtype: str, gain: float = 1.0) -> np.ndarray:
    """RMSNorm weight near gain (the effective multiplier; Gemma's 1+w is already folded in)."""
    return _round(gain * (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)), dtype)


def storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """On-disk form: matrices follow dtype, 1-D norms stay F32 as llama.cpp's converters do."""
    if dtype == "f16" and x.ndim >= 2:
        return x.astype(np.float16)
    return x.astype(np.float32)


def file_type(dtype: str) -> int:
    """general.file_type: what the whole file mostly holds."""
    return int(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
