"""A hash chain over token blocks (nano-vllm's ``compute_hash(token_ids, prefix)``).

Block i's hash covers every token up to the end of block i, so equal hashes mean equal prefixes (up to a 64-bit
collision, which the cache rules out by comparing tokens before any restore). The chain starts from a salt made
of the target's and the drafter's digests: the same tokens under another model pair hash differently.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np


def salt(*digests: str) -> bytes:
    """The chain's seed for a model pair (digests of the target and the drafter, '' for none)."""
    return hashlib.blake2b("\0".join(digests).encode(), digest_size=8).digest()


def block_hash(prefix: bytes, block: np.ndarray) -> bytes:
    """hash(prefix hash, block tokens); tokens as little-endian int32."""
    h = hashlib.blake2b(prefix, digest_size=8)
    h.update(np.ascontiguousarray(block, dtype="<i4").tobytes())
    return h.digest()


def chain(tokens: Sequence[int], seed: bytes, block: int) -> list[bytes]:
    """Hashes of every full block of ``tokens``: chain[i] covers tokens[: (i + 1) * block]."""
    arr = np.asarray(tokens, dtype=np.int32)
    out, prev = [], seed
    for i in range(len(arr) // block):
        prev = block_hash(prev, arr[i * block : (i + 1) * block])
        out.append(prev)
    return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n], dtype=np.int64), np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
