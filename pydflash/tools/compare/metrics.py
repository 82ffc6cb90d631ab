"""Error metrics accumulated chunk by chunk, and the per-type tolerance table.

  rel_rms = sqrt(sum((g - s)^2) / sum(s^2))     g: dequantized GGUF, s: source
  max_abs = max |g - s|
  cosine  = sum(g*s) / sqrt(sum(g^2) * sum(s^2))
Sums are float64 so a multi-GB tensor read in float32 chunks loses nothing.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import BadInput

# Max relative RMS error a healthy conversion gives, per GGUF type. A clean
# quantization of Gaussian-like weights sits at about half of these (measured
# with llama-quantize --pure: docs/compare-weights.md), leaving room for the
# heavier tails of real weights; a broken conversion (wrong permutation, wrong
# transform, wrong tensor) lands near 1.0 or above.
DEFAULT_TOLERANCE: dict[str, float] = {
    "F32": 1e-6, "F64": 1e-6,
    "F16": 1e-3, "BF16": 8e-3,
    "Q8_0": 0.02,
    "Q6_K": 0.04, "Q5_K": 0.08, "Q5_0": 0.09, "Q5_1": 0.08,
    "Q4_K": 0.15, "Q4_0": 0.17, "Q4_1": 0.15, "IQ4_NL": 0.15, "IQ4_XS": 0.15,
    "Q3_K": 0.3, "IQ3_S": 0.35, "IQ3_XXS": 0.4,
    "Q2_K": 0.55, "IQ2_S": 0.6, "IQ2_XS": 0.6, "IQ2_XXS": 0.65,
    "IQ1_M": 0.8, "IQ1_S": 0.85, "TQ1_0": 1.0, "TQ2_0": 1.0,
    "MXFP4": 0.2, "NVFP4": 0.2,
}
# Types missing from the table get this (loose: it still catches a wrong tensor).
FALLBACK_TOLERANCE = 0.5


@dataclass
class ErrorStats:
    sq_err: float = 0.0   # sum (g - s)^2
    sq_src: float = 0.0   # sum s^2
    sq_gguf: float = 0.0  # sum g^2
    dot: float = 0.0      # sum g*s
    max_abs: float = 0.0
    n: int = 0

    def update(self, g: np.ndarray, s: np.ndarray) -> None:
        g64, s64 = g.astype(np.float64).ravel(), s.astype(np.float64).ravel()
        d = g64 - s64
        self.sq_err += float(d @ d)
        self.sq_src += float(s64 @ s64)
        self.sq_gguf += float(g64 @ g64)
        self.dot += float(g64 @ s64)
        if d.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(d))))
        self.n += d.size

    @property
    def rel_rms(self) -> float:
        if self.sq_src == 0.0:
            return 0.0 if self.sq_err == 0.0 else math.inf
        return math.sqrt(self.sq_err / self.sq_src)

    @property
    def cosine(self) -> float:
        denom = math.sqrt(self.sq_gguf * self.sq_src)
        if denom == 0.0:
            return 1.0 if self.sq_err == 0.0 else 0.0
        return self.dot / denom


def load_tolerances(path: str | Path | None) -> dict[str, float]:
    """The default table, updated from a JSON file mapping type name -> max rel RMS."""
    table = dict(DEFAULT_TOLERANCE)
    if path is None:
        return table
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot read --tolerance-file {path}: {e}") from None
    if not isinstance(data, dict):
        raise BadInput(f"--tolerance-file {path}: expected a JSON object mapping type -> max rel RMS")
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise BadInput(f"--tolerance-file {path}: {k!r} must map to a non-negative number, got {v!r}")
        table[str(k).upper()] = float(v)
    return table


def tolerance_for(qtype: str, table: dict[str, float]) -> float:
    return table.get(qtype, FALLBACK_TOLERANCE)
