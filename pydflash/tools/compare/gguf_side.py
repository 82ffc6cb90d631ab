"""Open a GGUF and dequantize its tensors a block of rows at a time.

gguf-py's GGUFReader memory-maps the file; `ReaderTensor.data` is a view shaped
like the logical tensor (row-major, i.e. ggml `ne` reversed), whose last axis is
bytes for quantized types. Slicing rows of that view and passing them to
`gguf.quants.dequantize` keeps memory bounded by the chunk, not the tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from .errors import BadInput

# Types gguf-py reads as plain numpy arrays but does not route through dequantize().
_PLAIN = {
    GGMLQuantizationType.F64, GGMLQuantizationType.I8, GGMLQuantizationType.I16,
    GGMLQuantizationType.I32, GGMLQuantizationType.I64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    qtype: GGMLQuantizationType
    ne: tuple[int, ...]       # ggml order: ne[0] is the contiguous dim
    data: np.ndarray          # memmap view, rows x (elements or bytes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical row-major shape, comparable to the HF shape."""
        return tuple(reversed(self.ne))

    @property
    def n_rows(self) -> int:
        return self.rows2d().shape[0]

    def rows2d(self) -> np.ndarray:
        return self.data.reshape(-1, self.data.shape[-1]) if self.data.ndim else self.data.reshape(1, 1)


class GGUFFile:
    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise BadInput(f"GGUF not found: {path}")
        try:
            reader = GGUFReader(path)
        except Exception as e:  # gguf-py raises ValueError/IndexError/KeyError on corrupt files
            raise BadInput(f"not a readable GGUF (truncated or corrupt?): {path} ({type(e).__name__}: {e})") from None
        size = path.stat().st_size
        self.path = path
        self._reader = reader
        self.tensors: dict[str, GGUFTensor] = {}
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise BadInput(f"truncated GGUF: tensor {t.name} ends past the end of {path}")
            ne = tuple(int(d) for d in t.shape)
            self.tensors[t.name] = GGUFTensor(t.name, t.tensor_type, ne, t.data)
        self.arch = str(self.field("general.architecture") or "")

    def field(self, key: str):
        """A scalar or string metadata value, or None."""
        f = self._reader.get_field(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception:
            return None


def dequantize_rows(t: GGUFTensor, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of `t` as float32 [hi-lo, ncols]. Raises NotImplementedError for unsupported types."""
    rows = np.ascontiguousarray(t.rows2d()[lo:hi])
    if t.qtype in _PLAIN:
        return rows.astype(np.float32)
    # gguf/quants.py dequantize(): F32/F16 by view, every registered __Quant by dequantize_blocks.
    return dequantize(rows, t.qtype).reshape(hi - lo, -1)
