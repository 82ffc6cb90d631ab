"""Read HF safetensors (one file, a sharded index, or a directory) without torch.

The header is parsed by hand so every tensor, bf16 included, is a zero-copy
np.memmap view in its own dtype; nothing is loaded until a chunk is asked for.
Format: u64 little-endian header length N, N bytes of JSON, then the data.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import BadInput

# safetensors dtype tag -> numpy storage dtype. BF16 is stored as its raw bits.
_NP_DTYPE = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str                # safetensors tag, e.g. "BF16"
    shape: tuple[int, ...]
    path: Path
    offset: int               # absolute byte offset of the data in `path`


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Decode a chunk of source data to float32 (bf16: the top 16 bits of an f32)."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


class SafetensorsSource:
    """All tensors of a checkpoint, addressed by HF name."""

    def __init__(self, spec: str | Path):
        self.tensors: dict[str, SourceTensor] = {}
        self._maps: dict[Path, np.memmap] = {}
        for path in _shard_paths(Path(spec)):
            for t in _read_header(path):
                self.tensors[t.name] = t

    def array(self, t: SourceTensor) -> np.ndarray:
        """The tensor in its stored dtype, backed by the file (no copy)."""
        mm = self._maps.get(t.path)
        if mm is None:
            mm = self._maps[t.path] = np.memmap(t.path, dtype=np.uint8, mode="r")
        dt = np.dtype(_NP_DTYPE[t.dtype])
        n = int(np.prod(t.shape, dtype=np.int64))
        return mm[t.offset:t.offset + n * dt.itemsize].view(dt).reshape(t.shape)


def _shard_paths(spec: Path) -> list[Path]:
    if not spec.exists():
        raise BadInput(f"source not found: {spec}")
    if spec.is_dir():
        index = spec / "model.safetensors.index.json"
        if index.is_file():
            return _index_paths(index)
        files = sorted(spec.glob("*.safetensors"))
        if not files:
            raise BadInput(f"no .safetensors files in directory {spec}")
        return files
    if spec.name.endswith(".json"):
        return _index_paths(spec)
    return [spec]


def _index_paths(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"bad safetensors index {index}: {e}") from None
    paths = [index.parent / f for f in dict.fromkeys(weight_map.values())]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise BadInput(f"index {index} names missing shard(s): {', '.join(missing)}")
    return paths


def _read_header(path: Path) -> list[SourceTensor]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError("header length exceeds file size")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise BadInput(f"not a readable safetensors file: {path} ({e})") from None
    data_start, data_len = 8 + n, size - 8 - n
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        out.append(_tensor_entry(path, name, meta, data_start, data_len))
    return out


def _tensor_entry(path: Path, name: str, meta: dict, start: int, data_len: int) -> SourceTensor:
    try:
        dtype, shape, (lo, hi) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise BadInput(f"{path}: malformed header entry for {name!r}") from None
    if dtype not in _NP_DTYPE:
        raise BadInput(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
    want = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NP_DTYPE[dtype]).itemsize
    if hi - lo != want or hi > data_len:
        raise BadInput(f"{path}: tensor {name!r} is truncated or has bad offsets")
    return SourceTensor(name, dtype, shape, path, start + lo)
