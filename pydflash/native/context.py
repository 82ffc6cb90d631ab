"""A llama.cpp context and the operations the engine needs from it, in numpy and Python types.

Return codes become typed exceptions here (``KVSlotFull`` for code 1, ``DecodeError`` otherwise), and every
size llama.cpp would ``GGML_ASSERT`` on (a batch above ``n_batch``, a non-causal batch above ``n_ubatch``) is
checked first, so a bad call raises instead of aborting the process.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from ..errors import DecodeError, InvalidBatch, KVSlotFull, RollbackError
from ._lib import (
    C, embeddings_layer_inp_addr,
    get_sampled_candidates_count_ith, get_sampled_candidates_ith, get_sampled_probs_count_ith, get_sampled_probs_ith,
    get_sampled_token_ith, get_sampled_tokens, llama_set_embeddings_layer_inp, llama_set_spare_sched_ext,
    memory_seq_cp, memory_seq_pos_max, memory_seq_pos_min, memory_seq_rm, raise_if_interrupted, sampler_accept,
)
from .features import LayerRows
from .handles import ContextParams, Model

# From this many indices on, picks reads them in one call (patches/0008): below it, building the index array costs
# more than the calls it saves on a CPU (16 picks: 4.6 against 7.1 us; 2 picks: 3.9 against 1.3 us)
PICKS_IN_ONE_CALL = 8
log = logging.getLogger(__name__)


def _raise_for(code: int, what: str) -> None:
    raise_if_interrupted()  # a Ctrl-C that llama.cpp's log callback swallowed during the call
    if code == 1:
        raise KVSlotFull(code, what)
    if code != 0:
        raise DecodeError(code, what)


class SampledRow(NamedTuple):
    """The distribution a backend dist chain sampled one output from, after its top-k / top-p / temperature
    (``llama_get_sampled_probs_ith`` and ``llama_get_sampled_candidates_ith``): ``probs[j]`` is the probability
    of token ``ids[j]``, or of token j when ``ids`` is None (no filter reordered the vocabulary). Top-k leaves k
    entries; top-p keeps the whole sorted vocabulary with 0 past the nucleus. Views into llama.cpp's output
    buffers: valid until this context's next decode (``Context.n_decodes`` tells)."""

    ids: Optional[np.ndarray]  # [n] int32 token ids, or None for 0..n-1
    probs: np.ndarray  # [n] float32, sums to 1


class _Batch:
    """A ``llama_batch`` over numpy arrays this object owns, filled by slices: no per-token ctypes write (a step
    of 16 slots builds ~400 rows). llama.cpp reads the arrays only during a decode and frees nothing of them."""

    N_POS = 4  # an embedding row's positions are section-major, pos[j * n + i]: M-RoPE drafters read 3 sections

    def __init__(self, capacity: int, n_pos: int = 1):
        self.capacity = capacity
        self.pos = np.zeros(capacity * n_pos, dtype=np.int32)
        self.n_seq = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        # seq_id is int32 ** (a list per token, for a token in several sequences): each points at its row of self.seq
        self._seq_ptrs = self.seq.ctypes.data + self.seq.itemsize * np.arange(capacity, dtype=np.uintp)
        b = self._b = C.llama_batch()
        b.pos = self.pos.ctypes.data_as(ctypes.POINTER(C.llama_pos))
        b.n_seq_id = self.n_seq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = ctypes.cast(self._seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(C.llama_seq_id)))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def seq_of(self, i: int) -> int:
        return int(self.seq[i])

    def native(self):
        self._b.n_tokens = self.n
        return self._b

    def close(self) -> None:  # nothing native to free: kept for the callers that close what they make
        pass


