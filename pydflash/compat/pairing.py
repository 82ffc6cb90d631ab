"""Pairing checks before any decoding; each failure is an IncompatibleDrafter naming the mismatch."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from ..errors import IncompatibleDrafter
from ..native import Model
from .gguf_meta import read_metadata

log = logging.getLogger(__name__)

MIN_BLOCK, MAX_BLOCK = 2, 64


@dataclass(frozen=True)
class PairInfo:
    block_size: int
    mask_token: int
    target_layers: tuple[int, ...]


def vocab_digest(meta: dict) -> str:
    """sha256 over the token strings and BPE merges (EOS/BOS ids are deliberately not part of it)."""
    h = hashlib.sha256()
    for tok in meta.get("tokenizer.ggml.tokens") or []:
        h.update(tok.encode("utf-8", "surrogatepass") + b"\0")
    h.update(b"\1merges\1")
    for merge in meta.get("tokenizer.ggml.merges") or []:
        h.update(merge.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def check_pair(target: Model, drafter: Model) -> PairInfo:
    if drafter.arch != "dflash":
        raise IncompatibleDrafter(f"{drafter.path.name} is a '{drafter.arch}' model, not a DFlash drafter")
    tmeta, dmeta = read_metadata(target.path), read_metadata(drafter.path)

    if dmeta.get("tokenizer.ggml.tokens"):  # a drafter may omit its vocab; then it is the target's by construction
        if vocab_digest(tmeta) != vocab_digest(dmeta):
            raise IncompatibleDrafter("drafter and target vocabularies differ (tokens or merges)")
    if drafter.n_vocab != target.n_vocab:
        raise IncompatibleDrafter(f"vocab sizes differ: drafter {drafter.n_vocab}, target {target.n_vocab}")
    if drafter.eos != target.eos:
        log.warning("drafter EOS %d differs from target EOS %d; the target's is used", drafter.eos, target.eos)

    layers = tuple(drafter.target_layer_ids())
    if not layers:
        raise IncompatibleDrafter("drafter has no dflash.target_layers")
    bad = [i for i in layers if not 0 <= i < target.n_layer]
    if bad:
        raise IncompatibleDrafter(
            f"drafter reads target layer input(s) {bad}, outside the target's {target.n_layer} layers"
        )
    fc = dmeta["__tensors__"].get("fc.weight")
    want = len(layers) * target.n_embd
    if fc is None or fc[0] != want:
        raise IncompatibleDrafter(
            f"drafter fc input width {fc[0] if fc else None} != {len(layers)} layers x {target.n_embd} target n_embd"
        )
    if drafter.n_embd != target.n_embd:
        raise IncompatibleDrafter(
            f"drafter hidden size {drafter.n_embd} != target {target.n_embd} (it shares the target's embeddings)"
        )
    mask = drafter.mask_token
    if not 0 <= mask < target.n_vocab:
        raise IncompatibleDrafter("drafter has no mask token (tokenizer.ggml.mask_token_id)")
    block = int(dmeta.get("dflash.block_size") or 16)
    if not MIN_BLOCK <= block <= MAX_BLOCK:
        raise IncompatibleDrafter(f"drafter block size {block} outside [{MIN_BLOCK}, {MAX_BLOCK}]")
    return PairInfo(block_size=block, mask_token=mask, target_layers=layers)
