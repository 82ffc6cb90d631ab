"""A cheap model digest: what identifies the weights a snapshot was computed with.

Hashing a multi-GB GGUF at every load is too slow, so the digest covers the file size, its first MiB (the
metadata and the tensor table), 16 evenly spaced 64 KiB samples of the tensor data, its last MiB, and the
metadata overrides applied at load (a drafter's inherited embedding scale changes its KV). Any re-export,
requantisation or other model changes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Mapping

HEAD = TAIL = 1 << 20
SAMPLES, SAMPLE = 16, 64 << 10


def file_digest(path: os.PathLike, overrides: Mapping = {}) -> str:
    path = pathlib.Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(HEAD))
        for i in range(SAMPLES):
            f.seek(HEAD + (max(size - HEAD - TAIL, 0) * i) // SAMPLES)
            h.update(f.read(SAMPLE))
        f.seek(max(size - TAIL, 0))
        h.update(f.read(TAIL))
    h.update(json.dumps(dict(overrides), sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


def model_digest(model) -> str:
    """Digest of a loaded ``native.Model`` (its file and load-time overrides); '' for None."""
    if model is None:
        return ""
    return file_digest(model.path, model.params.kv_overrides)
