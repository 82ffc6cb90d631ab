"""Seeded random weights shared by the target and drafter writers.

Arrays are numpy in PyTorch/HF orientation ([out, in] for a linear layer); gguf-py's
GGUFWriter.add_tensor reverses the dims into ggml's ne order itself, so the same array
goes into GGUF and safetensors unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def storage_dtype(ndim: int, dtype: str) -> type:
    """On-disk type: matrices follow dtype, 1-D norms stay F32 as llama.cpp's converters do."""
    return np.float16 if dtype == "f16" and ndim >= 2 else np.float32


def storage(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(storage_dtype(x.ndim, dtype))


def file_type(dtype: str) -> int:
    """general.file_type: what the whole file mostly holds."""
    return int(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)


# --- plans: what to generate, apart from generating it --------------------------------------------------------------
# A writer that holds every array at once cannot write a 4B model in bounded memory. A plan lists each tensor's
# name, shape and recipe in generation order; materialize() turns it into arrays all at once (the tiny models, which
# tests edit before writing), make() one at a time (the streamed writer, pydflash.factory.stream). Both draw from
# the rng in plan order, so the two give the same numbers.
@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]  # numpy / HF orientation: [out, in] for a linear layer
    kind: str  # "matrix" (gain), "embedding" (std), "norm" (gain), "fixed" (values, no rng draw)
    scale: float = 1.0
    values: tuple[float, ...] = ()  # "fixed" only


def make(p: Planned, rng: np.random.Generator, dtype: str) -> np.ndarray:
    if p.kind == "matrix":
        return matrix(rng, p.shape[0], p.shape[1], dtype, gain=p.scale)
    if p.kind == "embedding":
        return embedding(rng, p.shape[0], p.shape[1], dtype, std=p.scale)
    if p.kind == "norm":
        return norm(rng, p.shape[0], dtype, gain=p.scale)
    if p.kind == "fixed":
        return np.asarray(p.values, dtype=np.float32).reshape(p.shape)
    raise ValueError(f"unknown tensor recipe {p.kind!r} for {p.name}")


def materialize(plan: list[Planned], rng: np.random.Generator, dtype: str) -> dict[str, np.ndarray]:
    return {p.name: make(p, rng, dtype) for p in plan}
