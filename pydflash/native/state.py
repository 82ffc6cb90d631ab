"""Per-sequence state snapshots (llama_state_seq_*_ext): the KV cells of one sequence, as bytes.

The prompt cache copies both contexts' states together (the target's KV and the drafter's injected features) so a
restore never leaves one without the other. The ``PARTIAL`` flag copies only what cannot be rolled back with
``seq_rm``: for an iSWA cache (Gemma-3) the sliding-window layers, which keep only the last ``n_swa`` positions;
llama-server's context checkpoints use the same flag.

Sampler chains and outputs are not part of a sequence's state: a restore changes the KV only.
"""

from __future__ import annotations

import ctypes

from ..errors import StateError
from ._lib import C, last_error
from .context import Context
from .handles import Model

FULL = 0  # LLAMA_STATE_SEQ_FLAGS_NONE
PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (== the older SWA_ONLY): the SWA layers of an iSWA cache


def n_swa(model: Model) -> int:
    """Sliding-window size of the model's SWA layers, 0 when it has none (llama_model_n_swa)."""
    return int(C.llama_model_n_swa(model.ptr))


def state_seq_get(ctx: Context, seq: int, flags: int = FULL) -> bytes:
    """One sequence's state. An empty sequence still yields a small header."""
    # size_t llama_state_seq_get_size_ext(struct llama_context * ctx, llama_seq_id seq_id, llama_state_seq_flags);
    size = C.llama_state_seq_get_size_ext(ctx.ptr, seq, flags)
    if size == 0:
        raise StateError(f"sizing the state of sequence {seq} failed: {last_error() or 'no detail'}")
    buf = bytearray(size)
    # size_t llama_state_seq_get_data_ext(ctx, uint8_t * dst, size_t size, llama_seq_id seq_id, flags);
    n = C.llama_state_seq_get_data_ext(ctx.ptr, (ctypes.c_uint8 * size).from_buffer(buf), size, seq, flags)
    if n != size:
        raise StateError(f"copying the state of sequence {seq}: {n} of {size} bytes ({last_error() or 'no detail'})")
    return bytes(buf)


def state_seq_set(ctx: Context, seq: int, data: bytes, flags: int = FULL) -> None:
    """Replace one sequence's cells (of the parts ``flags`` selects) with a state from ``state_seq_get``.

    Raises StateError when llama.cpp refuses it (wrong layout, too few free cells, truncated data); the sequence
    may then be left partly cleared, so the caller clears it in both contexts.
    """
    if not data:
        raise StateError(f"empty state for sequence {seq}")
    src = ctypes.cast(ctypes.c_char_p(bytes(data)), ctypes.POINTER(ctypes.c_uint8))
    last_error()
    ctx.n_writes += 1
    # size_t llama_state_seq_set_data_ext(ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id, flags);
    n = C.llama_state_seq_set_data_ext(ctx.ptr, src, len(data), seq, flags)
    if n == 0:
        raise StateError(f"restoring sequence {seq} failed: {last_error() or 'llama.cpp refused the state'}")
    if n != len(data):
        raise StateError(f"restoring sequence {seq} read {n} of {len(data)} bytes")
