"""llama.cpp-side reference numbers on CPU (tokenize, greedy continuation, layer-input features).

Used to verify the torch target and to tokenize the training corpus. Talks to llama-cpp-python's
low-level API directly (``LLAMA_CPP_LIB_PATH`` must point at our patched build before import) and
declares the two llama-ext.h functions that our patch exports with C linkage.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np


def _lib_dir() -> str:
    for env in ("PYDFLASH_LIB_DIR", "LLAMA_CPP_LIB_PATH"):
        if os.environ.get(env):
            return os.environ[env]
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", ".cache", "native", "current", "lib")


os.environ.setdefault("LLAMA_CPP_LIB_PATH", _lib_dir())
import llama_cpp.llama_cpp as C  # noqa: E402

_lib = C._lib
_lib.llama_set_embeddings_layer_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool]
_lib.llama_set_embeddings_layer_inp.restype = None
_lib.llama_get_embeddings_layer_inp.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
_lib.llama_get_embeddings_layer_inp.restype = ctypes.POINTER(ctypes.c_float)
_backend = False


class LlamaRef:
    """One model + one context; the context is rebuilt per call (simple, CPU, small prompts)."""

    def __init__(self, path: str, vocab_only: bool = False, n_threads: int = 2):
        global _backend
        if not _backend:
            C.llama_backend_init()
            _backend = True
        mp = C.llama_model_default_params()
        mp.vocab_only = vocab_only
        self.model = C.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"cannot load {path}")
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_embd = C.llama_model_n_embd(self.model)
        self.n_threads = n_threads

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        raw = text.encode("utf-8", errors="ignore")
        n = len(raw) + 8
        buf = (C.llama_token * n)()
        got = C.llama_tokenize(self.vocab, raw, len(raw), buf, n, add_bos, False)
        if got < 0:
            buf = (C.llama_token * -got)()
            got = C.llama_tokenize(self.vocab, raw, len(raw), buf, -got, add_bos, False)
        return list(buf[:got])

    def detokenize(self, ids: list[int]) -> str:
        out = b""
        buf = ctypes.create_string_buffer(256)
        for t in ids:
            n = C.llama_token_to_piece(self.vocab, t, buf, 256, 0, False)
            out += buf.raw[:max(n, 0)]
        return out.decode("utf-8", errors="replace")

    def token_text(self, t: int) -> str:
        return C.llama_vocab_get_text(self.vocab, t).decode("utf-8", errors="replace")

    def _ctx(self, n_ctx: int, layers: tuple[int, ...] = ()):
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = self.n_threads
        ctx = C.llama_init_from_model(self.model, cp)
        for lid in layers:
            _lib.llama_set_embeddings_layer_inp(ctx, lid, True)
        return ctx

    def _decode(self, ctx, toks: list[int], start: int, all_logits: bool):
        b = C.llama_batch_init(len(toks), 0, 1)
        for i, t in enumerate(toks):
            b.token[i] = t
            b.pos[i] = start + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = all_logits or i == len(toks) - 1
        b.n_tokens = len(toks)
        rc = C.llama_decode(ctx, b)
        C.llama_batch_free(b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def greedy(self, prompt: list[int], n_new: int) -> list[int]:
        ctx = self._ctx(len(prompt) + n_new + 8)
        try:
            self._decode(ctx, prompt, 0, False)
            out, pos = [], len(prompt)
            for _ in range(n_new):
                lg = np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, -1), shape=(self.n_vocab,))
                t = int(lg.argmax())
                out.append(t)
                self._decode(ctx, [t], pos, False)
                pos += 1
            return out
        finally:
            C.llama_free(ctx)

    def features(self, toks: list[int], layer_inp_ids: tuple[int, ...]) -> dict[int, np.ndarray]:
        """Layer-input features (index i = output of layer i-1) for every token of one batch."""
        ctx = self._ctx(len(toks) + 8, layer_inp_ids)
        try:
            self._decode(ctx, toks, 0, True)
            out = {}
            for lid in layer_inp_ids:
                p = _lib.llama_get_embeddings_layer_inp(ctx, lid)
                out[lid] = np.ctypeslib.as_array(p, shape=(len(toks), self.n_embd)).copy()
            logits = np.ctypeslib.as_array(C.llama_get_logits(ctx), shape=(len(toks), self.n_vocab)).copy()
            out["argmax"] = logits.argmax(-1)
            return out
        finally:
            C.llama_free(ctx)

    def close(self):
        if self.model:
            C.llama_model_free(self.model)
            self.model = None
