"""Read GGUF metadata without loading tensors (gguf-py's reader memory-maps the file)."""

from __future__ import annotations

import pathlib
from functools import lru_cache

import gguf

from ..errors import ModelLoadError


@lru_cache(maxsize=16)
def read_metadata(path: pathlib.Path) -> dict:
    """key -> python value (str, int, float, bool or list) for every metadata field."""
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF ({exc})") from exc
    out = {}
    for name, field in reader.fields.items():
        out[name] = _value(field)
    out["__tensors__"] = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    return out


def _value(field):
    return field.contents() if field.types else None
