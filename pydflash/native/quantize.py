"""llama_model_quantize through the library itself, so no llama-quantize binary (and no llama-common build)
is needed to write K-quant GGUFs (used by pydflash-compare-weights tests and the drafter export)."""

from __future__ import annotations

import ctypes
import pathlib
from concurrent.futures import ThreadPoolExecutor

import gguf
import numpy as np

from ..errors import ModelLoadError
from ._lib import LIB_DIR, C, ensure_backend, ggml_libs, last_error

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


# ggml's own row quantizers (ggml.h), for writers that quantize a tensor as they make it instead of staging the whole
# model in F16 first (pydflash.factory.direct: Gemma-4-31B in F16 would not fit a 64 GB disk beside its Q4_K_M).
# The ids are ggml_type's and gguf.GGMLQuantizationType's alike; gguf-py also knows each type's values per block.
ROW_TYPES = {q: int(gguf.GGMLQuantizationType[q]) for q in ("F16", "Q8_0", "Q4_K", "Q5_K", "Q6_K")}
ROW_BLOCK = {q: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[q]][0] for q in ROW_TYPES}
_ggml = ggml_libs.get("libggml-base.so")
if _ggml is not None:
    # size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst, int64_t start, int64_t nrows,
    #                            int64_t n_per_row, const float * imatrix);  (CDLL: the GIL is free while it runs)
    _quantize_chunk = _ggml["ggml_quantize_chunk"]
    _quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_int64, ctypes.c_void_p]
    _quantize_chunk.restype = ctypes.c_size_t
    # size_t ggml_row_size(enum ggml_type type, int64_t ne);
    _row_size = _ggml["ggml_row_size"]
    _row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    _row_size.restype = ctypes.c_size_t


def row_bytes(qtype: str, n_per_row: int) -> int:
    """Bytes of one quantized row of n_per_row values."""
    if _ggml is None:
        raise ModelLoadError(f"libggml-base.so not found in {LIB_DIR}")
    return int(_row_size(ROW_TYPES[qtype], n_per_row))


def quantize_rows(x: np.ndarray, qtype: str, n_threads: int = 1) -> np.ndarray:
    """x (2-D, float32, C order) quantized row by row to qtype by ggml itself: uint8 [rows, row_bytes], the bytes a
    GGUF stores. Rows go to n_threads threads in contiguous runs (each call quantizes whole rows, so the result does
    not depend on the split)."""
    if qtype not in ROW_TYPES:
        raise ValueError(f"unknown row type {qtype!r}; choose one of {sorted(ROW_TYPES)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize_rows takes a 2-D array, got shape {x.shape}")
    rows, n = x.shape
    t = ROW_TYPES[qtype]
    if n % ROW_BLOCK[qtype]:  # ggml would assert (and abort the process) on a row of part of a block
        raise ValueError(f"{qtype} quantizes rows of whole {ROW_BLOCK[qtype]}-value blocks; a row of {n} is not")
    out = np.empty((rows, row_bytes(qtype, n)), dtype=np.uint8)
    src, dst = x.ctypes.data, out.ctypes.data

    def run(r0: int, r1: int) -> None:
        _quantize_chunk(t, src, dst, r0 * n, r1 - r0, n, None)

    bounds = np.linspace(0, rows, max(1, min(n_threads, rows)) + 1).astype(int)
    if len(bounds) == 2:
        run(0, rows)
    else:
        with ThreadPoolExecutor(len(bounds) - 1) as pool:
            list(pool.map(run, bounds[:-1], bounds[1:]))
    return out

