"""Owners of native handles: a loaded model and its vocabulary.

A ``Model`` must outlive every ``Context`` made from it; ``Context`` keeps a reference to its model (and to
its ``ctx_other``) so Python's refcounting frees contexts first. ``close()`` is idempotent.
"""

from __future__ import annotations

import ctypes
import pathlib
from dataclasses import dataclass, field
from typing import Mapping, Union


from ..errors import ModelLoadError
from ._lib import (
    C, ensure_backend, last_error, llama_model_target_layer_ids, llama_model_target_layer_ids_n, vocab_is_eog,
)
from . import mmvq

GGUF_MAGIC = b"GGUF"
KVValue = Union[bool, int, float, str]


@dataclass(frozen=True)
class ModelParams:
    n_gpu_layers: int = 0  # layers offloaded to the GPUs and RPC servers together (llama.cpp's -ngl)
    # GGUF metadata overrides applied at load (e.g. {"dflash.embedding_scale": 25.3}).
    kv_overrides: Mapping[str, KVValue] = field(default_factory=dict)
    # llama.cpp RPC servers ("ip:port", from pydflash.rpc_endpoints.resolve_all) whose devices take offloaded layers,
    # split with the local GPUs by free memory (native/rpc.py); () = local devices only
    rpc: tuple[str, ...] = ()
    # llama.cpp's vocab_only: the vocabulary and metadata without the weights (a tokenizer; no Context can be made)
    vocab_only: bool = False

    def __post_init__(self):
        if self.n_gpu_layers < -1:
            raise ValueError("n_gpu_layers must be >= -1 (-1 = all)")
        for key in self.kv_overrides:
            if not key or len(key.encode()) >= 128:
                raise ValueError(f"kv override key {key!r} must be 1..127 bytes")


def check_gguf_file(path: pathlib.Path) -> None:
    """Cheap checks before handing a path to llama.cpp, which would only log and return NULL."""
    if not path.is_file():
        raise ModelLoadError(f"no such model file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file")


def _overrides_array(overrides: Mapping[str, KVValue]):
    """llama.cpp reads a NUL-key-terminated array of llama_model_kv_override."""
    arr = (C.llama_model_kv_override * (len(overrides) + 1))()
    for i, (key, value) in enumerate(overrides.items()):
        item = arr[i]
        item.key = key.encode()
        if isinstance(value, bool):
            item.tag, item.value.val_bool = C.LLAMA_KV_OVERRIDE_TYPE_BOOL, value
        elif isinstance(value, int):
            item.tag, item.value.val_i64 = C.LLAMA_KV_OVERRIDE_TYPE_INT, value
        elif isinstance(value, float):
            item.tag, item.value.val_f64 = C.LLAMA_KV_OVERRIDE_TYPE_FLOAT, value
        else:
            item.tag, item.value.val_str = C.LLAMA_KV_OVERRIDE_TYPE_STR, str(value).encode()[:127]
    arr[len(overrides)].key = b""
    return arr


