"""A GBNF grammar over a model's vocabulary: llama.cpp's grammar sampler (``llama_sampler_init_grammar``), used
only for its two questions: which tokens may come next (``apply`` over candidates), and the state after one
(``accept``). ``clone`` copies a state, so a draft path can be walked and dropped.

Never accept a token the grammar forbids: llama.cpp throws a C++ exception there, which ends the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile

import numpy as np

from ..errors import InvalidRequest
from ._lib import C, last_error, sampler_accept
from .handles import Model

# llama_token_data {llama_token id; float logit; float p;} as a numpy record, so a row is filled without a loop
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert TOKEN_DATA.itemsize == ctypes.sizeof(C.llama_token_data)


class Grammar:
    """One grammar state (an owned ``llama_sampler``)."""

    def __init__(self, ptr):
        self._ptr = ptr
        self._one = np.zeros(1, dtype=TOKEN_DATA)  # allows(): a one-candidate array, reused

    @classmethod
    def parse(cls, model: Model, text: str, field: str = "grammar") -> "Grammar":
        """The start state of a GBNF text (root rule ``root``); InvalidRequest naming ``field`` if llama.cpp
        cannot parse it (its first error line is the reason)."""
        last_error()  # forget older lines
        with _stderr_captured() as said:
            ptr = C.llama_sampler_init_grammar(model._vocab, text.encode("utf-8"), b"root")
        if not ptr:
            why = next((ln.split("error parsing grammar: ", 1)[-1] for ln in said() if ln.strip()), None)
            raise InvalidRequest(f"{field}: not a valid GBNF grammar ({why or last_error() or 'llama.cpp refused it'})")
        return cls(ptr)

    def clone(self) -> "Grammar":
        return Grammar(C.llama_sampler_clone(self._ptr))

    def accept(self, token: int) -> None:
        """Advance past one token the grammar allows (``allows``/``mask`` said so)."""
        sampler_accept(self._ptr, token)

    def allows(self, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(self._one["logit"][0] > -np.inf)

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of these tokens may come next ([n] bool), in one call."""
        cand = np.zeros(len(ids), dtype=TOKEN_DATA)
        cand["id"] = ids
        self._apply(cand)
        return cand["logit"] > -np.inf

    def mask(self, z: np.ndarray) -> None:
        """Set z[t] = -inf for every finite token t the grammar forbids here (in place; z: [V] float32). Tokens
        already at -inf (banned, outside a reduced head) are not asked about: that is most of a drafter's row."""
        ids = np.flatnonzero(z > -np.inf).astype(np.int32)
        cand = np.empty(len(ids), dtype=TOKEN_DATA)
        cand["id"], cand["logit"], cand["p"] = ids, 0.0, 0.0
        self._apply(cand)
        z[ids[cand["logit"] == -np.inf]] = -np.inf

    def _apply(self, cand: np.ndarray) -> None:
        # the grammar sampler rewrites logits in place and neither reorders nor resizes the array
        arr = C.llama_token_data_array(cand.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), len(cand), -1, False)
        C.llama_sampler_apply(self._ptr, ctypes.byref(arr))

    def close(self) -> None:
        if self._ptr:
            C.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()


@contextlib.contextmanager
def _stderr_captured():
    """llama.cpp's grammar parser prints its reason (and the whole grammar) with fprintf(stderr) rather than its
    log: keep it out of the terminal for our one-line error, and hand its lines to the caller."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        lines: list[str] = []
        try:
            yield lambda: lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines += tmp.read().decode("utf-8", "replace").splitlines()
