"""Quantize a drafter GGUF with llama.cpp's own quantizer, keeping ``fc`` (and every 1-D norm) as converted.

Why keep fc: it is the drafter's only view of the target. It projects the concatenated target features
(n_ctx_layers x n_embd wide, rows of very different scales per layer) into one hidden vector that hidden_norm then
normalizes; its rounding error lands on every context key and value. It is one matrix of the whole stack (11 % of
z-lab's Gemma-4-31B drafter, 6 % of the Qwen3-4B one), so keeping it costs little. Norms (hidden_norm included) are
1-D and never quantized by llama.cpp.

The quantizer takes per-tensor overrides (``llama_model_quantize_params.tt_overrides``, a regex per tensor name);
``fc.weight`` gets its own type back through one. pydflash.native.quantize has no overrides, hence this wrapper over
the same C call.
"""

from __future__ import annotations

import ctypes
import pathlib
import re

from ..errors import ModelLoadError
from ..native._lib import C, ensure_backend, last_error
from ..native.quantize import FTYPES
from .gguf_meta import read_metadata

KEPT = ("fc.weight",)


def quantize_drafter(src: str | pathlib.Path, dst: str | pathlib.Path, ftype: str, keep=KEPT,
                     n_threads: int = 0) -> pathlib.Path:
    """Write dst as src quantized to ftype (a key of pydflash.native.quantize.FTYPES), tensors in keep unchanged."""
    if ftype not in FTYPES:
        raise ValueError(f"unknown quantization type {ftype!r}; choose one of {sorted(FTYPES)}")
    meta = read_metadata(src)
    kept = [(name, meta.tensors[name].ggml_type) for name in keep if name in meta.tensors]
    overrides = (C.llama_model_tensor_override * (len(kept) + 1))()
    patterns = [f"^{re.escape(name)}$".encode() for name, _ in kept]  # referenced until the call returns
    for slot, pattern, (_, ggml_type) in zip(overrides, patterns, kept):
        slot.pattern, slot.type = pattern, ggml_type
    overrides[len(kept)].pattern = None  # the list ends at a NULL pattern
    ensure_backend()
    params = C.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = n_threads
    params.tt_overrides = ctypes.cast(overrides, type(params.tt_overrides))
    last_error()
    rc = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelLoadError(f"quantizing {src} to {ftype} failed: {last_error() or f'code {rc}'}")
    return pathlib.Path(dst)