class Model:
    """A loaded GGUF. Metadata, vocabulary and tokenizer helpers; no decoding (see ``Context``)."""

    def __init__(self, path: Union[str, pathlib.Path], params: ModelParams = ModelParams()):
        self.path = pathlib.Path(path)
        self.params = params
        check_gguf_file(self.path)
        ensure_backend()
        if params.n_gpu_layers != 0 and not params.vocab_only:
            mmvq.choose_for(self.path)  # before the first product of this process reads the switch
        mp = C.llama_model_default_params()
        mp.n_gpu_layers = params.n_gpu_layers if params.n_gpu_layers >= 0 else 999
        mp.vocab_only = params.vocab_only
        self._overrides = None
        if params.kv_overrides:
            self._overrides = _overrides_array(params.kv_overrides)  # must stay alive during the load
            mp.kv_overrides = ctypes.cast(self._overrides, ctypes.POINTER(C.llama_model_kv_override))
        self._devices = None
        if params.rpc:
            from . import rpc  # only here: a build without RPC loads every other model as before

            self._devices = rpc.target_devices(params.rpc)
            mp.devices = self._devices.ptr
            mp.tensor_buft_overrides = self._devices.overrides_ptr
        last_error()  # forget errors of earlier calls
        ptr = C.llama_model_load_from_file(str(self.path).encode(), mp)
        if ptr and self._devices is not None:
            self._devices.hold()
        if not ptr:
            why = last_error().removeprefix("llama_model_load: ") or "unsupported architecture or corrupt file"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {why}")
        self._ptr = ptr
        self._vocab = C.llama_model_get_vocab(ptr)
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        self.n_embd = C.llama_model_n_embd(ptr)
        self.n_layer = C.llama_model_n_layer(ptr)
        self.n_ctx_train = C.llama_model_n_ctx_train(ptr)
        self.arch = self.meta("general.architecture") or ""
        self._pieces: dict[tuple[int, bool], bytes] = {}

    # --- lifetime -------------------------------------------------------------------------------------
    @property
    def ptr(self):
        if self._ptr is None:
            raise ModelLoadError(f"model {self.path} is closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            C.llama_model_free(self._ptr)
            self._ptr = None
            if self._devices is not None:
                self._devices.release()

    @property
    def devices(self) -> list[str]:
        """Names of the devices given to llama.cpp for offloading ("RPC0", ..., then local GPUs); [] = its default."""
        return list(self._devices.names) if self._devices is not None else []

    def __del__(self):
        self.close()

    # --- metadata -------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", "replace")

    def target_layer_ids(self) -> list[int]:
        """Layer-input indices a DFlash drafter reads (empty for a non-drafter)."""
        n = llama_model_target_layer_ids_n(self.ptr)
        ids = llama_model_target_layer_ids(self.ptr)
        return [int(ids[i]) for i in range(n)] if n and ids else []

    # --- vocabulary -----------------------------------------------------------------------------------
    @property
    def bos(self) -> int:
        return C.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return C.llama_vocab_eos(self._vocab)

    @property
    def mask_token(self) -> int:
        return C.llama_vocab_mask(self._vocab)

    def is_eog(self, token: int) -> bool:
        return vocab_is_eog(self._vocab, token)

    def token_text(self, token: int) -> bytes:
        return C.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        out = (C.llama_token * cap)()
        n = C.llama_tokenize(self._vocab, data, len(data), out, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            out = (C.llama_token * cap)()
            n = C.llama_tokenize(self._vocab, data, len(data), out, cap, add_special, parse_special)
        return list(out[:n])

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The token's bytes; cached, since every emitted token asks (a native call and a buffer each)."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = self._token_to_piece(token, special)
        return piece

    def _token_to_piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens, special: bool = False) -> bytes:
        return b"".join(self.token_to_piece(int(t), special) for t in tokens)

    def detokenize_text(self, tokens, remove_special: bool = True) -> bytes:
        """llama.cpp's own inverse of ``tokenize`` (drops the SentencePiece space prefix and BOS/EOS text), for
        /detokenize; ``detokenize`` joins raw pieces, which streaming needs."""
        n = len(tokens)
        arr = (C.llama_token * max(n, 1))(*[int(t) for t in tokens])
        cap = 8 * n + 16
        buf = ctypes.create_string_buffer(cap)
        got = C.llama_detokenize(self._vocab, arr, n, buf, cap, remove_special, False)
        if got < 0:  # buffer too small: -got is the size needed
            cap = -got
            buf = ctypes.create_string_buffer(cap)
            got = C.llama_detokenize(self._vocab, arr, n, buf, cap, remove_special, False)
        return buf.raw[:got]


LLAMA_MAX_SEQ = 256  # llama-cparams.h: sequence ids per context


@dataclass(frozen=True)
class ContextParams:
    n_ctx: int = 4096  # total KV cells: shared by all sequences (kv_unified), or n_ctx / n_seq_max each
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq_max: int = 1
    # Sequence ids past n_seq_max that never decode: they only hold cells shared with others (``Context.seq_cp``),
    # the device prompt cache's copies of released sequences. No sampler is attached to them.
    n_seq_spare: int = 0
    # Most outputs (logits rows) in one batch, and per sequence; llama.cpp sizes its output and backend-sampling
    # buffers by these (n_vocab floats each), so they are kept to what a verify step needs. 0 = n_batch.
    n_outputs_max: int = 0
    n_outputs_max_per_seq: int = 0
    n_threads: int = 0  # 0 = llama.cpp's default
    # Greedy argmax taken on the backend for every sequence: no n_vocab floats copied per output.
    backend_greedy: bool = True
    # Layer-input indices whose features this context extracts for every token of every batch.
    feature_layers: tuple[int, ...] = ()
    # One pool of cells for all sequences (what the engine uses: admission bounds each slot's share). False gives
    # each sequence its own stream: attention then spans a sequence's own cells instead of every cell in use
    # (the engine allows streams for plain decoding only, EngineConfig).
    kv_unified: bool = True
    # patches/0012: a second scheduler, so that batches with and without outputs each keep their graph allocated (a
    # DFlash drafter's feature injection and its block alternate every drafting step and otherwise rebuild each
    # other's graph). Its buffers grow to the graphs it is given: worth it where the two kinds alternate
    spare_sched: bool = False

    def __post_init__(self):
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.n_seq_spare < 0 or self.n_seq_max + self.n_seq_spare > LLAMA_MAX_SEQ:
            raise ValueError(f"n_seq_max + n_seq_spare must be at most {LLAMA_MAX_SEQ}")
        if self.n_ubatch > self.n_batch:
            raise ValueError("n_ubatch must be <= n_batch")
        if self.n_threads < 0:
            raise ValueError("n_threads must be >= 0")
