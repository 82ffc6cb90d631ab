"""Pairing checks before any decoding; each failure is an IncompatibleDrafter naming the mismatch.

Why each check exists (all of these otherwise fail silently, as lost acceptance or garbage drafts):
- vocabulary: the drafter's argmax ids are verified by the target; a different tokenizer makes every draft wrong.
  An EOS difference alone is allowed (the target's EOS decides when to stop).
- fc input width = n_target_layers x n_embd_target: the features injected into the drafter are that wide.
- target layers: layer-INPUT indices (HF id + 1), so 1..n_layer-1. 0 (the embeddings) usually means raw HF ids
  were stored without the +1. n_layer (the last layer's output) is refused too: llama.cpp keeps only the output
  rows there (a GGML_ASSERT abort when a batch has none), and HF's hidden_states[n_layer] is post-final-norm anyway.
- mask token: the noise block is [anchor, MASK x (B-1)].
- block size: the trained block; the engine drafts B-1 tokens per step.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from ..errors import IncompatibleDrafter
from ..native import Model
from .gguf_meta import GGUFMeta, read_metadata

log = logging.getLogger(__name__)

MIN_BLOCK, MAX_BLOCK = 2, 64
DEFAULT_BLOCK = 16


@dataclass(frozen=True)
class PairInfo:
    block_size: int
    mask_token: int
    target_layers: tuple[int, ...]  # layer-input indices, in fc input order


def vocab_digest(meta: GGUFMeta) -> str:
    """sha256 over the encoded token strings and BPE merges (EOS/BOS ids are deliberately not part of it).

    Hashes the raw GGUF array payloads (length-prefixed strings), so no string is decoded: ~15 ms for 262k tokens.
    """
    h = hashlib.sha256()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        h.update(key.encode() + b"\0")
        h.update(meta.raw(key))
    return h.hexdigest()


def check_pair(target: Model, dmeta: GGUFMeta) -> PairInfo:
    """Check a drafter's metadata against the loaded target, before the drafter itself is loaded.

    Metadata first because llama.cpp rejects some of these (a wrong fc shape) with a generic load error, and
    accepts others (layer ids, mask token) without complaint.
    """
    if dmeta.arch != "dflash":
        raise IncompatibleDrafter(f"{dmeta.path.name} is a '{dmeta.arch}' model, not a DFlash drafter")
    _check_vocab(target, dmeta)
    layers = _check_layers(target, dmeta)
    n_embd = dmeta.get("dflash.embedding_length")
    if n_embd != target.n_embd:
        raise IncompatibleDrafter(
            f"drafter hidden size {n_embd} != target {target.n_embd} (it shares the target's embeddings)"
        )
    mask = dmeta.get("tokenizer.ggml.mask_token_id")
    if mask is None or not 0 <= int(mask) < target.n_vocab:
        raise IncompatibleDrafter(f"drafter has no usable mask token (tokenizer.ggml.mask_token_id = {mask})")
    block = int(dmeta.get("dflash.block_size", DEFAULT_BLOCK))
    if not MIN_BLOCK <= block <= MAX_BLOCK:
        raise IncompatibleDrafter(f"drafter block size {block} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    return PairInfo(block_size=block, mask_token=int(mask), target_layers=layers)


def _check_vocab(target: Model, dmeta: GGUFMeta) -> None:
    tokens = dmeta.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise IncompatibleDrafter("drafter has no tokenizer.ggml.tokens to compare with the target's")
    if len(tokens) != target.n_vocab:
        raise IncompatibleDrafter(f"vocab sizes differ: drafter {len(tokens)}, target {target.n_vocab}")
    if vocab_digest(read_metadata(target.path)) != vocab_digest(dmeta):
        raise IncompatibleDrafter("drafter and target vocabularies differ (sha256 over tokens and merges)")
    eos = dmeta.get("tokenizer.ggml.eos_token_id")
    if eos is not None and int(eos) != target.eos:
        log.warning("drafter EOS %d differs from target EOS %d; the target's is used", eos, target.eos)


def _check_layers(target: Model, dmeta: GGUFMeta) -> tuple[int, ...]:
    layers = tuple(int(i) for i in dmeta.get("dflash.target_layers") or ())
    if not layers:
        raise IncompatibleDrafter("drafter has no dflash.target_layers")
    bad = [i for i in layers if not 1 <= i < target.n_layer]
    if bad:
        hint = " (0 is the embeddings: raw HF ids stored without the +1?)" if 0 in bad else ""
        raise IncompatibleDrafter(
            f"drafter target layer inputs {bad} lie outside the target's layers 1..{target.n_layer - 1}{hint}"
        )
    fc = dmeta.tensors.get("fc.weight")
    width = fc.dims[0] if fc else None
    if width != len(layers) * target.n_embd:
        raise IncompatibleDrafter(
            f"drafter fc input width {width} != {len(layers)} target layers x {target.n_embd} target n_embd"
        )
    return layers
