"""llama_model_quantize through the library itself, so no llama-quantize binary (and no llama-common build)
is needed to write K-quant GGUFs (used by pydflash-compare-weights tests and the drafter export)."""

from __future__ import annotations

import ctypes
import pathlib

from ..errors import ModelLoadError
from ._lib import C, ensure_backend, last_error

FTYPES = {
    "F32": C.LLAMA_FTYPE_ALL_F32,
    "F16": C.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": C.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q6_K": C.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q5_K_M": C.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q4_K_M": C.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q4_K_S": C.LLAMA_FTYPE_MOSTLY_Q4_K_S,
}


def quantize(src: str | pathlib.Path, dst: str | pathlib.Path, ftype: str, pure: bool = True,
             allow_requantize: bool = False, n_threads: int = 0) -> pathlib.Path:
    """Write dst as src quantized to ftype (a key of FTYPES). pure=True: every 2-D tensor gets that type."""
    if ftype not in FTYPES:
        raise ValueError(f"unknown quantization type {ftype!r}; choose one of {sorted(FTYPES)}")
    ensure_backend()
    params = C.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.pure = pure
    params.allow_requantize = allow_requantize
    params.nthread = n_threads
    last_error()
    rc = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelLoadError(f"quantizing {src} to {ftype} failed: {last_error() or f'code {rc}'}")
    return pathlib.Path(dst)