class TokenBatch(_Batch):
    """A reusable ``llama_batch`` of up to ``capacity`` tokens."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.token = np.zeros(capacity, dtype=np.int32)
        self._b.token = self.token.ctypes.data_as(ctypes.POINTER(C.llama_token))
        self.n_outputs = 0  # rows marked as outputs: decode waits for the backend only when there are some

    def clear(self) -> None:
        self.n = 0
        self.n_outputs = 0

    def add(self, tokens: Sequence[int], pos0: int, seq_id: int, logits: bool | Sequence[bool]) -> int:
        """Append tokens at positions pos0.. for one sequence; returns the batch index of the first one."""
        k = len(tokens)
        start = self.n
        if start + k > self.capacity:
            raise ValueError(f"batch capacity {self.capacity} exceeded ({start + k} tokens)")
        self.token[start : start + k] = tokens
        self.pos[start : start + k] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq[start : start + k] = seq_id
        if isinstance(logits, bool):
            self.logits[start : start + k] = int(logits)
            self.n_outputs += k if logits else 0
        else:
            flags = np.asarray(logits, dtype=np.int8)
            self.logits[start : start + k] = flags
            self.n_outputs += int(np.count_nonzero(flags))
        self.n = start + k
        return start

    def add_spans(self, spans: Sequence[tuple[Sequence[int], int, int]], logits: bool) -> list[int]:
        """Append several sequences' tokens in one go: (tokens, pos0, seq_id) each, every row an output or none;
        returns each span's first batch index. The rows are gathered in Python lists and written with one slice
        assignment per field: a step's verify spans or draft blocks cost three numpy writes instead of a few per
        slot (on a CPU core, 16 blocks of 16 tokens: 52 -> 32 us; 4 single tokens: 13 -> 5 us)."""
        start = self.n
        tokens: list[int] = []
        pos: list[int] = []
        seq: list[int] = []
        starts = []
        for toks, pos0, seq_id in spans:
            starts.append(start + len(tokens))
            k = len(toks)
            tokens += toks
            pos += range(pos0, pos0 + k)
            seq += [seq_id] * k
        end = start + len(tokens)
        if end > self.capacity:
            raise ValueError(f"batch capacity {self.capacity} exceeded ({end} tokens)")
        self.token[start:end] = tokens
        self.pos[start:end] = pos
        self.seq[start:end] = seq
        self.logits[start:end] = int(logits)
        self.n_outputs += len(tokens) if logits else 0
        self.n = end
        return starts


class EmbdBatch(_Batch):
    """A reusable ``llama_batch`` of embedding rows (DFlash: target features for the drafter's KV), no outputs."""

    def __init__(self, capacity: int):
        super().__init__(capacity, n_pos=self.N_POS)

    def fill(self, rows: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """rows [n, width] float32 C-contiguous (kept alive by the caller through the decode); positions, seq_ids
        [n]."""
        n = len(rows)
        if n > self.capacity:
            raise ValueError(f"batch capacity {self.capacity} exceeded ({n} rows)")
        self.pos[: self.N_POS * n].reshape(self.N_POS, n)[:] = positions
        self.seq[:n] = seq_ids
        self._b.embd = ctypes.cast(rows.ctypes.data, ctypes.POINTER(ctypes.c_float))
        self.n = n


class Context:
    """A llama.cpp context over one model: decode, features, greedy picks, KV trimming."""

    def __init__(self, model: Model, params: ContextParams, ctx_other: "Context | None" = None, causal: bool = True):
        self.model = model
        self.params = params
        self._other = ctx_other  # held so the target context outlives a drafter borrowing its weights
        cp = C.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq_max + params.n_seq_spare
        # llama.cpp sizes its output buffers for at least one row per sequence id, spare ones included
        cp.n_outputs_max = max(params.n_outputs_max, cp.n_seq_max) if params.n_outputs_max else 0
        cp.n_outputs_max_per_seq = params.n_outputs_max_per_seq
        cp.kv_unified = params.kv_unified
        cp.no_perf = True
        if params.n_threads:
            cp.n_threads = cp.n_threads_batch = params.n_threads
        if ctx_other is not None:
            cp.ctx_other = ctx_other.ptr
        ptr = C.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise DecodeError(-1, f"creating a context for {model.path} (n_ctx={params.n_ctx})")
        self._ptr = ptr
        if params.spare_sched:
            llama_set_spare_sched_ext(ptr, True)
        self.causal = causal
        if not causal:
            C.llama_set_causal_attn(ptr, False)
        self._mem = C.llama_get_memory(ptr)
        self._chains: dict[int, tuple] = {}  # seq -> (sampling spec, native chain)
        if params.backend_greedy:
            for seq in range(params.n_seq_max):
                self.set_sampling(seq, ("greedy",))
        for lid in params.feature_layers:
            llama_set_embeddings_layer_inp(ptr, lid, True)
        self.features_on = bool(params.feature_layers)
        self._feature_views: dict[int, tuple[int, np.ndarray]] = {}  # layer -> (buffer address, float view)
        self.n_vocab = model.n_vocab
        self._embd: Optional[EmbdBatch] = None  # made on the first inject
        self._iota = np.arange(0, dtype=np.int32)  # batch indices 0, 1, ...: picks passes slices of it
        self.t_native = 0.0  # seconds spent inside llama_decode (the engine's time split)
        self.n_decodes = 0  # token batches decoded: outputs read later must come from the batch they expect
        # Calls that may change what the KV holds (decode, inject, clear, state restore): a check of the KV's extent
        # can be skipped while this has not moved (the engine's per-step invariant, see Engine._check). seq_rm and
        # seq_cp change only the sequence they name (the prompt cache trims idle slots between steps: those must
        # not send every running slot's check back to the KV), so they count per sequence in ``seq_writes``
        self.n_writes = 0
        self.seq_writes: dict[int, int] = {}
        self._later: list[tuple[int, int]] = []  # rollbacks not yet made (seq_rm_later)
        self.n_bad_rows = 0  # sampled rows that did not hold together (see sampled)

    @property
    def ptr(self):
        """The native context, for callers outside this class (state copies): the KV they see is current."""
        self.flush_rollbacks()
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None) is None:
            return
        for seq in self._chains:
            C.llama_set_sampler(self._ptr, seq, None)
        C.llama_free(self._ptr)  # the context before its samplers and its model
        for _, chain in self._chains.values():
            C.llama_sampler_free(chain)
        self._chains = {}
        self._ptr = None

    def __del__(self):
        self.close()

    # --- sampling -------------------------------------------------------------------------------------
    def set_sampling(self, seq: int, spec: Optional[tuple]) -> None:
        """Attach the backend sampler chain for one sequence: ("greedy",), ("greedy", bias), or ("dist", temp,
        top_k, top_p, min_p, bias, seed), bias a tuple of (token id, added logit) pairs (-inf bans); None detaches
        it, and llama.cpp then copies that sequence's full logits rows to the host (``logits``).

        Sampling runs inside the graph, so no n_vocab floats per output are copied to the host. Changing a chain
        makes llama.cpp re-reserve its graph, so an unchanged spec is left alone.
        """
        cur = self._chains.get(seq)
        if cur is not None and cur[0] == spec:
            C.llama_sampler_reset(cur[1])  # a new request: reseed, so a given seed reproduces its output
            return
        if spec is None:
            if cur is not None:
                C.llama_set_sampler(self._ptr, seq, None)
                C.llama_sampler_free(cur[1])
                del self._chains[seq]
            return
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        bias = spec[1] if spec[0] == "greedy" and len(spec) > 1 else spec[5] if spec[0] == "dist" else ()
        if bias:  # first, as in llama.cpp's sampler order: the filters below see the biased logits
            arr = (C.llama_logit_bias * len(bias))(*[C.llama_logit_bias(t, b) for t, b in bias])
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_logit_bias(self.n_vocab, len(bias), arr))
        if spec[0] == "greedy":
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        else:
            _, temp, top_k, top_p, min_p, _, seed = spec
            if 0 < top_k < self.n_vocab:  # k >= n_vocab keeps every token; ggml_top_k asserts k <= its row length
                C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(min_p, 1))
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(temp))
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(seed))
        if not C.llama_set_sampler(self._ptr, seq, chain):
            C.llama_sampler_free(chain)
            raise DecodeError(-1, f"attaching a backend sampler {spec[0]}")
        if cur is not None:
            C.llama_sampler_free(cur[1])
        self._chains[seq] = (spec, chain)

    def accept(self, seq: int, tokens: Sequence[int]) -> None:
        """Tell a sampling chain which of its outputs were committed (a prefix, in output order).

        With several outputs per sequence llama.cpp draws from a scratch RNG and advances the real one only on
        accept; without this every step would reuse the same random draws.
        """
        cur = self._chains.get(seq)
        if cur is None or cur[0][0] == "greedy":
            return
        for tok in tokens:
            sampler_accept(cur[1], tok)

    # --- decoding -------------------------------------------------------------------------------------
    def decode(self, batch: TokenBatch, during: Optional[Callable[[], None]] = None) -> None:
        """Decode a batch. ``during``: host work that needs nothing of this forward, run after llama_decode has
        queued it on an asynchronous backend (a GPU) and before waiting for its outputs, so that the device hides
        it; its time counts as this forward's (it adds to the step only where it outlasts the device's work)."""
        if batch.n == 0:
            if during is not None:
                during()
            return
        if batch.n > self.params.n_batch or (not self.causal and batch.n > self.params.n_ubatch):
            raise ValueError(f"batch of {batch.n} tokens exceeds n_batch/n_ubatch of this context")
        self._check_tokens(batch)
        self.flush_rollbacks()
        t = time.perf_counter()
        rc = C.llama_decode(self._ptr, batch.native())
        self.n_decodes += 1
        self.n_writes += 1
        try:
            if during is not None and rc == 0:
                during()
        finally:
            if batch.n_outputs:
                C.llama_synchronize(self._ptr)  # outputs are read next: count the wait as native time
            self.t_native += time.perf_counter() - t
        _raise_for(rc, "llama_decode")

    def _check_tokens(self, batch: TokenBatch) -> None:
        """Every id must be a vocabulary token. llama.cpp reads -1 (LLAMA_TOKEN_NULL, what a backend sampler gives
        for a row it did not sample, and CUDA's argmax for a row of NaN/-inf logits) as "no token" and fails the
        whole batch with "all entries in the batch must have the same content types"; name the culprit instead."""
        toks = batch.token[: batch.n]
        if toks.min() >= 0 and toks.max() < self.n_vocab:  # two reductions: the index is looked for only if needed
            return
        i = int(np.flatnonzero((toks < 0) | (toks >= self.n_vocab))[0])
        raise InvalidBatch(
            f"token id {int(toks[i])} at batch index {i} (sequence {batch.seq_of(i)}, "
            f"position {int(batch.pos[i])}) is outside the vocabulary [0, {self.n_vocab}) of "
            f"{self.model.path.name}; the batch was not decoded"
        )

    def inject(self, rows: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Decode a batch of embedding rows (DFlash: target features written into the drafter's KV).

        rows: [n, n_embd_in] float32, C-contiguous; positions, seq_ids: [n] int.
        """
        n = len(rows)
        if n == 0:
            return
        if n > self.params.n_batch or (not self.causal and n > self.params.n_ubatch):
            raise ValueError(f"injection of {n} rows exceeds n_batch/n_ubatch of this context")
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if self._embd is None:
            self._embd = EmbdBatch(max(self.params.n_batch, self.params.n_ubatch))
        self._embd.fill(rows, positions, seq_ids)
        self.flush_rollbacks()
        t = time.perf_counter()
        self.n_writes += 1
        # an embedding batch through llama_decode: llama.cpp reads each row at the context's input width (for a
        # DFlash drafter, its target-feature width)
        rc = C.llama_decode(self._ptr, self._embd.native())
        self.t_native += time.perf_counter() - t
        _raise_for(rc, "llama_decode(inject)")

    # --- outputs --------------------------------------------------------------------------------------
    def picks(self, indices: Sequence[int]) -> list[int]:
        """The backend sampler's token (argmax, or a sample) at the given batch indices (marked as outputs), read in
        one call (patches/0008): per index, llama.cpp synchronizes the backend first, a stream synchronization on a
        GPU, and a step of 16 slots reads ~512 picks."""
        n = len(indices)
        if n < PICKS_IN_ONE_CALL:
            ptr = self._ptr
            return [get_sampled_token_ith(ptr, i) for i in indices]
        if isinstance(indices, range) and indices.step == 1 and 0 <= indices.start:  # most calls: a span of rows
            if len(self._iota) < indices.stop:
                self._iota = np.arange(max(indices.stop, 2 * len(self._iota)), dtype=np.int32)
            idx = self._iota[indices.start:indices.stop]
        else:
            idx = np.fromiter(indices, dtype=np.int32, count=n)
        out = np.empty(n, dtype=np.int32)
        get_sampled_tokens(self._ptr, idx.ctypes.data, n, out.ctypes.data)
        return out.tolist()

    def sampled(self, i: int) -> Optional[SampledRow]:
        """The probabilities the sequence's dist chain sampled batch index i from (no copy; see SampledRow).
        llama.cpp already copied them to the host with the batch's outputs; a greedy chain has none.

        None for a row that does not hold together: ids outside the vocabulary, or the chain's own sample not
        among them with a positive probability. Seen once on CPU with a top-k + top-p chain, where one row's
        candidates held that row's filtered logits instead of ids (docs/sampling.md); callers fall back to the
        sampled token."""
        ptr = self._ptr
        n = get_sampled_probs_count_ith(ptr, i)
        probs = get_sampled_probs_ith(ptr, i)
        if not probs or n == 0:
            raise DecodeError(-1, f"no sampled probabilities at batch index {i} (is a dist sampler attached?)")
        probs = np.ctypeslib.as_array(probs, shape=(n,))
        nc = get_sampled_candidates_count_ith(ptr, i)  # 0: the identity (llama.cpp returns its full id list)
        tok = get_sampled_token_ith(ptr, i)
        if not nc:
            return SampledRow(None, probs) if 0 <= tok < n and probs[tok] > 0 else self._bad_row(i)
        ids = np.ctypeslib.as_array(get_sampled_candidates_ith(ptr, i), shape=(nc,))
        # checked here, before any acceptance test uses the row (a fallback decided after a rejection would bias
        # the output; rejection.speculative_commit); O(n) only for top-p rows, which hold the whole vocabulary
        if nc != n or ids.min() < 0 or ids.max() >= self.n_vocab:
            return self._bad_row(i)
        j = np.flatnonzero(ids[:256] == tok)  # the sample is nearly always near the front of a sorted row
        if not len(j):
            j = np.flatnonzero(ids == tok)
        return SampledRow(ids, probs) if len(j) and probs[j[0]] > 0 else self._bad_row(i)

    def _bad_row(self, i: int) -> None:
        self.n_bad_rows += 1
        if self.n_bad_rows == 1:
            log.warning("%s: backend-sampled probabilities at batch index %d do not hold together (the sampled "
                        "token is not among the candidates, or they leave the vocabulary); falling back to the "
                        "sample", self.model.path.name, i)
        return None

    def logits(self, i: int) -> np.ndarray:
        """Full-vocabulary logits at batch index i, copied. Only for the test oracle and sampling."""
        ptr = C.llama_get_logits_ith(self._ptr, i)
        if not ptr:
            raise DecodeError(-1, f"no logits at batch index {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def set_features(self, on: bool) -> None:
        """Turn target-feature extraction for the following batches on or off (for every feature layer).

        Off saves the per-layer copies (device to host, then into the rows) while no sequence needs features.
        patches/0004 makes the switch free: the graph keeps the outputs, only the copies stop and resume.
        """
        if on == self.features_on or not self.params.feature_layers:
            return
        for lid in self.params.feature_layers:
            llama_set_embeddings_layer_inp(self._ptr, lid, on)
        self.features_on = on

    def features(self, n_tokens: int) -> np.ndarray:
        """Layer-input features of every token of the last batch: [n_tokens, n_layers * n_embd] float32, a copy.

        Layers are concatenated in ``feature_layers`` order, which is the drafter's ``fc`` input order.
        """
        return self.layer_rows(n_tokens).array()

    def layer_rows(self, n_tokens: int) -> LayerRows:
        """The same rows left in llama.cpp's buffers (no copy): readable until this context's next decode."""
        if not self.features_on:
            raise DecodeError(-1, "feature extraction is off for this batch")
        views = [self._feature_view(lid) for lid in self.params.feature_layers]
        return LayerRows(views, self.n_decodes, self._decodes, 0, n_tokens)

    def _decodes(self) -> int:
        return self.n_decodes

    def _feature_view(self, lid: int) -> np.ndarray:
        """A numpy view of one layer's feature buffer, rebuilt only when llama.cpp moves the buffer: building one
        costs more than the copy itself for a one-token step."""
        addr = embeddings_layer_inp_addr(self._ptr, lid)
        if not addr:
            raise DecodeError(-1, f"layer {lid} input was not extracted")
        cached = self._feature_views.get(lid)
        if cached is None or cached[0] != addr:
            n_embd = self.model.n_embd
            rows = C.llama_n_batch(self._ptr)  # rows per layer
            view = np.ctypeslib.as_array((ctypes.c_float * (rows * n_embd)).from_address(addr)).reshape(rows, n_embd)
            cached = self._feature_views[lid] = (addr, view)
        return cached[1]

    # --- memory ---------------------------------------------------------------------------------------
    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence. Some memory types cannot drop a partial range: raise."""
        self.flush_rollbacks()
        self._seq_rm(seq_id, p0, p1)

    def _seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        self._wrote(seq_id)
        if not memory_seq_rm(self._mem, seq_id, p0, p1):
            raise RollbackError(f"memory refused to remove positions [{p0}, {p1}) of sequence {seq_id}")

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Give sequence ``dst`` the cells of ``src`` at positions [p0, p1) as well. In a unified KV cache (one
        stream) this is bookkeeping only: the cells are shared, no K/V byte moves and the device is not touched,
        which is what lets the prompt cache keep sequences at no cost per step. Streams would copy whole buffers:
        refused."""
        if not self.params.kv_unified:
            raise RollbackError("seq_cp between KV streams copies buffers: the engine keeps one stream for this")
        self.flush_rollbacks()
        self._wrote(dst)
        memory_seq_cp(self._mem, src, dst, p0, p1)

    def _wrote(self, seq_id: int) -> None:
        if seq_id < 0:  # every sequence
            self.n_writes += 1
        else:
            self.seq_writes[seq_id] = self.seq_writes.get(seq_id, 0) + 1

    def seq_rm_later(self, seq_id: int, p0: int) -> None:
        """Remove a sequence's positions from p0 on, before anything else reads or writes this context's memory
        (every method that does, and ``ptr``, runs what is queued first), or in ``flush_rollbacks``.

        On the H200 host a 16-slot step's target rollbacks took ~0.26 ms (docs/benchmarks.md, patches/0009
        applied), with the device idle. Queued, they run while the next step's drafter forward is on the device (the
        engine passes ``flush_rollbacks`` as its ``during``)."""
        self._later.append((seq_id, p0))

    def flush_rollbacks(self) -> None:
        """Make the queued ``seq_rm_later`` rollbacks, in order."""
        later, self._later = self._later, []
        for seq_id, p0 in later:
            self._seq_rm(seq_id, p0, -1)

    @property
    def graphs_reused(self) -> int:
        """Forwards so far whose ggml graph llama.cpp reused rather than built and allocated again (it reuses the
        previous forward's when the batch has the same shape): scripts/bench/step_costs.py tells the host's part of a
        forward by it."""
        return int(C.llama_perf_context(self._ptr).n_reused)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for the sequence, -1 when empty."""
        self.flush_rollbacks()
        return memory_seq_pos_max(self._mem, seq_id)

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position held for the sequence, -1 when empty."""
        self.flush_rollbacks()
        return memory_seq_pos_min(self._mem, seq_id)

    def clear(self) -> None:
        self._later = []  # nothing is left to remove them from
        self.n_writes += 1
        C.llama_memory_clear(self._mem, True)
